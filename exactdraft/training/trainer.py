"""train_draft_head: an EAGLE-style draft head distilled from the target's own writing.

Invariant: for the same target, prompts, settings and seed, on one machine with the same
number of torch threads, training writes the same head bytes, and a run resumed from its
checkpoint in DIR writes the same bytes as the run that was never interrupted: the corpus is a
pure function of the target and the settings (corpus.py), the initial weights come from
torch.manual_seed(seed), epoch e visits the examples in the order of
numpy.random.default_rng([seed, e]), and each epoch's checkpoint holds every parameter and the
optimizer's state exactly (float32 safetensors, no pickle). The head only ever drafts, so what
training does changes speed, never the tokens a Generator writes.

Loss, per example position p at or after the reply's first token (the positions a head drafts
for), for each unrolled pass j (torch_head.py): KL(target || head) over the draft vocabulary,
from the target's logits there (its features times its output rows), plus `feature_weight`
times a smooth-L1 regression of the head's output row onto the target's feature of p; pass j
is weighted pass_decay ** (j - 1).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import exactdraft.training.corpus as corpus
import exactdraft.training.torch_head as torch_head
from exactdraft.drafters.head_model import HeadConfig, HeadWeights
from exactdraft.errors import ParameterError
from exactdraft.models.target import capabilities_of

CHECKPOINT_FILE = "checkpoint.safetensors"
PROGRESS_FILE = "progress.json"


@dataclass(frozen=True)
class TrainingSettings:
    seed: int = 0
    epochs: int = 5
    max_new_tokens: int = 128
    samples: int = 4  # replies per prompt
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)  # reply k is written at temperatures[k % n]
    draft_vocab: int = 8192
    intermediate_size: int | None = None  # None: the target's
    depth: int = 2  # unrolled passes: the head trains for drafting this many tokens ahead
    batch_size: int = 2
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    feature_weight: float = 0.2
    pass_decay: float = 0.8
    validation: int = 8  # prompts (the last ones) held out and scored each epoch
    prompt_limit: int | None = None  # use the first N prompts only
    generation_batch: int = 8  # sequences sharing a pass while writing the corpus
    store_dtype: str = "float16"

    def check(self) -> None:
        for name in ("epochs", "max_new_tokens", "draft_vocab", "depth", "batch_size",
                     "generation_batch", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ParameterError(f"temperatures must be >= 0, got {self.temperatures!r}")
        if self.intermediate_size is not None and (isinstance(self.intermediate_size, bool) or
                                                   not isinstance(self.intermediate_size, int)
                                                   or self.intermediate_size < 1):
            raise ParameterError(f"intermediate_size must be None or an integer >= 1, got "
                                 f"{self.intermediate_size!r}")
        if self.learning_rate <= 0 or self.validation < 0 or self.warmup_steps < 0:
            raise ParameterError("learning_rate must be > 0, validation and warmup_steps >= 0")
        if self.store_dtype not in ("float16", "float32"):
            raise ParameterError(f"store_dtype must be float16 or float32, got "
                                 f"{self.store_dtype!r}")


class Reporter:
    """Progress lines with elapsed time and an ETA on stderr (or nowhere)."""

    def __init__(self, enabled: bool, every: float = 10.0) -> None:
        self.enabled, self.every, self.last = enabled, every, -math.inf

    def __call__(self, text: str, elapsed: float, eta: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < self.every):
            return
        self.last = now
        print(f"exactdraft train-drafter: {text} | {_clock(elapsed)} elapsed, ETA "
              f"{_clock(eta)}", file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def train_draft_head(generator: Any, out: str | os.PathLike[str],
                     settings: TrainingSettings | None = None, *,
                     prompts: list[str] | None = None, progress: bool = True,
                     threads: int | None = None) -> HeadWeights:
    """Train a draft head for generator.target (a Generator, or a Target without tokenizer)
    and write it to `out` (config.json + head.safetensors, loadable with
    DraftHead.from_pretrained(out, target)). `out` also keeps the corpus and a checkpoint
    per epoch; run again with the same settings to resume. `prompts`: the texts to write
    from (default: the package's set, exactdraft/data/train_prompts.txt)."""
    import torch

    from exactdraft.generator import Generator

    settings = settings or TrainingSettings()
    settings.check()
    if not isinstance(generator, Generator):
        generator = Generator(generator)
    target = generator.target
    if not capabilities_of(target).returns_features:
        raise ParameterError(f"{target!r} cannot return its features; a draft head needs them")
    folder = os.fspath(out)
    os.makedirs(folder, exist_ok=True)
    texts = corpus.read_prompts() if prompts is None else list(prompts)
    texts = texts[:settings.prompt_limit] if settings.prompt_limit else texts
    report = Reporter(progress)
    started = time.monotonic()
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        examples = corpus.load_or_generate(folder, generator, texts, asdict(settings), report)
        draft_ids = corpus.draft_vocabulary(examples, target.vocab_size, settings.draft_vocab)
        record = {**asdict(settings), "prompts": len(texts),
                  "torch_threads": torch.get_num_threads()}
        config = HeadConfig.for_target(target, len(draft_ids), settings.intermediate_size,
                                       training=record)
        data = Data(target, examples, draft_ids, report, started)
        weights = _fit(config, data, settings, folder, report, started)
    finally:
        torch.set_num_threads(previous_threads)
    weights.save(folder, settings.store_dtype)
    report(f"done: {folder}", time.monotonic() - started, 0, force=True)
    return weights


class Data:
    """Each example's embeddings and target features (host float32), and the output rows."""

    def __init__(self, target: Any, examples: list[corpus.Example], draft_ids: np.ndarray,
                 report: Any, started: float) -> None:
        self.examples, self.draft_ids = examples, draft_ids
        self.embeddings, self.features = [], []
        begun = time.monotonic()
        for index, example in enumerate(examples):
            self.embeddings.append(target.embedding_rows(example.tokens))
            self.features.append(corpus.target_features(target, example.tokens))
            done = time.monotonic() - begun
            report(f"target features: {index + 1}/{len(examples)} sequences",
                   time.monotonic() - started, done / (index + 1) * (len(examples) - index - 1))
        self.output = target.output_rows(draft_ids)  # [draft vocab, hidden]

    def batch(self, indices: list[int]) -> tuple[Any, Any, Any, Any]:
        """Padded tensors: embeddings of tokens 1.., features of positions 0.. (inputs),
        features of positions 1.. (targets), and the rows that count in the loss."""
        import torch

        length = max(len(self.examples[i].tokens) for i in indices) - 1
        hidden = self.output.shape[1]
        shape = (len(indices), length, hidden)
        inputs, features, targets = (np.zeros(shape, np.float32) for _ in range(3))
        counted = np.zeros((len(indices), length), dtype=bool)
        for b, i in enumerate(indices):
            rows = len(self.examples[i].tokens) - 1
            inputs[b, :rows] = self.embeddings[i][1:]
            features[b, :rows] = self.features[i][:-1]
            targets[b, :rows] = self.features[i][1:]
            # Row r is position r + 1; the reply's first token sits at n_prompt.
            counted[b, max(0, self.examples[i].n_prompt - 1):rows] = True
        return tuple(torch.from_numpy(a) for a in (inputs, features, targets, counted))


def _fit(config: HeadConfig, data: Data, s: TrainingSettings, folder: str, report: Any,
         started: float) -> HeadWeights:
    import torch

    held_out = min(s.validation * s.samples, len(data.examples) - 1)  # the last prompts
    train = list(range(len(data.examples) - held_out))
    validation = list(range(len(train), len(data.examples)))
    # Outputs start a tenth of the features' scale: near-uniform logits, a moderate first KL.
    scale = np.sqrt(np.mean(np.concatenate([data.features[i] for i in train]) ** 2, axis=0))
    torch.manual_seed(s.seed)
    model = torch_head.build(config, final_norm=0.1 * scale)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.learning_rate, betas=(0.9, 0.95),
                                  weight_decay=0.0, foreach=False)
    output = torch.from_numpy(np.ascontiguousarray(data.output.T))  # [hidden, draft vocab]
    steps_per_epoch = math.ceil(len(train) / s.batch_size)
    total = steps_per_epoch * s.epochs
    identity = {"settings": asdict(s), "target_digest": config.target_digest,
                "examples": len(data.examples)}
    epoch = _resume(folder, identity, model, optimizer)
    fit_started = time.monotonic()
    first_epoch = epoch
    while epoch < s.epochs:
        order = np.random.default_rng([s.seed, epoch]).permutation(train).tolist()
        totals = Totals(s.depth)
        for step in range(steps_per_epoch):
            done = epoch * steps_per_epoch + step
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(s, done, total)
            batch = data.batch(order[step * s.batch_size:(step + 1) * s.batch_size])
            loss = _loss(model, config, batch, output, s, totals)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            spent = time.monotonic() - fit_started
            finished = done + 1 - first_epoch * steps_per_epoch
            report(f"epoch {epoch + 1}/{s.epochs} step {step + 1}/{steps_per_epoch} "
                   f"{totals.line()}", time.monotonic() - started,
                   spent / finished * (total - done - 1))
        epoch += 1
        line = f"epoch {epoch}/{s.epochs} done: train {totals.line()}"
        if validation:
            scores = Totals(s.depth)
            with torch.no_grad():
                for begin in range(0, len(validation), s.batch_size):
                    _loss(model, config, data.batch(validation[begin:begin + s.batch_size]),
                          output, s, scores)
            line += f", held out {scores.line()}"
        _checkpoint(folder, identity, epoch, model, optimizer, line)
        spent = time.monotonic() - fit_started
        report(line, time.monotonic() - started,
               spent / (epoch - first_epoch) * (s.epochs - epoch), force=True)
    return torch_head.to_weights(model, config, data.draft_ids)


