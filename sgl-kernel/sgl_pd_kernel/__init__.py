"""sgl_pd_kernel: Triton kernels with torch reference versions (GPU path, built in a later issue)."""

__version__ = "0.1.0"
