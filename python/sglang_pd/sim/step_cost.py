"""The simulator's step-time models: ``StepCost`` (seconds of one scheduled step, the
simulated instance's "hardware") and the decode models it holds. Where their numbers come
from (roofline, the Kairos calibration, a measured profile) is ``profiles.py``."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel
from sglang_pd.scheduling.decode_cost_model import DecodeCostModel
from sglang_pd.scheduling.profile import DecodeGrid


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

    def overrun_s(self, quantile: float) -> float:
        return 0.0  # the ground truth never runs over itself


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
