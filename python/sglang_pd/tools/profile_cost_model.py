"""Measure step times for the cost models and the simulator; write one profile (docs/profile.md).

    python -m sglang_pd.tools.profile_cost_model --model-path DIR --out PROFILE.json \
        [--device cpu] [--load-format dummy] [--decode-batch-sizes 1,2,4,8] \
        [--decode-context-tokens 256,1024,4096,16384] [--repeats 5]

Builds an ``EngineCore`` on ``--device`` and drives ``core.runner.build_extend`` /
``build_decode`` / ``forward`` (and sampling, as an engine step does) directly, with synthetic
requests whose pages come from ``core.allocator`` (``kv_len`` = H for the cached history, never
computed: step time depends on shapes, not on the KV values). No scheduler is involved.

- prefill T(L, H): one request of L new tokens over H context tokens, and batched short
  prefills (B requests of L tokens). The attention backend is wrapped by a timing backend
  registered in ``ATTENTION_BACKENDS`` (``profile-timed-<name>``), so every step's time splits
  into attention (KV write, KV read, the L(L+2H) pairs) and the rest (projections and MLP: the
  compute-bound part). Two non-negative least-squares fits give PLA-Serve §2.1's coefficients
  with b and g_w apart: rest = launch + per_req * B + b * sum L; attention = a * sum L(L+2H)
  + g_w * sum L + g_r * sum H. Raw timings go to ``extra.prefill_attention_seconds``.
- decode: batch sizes x total context tokens (each request holds total / B), keyed by the
  total (``context_key: total``, what ``DecodeCostModel`` reads).
Each cell: ``--warmup`` untimed runs, then ``--repeats`` timed ones; the mean goes in
``seconds``, the population standard deviation in ``std_seconds``. Cells whose requests do not
fit the KV pool or the context length are ``null``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from collections.abc import Callable, Sequence

import numpy as np
import torch

import sglang_pd
from sglang_pd.engine.attention import ATTENTION_BACKENDS
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.request import Req
from sglang_pd.engine.tp.launcher import TPRanks, tp_server_args
from sglang_pd.engine.sampler import sample
from sglang_pd.protocol import SamplingParams
from sglang_pd.scheduling.profile import (SCHEMA_VERSION, DecodeGrid, PrefillBatchGrid,
                                          PrefillCoeffsSpec, PrefillGrid, Profile, ProfileMeta,
                                          dump_profile)
from sglang_pd.server_args import ServerArgs


class TimedAttention(AttentionBackend):
    """Wraps a backend and adds up the seconds its ``forward`` calls take (synchronising the
    device around each, so the time is the kernels', not the launch's)."""

    def __init__(self, inner: AttentionBackend, device: str) -> None:
        self.inner = inner
        on_gpu = device.startswith("cuda")
        self.sync: Callable[[], None] = torch.cuda.synchronize if on_gpu else (lambda: None)
        self.seconds = 0.0

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.inner.init_forward_metadata(batch)

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch,
                scale: float) -> torch.Tensor:
        self.sync()
        t = time.perf_counter()
        out = self.inner.forward(q, k, v, layer_id, batch, scale)
        self.sync()
        self.seconds += time.perf_counter() - t
        return out


@dataclass
class Cell:
    seconds: list[float] = field(default_factory=list)
    attention: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seconds)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.seconds)


class Profiler:
    def __init__(self, core: EngineCore, warmup: int, repeats: int) -> None:
        self.core = core
        self.warmup = warmup
        self.repeats = repeats
        self.attn: TimedAttention = core.runner.attn_backend  # type: ignore[assignment]
        self.vocab = core.vocab_size
        self.sync = self.attn.sync
        self._ids = 0

    def _req(self, prompt_len: int, kv_len: int, decode: bool) -> Req | None:
        """A request with ``kv_len`` tokens of (uncomputed) history and pages for the step."""
        core = self.core
        tokens = kv_len + 1 if decode else prompt_len
        if tokens >= core.context_length:
            return None
        pages_needed = -(-tokens // core.page_size)
        if pages_needed > core.allocator.num_free:
            return None
        self._ids += 1
        ids = [(7 * i + 3) % self.vocab for i in range(prompt_len)]
        req = Req(rid=f"profile-{self._ids}", prompt_ids=ids,
                  params=SamplingParams(max_new_tokens=1 << 20, temperature=0.0), arrival=0.0)
        req.pages = core.allocator.alloc(pages_needed)
        req.kv_len = kv_len
        if decode:
            req.output_ids = [ids[-1] if ids else 1]
        return req

    def _free(self, reqs: Sequence[Req]) -> None:
        for r in reqs:
            self.core.allocator.free(r.pages)
            r.pages = []

    def _time(self, run: Callable[[], None]) -> Cell:
        cell = Cell()
        for i in range(self.warmup + self.repeats):
            self.attn.seconds = 0.0
            self.sync()
            t = time.perf_counter()
            run()
            self.sync()
            if i >= self.warmup:
                cell.seconds.append(time.perf_counter() - t)
                cell.attention.append(self.attn.seconds)
        return cell

    def extend(self, batch: int, new_tokens: int, context: int) -> Cell | None:
        reqs = [self._req(context + new_tokens, context, decode=False) for _ in range(batch)]
        if any(r is None for r in reqs):
            self._free([r for r in reqs if r is not None])
            return None
        ready = [r for r in reqs if r is not None]  # all of them (checked above)
        plan = [(r, new_tokens) for r in ready]
        runner = self.core.runner

        def run() -> None:
            logits = runner.forward(runner.build_extend(plan))
            sample(logits, ready, self.core.eos_ids)

        try:
            return self._time(run)
        finally:
            self._free(reqs)  # type: ignore[arg-type]

    def decode(self, batch: int, total_context: int) -> Cell | None:
        each = total_context // batch
        if each < 1:
            return None
        reqs = [self._req(each, each, decode=True) for _ in range(batch)]
        if any(r is None for r in reqs):
            self._free([r for r in reqs if r is not None])
            return None
        runner = self.core.runner

        def run() -> None:
            logits = runner.forward(runner.build_decode(reqs))  # type: ignore[arg-type]
            sample(logits, reqs, self.core.eos_ids)  # type: ignore[arg-type]

        try:
            return self._time(run)
        finally:
            self._free(reqs)  # type: ignore[arg-type]


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares with relative weights (1/y), by dropping the most negative
    coefficient and refitting (the systems here have 3 unknowns)."""
    w = 1.0 / np.maximum(y, 1e-6)
    active = list(range(X.shape[1]))
    while True:
        theta = np.zeros(X.shape[1])
        if active:
            scale = np.maximum(np.abs(X[:, active]).max(axis=0), 1e-30)
            sol, *_ = np.linalg.lstsq((X[:, active] / scale) * w[:, None], y * w, rcond=None)
            theta[active] = sol / scale
        neg = [i for i in active if theta[i] < 0]
        if not neg:
            return theta
        active.remove(min(neg, key=lambda i: theta[i]))


