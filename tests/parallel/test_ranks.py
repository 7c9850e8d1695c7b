"""launch (parallel/ranks.py) starts one process per rank with torch.distributed's environment
and reports each rank's exit status; run_command_ranks runs the exactdraft command line in
every rank."""

from __future__ import annotations

import json
import os

from exactdraft.cli.ranks import run_command_ranks
from exactdraft.parallel import launch


def write_environment(folder: str) -> None:
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT")
    with open(os.path.join(folder, f"env{os.environ['RANK']}.json"), "w") as handle:
        json.dump({name: os.environ[name] for name in names}, handle)
    if os.environ["RANK"] == "1":
        raise SystemExit(5)


def test_each_rank_gets_its_environment_and_its_exit_status_comes_back(tmp_path):
    assert launch(write_environment, 2, (str(tmp_path),), timeout_s=120) == [0, 5]
    seen = [json.loads((tmp_path / f"env{rank}.json").read_text()) for rank in range(2)]
    assert [s["RANK"] for s in seen] == ["0", "1"] and seen[0]["WORLD_SIZE"] == "2"
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]


def test_a_command_line_runs_in_every_rank_and_its_failure_is_reported():
    # Every rank parses the command line and refuses it: the CLI's exit status for bad input.
    assert run_command_ranks(["generate", "--max-new-tokens", "-1"], 2, timeout_s=120) == 2
