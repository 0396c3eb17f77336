#!/usr/bin/env python
"""Benchmark PD KV transfer: NixlKVTransport WRITEs between two processes.

The parent plays prefill (posts one WRITE per request covering every layer's
K and V of the request's pages and polls it to DONE); a spawned child plays
decode (passive; polls notifications like an engine loop, every 0.2 ms).
Per request we report the sender-side latency (write_pages() call -> poll()
says DONE) and when the decode saw the completion notification.

  python scripts/bench_kv_transfer.py                        # full matrix
  python scripts/bench_kv_transfer.py --shapes tiny --tokens 1024 --page-sizes 16
  python scripts/bench_kv_transfer.py --output-json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import numpy as np
import torch
from sglang_pd.disaggregation.kv_layout import KVLayout
from sglang_pd.disaggregation.transfer.nixl_transport import NixlKVTransport, nixl_available

# name -> (num_layers, kv_heads, head_dim, dtype)
SHAPES: dict[str, tuple[int, int, int, torch.dtype]] = {
    "tiny": (4, 2, 32, torch.float32),  # the project's tiny test model
    "7b": (32, 8, 128, torch.bfloat16),  # Llama-2-7B-class KV (GQA 8 heads)
}


def alloc(shape: str, num_pages: int, page_size: int) -> torch.Tensor:
    layers, heads, dim, dtype = SHAPES[shape]
    return torch.zeros(layers, 2, num_pages, page_size, heads, dim, dtype=dtype)


def stamps(buf: torch.Tensor) -> torch.Tensor:
    """[layers, 2, pages] int32 view of each page's first 4 bytes (exact for any dtype,
    unlike writing page ids as bf16 values)."""
    return buf.view(torch.int32)[:, :, :, 0, 0, 0]


def make_transport(name: str, buf: torch.Tensor, opts: dict[str, Any]) -> NixlKVTransport:
    params = {"ucx_error_handling_mode": opts["error_mode"]} if opts["error_mode"] else {}
    return NixlKVTransport(
        name, buf, progress_thread=opts["progress_thread"], backend_params=params
    )


def child(conn: Any, opts: dict[str, Any]) -> None:
    """Decode side: owns a pool, records when each notification arrives."""
    t: NixlKVTransport | None = None
    buf: torch.Tensor | None = None
    seen: dict[bytes, float] = {}
    while True:
        if conn.poll(0):
            cmd = conn.recv()
            if cmd[0] == "setup":
                _, shape, num_pages, page_size, tag = cmd
                buf = alloc(shape, num_pages, page_size)
                t = make_transport(f"bench-decode-{tag}", buf, opts)
                seen = {}
                conn.send((t.metadata(), t.layout))
            elif cmd[0] == "report":
                src, dst = cmd[1], cmd[2]
                deadline = time.monotonic() + 10
                while len(seen) < cmd[3] and time.monotonic() < deadline:
                    seen.update({m: time.monotonic() for m in t.get_notifs()})  # type: ignore[union-attr]
                # Spot check: the sender stamps every (layer, kind, page) with its page id.
                stamp = stamps(buf)[:, :, torch.as_tensor(dst)]  # type: ignore[arg-type]
                ok = bool((stamp == torch.as_tensor(src, dtype=torch.int32)).all())
                conn.send((seen, ok))
            elif cmd[0] == "teardown":
                if t is not None:
                    t.close()
                t = buf = None
                conn.send("ok")
            elif cmd[0] == "exit":
                return
        if t is not None:
            for m in t.get_notifs():
                seen[m] = time.monotonic()
        time.sleep(0.0002)


def run_config(
    conn: Any, shape: str, page_size: int, tokens: int, order: str, args: Any
) -> dict[str, Any]:
    n_req = (tokens + page_size - 1) // page_size
    num_pages = n_req + 1  # + dummy page 0
    tag = f"{shape}-{page_size}-{tokens}-{order}"
    conn.send(("setup", shape, num_pages, page_size, tag))
    buf = alloc(shape, num_pages, page_size)
    t0 = time.perf_counter()
    t = make_transport(f"bench-prefill-{tag}", buf, transport_opts(args))
    t_local = time.perf_counter() - t0
    md, layout = conn.recv()
    t0 = time.perf_counter()
    peer = t.add_peer(md, layout)
    t_peer = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    src = np.arange(1, num_pages)
    dst = np.arange(1, num_pages)
    if order == "shuffled":  # fragmented pools: no two request pages adjacent on either side
        src, dst = rng.permutation(src), rng.permutation(dst)
    stamps(buf)[:, :, torch.as_tensor(src)] = torch.as_tensor(src, dtype=torch.int32)
    lat: list[float] = []
    posted: dict[bytes, float] = {}
    budget = time.monotonic() + args.seconds_per_config
    i = 0
    while i < args.min_iters + 1 or (i < args.max_iters + 1 and time.monotonic() < budget):
        notif = b"kv|%d|0|1" % i
        t0 = time.monotonic()
        h = t.write_pages(peer, src.tolist(), dst.tolist(), notif)
        while t.poll(h) == "PROC":
            pass
        t1 = time.monotonic()
        if h.status != "DONE":
            raise RuntimeError(f"{tag}: transfer failed: {h.error}")
        if i > 0:  # iteration 0 warms the UCX connection and rkeys
            lat.append(t1 - t0)
            posted[notif] = t0
        i += 1
    conn.send(("report", src.tolist(), dst.tolist(), i))
    seen, ok = conn.recv()
    notif_lat = [seen[k] - v for k, v in posted.items() if k in seen]
    conn.send(("teardown",))
    conn.recv()
    t.close()
    lay = KVLayout.from_tensor(buf)
    nbytes = n_req * lay.bytes_per_page_all_layers
    p50 = statistics.median(lat)
    return {
        "shape": shape,
        "dtype": lay.dtype,
        "page_size": page_size,
        "tokens": tokens,
        "order": order,
        "pages": n_req,
        "descriptors": n_req * lay.num_layers * 2,
        "mib": nbytes / 2**20,
        "iters": len(lat),
        "lat_p50_ms": p50 * 1e3,
        "lat_p90_ms": float(np.percentile(lat, 90)) * 1e3,
        "notif_p50_ms": statistics.median(notif_lat) * 1e3 if notif_lat else None,
        "pages_per_s": n_req / p50,
        "gb_per_s": nbytes / p50 / 1e9,
        "setup_local_ms": t_local * 1e3,
        "add_peer_ms": t_peer * 1e3,
        "ok": ok,
    }


def transport_opts(args: Any) -> dict[str, Any]:
    return {"progress_thread": not args.no_progress_thread, "error_mode": args.ucx_error_handling}


def fmt_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| shape | dtype | page | tokens | order | pages | MiB | p50 ms | p90 ms | notif p50 ms "
        "| pages/s | GB/s | add_peer ms | ok |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "skipped" in r:
            lines.append(
                f"| {r['shape']} | | {r['page_size']} | {r['tokens']} | {r['order']} | "
                f"| | skipped: {r['skipped']} | | | | | | |"
            )
            continue
        notif = f"{r['notif_p50_ms']:.2f}" if r["notif_p50_ms"] is not None else "-"
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['page_size']} | {r['tokens']} | {r['order']} "
            f"| {r['pages']} | {r['mib']:.1f} | {r['lat_p50_ms']:.2f} | {r['lat_p90_ms']:.2f} "
            f"| {notif} | {r['pages_per_s']:,.0f} | {r['gb_per_s']:.2f} "
            f"| {r['add_peer_ms']:.1f} | {'yes' if r['ok'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--page-sizes", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1024, 8192, 32768])
    ap.add_argument(
        "--orders",
        nargs="+",
        default=["contiguous", "shuffled"],
        choices=["contiguous", "shuffled"],
    )
    ap.add_argument(
        "--max-gib-per-side",
        type=float,
        default=4.5,
        help="skip configs whose pool exceeds this (each process holds one pool)",
    )
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=30)
    ap.add_argument("--seconds-per-config", type=float, default=2.0)
    ap.add_argument("--no-progress-thread", action="store_true")
    ap.add_argument(
        "--ucx-error-handling",
        choices=["peer", "none"],
        default=None,
        help="UCX backend ucx_error_handling_mode; 'none' (with UCX_TLS=shm) allows "
        "shared-memory transports but loses peer-failure detection",
    )
    ap.add_argument("--output-json", type=Path)
    args = ap.parse_args()
    why = nixl_available()
    if why is not None:
        sys.exit(f"nixl is required: {why}")
    ctx = mp.get_context("spawn")
    parent, child_end = ctx.Pipe()
    proc = ctx.Process(target=child, args=(child_end, transport_opts(args)), daemon=True)
    proc.start()
    rows: list[dict[str, Any]] = []
    try:
        for shape in args.shapes:
            for page_size in args.page_sizes:
                for tokens in args.tokens:
                    for order in args.orders:
                        layers, heads, dim, dtype = SHAPES[shape]
                        itemsize = torch.empty(0, dtype=dtype).element_size()
                        pages = (tokens + page_size - 1) // page_size + 1
                        gib = layers * 2 * pages * page_size * heads * dim * itemsize / 2**30
                        if gib > args.max_gib_per_side:
                            rows.append(
                                {
                                    "shape": shape,
                                    "page_size": page_size,
                                    "tokens": tokens,
                                    "order": order,
                                    "skipped": f"{gib:.1f} GiB/side > --max-gib-per-side",
                                }
                            )
                        else:
                            rows.append(run_config(parent, shape, page_size, tokens, order, args))
                        print(rows[-1], file=sys.stderr, flush=True)
    finally:
        parent.send(("exit",))
        proc.join(timeout=10)
    print(fmt_table(rows))
    if args.output_json:
        meta = {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            **transport_opts(args),
            "env": {k: v for k, v in os.environ.items() if k.startswith(("UCX_", "NIXL_"))},
        }
        args.output_json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
