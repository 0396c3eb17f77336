"""Attention backends behind one interface, created by name from a registry."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING
from collections.abc import Callable

if TYPE_CHECKING:  # importing this package must stay torch-free: server_args reads the names
    from sglang_pd.engine.attention.base import AttentionBackend


def _make_torch() -> AttentionBackend:
    from sglang_pd.engine.attention.torch_backend import TorchAttnBackend

    return TorchAttnBackend()


def _make_triton() -> AttentionBackend:
    try:
        from sglang_pd.engine.attention.triton_backend import TritonAttnBackend
    except ImportError as exc:
        raise RuntimeError(
            f"the triton attention backend needs triton ({exc}); pip install triton (the gpu "
            "extra), or use --attention-backend torch"
        ) from exc
    return TritonAttnBackend()


def _make_flashinfer() -> AttentionBackend:
    if importlib.util.find_spec("flashinfer") is None:
        raise RuntimeError(
            "the flashinfer attention backend needs FlashInfer: pip install flashinfer-python "
            "(the gpu extra, CUDA only), or use --attention-backend triton (or auto)"
        )
    from sglang_pd.engine.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend()


def resolve_attention_backend(name: str, device: str, cuda_graph: bool = True) -> str:
    """"auto": torch off CUDA. On CUDA, triton while CUDA graphs are on (FlashInfer's backend
    here has no graph support, and decode without graphs is launch-bound); with graphs off
    (--disable-cuda-graph) flashinfer when importable, else triton."""
    if name != "auto":
        return name
    if not str(device).startswith("cuda"):
        return "torch"
    if cuda_graph:
        return "triton"
    return "flashinfer" if importlib.util.find_spec("flashinfer") is not None else "triton"


def _make_auto() -> AttentionBackend:
    # Zero-argument factories cannot see --device; create_attention_backend(name, device)
    # resolves "auto" with it. This fallback guesses from the host (graphs on, the default).
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return ATTENTION_BACKENDS[resolve_attention_backend("auto", device)]()


# Heavy or optional imports (torch, triton, flashinfer) stay inside the factories.
ATTENTION_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch": _make_torch,
    "triton": _make_triton,
    "flashinfer": _make_flashinfer,
    "auto": _make_auto,
}


def create_attention_backend(name: str, device: str = "cpu",
                             cuda_graph: bool = True) -> AttentionBackend:
    """``cuda_graph``: whether the engine will capture CUDA graphs (only "auto" reads it)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; supported: {sorted(ATTENTION_BACKENDS)}"
        )
    if name == "auto":
        name = resolve_attention_backend(name, device, cuda_graph)
    return ATTENTION_BACKENDS[name]()
