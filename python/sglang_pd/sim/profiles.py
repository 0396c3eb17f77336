"""Ground-truth step times of a simulated instance (the simulator's "hardware").

A ``StepCost`` holds the prefill model in PLA-Serve §2.1's form (``PrefillCoeffs``, the very
form the schedulers' ``PrefillCostModel`` fits, so ``exact`` mode can hand them the true
coefficients) and a decode model ``decode_s(batch, total context, max context)``. Three sources:

- ``analytic``: from a ``ModelShape`` and a ``HardwareSpec`` x TP (roofline terms summed, as
  PLA's T_comp + T_mem): b = 2·active params / (FLOP/s·eff), a = 2·layers·heads·head_dim /
  (FLOP/s·attn eff) (causal pairs L(L+2H)/2 at 4 FLOP each), g_w = g_r = KV bytes per token /
  (HBM B/s·eff), launch = fixed overhead + one pass over the weights. Decode: overhead + per
  request + max(weights read, FLOPs) + context KV read.
- ``minimax-m2.5@h200x4``: the analytic MoE preset calibrated to Kairos §2.2's measured points
  (prefill 8K 0.4 s and 128K 8.8 s fix k = b + g_w and a; decode at batch 1, 8K 11.0 ms and
  128K 40.3 ms fix the longest request's per-context-token cost and a fixed per-step
  overhead). Batch dependence (expert weights touched, the bandwidth-bound KV read of every
  request), memory terms and KV bytes per token stay analytic: assumptions.
- a profile JSON (docs/profile.md, D's profiler): prefill from a fit of its measured steps
  (``fit_measured_prefill``: PLA's terms plus one in the step's tokens squared); decode by
  bilinear interpolation of its grid (linear extrapolation outside).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from collections.abc import Callable

import msgspec
import numpy as np

from sglang_pd.core.scheduler import ScheduledStep
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel
from sglang_pd.scheduling.decode_cost_model import DecodeCostModel
from sglang_pd.scheduling.profile import DecodeGrid, Profile, load_profile
from sglang_pd.sim.hardware import HardwareSpec, ModelShape, hardware_spec, model_shape

PREFILL_OVERHEAD_S = 3e-3  # assumption: scheduling + launches of one prefill forward
DECODE_OVERHEAD_S = 1.5e-3  # assumption: one decode forward with CUDA graphs
DECODE_PER_REQ_S = 2e-5  # assumption: per request in a decode batch (sampling, metadata)
PER_REQ_S = 5e-5  # assumption: per request in a prefill step


@dataclass
class DecodeModel:
    """t = overhead + per_req·B + max(weights(B), flops·B) + ctx·(total context tokens)
    + ctx_max·(longest context): the last term is the longest request's attention beyond the
    bandwidth bound, which sets a batch's step (Kairos §2.2: a batch runs at its slowest)."""

    overhead_s: float
    per_req_s: float
    weights_s: Callable[[int], float]  # weights read by a batch of B tokens, seconds
    flop_s_per_token: float
    ctx_s_per_token: float
    ctx_max_s_per_token: float = 0.0

    def __call__(self, batch: int, ctx_total: int, ctx_max: int) -> float:
        return (self.overhead_s + self.per_req_s * batch + max(self.weights_s(batch), self.flop_s_per_token * batch)
                + self.ctx_s_per_token * ctx_total + self.ctx_max_s_per_token * ctx_max)


@dataclass
class GridDecode:
    """A profile's decode grid as ground truth: the decode policies' own table reader
    (``DecodeCostModel``, fixed: bilinear, linear past the edges, null cells from a linear fit).
    ``padded``: the profiled engine's decode attention pads every request to the longest (the
    torch backend), so a step costs batch x longest context. ``smooth``: each batch size's row
    is replaced by its straight line in the context (``smooth_rows``)."""

    grid: DecodeGrid
    padded: bool = False
    smooth: bool = False

    def __post_init__(self) -> None:
        grid = smooth_rows(self.grid) if self.smooth else self.grid
        self.model = DecodeCostModel(grid=grid, learn=False, padded=self.padded)

    def __call__(self, batch: int, ctx_total: int, ctx_max: int) -> float:
        return max(self.model.step_s(batch, ctx_total, ctx_max), 1e-6)


