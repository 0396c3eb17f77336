"""``python -m sglang_pd.sim run|sweep|plan`` (docs/simulator.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_pd.sim.cli import (PolicyPair, add_common, cluster_spec, cost_of, decode_cost_of, mixed_tp, slo_of,
                               workload_of)
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.report import (class_ttft, format_class_ttft, format_run, metrics, plot_policy_sweep,
                                  plot_queues, run_info, summary_record,
                                  write_requests)
from sglang_pd.sim.sweep import PlanCandidate, plan, sweep


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def cmd_run(a: argparse.Namespace) -> int:
    spec = cluster_spec(a)
    wl = workload_of(a)
    res = Cluster(spec, cost_of(a), decode_cost_of(a)).run(wl, progress=not a.no_progress)
    results, m = metrics(res, slo_of(a), a.long_threshold)
    info = run_info(res, spec.describe(), a.qps, {"workload": a.trace or a.mix, "profile": a.profile,
                                                  "gpus": spec.num_gpus})
    print(format_run(m, info))
    print(f"cluster: {spec.describe()} on {spec.num_gpus} GPUs")
    if spec.slo_ttft_s_long is not None or spec.pool_controller is not None:
        print("per class (threshold", spec.routing.short_prefill_threshold, "new tokens):")
        print(format_class_ttft(class_ttft(res, spec.cfg.slo_ttft_s)))
    if spec.pool_controller is not None:
        print(f"pool controller: {len(res.moves)} moves" + "".join(
            f"; t={t:.0f}s {m.url} {m.from_role}->{m.to_role}" for t, m in res.moves[:20]))
    if a.output_dir:
        out = Path(a.output_dir)
        write_requests(out / "requests.jsonl", res)
        (out / "summary.json").write_text(json.dumps(summary_record(m, info), indent=1, default=str))
        from sglang_pd.bench.plots import plot_run

        files = plot_run(results, m, out, spec.describe()) + [plot_queues(res, out / "queues.png", spec.describe())]
        print("wrote", out / "requests.jsonl", out / "summary.json", *files)
    return 0


def cmd_sweep(a: argparse.Namespace) -> int:
    pairs = [PolicyPair.parse(p) for p in a.policies.split(",")]
    specs = {str(p): cluster_spec(a, p.prefill, p.decode, p.exact or a.exact) for p in pairs}
    points = sweep(a.qps_list, specs, lambda: cost_of(a), lambda q: workload_of(a, q), slo_of(a), a.long_threshold,
                   decode_cost_factory=lambda: decode_cost_of(a))
    if a.output_dir:
        out = Path(a.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "sweep.jsonl", "w") as f:
            for pt in points:
                o = pt.metrics.overall
                f.write(json.dumps({"qps": pt.qps, "policy": pt.label, "cluster": pt.spec.describe(),
                                    "e2e_attainment": o.slo_attainment, "ttft_attainment": o.ttft_attainment,
                                    "tpot_attainment": o.tpot_attainment, "goodput_rps": o.goodput_rps,
                                    "ttft_p50_ms": o.ttft.median, "ttft_p90_ms": o.ttft.p90,
                                    "tpot_p50_ms": o.tpot.median, "tpot_p90_ms": o.tpot.p90}) + "\n")
        series = {label: [p.metrics for p in points if p.label == label] for label in specs}
        files = plot_policy_sweep(a.qps_list, series, out, a.title or f"{a.profile}, {next(iter(specs.values())).describe()}")
        print("wrote", out / "sweep.jsonl", *files)
    return 0


def _tp_choices(a: argparse.Namespace) -> list[tuple[str, int, int, argparse.Namespace]]:
    """(label prefix, GPUs per prefill instance, per decode instance, flags) per TP pair the planner
    may choose. --tp-choices: every prefill TP x decode TP from the list (real PD clusters run e.g.
    P at TP2, D at TP1), each instance on TP GPUs with the analytic model's step costs at its TP."""
    if not a.tp_choices:
        gpi = a.gpus_per_instance
        return [("", gpi, gpi if a.decode_tp is None else a.decode_tp, a)]
    hw = a.profile.partition("@")[2]
    if not hw or "x" in hw or a.profile.endswith(".json"):
        raise ValueError(f"--tp-choices needs an analytic MODEL@HW profile without xTP, got {a.profile!r}")
    fits = []
    for tp in a.tp_choices:
        try:
            cost_of(argparse.Namespace(**{**vars(a), "tp": tp}))  # weights > memory: no choice
        except ValueError as e:
            print(f"TP{tp} skipped: {e}", file=sys.stderr)
            continue
        fits.append(tp)
    return [(f"TP{tp} " if tp == dtp else f"TP{tp}/{dtp} ", tp, dtp,
             argparse.Namespace(**{**vars(a), "tp": tp, "decode_tp": None if tp == dtp else dtp}))
            for tp in fits for dtp in fits]


