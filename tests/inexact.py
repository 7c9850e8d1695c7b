"""A deliberately inexact backend for negative controls: torch's plain ops, no padding."""

from __future__ import annotations

import threading

from exactdraft.backends.torch_backend import TorchBackend

# Greedy cases for the knife-edge checkpoint (tests/conftest.py), where the token controls
# run: the second, 60 tokens long, also reaches attention over a longer context.
KNIFE_PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], list(range(30, 60)) * 2]


class InexactTorchBackend(TorchBackend):
    """Matmuls without row padding (so M = 1..3 and M >= 4 take different MKL paths) and
    torch's scaled_dot_product_attention; rows of a multi-row pass get other bits, by ulps:
    the realistic failure, which the suite's negative controls use (tests/README.md). Whether
    MKL's paths for these tiny shapes differ is a fact about the CPU, so `split_k=True` also
    sums multi-row products over two halves of the inner dimension, as a GEMM that picks a
    split-K by M does: ulp-level and on every machine, for the controls that compare tokens.
    With `coarse=True` multi-row products are also scaled by a factor that grows with the row
    count, a caricature of a kernel that changes with M, for the one control that needs bits to
    follow the row count itself (tests/models/test_moe.py) on a CPU where MKL's paths agree."""

    name = "torch-inexact"

    def __init__(self, coarse: bool = False, split_k: bool = False, **options):
        super().__init__(**options)
        self.coarse = coarse
        self.split_k = split_k

    _threads_applied = threading.local()

    def _apply_thread_count(self) -> None:
        """Give this thread torch's thread count before its first op. A thread that has not
        asked torch for it runs its first ops on OpenMP's default team (every CPU) instead of
        the count torch.set_num_threads set (one_torch_thread), so a server's engine thread
        gave its first request other bits than later ones (measured on a 2-core AMD EPYC,
        where MKL splits these products by thread count); asking applies the setting."""
        if not getattr(self._threads_applied, "done", False):
            import torch

            torch.get_num_threads()
            self._threads_applied.done = True

    def linear(self, x, weight, bias=None):
        self._apply_thread_count()
        if self.split_k and x.shape[0] > 1:
            half = x.shape[1] // 2
            out = x[:, :half] @ weight[:half] + x[:, half:] @ weight[half:]
        else:
            out = x @ weight
        if self.coarse and x.shape[0] > 1:
            out = out * (1.0 + 0.02 * x.shape[0])
        return out if bias is None else out + bias

    def attention(self, q, keys, values, positions, window, scale):
        import torch

        self._apply_thread_count()
        rows, num_heads, head_dim = q.shape
        group = num_heads // keys.shape[0]
        length = int(positions.max()) + 1
        k = keys[:, :length].repeat_interleave(group, 0)
        v = values[:, :length].repeat_interleave(group, 0)
        query_positions = torch.from_numpy(positions)[:, None]
        mask = torch.arange(length)[None, :] <= query_positions
        if window:
            mask &= query_positions - torch.arange(length)[None, :] < window
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k, v, attn_mask=mask, scale=scale)
        return out.transpose(0, 1)
