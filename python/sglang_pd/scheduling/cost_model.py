"""Step-time models the policies predict with: the prefill model (PLA-Serve §2.1), learned online.

Pure: no torch, no I/O, no clock. The decode step-time table is its sibling,
``decode_cost_model.py: DecodeCostModel``; both read the one profile (docs/profile.md).

The model (PLA-Serve §2.1). A prefill of L new tokens over H cached/context tokens takes
    T(L, H) = T_comp + T_mem,   T_comp = a·L·(L + 2H) + b·L,   T_mem = g_w·L + g_r·H
(a: attention per token pair, b: FFN/projection compute per token, g_w: KV write per new token,
g_r: KV read per context token). One engine step runs a batch; ours on top, per step:
    T_step = launch_s + sum_i [ per_req_s + a·L_i(L_i + 2H_i) + (b + g_w)·L_i + g_r·H_i ]
- ``launch_s`` (ours, named): paid once per forward whatever it holds: kernel launches and the
  one pass over the weights. It is the batch term: B short prefills in one step pay it once,
  B steps of one pay it B times (PLA-Serve §3.1's reason to batch short prefills).
- ``per_req_s`` (ours): per request in the step (metadata, per-sequence attention setup).
Chunked prefill: a·L(L + 2H) summed over the chunks of one request is a·R(R + 2H0) however it
is cut (R new tokens after H0), so only launch, per-request and g_r·H (each chunk re-reads the
KV before it) depend on the chunk size; ``request_s`` sums them in closed form.

Why one fit of total time cannot separate b from g_w: both multiply L, so a least-squares fit of
step times sees only their sum k = b + g_w (the columns are identical; any split fits equally
well). PLA-Serve fits T_comp and T_mem from samples where the two are timed apart ("we collect
runtime samples (T_comp, T_mem, L, H)"); the roofline (AI* = peak FLOP/s / memory bandwidth)
is the other way to place the boundary. Here the online fit learns k and keeps the prior's
split ``b / (b + g_w)`` (the profile's, whose profiler times the parts apart, docs/profile.md);
``boundary_tokens`` (PLA's L_m) is only as good as that split and is None without one.

The fit. Weighted least squares over a sliding window of EXTEND steps (``observe``; DECODE and
MIXED steps are not prefill samples), features (1, B, sum L(L+2H), L, H) per step, weights
1/T^2 (relative errors: step times span milliseconds to seconds and noise scales with them).
The prior enters as pseudo-observations worth ``prior_weight`` samples in all (a profile's
measured grid, or points computed from prior coefficients), so directions the live data never
explores (no context yet, never batched) follow the prior. It enters as a shape: its points are
scaled by the one factor that best maps the prior onto the live window (relative least
squares), so a prior from other hardware, or the cold-start guess on a CPU 100x slower, cannot
hold the fit at the wrong scale. Coefficients are kept non-negative (exact NNLS over the 2^5
supports when the free solution has a negative one). Before ``min_samples`` live samples the
prior is used as it is.

The attention feature sum L_i(L_i + 2H_i) is exact: ``StepProfile.attn_tokens2`` carries it per
step (the engine's and the simulator's steps). Only a step without it (a profile from an
older writer) falls back to equal shares, (L^2 + 2LH)/B: exact for B = 1 and for equal
requests, low for a long chunk batched with short prompts.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, fields, replace
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import numpy as np

from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.nnls import nnls
from sglang_pd.scheduling.profile import Profile, load_profile

_NF = 5  # features: launch (1), per request (B), attention (sum L(L+2H)), new tokens (L), context (H)
_SCALE = (1.0, 1.0, 1e-6, 1e-3, 1e-3)  # feature scaling so the normal equations are near unit size
_T_FLOOR_S = 1e-4  # relative weights never divide by less than this


@dataclass(frozen=True)
class PrefillCoeffs:
    """Seconds per unit: PLA-Serve §2.1's a, b, g_w, g_r plus our launch and per-request terms."""

    launch_s: float = 0.0  # per forward (ours)
    per_req_s: float = 0.0  # per request in the step (ours)
    a: float = 0.0  # per token pair: a·L(L + 2H)
    b: float = 0.0  # per new token, compute
    g_w: float = 0.0  # per new token, KV write
    g_r: float = 0.0  # per context token, KV read

    def __post_init__(self) -> None:
        for name, v in self.__dict__.items():
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"prefill coefficient {name} must be a finite number >= 0, got {v}")

    def as_theta(self) -> list[float]:
        return [self.launch_s, self.per_req_s, self.a, self.b + self.g_w, self.g_r]

    def times(self, factor: float) -> PrefillCoeffs:
        """Every coefficient ``factor`` times as large: the same machine, every step that much slower."""
        return PrefillCoeffs(**{f.name: getattr(self, f.name) * factor for f in fields(self)})


