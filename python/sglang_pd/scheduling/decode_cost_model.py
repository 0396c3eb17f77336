"""Decode step-time table (Kairos §3.2, Alg. 3 lines 1 and 23-24), learned online.

Pure: no torch, no I/O beyond reading a profile, no clock. It lives beside ``cost_model.py``'s
``PrefillCostModel`` (a separate module only to keep files small); docs/decode_scheduling.md.

The table: step_time[batch size, context] over two ascending axes, read with bilinear
interpolation (linear extrapolation past the edges: decode time is close to linear in both
batch size and context, so the edge slope is the best guess there), floored at 10 us.

Deviation from Kairos, named: Kairos keys a step by its longest sequence (``UpdateLUT(|B|,
max seq_len, t)``). Decode attention reads every request's KV, so its cost follows the *sum* of
the contexts: a 128K request with three 8K ones costs more than a 128K request with three 1K
ones, which a max key cannot tell apart. We key by the batch's **total** context (KV tokens
attended over before the step, as ``StepProfile.context_tokens``); a profile may say it was
keyed by the mean or the max instead (``DecodeGrid.context_key``) and is read that way.
That holds for paged attention kernels (triton, flashinfer). The CPU torch backend pads every
request to the longest context in one SDPA call, so there a step costs B x max context
(``padded=True``, set from ``PolicyConfig.decode_attention_padded``): the model then reads and
learns every step at that effective total, which is Kairos's max key times the batch size.
Profiles are measured with equal contexts, where both readings agree.

Learning (Kairos: "the historical mean of all observed step times" per cell). After every pure
DECODE step ``observe`` moves the step's time to its nearest cell (scaled by the table's own
ratio between the cell and the step's exact point, so a step between cells does not bias the
cell) and the cell holds the mean of its prior and every time observed there. The prior counts
as ``prior_weight`` observations (Kairos's profile is the mean of 100 runs; ours defaults to a
few, so live steps take over quickly when the machine differs from the profile).
Cells never observed follow the prior times a live scale (the mean ratio observed / prior over
the last ``scale_window`` steps), so a prior from other hardware, or the built-in guess on a CPU
100x slower than the GPU it describes, is not read at the wrong scale where no step ran yet.
MIXED steps carry prefill work and EXTEND steps are prefill: neither is a decode sample.

Overruns (issue 34): every learned step also records how much longer it ran than the table
predicted just before it (``seconds - step_s``, negative when faster), over the last
``scale_window`` steps; ``overrun_s(q)`` is their q-quantile, floored at 0: how much slower
than the table a step may run, read by ``slack+``'s reserve. A table that does not learn (the
simulator's exact one) records none and reads 0.

Cold start (no profile): t = launch + per_req * B + per_ctx * C with Kairos §2.2's batch-1
points (MiniMax-M2.5: 8K tokens 11.0 ms, 128K tokens 40.3 ms per step); the batch slope is a
guess. The profiler (tools/profile_cost_model.py) measures the real table.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.profile import DecodeGrid, Profile, load_profile

_FLOOR_S = 1e-5  # no step is predicted faster than this (extrapolation can go below 0)
CONTEXT_KEYS = ("total", "mean", "max")


@dataclass(frozen=True)
class DecodeCoeffs:
    """A linear decode step: launch_s + per_req_s * B + per_ctx_s * total context (seconds)."""

    launch_s: float
    per_req_s: float
    per_ctx_s: float

    def __post_init__(self) -> None:
        for name, v in self.__dict__.items():
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"decode coefficient {name} must be a finite number >= 0, got {v}")

    def step_s(self, batch: float, total_ctx: float) -> float:
        return self.launch_s + self.per_req_s * batch + self.per_ctx_s * total_ctx


# Kairos §2.2: 11.0 ms at 8K, 40.3 ms at 128K (batch 1): slope 29.3 ms / 120K tokens.
_KAIROS_SLOPE = 29.3e-3 / (131072 - 8192)
DEFAULT_DECODE_PRIOR = DecodeCoeffs(launch_s=11.0e-3 - 8192 * _KAIROS_SLOPE - 5e-5, per_req_s=5e-5,
                                    per_ctx_s=_KAIROS_SLOPE)
DEFAULT_BATCH_AXIS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXT_AXIS = (0, 1024, 4096, 16384, 65536, 262144, 1048576)


def _bracket(axis: Sequence[int], x: float) -> tuple[int, float]:
    """(i, w): x = axis[i] + w (axis[i+1] - axis[i]); w outside [0, 1] past the edges."""
    if len(axis) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def _nearest(axis: Sequence[int], x: float) -> int:
    i, w = _bracket(axis, x)
    if len(axis) == 1:
        return 0
    return i + 1 if w > 0.5 else i if w >= 0 else 0


def fit_linear(cells: Sequence[tuple[int, float, float]]) -> DecodeCoeffs:
    """Least-squares ``DecodeCoeffs`` through (batch, total context, seconds) points, relative
    errors; a negative coefficient is dropped and the rest refitted (small 3x3 systems)."""
    if not cells:
        raise ValueError("fit_linear needs at least one measured cell")
    feats = [(1.0, float(b), float(c) / 1e4) for b, c, _ in cells]  # scaled near unit size
    ys = [t for *_, t in cells]
    active = [0, 1, 2]
    while True:
        theta = _lstsq([[f[i] for i in active] for f in feats], ys)
        full = [0.0, 0.0, 0.0]
        for i, v in zip(active, theta):
            full[i] = v
        neg = [i for i in active if full[i] < 0]
        if not neg or len(active) == 1:
            full = [max(v, 0.0) for v in full]
            return DecodeCoeffs(full[0], full[1], full[2] / 1e4)
        active.remove(min(neg, key=lambda i: full[i]))


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    n = len(rows[0])
    A = [[0.0] * (n + 1) for _ in range(n)]
    for x, y in zip(rows, ys):
        w = 1.0 / max(y, _FLOOR_S) ** 2
        for i in range(n):
            for j in range(n):
                A[i][j] += w * x[i] * x[j]
            A[i][n] += w * x[i] * y
    for i in range(n):
        A[i][i] += 1e-12 * (1.0 + A[i][i])  # a direction no point explores stays solvable
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(A[r][col]))
        A[col], A[piv] = A[piv], A[col]
        for r in range(n):
            if r != col and A[col][col]:
                f = A[r][col] / A[col][col]
                for c in range(col, n + 1):
                    A[r][c] -= f * A[col][c]
    return [A[i][n] / A[i][i] if A[i][i] else 0.0 for i in range(n)]


class DecodeCostModel:
    """step_time[batch, context] table: profile prior, online mean per cell (module docstring)."""

    def __init__(self, prior: DecodeCoeffs = DEFAULT_DECODE_PRIOR,
                 grid: DecodeGrid | None = None, *,
                 prior_weight: float = 4.0, scale_window: int = 64, learn: bool = True,
                 padded: bool = False) -> None:
        if not prior_weight > 0 or scale_window < 1:
            raise ValueError(f"prior_weight ({prior_weight}) must be > 0 and scale_window "
                             f"({scale_window}) >= 1")
        self.learn = learn
        self.padded = padded  # the engine pads decode attention to the longest context
        self.prior_weight = prior_weight
        if grid is not None:
            self.batch_axis = list(grid.batch_sizes)
            self.context_axis = list(grid.context_tokens)
            self.context_key = grid.context_key
            measured = list(grid.cells())
            # unmeasured (null) cells follow a linear fit of the measured ones
            self.coeffs = fit_linear([(b, self._total(b, c), t) for b, c, t in measured]) \
                if measured else prior
            self.prior = [[t if t is not None else self._linear(b, c)
                           for c, t in zip(self.context_axis, row)]
                          for b, row in zip(self.batch_axis, grid.seconds)]
        else:
            self.batch_axis = list(DEFAULT_BATCH_AXIS)
            self.context_axis = list(DEFAULT_CONTEXT_AXIS)
            self.context_key = "total"
            self.coeffs = prior
            self.prior = [[prior.step_s(b, c) for c in self.context_axis] for b in self.batch_axis]
        nb, nc = len(self.batch_axis), len(self.context_axis)
        self._sum = [[0.0] * nc for _ in range(nb)]  # observed seconds per cell
        self._count = [[0] * nc for _ in range(nb)]
        self._ratios: deque[float] = deque(maxlen=scale_window)  # observed / prior, recent steps
        self._overruns: deque[float] = deque(maxlen=scale_window)  # observed - predicted, recent steps
        self._overrun_q: tuple[int, float, float] | None = None  # (samples, q, value): read once per sample
        self.scale = 1.0
        self.num_samples = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def fixed(cls, grid: DecodeGrid | None = None, prior: DecodeCoeffs = DEFAULT_DECODE_PRIOR
              ) -> DecodeCostModel:
        """A table that never learns (tests, a simulator's ground truth)."""
        return cls(prior, grid, learn=False)

    @classmethod
    def from_config(cls, cfg: PolicyConfig) -> DecodeCostModel:
        """The decode section of ``cfg.cost_model_profile``, else the cold-start guess."""
        padded = cfg.decode_attention_padded
        if not cfg.cost_model_profile:
            return cls(padded=padded)
        return cls.from_profile(load_profile(cfg.cost_model_profile), padded=padded)

    @classmethod
    def from_profile(cls, profile: Profile, **kwargs: Any) -> DecodeCostModel:
        return cls(grid=profile.decode, **kwargs)

    # ------------------------------------------------------------------ reading
    def _total(self, batch: int, column: float) -> float:
        """A column value (by this table's key) as a total context, for equal requests."""
        return column * batch if self.context_key in ("mean", "max") else column

    def _column(self, batch: int, total_ctx: float, max_ctx: float | None) -> float:
        if self.padded and max_ctx is not None:
            total_ctx = batch * max_ctx  # every request attends over the longest context
        if self.context_key == "total":
            return total_ctx
        if self.context_key == "mean":
            return total_ctx / max(batch, 1)
        return max_ctx if max_ctx is not None else total_ctx / max(batch, 1)

    def _linear(self, batch: int, column: float) -> float:
        return max(self.coeffs.step_s(batch, self._total(batch, column)), _FLOOR_S)

    def cell_s(self, i: int, j: int) -> float:
        """Cell (batch_axis[i], context_axis[j]): the mean of its prior (worth ``prior_weight``
        observations, at the live scale) and the steps observed there."""
        w = self.prior_weight
        return (w * self.prior[i][j] * self.scale + self._sum[i][j]) / (w + self._count[i][j])

    def _at(self, batch: float, column: float) -> float:
        bi, bw = _bracket(self.batch_axis, batch)
        ci, cw = _bracket(self.context_axis, column)
        b2 = min(bi + 1, len(self.batch_axis) - 1)
        c2 = min(ci + 1, len(self.context_axis) - 1)
        lo = self.cell_s(bi, ci) * (1 - cw) + self.cell_s(bi, c2) * cw
        hi = self.cell_s(b2, ci) * (1 - cw) + self.cell_s(b2, c2) * cw
        return max(lo * (1 - bw) + hi * bw, _FLOOR_S)

    def step_s(self, batch: int, total_ctx: float, max_ctx: float | None = None) -> float:
        """One decode step of ``batch`` requests holding ``total_ctx`` KV tokens in all
        (``max_ctx``: the longest one's, read only by a max-keyed table). 0 for an empty step."""
        if batch <= 0:
            return 0.0
        return self._at(batch, self._column(batch, total_ctx, max_ctx))

    def batch_s(self, contexts: Sequence[int]) -> float:
        """One decode step over requests with these KV lengths."""
        return self.step_s(len(contexts), sum(contexts), max(contexts) if contexts else 0)

    # ------------------------------------------------------------------ learning
    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        """Learn from a finished pure DECODE step (``elapsed_s`` = ``StepProfile.total_s``)."""
        if step.mode is not ForwardMode.DECODE or step.batch_size <= 0:
            return
        self.add_sample(step.batch_size, step.context_tokens, elapsed_s, step.max_context_tokens)

    def add_sample(self, batch: int, total_ctx: int, seconds: float,
                   max_ctx: int | None = None) -> None:
        if not self.learn or not (seconds > 0 and math.isfinite(seconds)) or batch <= 0:
            return
        column = self._column(batch, total_ctx, max_ctx)
        i, j = _nearest(self.batch_axis, batch), _nearest(self.context_axis, column)
        here = self._at(batch, column)
        self._overruns.append(seconds - here)  # (before this step moves the table)
        # the cell's share of this step: the table's own ratio between the cell and the point
        self._sum[i][j] += seconds * self.cell_s(i, j) / here
        self._count[i][j] += 1
        prior_here = self._prior_at(batch, column)
        self._ratios.append(seconds / prior_here)
        self.scale = sum(self._ratios) / len(self._ratios)
        self.num_samples += 1

    def overrun_s(self, quantile: float) -> float:
        """The ``quantile`` of the recent steps' overruns (seconds past the table's prediction),
        0 when none ran over it or none was observed (module docstring)."""
        cached = self._overrun_q
        if cached is not None and cached[0] == self.num_samples and cached[1] == quantile:
            return cached[2]
        runs = sorted(self._overruns)
        value = max(runs[min(len(runs) - 1, int(quantile * len(runs)))], 0.0) if runs else 0.0
        self._overrun_q = (self.num_samples, quantile, value)
        return value

    def _prior_at(self, batch: float, column: float) -> float:
        bi, bw = _bracket(self.batch_axis, batch)
        ci, cw = _bracket(self.context_axis, column)
        b2 = min(bi + 1, len(self.batch_axis) - 1)
        c2 = min(ci + 1, len(self.context_axis) - 1)
        p = self.prior
        lo = p[bi][ci] * (1 - cw) + p[bi][c2] * cw
        hi = p[b2][ci] * (1 - cw) + p[b2][c2] * cw
        return max(lo * (1 - bw) + hi * bw, _FLOOR_S)

    def table(self) -> list[list[float]]:
        """The current table, one row per batch size (for logs and tests)."""
        return [[self.cell_s(i, j) for j in range(len(self.context_axis))]
                for i in range(len(self.batch_axis))]
