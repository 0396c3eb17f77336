#!/usr/bin/env python3
"""Where a PD request's TTFT went: the engines' per-request lines joined by bootstrap room.

Each engine logs one line per finished request (python/sglang_pd/engine/request_log.py, with
``--log-requests``; ``bench_cluster.py --request-log`` sets it on every server). A prefill's
line and its decode's carry the same room; joined, they split the server-side TTFT into the
stages of ``sglang_pd/bench/ttft_stages.py`` (prefill_queue, prefill_forward, kv_to_decode,
ttft_server, decode_skew).

    python scripts/request_timeline_report.py LOG_DIR/round1/ours_*.log [--short-threshold 256]

Prints per class the p50 and p90 of each stage, in ms (markdown).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_pd.bench.ttft_stages import join, read_lines, summarise, table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", type=Path, help="server logs (prefill and decode) of one run")
    ap.add_argument("--short-threshold", type=int, default=256,
                    help="class of a line without one: short up to this many new tokens")
    args = ap.parse_args(argv)
    lines = read_lines(args.logs)
    timelines = join(lines, args.short_threshold)
    if not timelines:
        print(f"no prefill/decode pair among {len(lines)} request lines (run the servers with "
              "--log-requests)", file=sys.stderr)
        return 1
    counts: dict[str, int] = {}
    for t in timelines:
        counts[t.cls] = counts.get(t.cls, 0) + 1
    print(f"{len(timelines)} PD requests joined from {len(lines)} lines (ms)")
    print(table(summarise(timelines), counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
