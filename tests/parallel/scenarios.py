"""What the tensor-parallel tests run: one scenario of passes and generations, run on a TP=1
model in the test process and on rank 0 of a TP=N run, and the rank functions started by
exactdraft.parallel.launch (module-level, so spawned processes can import them)."""

from __future__ import annotations

import json
import os
import time
import traceback

import numpy as np

PROMPT = "the cat sat on the mat; the cat sat on the "
PREFIX = list(range(3, 40))


def scenario(generator, heads: bool = False) -> dict[str, np.ndarray]:
    """Logits of chains, a batch, a token tree and an imported prefix, then tokens of serial,
    drafted and batched generations: everything whose bits TP must keep. With `heads`, also
    the bundled draft head's runs, chains and trees (features and tree passes)."""
    import exactdraft as xd
    from exactdraft.engine.scheduler import Engine
    from exactdraft.models.target import capabilities_of

    target, out = generator.target, {}
    state = target.new_state()
    out["prefill"] = target.forward(state, PREFIX, rows="all")
    out["step"] = target.forward(state, [7])
    other = target.new_state()
    batch = target.forward_batch([state, other], [[9, 10, 11], [12, 13]], rows="all")
    out["batch0"], out["batch1"] = batch
    length = state.length
    can = capabilities_of(target)
    if can.verifies_trees:
        out["tree"] = target.forward_tree(state, [5, 6, 7, 8], [-1, 0, 0, 1])
        target.commit_tree(state, [0, 1, 3])
        out["after_tree"] = target.forward(state, [4], rows="all")
    else:
        out["after_chain"] = target.forward(state, [5, 6, 8, 4], rows="all")
    target.truncate(state, length)
    out["after_truncate"] = target.forward(state, [4, 4])
    if can.kv_prefixes:
        keys, values = target.export_kv(state, 0, 20)
        imported = target.new_state()
        target.import_kv(imported, keys, values)
        out["after_import"] = target.forward(imported, [21, 22, 23], rows="all")
    params = xd.SamplingParams(temperature=0.8, seed=3)
    tokenizer = generator.tokenizer

    def prompt(text: str):  # a file without a tokenizer (GGUF) takes the tiny one's ids
        return text if tokenizer is not None else [ord(c) - 29 for c in text]

    runs = {"serial": xd.Generator(target, tokenizer=tokenizer),
            "lookup": xd.Generator(target, xd.PromptLookup(max_draft=4, min_match=1),
                                   tokenizer=tokenizer, adaptive_depth=False),
            "self_drafted": xd.Generator(target, xd.DraftModel(target, max_draft=3),
                                         tokenizer=tokenizer, adaptive_depth=False)}
    if heads:
        for width in (1, 2):
            head = xd.DraftHead.from_pretrained(None, target, max_draft=4, tree_width=width)
            runs[f"head{width}"] = xd.Generator(target, head, tokenizer=tokenizer,
                                                adaptive_depth=False)
        assert runs["head2"].trees  # token trees verified in one pass
    for name, run in runs.items():
        result = run.generate(prompt(PROMPT), 20, params, stop_tokens=[])
        out[f"tokens_{name}"] = np.array(result.tokens)
        # Drafted and accepted tokens: rejected drafts roll the target's state back.
        out[f"drafts_{name}"] = np.array([result.stats.drafted, result.stats.accepted])
    with Engine(runs["lookup"], max_sequences=3) as engine:
        results = engine.generate_batch([prompt(PROMPT), prompt("abc abc"),
                                         prompt(PROMPT[:9])], max_new_tokens=12,
                                        sampling=params, stop_tokens=[])
    for index, result in enumerate(results):
        out[f"tokens_engine{index}"] = np.array(result.tokens)
    return out


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Names whose arrays differ in dtype, shape or any byte (empty: all equal)."""
    assert a.keys() == b.keys()
    return [name for name in a if a[name].dtype != b[name].dtype or
            a[name].shape != b[name].shape or a[name].tobytes() != b[name].tobytes()]


def write_outcome(folder: str, rank: int, **fields) -> None:
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump(fields, handle)


def read_outcome(folder: str, rank: int) -> dict:
    path = os.path.join(folder, f"rank{rank}.json")
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def rank() -> int:
    return int(os.environ["RANK"])


# -- rank functions -----------------------------------------------------------------------------

def scenario_rank(model: str, settings, folder: str, control: bool | str,
                  heads: bool = False) -> None:
    """Rank 0 runs the scenario through Generator.from_pretrained(tensor_parallel=...) and
    saves it; with `control`, every rank first runs the row-parallel negative control (the
    MLP down projection's, or with control="recurrent" the split recurrent layers' out
    projection's)."""
    import exactdraft as xd

    try:
        if control == "recurrent":
            row_parallel_recurrent_control(model, settings, folder)
        elif control == "experts":
            summed_experts_control(model, settings, folder)
        elif control:
            row_parallel_control(model, settings, folder)
        generator = xd.Generator.from_pretrained(model, tensor_parallel=settings,
                                                 guard=heads)
        np.savez(os.path.join(folder, "tp.npz"), **scenario(generator, heads))
        model_ = generator.target.model
        generator.target.close()
        fresh = model_.new_state()
        write_outcome(folder, rank(), ok=True, model=type(model_).__name__,
                      kv_heads=fresh.cache.num_kv_heads,
                      recurrent=[[list(part.shape) for part in layer]
                                 for layer in fresh.recurrent],
                      experts=[[e for e, expert in enumerate(layer.feed_forward.experts)
                                if expert is not None] for layer in model_.layers
                               if type(layer.feed_forward).__name__ == "ExpertParallelMoE"])
    except BaseException as error:
        if isinstance(error, SystemExit) and error.code == 0:
            write_outcome(folder, rank(), ok=True, followed=True)
        else:
            write_outcome(folder, rank(), ok=False, error=traceback.format_exc())
        raise


def save_control_logits(target, group, folder: str) -> None:
    """Every rank runs the scenario's prefill on a control's target; rank 0 saves its logits
    (row_parallel.npy), and the ranks end together."""
    logits = target.forward(target.new_state(), PREFIX, rows="all")
    if group.rank == 0:
        np.save(os.path.join(folder, "row_parallel.npy"), logits)
    group.barrier("the control")
    group.close()


def row_parallel_control(model: str, settings, folder: str) -> None:
    """Negative control: the usual split whose down projection is row-parallel (each rank
    multiplies its slice of K and the ranks all-reduce the partial sums). Rank 0 saves the
    logits of the scenario's prefill."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.parallel.group import ParallelGroup
    from exactdraft.pretrained import load_checkpoint
    from tests.parallel.row_parallel import RowParallelDownBackend

    checkpoint = load_checkpoint(model, with_tokenizer=False)
    group = ParallelGroup(settings)
    backend = RowParallelDownBackend(TorchCPUBackend(), group,
                                     checkpoint.config.intermediate_size)
    target = checkpoint.family.build(checkpoint.config, checkpoint.tensors, backend)
    save_control_logits(target, group, folder)


def row_parallel_recurrent_control(model: str, settings, folder: str) -> None:
    """Negative control for the split recurrent layers: each rank multiplies its heads' rows
    by its slice of the out projection's K and the ranks all-reduce the partial sums instead
    of gathering the heads. Rank 0 saves the logits of the scenario's prefill."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.parallel.group import ParallelGroup
    from exactdraft.parallel.load import build_split_model
    from exactdraft.pretrained import load_checkpoint
    from tests.parallel.row_parallel import RowParallelHeadsBackend

    checkpoint = load_checkpoint(model, with_tokenizer=False)
    group = ParallelGroup(settings)
    backend = RowParallelHeadsBackend(TorchCPUBackend(), group)
    target = build_split_model(checkpoint, backend)
    assert backend.split_out_projections(target, checkpoint.tensors) > 0
    save_control_logits(target, group, folder)


def summed_experts_control(model: str, settings, folder: str) -> None:
    """Negative control for whole experts per rank: each rank adds up its own experts'
    weighted outputs and the ranks all-reduce those partial sums, instead of gathering the
    outputs and adding them in expert order. Rank 0 saves the logits of the prefill."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.parallel.backend import GatheringBackend
    from exactdraft.parallel.group import ParallelGroup
    from exactdraft.parallel.load import build_split_model
    from exactdraft.pretrained import load_checkpoint
    from tests.parallel.row_parallel import SummedExpertsMoE

    checkpoint = load_checkpoint(model, with_tokenizer=False)
    group = ParallelGroup(settings)
    target = build_split_model(checkpoint, GatheringBackend(TorchCPUBackend(), group))
    blocks = [layer for layer in target.layers
              if type(layer.feed_forward).__name__ == "ExpertParallelMoE"]
    assert blocks
    for layer in blocks:
        layer.feed_forward.__class__ = SummedExpertsMoE
    save_control_logits(target, group, folder)


def killing_rank(model: str, settings, folder: str, victim: int, after_passes: int,
                 hang_s: float = 0.0) -> None:
    """Rank `victim` kills itself (SIGKILL) after `after_passes` passes of a generation, or with
    `hang_s` stops inside its next pass for that long (alive, heartbeat beating); the others
    record the error they stop with and when."""
    import signal

    import exactdraft as xd
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.parallel.backend import GatheringBackend
    from exactdraft.parallel.group import ParallelGroup
    from exactdraft.parallel.target import TensorParallelTarget, follow
    from exactdraft.pretrained import load_checkpoint

    me = rank()
    checkpoint = load_checkpoint(model)
    group = ParallelGroup(settings)
    model_ = checkpoint.family.build(checkpoint.config, checkpoint.tensors,
                                     GatheringBackend(TorchCPUBackend(), group))
    passes = 0
    original = model_.forward_batch

    def forward_batch(*args, **kwargs):
        nonlocal passes
        passes += 1
        if me == victim and passes > after_passes:
            with open(os.path.join(folder, "killed_at"), "w") as handle:
                handle.write(repr(time.time()))
            if hang_s:
                time.sleep(hang_s)
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    model_.forward_batch = forward_batch
    started = time.time()
    try:
        if me == 0:
            target = TensorParallelTarget(model_, group)
            generator = xd.Generator(target, tokenizer=checkpoint.tokenizer, guard=False)
            generator.generate(PROMPT, 400, xd.SamplingParams(seed=1), stop_tokens=[])
            write_outcome(folder, me, ok=True)
        else:
            follow(model_, group)
            write_outcome(folder, me, ok=True)
    except Exception as error:  # noqa: BLE001  (what the test inspects)
        write_outcome(folder, me, ok=False, type=type(error).__name__, error=str(error),
                      at=time.time(), started=started)