# Cold-start guess (no profile): an 8B-class model on one recent GPU. Only the prior of the
# online fit; ``min_samples`` EXTEND steps replace it. Ratio b : g_w from the roofline of that
# class (FFN ~2·8e9 FLOP/token at ~400 TFLOP/s vs ~130 KB KV write/token at ~3 TB/s).
DEFAULT_PREFILL_PRIOR = PrefillCoeffs(launch_s=5e-3, per_req_s=1e-4, a=5e-10, b=4e-5, g_w=5e-8, g_r=5e-8)


@dataclass(frozen=True)
class PrefillPoint:
    """One measured (or computed) step: what it held and how long it took."""

    batch_size: int
    new_tokens: int  # sum L
    context_tokens: int  # sum H
    seconds: float
    attn_tokens2: float | None = None  # sum L_i(L_i + 2H_i); None = equal shares

    def features(self) -> list[float]:
        b, l, h = max(self.batch_size, 1), self.new_tokens, self.context_tokens
        attn = self.attn_tokens2 if self.attn_tokens2 is not None else (l * l + 2 * l * h) / b
        return [1.0, float(b) * _SCALE[1], attn * _SCALE[2], l * _SCALE[3], h * _SCALE[4]]


def prior_points(c: PrefillCoeffs) -> list[PrefillPoint]:
    """A small grid computed from coefficients (B in {1, 8}, L in {16..8192}, H in {0, 8192}):
    the prior as pseudo-observations when no measured grid is at hand."""
    pts = []
    for batch, l, h in itertools.product((1, 8), (16, 128, 1024, 8192), (0, 8192)):
        t = c.launch_s + batch * (c.per_req_s + c.a * l * (l + 2 * h) + (c.b + c.g_w) * l + c.g_r * h)
        pts.append(PrefillPoint(batch, batch * l, batch * h, t, batch * l * (l + 2 * h)))
    return pts