def smooth_rows(grid: DecodeGrid) -> DecodeGrid:
    """Each batch size's measured steps as the straight line in the context that fits them best
    (relative errors). A decode step is linear in its context (the KV read, the attention), and
    measured cells are noisy: on the shared CPU, cell means of 3 repeats moved 5-10% between
    runs, and bilinear reading passes that noise on. The rows are kept apart, since steps are
    not smooth in the batch size there (batch 3 to 4: 55 to 81 ms at short context, the CPU's
    matrix kernels). Rows with fewer than two cells, and null cells, stay as they are."""
    ctx = np.array(grid.context_tokens, dtype=np.float64)
    rows = []
    for row in grid.seconds:
        known = [(c, t) for c, t in zip(ctx, row) if t is not None]
        if len(known) < 2:
            rows.append(list(row))
            continue
        c, t = np.array(known).T
        X = np.stack([np.ones_like(c), c], 1) / t[:, None]
        (alpha, beta), *_ = np.linalg.lstsq(X, np.ones_like(t), rcond=None)
        rows.append([None if t0 is None else float(alpha + beta * c0) for c0, t0 in zip(ctx, row)])
    return msgspec.structs.replace(grid, seconds=rows, std_seconds=None)


@dataclass
class ExactDecode:
    """The decode policies' cost model in ``exact`` mode: the ground truth itself, not learned
    (``DecodeCostModel``'s reading interface)."""

    fn: Callable[[int, int, int], float]

    def step_s(self, batch: int, total_ctx: float, max_ctx: float | None = None) -> float:
        if batch <= 0:
            return 0.0
        return self.fn(batch, int(total_ctx), int(max_ctx if max_ctx is not None else total_ctx // batch))

    def batch_s(self, contexts) -> float:
        return self.step_s(len(contexts), sum(contexts), max(contexts) if contexts else 0)

    def observe(self, step: object, elapsed_s: float, now: float) -> None:
        pass


@dataclass
class StepCost:
    """Seconds of one scheduled step; ``noise`` = relative std of a multiplicative factor."""

    name: str
    prefill: PrefillCoeffs
    decode: Callable[[int, int, int], float]
    kv_bytes_per_token: float
    kv_capacity_tokens: int
    step_tokens2_s: float = 0.0  # seconds per (new tokens of the step)^2 (``fit_measured_prefill``)
    noise: float = 0.0
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def exact_model(self) -> PrefillCostModel:
        """The schedulers' ``exact`` mode: the true prefill coefficients, not learned."""
        return PrefillCostModel.fixed(self.prefill)

    def prefill_s(self, chunks: list[tuple[int, int]]) -> float:
        c = self.prefill
        k = c.b + c.g_w
        t = c.launch_s
        tokens = 0
        for n, h in chunks:
            t += c.per_req_s + c.a * n * (n + 2 * h) + k * n + c.g_r * h
            tokens += n
        return t + self.step_tokens2_s * tokens * tokens

    def step_s(self, step: ScheduledStep) -> float:
        """Read before the step advances KV lengths (as ``ScheduledStep.profile``)."""
        plan = step.plan
        if step.mode is ForwardMode.DECODE:
            ctx = [r.kv_len for r, _ in plan]
            t = self.decode(len(plan), sum(ctx), max(ctx))
        else:
            nd = step.num_decode
            pre = plan[: len(plan) - nd] if nd else plan
            t = self.prefill_s([(n, r.kv_len) for r, n in pre])
            if nd:  # decodes riding along: their marginal cost, the launch is paid already
                ctx = [r.kv_len for r, _ in plan[len(pre):]]
                t += self.decode(nd, sum(ctx), max(ctx)) - self.decode(1, 0, 0)
        if self.noise:
            t *= max(0.05, self._rng.gauss(1.0, self.noise))
        return t


def _instance_memory(shape: ModelShape, hw: HardwareSpec, tp: int) -> int:
    pool = hw.memory_bytes * tp * hw.mem_util - shape.params * shape.weight_bytes
    if pool <= 0:
        raise ValueError(f"{shape.name} does not fit {tp} x {hw.name}: weights "
                         f"{shape.params * shape.weight_bytes / 1e9:.0f} GB")
    return int(pool / shape.kv_bytes_per_token)


def analytic_cost(shape: ModelShape, hw: HardwareSpec, tp: int = 1) -> StepCost:
    eff_tp = hw.tp_eff if tp > 1 else 1.0
    flops = hw.peak_flops * tp * eff_tp * (hw.fp8_speedup if shape.weight_bytes < 2 else 1.0)
    attn_flops = hw.peak_flops * tp * eff_tp  # attention stays bf16
    hbm = hw.hbm_bytes_s * tp * hw.mem_eff
    kv_tok = shape.kv_bytes_per_token
    coeffs = PrefillCoeffs(
        launch_s=PREFILL_OVERHEAD_S + shape.weight_bytes_read(1 << 20) / hbm,
        per_req_s=PER_REQ_S,
        a=2.0 * shape.layers * shape.attn_dim / (attn_flops * hw.attn_eff),
        b=2.0 * shape.active / (flops * hw.compute_eff),
        g_w=kv_tok / hbm,
        g_r=kv_tok / hbm,
    )
    decode = DecodeModel(DECODE_OVERHEAD_S, DECODE_PER_REQ_S, lambda b: shape.weight_bytes_read(b) / hbm,
                         2.0 * shape.active / (flops * hw.compute_eff), kv_tok / hbm)
    return StepCost(f"{shape.name}@{hw.name}x{tp}", coeffs, decode, kv_tok, _instance_memory(shape, hw, tp))


# Kairos §2.2 (MiniMax-M2.5, FP8, TP4 on H200): measured prefill and batch-1 decode points
KAIROS_PREFILL_POINTS = ((8192, 0.4004), (131072, 8.8))
KAIROS_DECODE_POINTS = ((8192, 0.0110), (131072, 0.0403))


def kairos_minimax_cost() -> StepCost:
    """The analytic MiniMax-M2.5 x 4 H200 instance, calibrated to Kairos §2.2 (module docstring)."""
    base = analytic_cost(model_shape("minimax-m2.5"), hardware_spec("h200"), tp=4)
    c = base.prefill
    fixed = c.launch_s + c.per_req_s  # analytic: paid once by a one-step prefill
    (l1, t1), (l2, t2) = KAIROS_PREFILL_POINTS
    # t = fixed + k·l + a·l² at both points
    a = ((t2 - fixed) / l2 - (t1 - fixed) / l1) / (l2 - l1)
    k = (t1 - fixed) / l1 - a * l1
    share = c.b / (c.b + c.g_w)
    prefill = replace(c, a=a, b=k * share, g_w=k * (1 - share))
    (c1, d1), (c2, d2) = KAIROS_DECODE_POINTS
    slope = (d2 - d1) / (c2 - c1)  # per context token at batch 1
    dec = base.decode
    assert isinstance(dec, DecodeModel)
    # the bandwidth-bound KV read stays per token of every request (analytic); the measured
    # excess goes to the longest request; the batch-1 gap to the analytic base is a fixed
    # per-step overhead (launches of 62 MoE layers at TP4), not a factor on the batch terms
    ctx_max = max(slope - dec.ctx_s_per_token, 0.0)
    no_ctx = d1 - slope * c1
    calibrated = replace(dec, ctx_max_s_per_token=ctx_max,
                         overhead_s=dec.overhead_s + max(no_ctx - dec(1, 0, 0), 0.0))
    return StepCost("minimax-m2.5@h200x4 (Kairos-calibrated)", prefill, calibrated, base.kv_bytes_per_token,
                    base.kv_capacity_tokens)


def pads(prof: Profile) -> bool:
    """Was the profile measured on an engine whose decode attention pads to the longest request?"""
    return prof.meta.attention_backend == "torch"


def profile_cost(path: str, kv_bytes_per_token: float, kv_capacity_tokens: int) -> StepCost:
    """Ground truth from a measured profile JSON (docs/profile.md)."""
    prof = load_profile(path)
    if prof.prefill is None or prof.decode is None:
        raise ValueError(f"{path}: the simulator needs both a prefill and a decode section")
    coeffs, tokens2 = fit_measured_prefill(prof)
    return StepCost(f"profile:{prof.meta.model}@{prof.meta.device}", coeffs,
                    GridDecode(prof.decode, padded=pads(prof), smooth=True),
                    kv_bytes_per_token, kv_capacity_tokens, step_tokens2_s=tokens2)


def fit_measured_prefill(prof: Profile) -> tuple[PrefillCoeffs, float]:
    """Ground-truth prefill steps from a profile's measured ones (the lone grid and the batched
    one): PLA-Serve §2.1's terms (launch, per request, a, k = b + g_w, g_r) plus one of ours,
    named, in the step's new tokens squared. Why: on a CPU a forward over more tokens costs more
    per token (its activations leave the caches), which the PLA form cannot hold; measured here
    (SmolLM2-135M shape, one core), two prompts of ~300 tokens in one step took 11-14% longer
    than the PLA fit of the grid said, one alone within 3%. Where the grid shows no such
    growth the term fits to 0. Weighted least squares on relative errors (weights 1/t),
    coefficients non-negative (every support tried: 2^6). The b/g_w split is the profile's
    ``coeffs`` one when given (the profiler times them apart), else all of k is b.
    The schedulers keep PLA's form (their own fit; ``exact`` mode hands them these PLA terms):
    the squared term is a model error they live with, as on the real engine."""
    g = prof.prefill
    assert g is not None
    rows: list[tuple[int, int, int, float]] = []  # batch, L per request, H per request, seconds
    for l, line in zip(g.new_tokens, g.seconds):
        rows += [(1, l, h, t) for h, t in zip(g.context_tokens, line) if t is not None]
    if g.batched is not None:
        bg = g.batched
        for b, line in zip(bg.batch_sizes, bg.seconds):
            rows += [(b, l, bg.context_tokens, t) for l, t in zip(bg.new_tokens, line) if t is not None]
    X = np.array([[1.0, b, b * l * (l + 2 * h), b * l, b * h, float(b * l) ** 2] for b, l, h, _ in rows])
    y = np.array([t for *_, t in rows])
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    A, v = X / scale / y[:, None], np.ones(len(y))  # relative errors: (x theta - t) / t
    best, best_err = np.zeros(X.shape[1]), np.inf
    for k in range(X.shape[1], 0, -1):
        for support in itertools.combinations(range(X.shape[1]), k):
            theta, *_ = np.linalg.lstsq(A[:, support], v, rcond=None)
            if (theta < 0).any():
                continue
            err = float(np.sum((A[:, support] @ theta - v) ** 2))
            if err < best_err:
                best, best_err = np.zeros(X.shape[1]), err
                best[list(support)] = theta
    launch, per_req, a, k, g_r, tokens2 = (best / scale).tolist()
    spec = g.coeffs
    share = spec.b / (spec.b + spec.g_w) if spec is not None and spec.b + spec.g_w > 0 else 1.0
    return PrefillCoeffs(launch_s=launch, per_req_s=per_req, a=a, b=k * share, g_w=k * (1 - share), g_r=g_r), tokens2


PRESETS = ("minimax-m2.5@h200x4", "MODEL@HW[xTP] for MODEL in hardware.MODELS, HW in hardware.HARDWARE")


def build_cost(spec: str, tp: int = 1, kv_capacity_tokens: int | None = None,
               kv_bytes_per_token: float | None = None, noise: float = 0.0, seed: int = 0) -> StepCost:
    """``spec``: a profile JSON path, ``minimax-m2.5@h200x4`` (Kairos-calibrated), or
    ``MODEL@HW`` / ``MODEL@HWxTP`` (analytic)."""
    if spec.endswith(".json"):
        if kv_capacity_tokens is None or kv_bytes_per_token is None:
            raise ValueError("a profile JSON needs --kv-capacity-tokens and --kv-bytes-per-token "
                             "(the profile holds times, not the memory model)")
        cost = profile_cost(spec, kv_bytes_per_token, kv_capacity_tokens)
    elif spec in ("minimax-m2.5@h200x4", "kairos"):
        cost = kairos_minimax_cost()
    else:
        model, sep, hw = spec.partition("@")
        if not sep:
            raise ValueError(f"cost profile {spec!r}: expected MODEL@HW[xTP], a preset, or a .json path; "
                             f"presets: {PRESETS}")
        hw, _, tps = hw.partition("x")
        cost = analytic_cost(model_shape(model), hardware_spec(hw), int(tps) if tps else tp)
    if kv_capacity_tokens is not None:
        cost.kv_capacity_tokens = kv_capacity_tokens
    if kv_bytes_per_token is not None:
        cost.kv_bytes_per_token = kv_bytes_per_token
    cost.noise, cost.seed = noise, seed
    cost._rng = random.Random(seed)
    return cost
