"""PNG plots of a run (and of a rate sweep). Uses matplotlib's Figure API, no pyplot state,
so it works headless and never touches a global backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from sglang_pd.bench.backends import RequestResult
from sglang_pd.bench.metrics import CLASSES, BenchMetrics, length_class, timeseries

_COLORS = {"all": "black", "short": "tab:blue", "long": "tab:orange"}


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG (the folder made as needed): for scripts building their own."""
    return _save(fig, Path(path))


def grouped_bars(ax, names: Sequence[str], series: Sequence[tuple[str, Sequence[float]]],
                 width: float = 0.8) -> None:
    """One group of bars per name (x tick), one bar per series inside it: the comparison
    table's figure that bench_cluster and the prefill-policy bench both draw."""
    w = width / max(len(series), 1)
    xs = range(len(names))
    for k, (label, ys) in enumerate(series):
        ax.bar([x + (k - (len(series) - 1) / 2) * w for x in xs], ys, w, label=label)
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)


def _cdf(ax, values: Sequence[float], label: str, color: str) -> None:
    xs = sorted(values)
    n = len(xs)
    ax.step(
        xs, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})", color=color
    )


def plot_latency_cdfs(
    results: Sequence[RequestResult], m: BenchMetrics, path: Path, title: str
) -> Path:
    """CDFs of TTFT, TPOT and E2E, overall and per length class, with the SLOs drawn in."""
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, 3)
    ok = [r for r in results if r.success]
    getters = {
        "TTFT": (lambda r: r.ttft_s * 1000.0, m.slo.ttft_ms),
        "TPOT": (lambda r: None if r.tpot_s is None else r.tpot_s * 1000.0, m.slo.tpot_ms),
        "E2E latency": (lambda r: r.e2e_s * 1000.0, None),
    }
    for ax, (name, (get, slo)) in zip(axes, getters.items()):
        groups = {
            "all": ok,
            **{c: [r for r in ok if length_class(r, m.long_threshold) == c] for c in CLASSES},
        }
        for label, rs in groups.items():
            vals = [v for v in (get(r) for r in rs) if v is not None]
            if vals:
                _cdf(ax, vals, label, _COLORS[label])
        if slo is not None:
            ax.axvline(slo, color="red", linestyle="--", label=f"SLO {slo:g} ms")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of successful requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Latency CDFs by prompt class (long: >= {m.long_threshold} tokens) - {title}")
    return _save(fig, path)


def plot_latency_over_time(
    results: Sequence[RequestResult], m: BenchMetrics, path: Path, title: str
) -> Path:
    """TTFT and E2E of each request against its send time; failures marked on the x axis."""
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    ax_ttft, ax_e2e = fig.subplots(2, 1, sharex=True)
    for c in CLASSES:
        rs = [r for r in results if r.success and length_class(r, m.long_threshold) == c]
        if not rs:
            continue
        xs = [r.start_s for r in rs]
        ax_ttft.scatter(xs, [r.ttft_s * 1000 for r in rs], s=8, color=_COLORS[c], label=c)
        ax_e2e.scatter(xs, [r.e2e_s * 1000 for r in rs], s=8, color=_COLORS[c], label=c)
    if m.slo.ttft_ms is not None:
        ax_ttft.axhline(
            m.slo.ttft_ms, color="red", linestyle="--", label=f"TTFT SLO {m.slo.ttft_ms:g} ms"
        )
    failed = [r for r in results if not r.success]
    for ax in (ax_ttft, ax_e2e):
        if failed:
            ax.scatter(
                [r.start_s for r in failed],
                [0] * len(failed),
                marker="x",
                color="red",
                label=f"failed (n={len(failed)})",
            )
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    ax_ttft.set_ylabel("TTFT (ms)")
    ax_e2e.set_ylabel("E2E latency (ms)")
    ax_e2e.set_xlabel("request send time since start (s)")
    ax_ttft.set_title("Time to first token over time")
    ax_e2e.set_title("End-to-end latency over time")
    fig.suptitle(f"Latency over time - {title}")
    return _save(fig, path)


def plot_throughput_over_time(
    results: Sequence[RequestResult], m: BenchMetrics, path: Path, title: str
) -> Path:
    """Output tokens/s and completed requests/s in time bins (about 60 bins per run)."""
    horizon = max(m.duration_s, 1e-3)
    bin_s = _nice_bin(horizon / 60.0)
    ts = timeseries(results, bin_s, horizon)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax = fig.subplots()
    edges = [*ts["t_s"], ts["t_s"][-1] + bin_s]
    ax.stairs(ts["out_tok_per_s"], edges, color="tab:green", linewidth=1.5, label="output tokens/s")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.stairs(ts["req_per_s"], edges, color="tab:purple", linewidth=1.0, label="completed req/s")
    ax2.set_ylabel("request throughput (req/s)")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    ax.set_title(f"Throughput over time ({bin_s:g} s bins) - {title}")
    return _save(fig, path)


def _nice_bin(x: float) -> float:
    for b in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60):
        if x <= b:
            return float(b)
    return 120.0


def plot_run(
    results: Sequence[RequestResult],
    m: BenchMetrics,
    out_dir: str | Path,
    title: str,
    prefix: str = "",
) -> list[Path]:
    """All per-run plots into ``out_dir``; returns the files written."""
    d = Path(out_dir)
    return [
        plot_latency_cdfs(results, m, d / f"{prefix}latency_cdf.png", title),
        plot_latency_over_time(results, m, d / f"{prefix}latency_over_time.png", title),
        plot_throughput_over_time(results, m, d / f"{prefix}throughput_over_time.png", title),
    ]


def plot_sweep(
    rates: Sequence[float], runs: Sequence[BenchMetrics], out_dir: str | Path, title: str
) -> list[Path]:
    """Attainment vs request rate, and goodput vs throughput vs request rate."""
    d = Path(out_dir)
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    series = {  # label: (values, marker, line width); joint drawn thick so overlaps stay visible
        "joint (TTFT and TPOT)": ([m.overall.slo_attainment for m in runs], "s", 3.0),
        "TTFT attainment": ([m.overall.ttft_attainment for m in runs], "o", 1.5),
        "TPOT attainment": ([m.overall.tpot_attainment for m in runs], "^", 1.5),
    }
    for label, (ys, marker, width) in series.items():
        if any(y is not None for y in ys):
            ax.plot(
                rates, [100 * (y or 0) for y in ys], marker=marker, linewidth=width, label=label
            )
    for c, style in zip(CLASSES, (":", "-.")):
        ys = [m.by_class[c].slo_attainment for m in runs]
        if any(m.by_class[c].num_requests for m in runs) and any(y is not None for y in ys):
            ax.plot(
                rates,
                [100 * (y or 0) for y in ys],
                linestyle=style,
                marker=".",
                label=f"joint, {c} prompts",
            )
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("SLO attainment (% of all requests)")
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"SLO attainment vs request rate - {title}")
    files = [_save(fig, d / "sweep_attainment.png")]

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    ax.plot(rates, list(rates), color="gray", linestyle="--", label="offered load")
    ax.plot(rates, [m.overall.request_throughput for m in runs], marker="o", label="throughput")
    ax.plot(
        rates,
        [m.overall.goodput_rps or 0 for m in runs],
        marker="s",
        label="goodput (met both SLOs)",
    )
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("requests per second (req/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Goodput vs request rate - {title}")
    files.append(_save(fig, d / "sweep_goodput.png"))
    return files
