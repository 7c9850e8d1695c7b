"""llama.cpp's tensor names (blk.N.attn_q, ...) mapped onto a family's Hugging Face names.

Invariant: every tensor of a GGUF file is accounted for: it maps to exactly one name the family
reads, or it is one the family declares it reads another way (rope factors, for instance), or
the file is refused naming the tensor; a tensor is read only when the model asks for it, and it
reaches the model with the values and [rows, K] layout the file stores, transformed only by the
family's own function (llama's q/k row order, for instance).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from exactdraft.errors import WeightError
from exactdraft.models.decoder import TensorNames

_GLOBAL = {"token_embd.weight": "embedding", "output_norm.weight": "final_norm",
           "output.weight": "lm_head"}
# GGUF part -> TensorNames field; projections carry .weight/.bias, norms only .weight.
_LAYER = {
    "attn_norm": "attention_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_output": "output", "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
    "post_attention_norm": "post_attention_norm", "ffn_norm": "mlp_norm", "ffn_gate": "gate",
    "ffn_up": "up", "ffn_down": "down", "post_ffw_norm": "post_mlp_norm",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")

# (GGUF name, the value read from the file) -> the value the model gets.
Transform = Callable[[str, Any], Any]


def hf_name(names: TensorNames, gguf_name: str) -> str | None:
    """The family's name for a GGUF tensor, or None when the family has no such tensor."""
    if gguf_name in _GLOBAL:
        return getattr(names, _GLOBAL[gguf_name])
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER:
        return None
    index, part, kind = match.groups()
    template = getattr(names, _LAYER[part])
    if template is None:
        return None
    if template.endswith(".weight"):
        return template.format(i=index) if kind == "weight" else None
    return template.format(i=index) + "." + kind


class RenamedTensors(Mapping):
    """A GGUF tensor mapping seen under the family's names (see the module invariant)."""

    def __init__(self, source: Mapping[str, Any], names: TensorNames, path: str,
                 transform: Transform | None = None, ignored: tuple[str, ...] = ()) -> None:
        self.source, self.transform = source, transform
        self.gguf_names: dict[str, str] = {}
        for gguf_name in source:
            if gguf_name in ignored:
                continue
            name = hf_name(names, gguf_name)
            if name is None:
                raise WeightError(f"{path}: unexpected GGUF tensor {gguf_name!r}: not part of "
                                  "a model of this family")
            self.gguf_names[name] = gguf_name

    def __getitem__(self, name: str) -> Any:
        gguf_name = self.gguf_names[name]
        value = self.source[gguf_name]
        return value if self.transform is None else self.transform(gguf_name, value)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.source.shape(self.gguf_names[name]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.gguf_names)

    def __len__(self) -> int:
        return len(self.gguf_names)