class Totals:
    """Running KL and top-1 agreement with the target, per pass."""

    def __init__(self, depth: int) -> None:
        self.kl = [0.0] * depth
        self.agree = [0.0] * depth
        self.rows = [0] * depth

    def add(self, j: int, kl: float, agree: float, rows: int) -> None:
        self.kl[j] += kl
        self.agree[j] += agree
        self.rows[j] += rows

    def line(self) -> str:
        kl = "/".join(f"{k / max(r, 1):.3f}" for k, r in zip(self.kl, self.rows))
        agree = "/".join(f"{a / max(r, 1):.0%}" for a, r in zip(self.agree, self.rows))
        return f"kl {kl} top-1 {agree}"


def _loss(model: Any, config: HeadConfig, batch: tuple[Any, ...], output: Any,
          s: TrainingSettings, totals: Totals) -> Any:
    import torch

    inputs, features, targets, counted = batch
    outputs = model(inputs, features, s.depth)
    target_logp = torch.log_softmax(targets[counted] @ output, dim=-1)
    target_best = target_logp.argmax(-1)
    rows = torch.arange(counted.shape[1])[None, :].expand_as(counted)
    loss = torch.zeros(())
    for j, out in enumerate(outputs):
        valid = rows[counted] >= j  # pass j + 1 needs j earlier rows of the sequence
        head = out[counted]
        head_logp = torch.log_softmax(head @ output, dim=-1)
        kl = (target_logp.exp() * (target_logp - head_logp)).sum(-1)
        regression = torch.nn.functional.smooth_l1_loss(head, targets[counted],
                                                        reduction="none").mean(-1)
        count = int(valid.sum())
        if count == 0:
            continue
        per_row = kl + s.feature_weight * regression
        loss = loss + s.pass_decay ** j * per_row[valid].sum() / count
        agree = (head_logp.argmax(-1) == target_best)[valid]
        totals.add(j, float(kl[valid].sum().detach()), float(agree.sum()), count)
    return loss