def cmd_plan(a: argparse.Namespace) -> int:
    pairs = [PolicyPair.parse(p) for p in a.policies.split(",")]
    cands = []
    for tp_label, gp, gd, at in _tp_choices(a):
        def cost(at: argparse.Namespace = at) -> StepCost:
            return cost_of(at)

        def d_cost(at: argparse.Namespace = at) -> StepCost | None:
            return decode_cost_of(at)

        for p in pairs:
            if (a.colocated_too or a.colocated) and not mixed_tp(at):
                for n in range(1, a.max_gpus // gp + 1):
                    cands.append(PlanCandidate(f"{tp_label}{n} colocated {p}", n * gp, cluster_spec(
                        at, p.prefill, p.decode, p.exact, num_colocated=n), cost))
            if a.colocated:
                continue
            for n_p in range(1, (a.max_gpus - gd) // gp + 1):
                for n_d in range(1, (a.max_gpus - n_p * gp) // gd + 1):
                    cands.append(PlanCandidate(f"{tp_label}{n_p}P+{n_d}D {p}", n_p * gp + n_d * gd,
                                               cluster_spec(at, p.prefill, p.decode, p.exact, num_prefill=n_p,
                                                            num_decode=n_d, num_colocated=0),
                                               cost, d_cost))
    if not cands:
        print(f"no candidate fits {a.max_gpus} GPUs at {a.gpus_per_instance} per instance", file=sys.stderr)
        return 2
    best = plan(cands, lambda: cost_of(a), workload_of(a), slo_of(a), a.target_attainment, a.long_threshold)
    if best is None:
        print(f"no cluster of at most {a.max_gpus} GPUs reaches {100 * a.target_attainment:.1f}% attainment")
        return 1
    cand, m = best
    print(f"cheapest: {cand.label} on {cand.gpus} GPUs, E2E attainment {100 * (m.overall.slo_attainment or 0):.1f}% "
          f"(TTFT {100 * (m.overall.ttft_attainment or 0):.1f}%, TPOT {100 * (m.overall.tpot_attainment or 0):.1f}%)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_pd.sim", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="simulate one cluster on one workload")
    add_common(run)
    sw = sub.add_parser("sweep", help="QPS x policy grid, one plot per metric")
    add_common(sw)
    sw.add_argument("--qps-list", type=_floats, required=True)
    sw.add_argument("--policies", default="fcfs/continuous", help="PREFILL/DECODE[@exact],...")
    sw.add_argument("--title", default="")
    pl = sub.add_parser("plan", help="the cheapest cluster meeting an attainment target")
    add_common(pl)
    pl.add_argument("--target-attainment", type=float, required=True, help="0..1, E2E (both SLOs)")
    pl.add_argument("--max-gpus", type=int, required=True)
    pl.add_argument("--gpus-per-instance", type=int, default=1)
    pl.add_argument("--policies", default="fcfs/continuous", help="PREFILL/DECODE[@exact],... to consider")
    pl.add_argument("--colocated-too", action="store_true", help="also consider colocated clusters")
    pl.add_argument("--tp-choices", type=_ints, default=None,
                    help="TP sizes to choose from, e.g. 1,2,4 (an instance at TP N takes N GPUs; "
                         "needs a MODEL@HW profile); default: --tp with --gpus-per-instance")
    a = ap.parse_args(argv)
    try:
        return {"run": cmd_run, "sweep": cmd_sweep, "plan": cmd_plan}[a.cmd](a)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
