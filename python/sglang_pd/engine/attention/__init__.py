"""Attention backends behind one interface, created by name from a registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # importing this package must stay torch-free: server_args reads the names
    from sglang_pd.engine.attention.base import AttentionBackend


def _make_torch() -> AttentionBackend:
    from sglang_pd.engine.attention.torch_backend import TorchAttnBackend

    return TorchAttnBackend()


# Heavy or optional imports stay inside the factories (triton/flashinfer on GPU later).
ATTENTION_BACKENDS: dict[str, Callable[[], "AttentionBackend"]] = {"torch": _make_torch}


def create_attention_backend(name: str) -> AttentionBackend:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; supported: {sorted(ATTENTION_BACKENDS)}"
        )
    return ATTENTION_BACKENDS[name]()
