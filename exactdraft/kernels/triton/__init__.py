"""Row-invariant Triton kernels for the torch backend on CUDA.

Invariant (INVARIANCE.md): every kernel gives a row the same bits whatever the number of rows in
the call and wherever the row sits; each module's docstring carries its own argument.
- matmul.matmul(x, w, bias=None): x [M, K] @ w[N, K].T, float32 accumulation, no split-K
- norm.rms_norm(x, weight, eps): one row per program
- softmax.softmax(x) / softmax.log_softmax(x): one row per program, float32 out
- attention.attention(q, k_cache, v_cache, q_positions, scale, window=0): causal GQA over
  absolute-position-aligned key chunks, merged in order
The modules import triton and torch when they are imported, so this package stays importable
without them; import the submodules only where the kernels are used. On CPU tensors the kernels
run under Triton's interpreter (TRITON_INTERPRET=1 set before triton is first imported).
"""
