"""A rank that dies mid-generation makes the others stop with an error naming it within the
bounded time; splits the model cannot take are refused before anything loads; ranks with
different checkpoints stop at the fingerprint exchange."""

from __future__ import annotations

import os

import pytest

import exactdraft as xd
from exactdraft.errors import ParameterError
from exactdraft.parallel import ParallelSettings, launch
from exactdraft.parallel.load import check_split
from tests.conftest import build_tiny_checkpoint
from tests.parallel.scenarios import killing_rank, read_outcome, scenario_rank

SETTINGS = ParallelSettings(2, timeout_s=30, heartbeat_s=0.25, stale_s=2)
# The survivor's error must come within the heartbeat's bound (stale_s and two heartbeats),
# with room for a loaded machine; gloo's timeout_s is far above it.
BOUND_S = 12


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("model")), "llama")


@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_rank_is_named_by_the_survivor_within_the_bound(model, tmp_path, victim):
    codes = launch(killing_rank, 2, (model, SETTINGS, str(tmp_path), victim, 6),
                   timeout_s=120)
    survivor = 1 - victim
    assert codes[victim] == -9 and codes[survivor] == 0, codes  # SIGKILL; the other returned
    outcome = read_outcome(str(tmp_path), survivor)
    assert outcome and not outcome["ok"], outcome
    assert outcome["type"] == "TensorParallelError"
    assert f"rank {victim} is gone" in outcome["error"], outcome["error"]
    with open(tmp_path / "killed_at") as handle:
        killed_at = float(handle.read())
    assert 0 < outcome["at"] - killed_at < BOUND_S, outcome


@pytest.mark.slow
def test_ranks_with_different_checkpoints_stop_before_loading(model, tmp_path):
    other = build_tiny_checkpoint(str(tmp_path / "other"), "llama", seed=1)
    runs = tmp_path / "runs"
    runs.mkdir()
    codes = launch(mismatched_rank, 2, (model, other, SETTINGS, str(runs)), timeout_s=120)
    assert codes == [1, 1], codes
    for rank in range(2):
        error = read_outcome(str(runs), rank)["error"]
        assert "disagree on the checkpoint and settings: rank 1 has" in error, error


def mismatched_rank(model: str, other: str, settings, folder: str) -> None:
    path = other if int(os.environ["RANK"]) == 1 else model
    scenario_rank(path, settings, folder, control=False)


# -- refused before anything loads (no ranks needed) --------------------------------------------

def test_a_rank_count_above_the_heads_is_refused_naming_it(model):
    with pytest.raises(ParameterError, match="tensor_parallel=8 exceeds the model's 4 "
                                             "attention heads"):
        xd.Generator.from_pretrained(model, tensor_parallel=8)


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_a_bad_rank_count_is_refused_naming_it(model, value):
    with pytest.raises(ParameterError, match=f"tensor_parallel must be an integer >= 1, got "
                                             f"{value!r}"):
        xd.Generator.from_pretrained(model, tensor_parallel=value)


def test_families_not_split_yet_are_refused_naming_them():
    """A family that declares no split (models/split.py) is refused by its model type and its
    family's name, and the message lists the model types whose families declare one."""
    from exactdraft.models.families.registry import Family

    class RecurrentConfig:
        model_type = "rwkv"

    unsplit = Family("rwkv", ("rwkv",), (), *([None] * 5))
    with pytest.raises(ParameterError, match="'rwkv' models are not split yet \\(the rwkv "
                                             "family declares no tensor-parallel split\\); "
                                             "tensor parallel supports .*qwen3_moe"):
        check_split(unsplit, RecurrentConfig(), 2)


@pytest.mark.parametrize("model_type", ["llama", "gemma3", "mixtral", "qwen3_next",
                                        "qwen3_5_text", "nemotron_h"])
def test_the_families_declare_their_split(model_type):
    from exactdraft.models.families.registry import family_for_model_type

    family = family_for_model_type(model_type, "<test>")

    class Config:
        num_heads = 4

    config = Config()
    config.model_type = model_type
    if model_type in ("llama", "gemma3"):  # a dense decoder's configuration
        from exactdraft.models.config import DecoderConfig

        config = DecoderConfig.__new__(DecoderConfig)
        object.__setattr__(config, "num_heads", 4)
    split = family.tensor_parallel(config)
    assert split is not None
    dense = model_type in ("llama", "gemma3")
    hybrid = model_type in ("qwen3_next", "qwen3_5_text", "nemotron_h")
    assert (split.heads is not None) == dense
    assert (split.experts is not None) == (not dense)
    assert (split.recurrent is not None) == (split.attention is not None) == hybrid
    assert check_split(family, config, 2).world_size == 2
    with pytest.raises(ParameterError, match="tensor_parallel=8 exceeds the model's 4 "
                                             "attention heads"):
        check_split(family, config, 8)


def test_without_the_distributed_environment_the_error_says_how_to_start(model, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ParameterError, match="torchrun --nproc-per-node 2"):
        xd.Generator.from_pretrained(model, tensor_parallel=2)


def test_one_rank_is_the_plain_model(model):
    generator = xd.Generator.from_pretrained(model, tensor_parallel=1, guard=False)
    assert type(generator.target).__name__ == "DecoderModel"


@pytest.mark.slow
def test_a_hung_rank_is_named_as_stuck_after_the_collective_timeout(model, tmp_path):
    settings = ParallelSettings(2, timeout_s=3, heartbeat_s=0.25, stale_s=4)
    codes = launch(killing_rank, 2, (model, settings, str(tmp_path), 1, 6, 15.0),
                   timeout_s=120)
    assert codes == [0, 3], codes
    outcome = read_outcome(str(tmp_path), 0)
    assert outcome["type"] == "TensorParallelError"
    assert "rank 1 (at command" in outcome["error"] and "is stuck" in outcome["error"], outcome
    with open(tmp_path / "killed_at") as handle:
        hung_at = float(handle.read())
    # gloo's timeout (counted from when rank 0 entered the gather, which may precede the
    # hang), then the heartbeat's wait for a silent rank (none): within the bound.
    assert 0 < outcome["at"] - hung_at < settings.timeout_s + BOUND_S, outcome


def lonely_rank(folder: str) -> None:
    """Rank 0 of two whose partner never comes: records the error it stops with."""
    from exactdraft.parallel.group import ParallelGroup

    os.environ["WORLD_SIZE"] = "2"
    try:
        ParallelGroup(ParallelSettings(2, timeout_s=2, heartbeat_s=0.25, stale_s=1))
    except Exception as error:  # noqa: BLE001  (what the test inspects)
        with open(os.path.join(folder, "error.txt"), "w") as handle:
            handle.write(f"{type(error).__name__}: {error}")


@pytest.mark.slow
def test_a_rank_that_never_joins_stops_the_others_at_the_timeout(tmp_path):
    assert launch(lonely_rank, 1, (str(tmp_path),), timeout_s=60) == [0]
    error = (tmp_path / "error.txt").read_text()
    assert error.startswith("TensorParallelError: tensor parallel rank 0 could not join the 2 "
                            "ranks"), error
