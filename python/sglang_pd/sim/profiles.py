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
from dataclasses import replace

import numpy as np

from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.scheduling.profile import Profile, load_profile
from sglang_pd.sim.hardware import HardwareSpec, ModelShape, hardware_spec, model_shape
from sglang_pd.sim.step_cost import DecodeModel, ExactDecode, GridDecode, StepCost, smooth_rows

# The step-time models live in step_cost.py; their names stay importable from here.
__all__ = [
    "DecodeModel", "ExactDecode", "GridDecode", "StepCost", "analytic_cost", "build_cost",
    "fit_measured_prefill", "kairos_minimax_cost", "pads", "profile_cost", "smooth_rows",
]

PREFILL_OVERHEAD_S = 3e-3  # assumption: scheduling + launches of one prefill forward
DECODE_OVERHEAD_S = 1.5e-3  # assumption: one decode forward with CUDA graphs
DECODE_PER_REQ_S = 2e-5  # assumption: per request in a decode batch (sampling, metadata)
PER_REQ_S = 5e-5  # assumption: per request in a prefill step


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


def profile_tp(spec: str, tp: int = 1) -> int:
    """GPUs per instance of a profile: its ``xTP`` or the preset's, else ``tp`` (a JSON's is
    what it was measured at, which the file does not say)."""
    if spec in ("minimax-m2.5@h200x4", "kairos"):
        return 4
    tps = spec.partition("@")[2].partition("x")[2]
    return int(tps) if tps and not spec.endswith(".json") else tp


def at_tp(spec: str, tp: int) -> str:
    """The analytic profile ``spec`` at TP ``tp`` (its own ``xTP``, if any, replaced): how decode
    instances get another TP size than prefill (``--decode-tp``). A profile JSON or preset fixes
    its TP (the times were measured or calibrated there), so it has no other size."""
    model, sep, hw = spec.partition("@")
    if spec.endswith(".json") or spec in ("minimax-m2.5@h200x4", "kairos") or not sep:
        raise ValueError(f"--decode-tp needs an analytic MODEL@HW[xTP] profile; {spec!r} fixes its TP "
                         "(drop --decode-tp, or give MODEL@HW)")
    if tp < 1:
        raise ValueError(f"TP must be >= 1, got {tp}")
    return f"{model}@{hw.partition('x')[0]}x{tp}"


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
