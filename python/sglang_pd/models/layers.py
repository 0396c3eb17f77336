"""Building blocks shared by the decoder-only models: RMSNorm, RoPE, SwiGLU MLP.

Each has a plain torch path (CPU, and CUDA with SGLANG_PD_FUSED_KERNELS=0) and a fused Triton
path with the same rounding, chosen by ``fused.fused_kernels_on`` (see models/fused.py)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglang_pd.models import fused
from sglang_pd.models.parallel import ColumnParallelLinear, RowParallelLinear, TPGroup


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: torch.Tensor, fused_path: bool = False) -> torch.Tensor:
        """``fused_path``: the step's decision (RopeStep.fused), taken once per forward."""
        if fused_path:
            return fused.rmsnorm(x, self.weight, self.eps)
        return self._torch(x)

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 (bf16/fp16 inputs lose too much in the mean of squares), then
        # scale in the input dtype, the order checkpoints were trained with.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor, fused_path: bool = False
    ) -> torch.Tensor:
        """residual += x (in place), then returns this norm of residual: one kernel when fused."""
        if fused_path:
            return fused.add_rmsnorm_(x, residual, self.weight, self.eps)
        return self._torch(residual.add_(x))


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, with optional linear/llama3 scaling."""
    exponents = (
        torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    )
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: frequencies whose wavelength fits well inside the original context are kept,
    # those far longer than it are slowed by `factor`, and a band in between is blended
    # linearly in (original_context / wavelength).
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    orig = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    blend = (orig / wavelen - low) / (high - low)
    blended = (1 - blend) * inv_freq / factor + blend * inv_freq
    out = torch.where(wavelen > orig / low, inv_freq / factor, inv_freq)
    in_band = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(in_band, blended, out)


class RotaryEmbedding:
    """cos/sin tables [max_positions, head_dim // 2] computed once (float32, on first use per
    device), then indexed by each step's positions. Rotation is the "split halves" (NeoX)
    layout that HF Llama/Qwen checkpoints use."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
    ) -> None:
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
        # Built lazily: models are constructed under a meta-device context by the loader.
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._tables:
            inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling)
            pos = torch.arange(self.max_positions, dtype=torch.int64, device="cpu").to(
                torch.float32
            )
            freqs = torch.outer(pos, inv_freq)
            self._tables[device] = (freqs.cos().to(device), freqs.sin().to(device))
        return self._tables[device]

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-width [T, 1, head_dim] (cos, cos) and (-sin, sin) for ``positions`` [T], ready
        to broadcast over heads; see apply_rope.

        Positions must be below ``max_positions``: the model runner checks that on the host
        when it builds the batch (ModelRunner._batch). Checking here would read a device tensor
        back to the host in every forward, which stalls the GPU and breaks CUDA-graph capture."""
        cos, sin = self._table(positions.device)
        c, s = cos[positions].to(dtype), sin[positions].to(dtype)
        return torch.cat((c, c), -1).unsqueeze(1), torch.cat((-s, s), -1).unsqueeze(1)


    def for_step(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeStep:
        """What rotates q and k in every layer of one forward (tables gathered once per step)."""
        return RopeStep(self, positions, dtype)


class RopeStep:
    """RoPE for one forward: the plain path gathers full-width cos/sin for the step's positions
    once (apply_rope per layer); the fused path rotates q and k in place in one kernel that reads
    the float32 tables at ``positions`` itself.

    ``fused`` is the step's one fused-or-plain decision, which the norms and the MLP follow too
    (asked once per forward: the predicate costs microseconds, a CPU step calls ~60 norms)."""

    def __init__(self, rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype) -> None:
        self.fused = fused.fused_kernels_on(positions.device)
        self.positions = positions
        if self.fused:
            self.cos, self.sin = rotary._table(positions.device)
        else:
            self.cos, self.sin = rotary.cos_sin(positions, dtype)

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] -> rotated (in place on the fused path)."""
        if self.fused:
            fused.rope_qk_(q, k, self.positions, self.cos, self.sin)
            return q, k
        return apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim]: halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).

    Written as x * cos + swap_halves(x) * signed_sin with full-width tables: two wide
    multiplies instead of four half-width ones, several times faster for long prefills."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * signed_sin


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)).

    ``merged`` (chosen by the loader: the fused path, i.e. CUDA) holds gate and up as one
    [2 * intermediate, hidden] gate_up_proj, one matmul whose output the SiLU-and-mul kernel
    reads. Unmerged (CPU) they stay two matmuls: on CPU (MKL, 2 cores) one fused matmul measured
    3-10% slower than the pair, plus a strided activation afterwards.

    With tensor parallelism ``intermediate`` is this rank's block: gate/up are column-parallel,
    down is row-parallel (one all-reduce per MLP)."""

    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype | None = None,
                 merged: bool = False, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.intermediate = intermediate
        if merged:
            self.gate_up_proj = ColumnParallelLinear(hidden, 2 * intermediate, bias=False,
                                                     dtype=dtype)
        else:
            self.gate_proj = ColumnParallelLinear(hidden, intermediate, bias=False, dtype=dtype)
            self.up_proj = ColumnParallelLinear(hidden, intermediate, bias=False, dtype=dtype)
        self.down_proj = RowParallelLinear(intermediate, hidden, False, dtype,
                                           tp or TPGroup.single())

    @property
    def merged(self) -> bool:
        return hasattr(self, "gate_up_proj")

    def forward(self, x: torch.Tensor, fused_path: bool = False) -> torch.Tensor:
        if not self.merged:
            return self.down_proj(F.silu(self.gate_proj(x)).mul_(self.up_proj(x)))
        gate_up = self.gate_up_proj(x)
        if fused_path:
            return self.down_proj(fused.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)  # fused kernels off after loading
        return self.down_proj(F.silu(gate).mul_(up))