def fit_prefill_coeffs(points: Sequence[tuple[int, int, int, float, float, float]]
                       ) -> PrefillCoeffsSpec:
    """points: (B, sum L, sum H, sum L(L+2H), total s, attention s) -> PLA-Serve coefficients."""
    P = np.array(points, dtype=float)
    rest = np.maximum(P[:, 4] - P[:, 5], 1e-7)
    launch, per_req, b = _nnls(np.stack([np.ones(len(P)), P[:, 0], P[:, 1]], axis=1), rest)
    a, g_w, g_r = _nnls(np.stack([P[:, 3], P[:, 1], P[:, 2]], axis=1), np.maximum(P[:, 5], 1e-7))
    return PrefillCoeffsSpec(launch_s=float(launch), per_req_s=float(per_req), a=float(a),
                             b=float(b), g_w=float(g_w), g_r=float(g_r))


Grid = list[list[float | None]]


def _grid(cells: list[list[Cell | None]]) -> tuple[Grid, Grid]:
    return ([[c.mean if c else None for c in row] for row in cells],
            [[c.std if c else None for c in row] for row in cells])


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}"
                                         ) from None
    if not values or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected strictly ascending integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sglang_pd.tools.profile_cost_model",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--out", required=True, help="profile JSON to write")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention-backend", default="torch")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--prefill-new-tokens", type=_ints, default=_ints("16,64,256,1024"))
    ap.add_argument("--prefill-context-tokens", type=_ints, default=_ints("0,1024,4096"))
    ap.add_argument("--prefill-batch-sizes", type=_ints, default=_ints("1,4,8"))
    ap.add_argument("--prefill-batch-new-tokens", type=_ints, default=_ints("16,64,256"))
    ap.add_argument("--decode-batch-sizes", type=_ints, default=_ints("1,2,4,8,16"))
    ap.add_argument("--decode-context-tokens", type=_ints, default=_ints("256,1024,4096,16384"),
                    help="total KV tokens of the batch (each request holds total / batch)")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--notes", default="")
    ap.add_argument("--tp-size", type=int, default=1,
                    help="tensor-parallel ranks (recorded in the profile's meta.tp_size)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        ap.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    if args.skip_prefill and args.skip_decode:
        ap.error("nothing to measure: both --skip-prefill and --skip-decode")
    return args


def build_core(args: argparse.Namespace) -> EngineCore:
    """An engine whose KV pool holds the largest cell, with the timing attention wrapper."""
    return build_tp_core(args)[0]


def build_tp_core(args: argparse.Namespace) -> tuple[EngineCore, TPRanks | None]:
    """build_core, and with --tp-size N > 1 its ranks 1..N-1 (the caller closes them). Only
    rank 0 times attention: the other ranks run the plain backend of the same name."""
    inner = ATTENTION_BACKENDS.get(args.attention_backend)
    if inner is None:
        raise SystemExit(f"unknown --attention-backend {args.attention_backend!r}; "
                         f"supported: {sorted(ATTENTION_BACKENDS)}")
    name = f"profile-timed-{args.attention_backend}"
    ATTENTION_BACKENDS[name] = lambda: TimedAttention(inner(), args.device)
    need = 0 if args.skip_decode else (max(args.decode_context_tokens)
                                       + 2 * max(args.decode_batch_sizes))
    if not args.skip_prefill:
        need = max(need, max(args.prefill_new_tokens) + max(args.prefill_context_tokens),
                   max(args.prefill_batch_sizes) * max(args.prefill_batch_new_tokens))
    pages = need // args.page_size + 2 * max(args.decode_batch_sizes + args.prefill_batch_sizes) + 2
    server_args = tp_server_args(ServerArgs(
        model_path=args.model_path, load_format=args.load_format, dtype=args.dtype,
        device=args.device, attention_backend=name, page_size=args.page_size,
        skip_tokenizer_init=True, max_total_tokens=pages * args.page_size,
        tp_size=getattr(args, "tp_size", 1)))
    if server_args.tp_size == 1:
        return EngineCore(server_args), None
    ranks = TPRanks.start(replace(server_args, attention_backend=args.attention_backend))
    try:
        core = EngineCore(server_args, tp=ranks.group)
        ranks.attach(core.runner, core.kv_pool.num_pages)
    except BaseException:
        ranks.close()
        raise
    return core, ranks


def run_profile(args: argparse.Namespace, log: Callable[[str], None] = print) -> Profile:
    core, ranks = build_tp_core(args)
    try:
        return _run_profile(core, args, log)
    finally:
        if ranks is not None:
            ranks.close()


def _run_profile(core: EngineCore, args: argparse.Namespace, log: Callable[[str], None]) -> Profile:
    # touch every KV page once: a fresh pool is mapped lazily, and first-touch page faults
    # would land in whichever cell first uses the memory (seconds on a CPU, not step time)
    core.kv_pool.kv_buffer.fill_(1.0)
    core.kv_pool.kv_buffer.zero_()
    prof = Profiler(core, args.warmup, args.repeats)
    prefill = None
    extra: dict[str, object] = {}
    if not args.skip_prefill:
        Ls, Hs = args.prefill_new_tokens, args.prefill_context_tokens
        cells = [[prof.extend(1, l, h) for h in Hs] for l in Ls]
        Bs, BLs = args.prefill_batch_sizes, args.prefill_batch_new_tokens
        bcells = [[prof.extend(b, l, 0) for l in BLs] for b in Bs]
        points = [(1, l, h, l * (l + 2 * h), c.mean, statistics.fmean(c.attention))
                  for l, row in zip(Ls, cells) for h, c in zip(Hs, row) if c]
        points += [(b, b * l, 0, b * l * l, c.mean, statistics.fmean(c.attention))
                   for b, row in zip(Bs, bcells) for l, c in zip(BLs, row) if c]
        sec, std = _grid(cells)
        bsec, bstd = _grid(bcells)
        prefill = PrefillGrid(new_tokens=Ls, context_tokens=Hs, seconds=sec, std_seconds=std,
                              batched=PrefillBatchGrid(batch_sizes=Bs, new_tokens=BLs, seconds=bsec,
                                                       std_seconds=bstd),
                              coeffs=fit_prefill_coeffs(points) if len(points) >= 3 else None)
        extra["prefill_attention_seconds"] = [
            [statistics.fmean(c.attention) if c else None for c in row] for row in cells]
        log(f"prefill: {len(points)} cells measured")
    decode = None
    if not args.skip_decode:
        Bs, Cs = args.decode_batch_sizes, args.decode_context_tokens
        cells = [[prof.decode(b, c) for c in Cs] for b in Bs]
        sec, std = _grid(cells)
        decode = DecodeGrid(batch_sizes=Bs, context_tokens=Cs, seconds=sec, std_seconds=std,
                            context_key="total")
        log(format_decode_table(decode))
    meta = ProfileMeta(
        model=args.model_path, arch=core.config.architecture, device=_device_name(args.device),
        dtype=str(next(core.model.parameters()).dtype).removeprefix("torch."),
        page_size=args.page_size,
        attention_backend=args.attention_backend,
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        tool_version=getattr(sglang_pd, "__version__", "0"), repeats=args.repeats, notes=args.notes,
        tp_size=args.tp_size)
    core.close()
    return Profile(schema_version=SCHEMA_VERSION, meta=meta, prefill=prefill, decode=decode,
                   extra=extra)


def format_decode_table(g: DecodeGrid) -> str:
    """The decode grid in ms, one row per batch size (what the closing notes quote)."""
    head = "batch / total ctx " + "".join(f"{c:>10}" for c in g.context_tokens)
    rows = [head] + [f"{b:>18}" + "".join(f"{t * 1e3:>10.2f}" if t is not None else f"{'-':>10}"
                                          for t in row)
                     for b, row in zip(g.batch_sizes, g.seconds)]
    return "decode step time (ms):\n" + "\n".join(rows)


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    profile = run_profile(args)
    dump_profile(profile, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
