"""sgl_pd_kernel: Triton kernels for the GPU path, each beside a torch reference.

- ``triton_attention``: KV store, paged decode and extend attention (imports triton: import it
  only where triton is wanted, as ``sglang_pd.engine.attention.triton_backend`` does).
- ``reference``: the same operations in plain torch, what the kernels are tested against.

Importing this package imports neither.
"""

__version__ = "0.1.0"
