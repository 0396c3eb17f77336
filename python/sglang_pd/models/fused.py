"""When the models use the fused Triton kernels of ``sgl_pd_kernel.triton_fused`` (residual add +
RMSNorm, SiLU-and-mul over a merged gate/up, in-place RoPE), and thin calls into them.

The one predicate is ``fused_kernels_on(device)``. On CUDA the fused path is the default: a decode
step at small batch is bound by kernel launches, and fusing cuts ~36 kernels per layer to ~11.
On CPU it stays off (the torch ops are what the CPU path was tuned with; Triton runs there only
under its slow interpreter). ``SGLANG_PD_FUSED_KERNELS`` overrides it:
  unset / "auto": on for CUDA tensors when triton imports;
  "0": off everywhere (A/B timing on a GPU);
  "1": on for CUDA, and on CPU too when TRITON_INTERPRET=1 (tests of the fused path on CPU).
The predicate is asked at load time (gate/up merged or not) and once per forward (RopeStep:
the norms, RoPE and the MLP of that step follow its answer), so both follow one rule.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

import torch

FUSED_ENV = "SGLANG_PD_FUSED_KERNELS"
_MODES = ("auto", "0", "1")


@functools.cache
def _kernels() -> ModuleType | None:
    try:
        from sgl_pd_kernel import triton_fused
    except ImportError:  # triton is in the gpu extra; without it the torch path runs
        return None
    return triton_fused


def fused_kernels_on(device: torch.device | str) -> bool:
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    # called a few times per layer per eager step: the decision is cached per setting
    return _decide(os.environ.get(FUSED_ENV, "auto"), kind, os.environ.get("TRITON_INTERPRET"))


@functools.cache
def _decide(setting: str, kind: str, interpret: str | None) -> bool:
    mode = setting.strip() or "auto"
    if mode not in _MODES:
        raise ValueError(f"{FUSED_ENV}={setting!r}; expected one of {list(_MODES)}")
    if mode == "0":
        return False
    if kind != "cuda" and not (mode == "1" and interpret == "1"):
        return False
    return _kernels() is not None


def _k() -> ModuleType:
    mod = _kernels()
    assert mod is not None, "fused kernels called where fused_kernels_on() is false"
    return mod


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _k().rmsnorm(x, weight, eps)


def add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    return _k().add_rmsnorm_(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _k().silu_and_mul(x)


def rope_qk_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> None:
    _k().rope_qk_(q, k, positions, cos, sin)
