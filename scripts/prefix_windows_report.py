#!/usr/bin/env python3
"""Issue 30: what the prefix cache buys per window of the Mooncake trace, from the JSON files
of ``bench_prefix_replay.py --out`` (one per window): a table (window, its ceiling, the
engine's hit rate beside the simulator's cache model, the cache-off server's load, the cache's
cut in stepping, TTFT p50 / p90 off over on, each side's runs pooled) and a PNG of the TTFT
ratios against the window's hit rate.

    python scripts/prefix_windows_report.py /tmp/s10/replay_w*.json --png docs/bench/prefix_windows.png
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench_prefix_replay import pooled  # the replay's own pooling of a side's runs (scripts/ is on the path)


@dataclass(frozen=True)
class Window:
    first: int  # the window's first request (1-based)
    size: int  # requests in the window
    warm: str  # the warm-up: "all" earlier prompts, their "shared" prefixes, or those a "pool" keeps
    ceiling: float
    hit_rate: float  # the engine's, from meta_info cached_tokens
    sim_hit_rate: float  # the simulator's cache model
    qps: float
    off_load: float  # the cache-off server's stepping over the arrival span (mean of its runs)
    step_cut: float  # 1 - on stepping / off stepping
    p50_ratio: float  # TTFT p50 off / on, each side's runs pooled
    p90_ratio: float


def read_window(path: Path) -> Window:
    d = json.loads(path.read_text())
    on = [r for r in d["runs"] if r["cache"]]
    off = [r for r in d["runs"] if not r["cache"]]
    if not on or not off:
        raise SystemExit(f"{path}: needs cache-on and cache-off runs")
    step = {side: float(np.mean([r["step_s"] for r in runs])) for side, runs in (("on", on), ("off", off))}
    off_ttft, on_ttft = pooled(off), pooled(on)
    assert off_ttft is not None and on_ttft is not None  # both sides present, checked above
    args = d["args"]
    warm = "all" if args.get("warm_shared_only") != "True" else "pool" if args.get("warm_bounded") == "True" else "shared"
    return Window(first=int(args["warm_requests"]) + 1, size=int(args["num_requests"]), warm=warm, ceiling=d["ceiling"],
                  hit_rate=float(np.mean([r["hit_rate"] for r in on])), sim_hit_rate=d["sim_hit_rate"],
                  qps=float(d["args"]["qps"]), off_load=float(np.mean([r["load"] for r in off])),
                  step_cut=1 - step["on"] / step["off"],
                  p50_ratio=off_ttft[0] / on_ttft[0], p90_ratio=off_ttft[1] / on_ttft[1])


def table(windows: list[Window]) -> str:
    head = ("| window | warm-up | ceiling | hit rate: engine / sim (pts) | qps | off load | stepping cut "
            "| TTFT p50 off/on | TTFT p90 off/on |")
    rows = [head, "|---|---|---|---|---|---|---|---|---|"]
    for w in windows:
        rows.append(f"| {w.first}-{w.first + w.size - 1} | {w.warm} | {w.ceiling:.1%} | {w.hit_rate:.1%} / "
                    f"{100 * (w.sim_hit_rate - w.hit_rate):+.1f} | {w.qps:.2f} | {w.off_load:.2f} "
                    f"| {w.step_cut:.0%} | {w.p50_ratio:.2f}x | {w.p90_ratio:.2f}x |")
    return "\n".join(rows)


def plot(windows: list[Window], path: Path) -> None:
    from matplotlib.figure import Figure

    from sglang_pd.bench.plots import save_figure

    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for warm, face in (("all", "full"), ("shared", "full"), ("pool", "none")):
        mine = [w for w in windows if w.warm == warm]
        if not mine:
            continue
        hits = [100 * w.hit_rate for w in mine]
        tag = "" if warm != "pool" else " (pool-bounded warm-up)"
        ax.scatter(hits, [w.p50_ratio for w in mine], label=f"TTFT p50 off/on{tag}", edgecolors="tab:blue",
                   facecolors="tab:blue" if face == "full" else "none")
        ax.scatter(hits, [w.p90_ratio for w in mine], label=f"TTFT p90 off/on{tag}", marker="^",
                   edgecolors="tab:orange", facecolors="tab:orange" if face == "full" else "none")
        for w, h in zip(mine, hits):
            ax.annotate(str(w.first), (h, w.p50_ratio), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(2.0, color="grey", ls="--", lw=1, label="2x (the bar, p50)")
    ax.set_xlabel("window hit rate (% of prompt tokens cached, engine)")
    ax.set_ylabel("cache off / cache on")
    ax.set_title("Mooncake conversation windows (label: first request)", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", type=Path, nargs="+", help="bench_prefix_replay.py --out JSON files")
    ap.add_argument("--png", type=Path, default=None)
    a = ap.parse_args()
    windows = sorted((read_window(f) for f in a.files), key=lambda w: (w.first, w.warm))
    print(table(windows))
    if a.png:
        plot(windows, a.png)
        print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