class PrefillCostModel:
    """Predicts prefill step and request times; learns from ``observe`` (see module docstring).

    ``learn=False`` gives a fixed model (tests, a simulator's ground truth)."""

    def __init__(self, prior: PrefillCoeffs = DEFAULT_PREFILL_PRIOR,
                 prior_grid: Sequence[PrefillPoint] | None = None, *, window: int = 512,
                 min_samples: int = 16, prior_weight: float = 8.0, learn: bool = True) -> None:
        if window < 1 or min_samples < 1 or prior_weight < 0:
            raise ValueError(f"window ({window}) and min_samples ({min_samples}) must be >= 1 and "
                             f"prior_weight ({prior_weight}) >= 0")
        self.prior = prior
        self.coeffs = prior
        self.learn = learn
        self.window = window
        self.min_samples = min_samples
        kb = prior.b + prior.g_w
        self.compute_share: float | None = prior.b / kb if kb > 0 else None  # b / (b + g_w)
        # prior pseudo-observations: fixed sums, worth prior_weight samples in all
        grid = list(prior_grid) if prior_grid else prior_points(prior)
        self._prior_A = [0.0] * (_NF * _NF)
        self._prior_v = [0.0] * _NF
        for p in grid:
            w = prior_weight / len(grid)
            self._accumulate(self._prior_A, self._prior_v, p.features(), p.seconds, w)
        self._prior_theta = [t / sc for t, sc in zip(prior.as_theta(), _SCALE)]  # on scaled features
        # the live window: (features, seconds, prior prediction / seconds), and its sums
        self._samples: deque[tuple[list[float], float, float]] = deque()
        self._A = [0.0] * (_NF * _NF)
        self._v = [0.0] * _NF
        self._z = [0.0, 0.0]  # sum z, sum z^2 with z = prior prediction / observed
        self._evictions = 0

    @classmethod
    def fixed(cls, coeffs: PrefillCoeffs) -> PrefillCostModel:
        return cls(coeffs, learn=False)

    @classmethod
    def from_config(cls, cfg: PolicyConfig) -> PrefillCostModel:
        """The cold-start prior, or the prefill section of ``cfg.cost_model_profile``."""
        if not cfg.cost_model_profile:
            return cls()
        return cls.from_profile(load_profile(cfg.cost_model_profile))

    @classmethod
    def from_profile(cls, profile: Profile, **kwargs: Any) -> PrefillCostModel:
        """A profile's measured prefill steps as the prior grid (docs/profile.md). Prior
        coefficients: the profile's ``coeffs`` (b and g_w timed apart) when given, else fitted to
        the grid, whose b/g_w split is then unknown (``boundary_tokens`` is None)."""
        if profile.prefill is None:
            return cls(**kwargs)
        pts = [PrefillPoint(b, l, h, t) for b, l, h, t in profile.prefill.points()]
        spec = profile.prefill.coeffs
        if spec is not None:
            return cls(PrefillCoeffs(**msgspec.structs.asdict(spec)), pts, **kwargs)
        fit = cls(prior_weight=0.0, min_samples=1, window=len(pts))
        for p in pts:
            fit.add_sample(p)
        c = fit.coeffs
        model = cls(replace(c, b=c.b + c.g_w, g_w=0.0), pts, **kwargs)
        model.compute_share = None
        return model

    # ------------------------------------------------------------------ predictions
    def step_s(self, chunks: Iterable[tuple[int, int]]) -> float:
        """One forward over ``chunks`` = [(new tokens, context tokens)] (an empty step costs 0)."""
        c = self.coeffs
        k = c.b + c.g_w
        t, n = 0.0, 0
        for l, h in chunks:
            t += c.per_req_s + c.a * l * (l + 2 * h) + k * l + c.g_r * h
            n += 1
        return c.launch_s + t if n else 0.0

    def marginal_s(self, new_tokens: int, context_tokens: int = 0) -> float:
        """What one more request adds to a step that runs anyway (no launch)."""
        c = self.coeffs
        l, h = new_tokens, context_tokens
        return c.per_req_s + c.a * l * (l + 2 * h) + (c.b + c.g_w) * l + c.g_r * h

    def marginal_s_array(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """``marginal_s`` over integer arrays (same formula, same operation order: the same
        float64 numbers)."""
        c = self.coeffs
        l, h = new_tokens, context_tokens
        s: np.ndarray = c.per_req_s + c.a * l * (l + 2 * h) + (c.b + c.g_w) * l + c.g_r * h
        return s

    def request_s(self, new_tokens: int, context_tokens: int = 0, chunk: int | None = None) -> float:
        """Prefill ``new_tokens`` after ``context_tokens`` alone, one chunk of at most ``chunk``
        tokens per step (None: one step). Equals the sum of ``step_s`` over its chunks."""
        if new_tokens <= 0:
            return 0.0
        n, quad, ctx = work_features(new_tokens, context_tokens, chunk)
        c = self.coeffs
        return n * (c.launch_s + c.per_req_s) + c.a * quad + (c.b + c.g_w) * new_tokens + c.g_r * ctx

    def request_times(self, new_tokens: Sequence[int], context_tokens: Sequence[int],
                      chunk: int) -> list[float]:
        """``request_s`` of many requests at once (one pass, for a whole queue; 0 new tokens
        is charged one launch here)."""
        c = self.coeffs
        fixed, a, k, gr = c.launch_s + c.per_req_s, c.a, c.b + c.g_w, c.g_r
        out: list[float] = []
        append = out.append
        for r, h in zip(new_tokens, context_tokens):
            n, quad, ctx = work_features(r, h, chunk)
            append(n * fixed + a * quad + k * r + gr * ctx)
        return out

    def request_times_array(self, new_tokens: np.ndarray, context_tokens: np.ndarray, chunk: int,
                            empty_is_zero: bool = False) -> np.ndarray:
        """``request_times`` over arrays of whole numbers, int or float (``work_features_array``
        then ``times_of``). ``empty_is_zero``: 0 s for no new tokens, as ``request_s``
        (``request_times`` charges those one launch)."""
        r = new_tokens if new_tokens.dtype == np.float64 else new_tokens.astype(np.float64)
        out = self.times_of(*work_features_array(r, context_tokens, chunk), r)
        if empty_is_zero:
            out[r <= 0] = 0.0
        return out

    def times_of(self, chunks: np.ndarray, quad: np.ndarray, ctx: np.ndarray,
                 new_tokens: np.ndarray) -> np.ndarray:
        """``request_s`` from ``work_features`` columns (float64; the waiting queue keeps them,
        ``scheduling/waiting.py``): four products and three sums, in ``request_s``'s order, so
        the same float64 numbers (the features are whole numbers, exact in float64)."""
        c = self.coeffs
        out = chunks * (c.launch_s + c.per_req_s)
        out += c.a * quad
        out += (c.b + c.g_w) * new_tokens
        out += c.g_r * ctx
        return out

    def boundary_tokens(self, context_tokens: int = 0) -> float | None:
        """PLA-Serve §2.1's L_m: new tokens below which a (re-)prefill is memory-bound.
        None when the b/g_w split is unknown or a = 0."""
        c = self.coeffs
        if self.compute_share is None or c.a <= 0:
            return None
        h = context_tokens
        if h <= 0:
            return max(0.0, (c.g_w - c.b) / c.a)
        q = 2 * c.a * h + c.b - c.g_w
        return max(0.0, (-q + math.sqrt(q * q + 4 * c.a * c.g_r * h)) / (2 * c.a))

    # ------------------------------------------------------------------ learning
    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        """Learn from a finished step (only pure prefill steps: EXTEND)."""
        if step.mode is not ForwardMode.EXTEND or step.new_tokens <= 0:
            return
        self.add_sample(PrefillPoint(step.batch_size, step.new_tokens, step.context_tokens, elapsed_s,
                                     step.attn_tokens2))

    def add_sample(self, p: PrefillPoint) -> None:
        if not self.learn or not (p.seconds > 0 and math.isfinite(p.seconds)):
            return
        x = p.features()
        z = sum(t * xi for t, xi in zip(self._prior_theta, x)) / p.seconds
        self._samples.append((x, p.seconds, z))
        self._accumulate(self._A, self._v, x, p.seconds, 1.0)
        self._z[0] += z
        self._z[1] += z * z
        if len(self._samples) > self.window:
            old_x, old_y, old_z = self._samples.popleft()
            self._accumulate(self._A, self._v, old_x, old_y, -1.0)
            self._z[0] -= old_z
            self._z[1] -= old_z * old_z
            self._evictions += 1
            if self._evictions % self.window == 0:  # wipe float drift of add/subtract
                self._A, self._v = [0.0] * (_NF * _NF), [0.0] * _NF
                for sx, sy, _ in self._samples:
                    self._accumulate(self._A, self._v, sx, sy, 1.0)
                self._z = [sum(sz for *_, sz in self._samples), sum(sz * sz for *_, sz in self._samples)]
        if len(self._samples) >= self.min_samples:
            self._refit()

    @staticmethod
    def _accumulate(A: list[float], v: list[float], x: list[float], y: float, w: float) -> None:
        w /= max(y, _T_FLOOR_S) ** 2
        for i in range(_NF):
            wxi = w * x[i]
            v[i] += wxi * y
            row = i * _NF
            for j in range(_NF):
                A[row + j] += wxi * x[j]

    def _refit(self) -> None:
        # the prior's scale on this window: s minimising sum (1 - s z)^2, z = prior / observed
        s = self._z[0] / self._z[1] if self._z[1] > 0 and self._z[0] > 0 else 1.0
        A = [p / (s * s) + q for p, q in zip(self._prior_A, self._A)]
        v = [p / s + q for p, q in zip(self._prior_v, self._v)]
        theta = nnls(A, v)
        if theta is None:
            return
        launch, per_req, a, k, g_r = (t * s for t, s in zip(theta, _SCALE))
        share = self.compute_share if self.compute_share is not None else 1.0
        self.coeffs = replace(self.prior, launch_s=launch, per_req_s=per_req, a=a, b=k * share,
                              g_w=k * (1.0 - share), g_r=g_r)


def work_features(new_tokens: int, context_tokens: int, chunk: int | None) -> tuple[int, int, int]:
    """What ``request_s`` needs of a request besides the coefficients, all whole numbers: chunks
    n (one per step, at least 1), r(r + 2H) (the attention pairs of all chunks together) and the
    context before each chunk, summed (n H + chunk n(n - 1) / 2)."""
    r, h = new_tokens, context_tokens
    if not chunk or chunk >= r:
        return 1, r * (r + 2 * h), h
    n = -(-r // chunk)
    return n, r * (r + 2 * h), n * h + chunk * n * (n - 1) // 2 if n > 1 else h


def work_features_array(new_tokens: np.ndarray, context_tokens: np.ndarray,
                        chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``work_features`` over arrays (float64 results, the same whole numbers)."""
    r, h = new_tokens, context_tokens
    n = np.ceil(r / chunk)  # a quotient that is not whole is not rounded onto one (r << 2**53)
    np.maximum(n, 1.0, out=n)
    ctx = n - 1.0
    ctx *= n
    ctx *= 0.5 * chunk  # n (n - 1) is even: exact
    ctx += n * h
    quad = 2.0 * h
    quad += r
    quad *= r
    return n, quad, ctx