def _learning_rate(s: TrainingSettings, step: int, total: int) -> float:
    if step < s.warmup_steps:
        return s.learning_rate * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, total - s.warmup_steps)
    return s.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _checkpoint(folder: str, identity: dict[str, Any], epoch: int, model: Any,
                optimizer: Any, line: str) -> None:
    from safetensors.numpy import save_file

    tensors = {f"parameter.{k}": v for k, v in torch_head.parameter_arrays(model).items()}
    names = dict(zip((id(p) for p in model.parameters()),
                     (name for name, _ in model.named_parameters())))
    steps = {}
    for parameter, state in optimizer.state.items():
        name = names[id(parameter)]
        tensors[f"exp_avg.{name}"] = state["exp_avg"].numpy().copy()
        tensors[f"exp_avg_sq.{name}"] = state["exp_avg_sq"].numpy().copy()
        steps[name] = float(state["step"])
    temporary = os.path.join(folder, CHECKPOINT_FILE + ".partial")
    save_file(tensors, temporary)
    os.replace(temporary, os.path.join(folder, CHECKPOINT_FILE))
    progress = {"identity": identity, "epochs_done": epoch, "steps": steps, "last": line}
    with open(os.path.join(folder, PROGRESS_FILE + ".partial"), "w") as handle:
        json.dump(progress, handle, indent=1)
    os.replace(os.path.join(folder, PROGRESS_FILE + ".partial"),
               os.path.join(folder, PROGRESS_FILE))


def _resume(folder: str, identity: dict[str, Any], model: Any, optimizer: Any) -> int:
    """The epochs already done in `folder` (0 for a fresh run), their state loaded."""
    import torch
    from safetensors.numpy import load_file

    path = os.path.join(folder, PROGRESS_FILE)
    if not os.path.isfile(path):
        return 0
    with open(path) as handle:
        progress = json.load(handle)
    if json.loads(json.dumps(identity)) != progress.get("identity"):
        raise ParameterError(f"{folder} holds a training run with other settings or for "
                             "another target; use another --out or delete it")
    tensors = load_file(os.path.join(folder, CHECKPOINT_FILE))
    torch_head.load_parameters(model, {k[len("parameter."):]: v for k, v in tensors.items()
                                       if k.startswith("parameter.")})
    for name, parameter in model.named_parameters():
        if name in progress["steps"]:
            optimizer.state[parameter] = {
                "step": torch.tensor(progress["steps"][name]),
                "exp_avg": torch.from_numpy(tensors[f"exp_avg.{name}"].copy()),
                "exp_avg_sq": torch.from_numpy(tensors[f"exp_avg_sq.{name}"].copy())}
    return int(progress["epochs_done"])
