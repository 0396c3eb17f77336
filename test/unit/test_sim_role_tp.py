"""Per-side TP sizes in the simulator (issue 31 item 4): ``--decode-tp N`` gives decode
instances the analytic model's step costs at TP N while prefill keeps its own; GPU counts
count each side's TP; ``sim plan --tp-choices`` also tries mixed prefill/decode TP pairs."""

from __future__ import annotations

import argparse
import re

import pytest

from sglang_pd.sim.__main__ import main
from sglang_pd.sim.cli import add_common, cluster_spec, cost_of, decode_cost_of
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec, SimResult
from sglang_pd.sim.profiles import at_tp, build_cost, profile_tp
from sglang_pd.sim.workload import Arrival, Workload

# decode-heavy: short prompts, long outputs, spaced so prefill never queues behind anything
ARRIVALS = [Arrival(2.0 * i, 256, 400) for i in range(8)]


def _run(decode_tp: int | None) -> SimResult:
    cost = build_cost("llama-3-8b@h100", tp=1)
    dcost = build_cost(at_tp("llama-3-8b@h100", decode_tp), decode_tp) if decode_tp else None
    res = Cluster(ClusterSpec(num_prefill=1, num_decode=1), cost, dcost).run(Workload(list(ARRIVALS)))
    assert all(t.finish is not None and not t.error for t in res.tracks)
    return res


def test_decode_instances_run_at_the_decode_tp() -> None:
    shared, d1, d2 = _run(None), _run(1), _run(2)
    # the decode instance steps with the TP2 cost, the prefill instance keeps TP1's
    assert [i.cost.name for i in d2.instances] == ["llama-3-8b@h100x1", "llama-3-8b@h100x2"]
    assert d2.instances[1].cost.kv_capacity_tokens > d1.instances[1].cost.kv_capacity_tokens  # 2 GPUs' memory

    def decode_s(res: SimResult) -> list[float]:
        return [t.finish - t.first_token for t in res.tracks]  # type: ignore[operator]

    def prefill_s(res: SimResult) -> list[float]:  # from its first step: when that comes also
        # depends on decode (a decode engine reads a new request between its steps)
        return [t.prefill_done - t.prefill_started for t in res.tracks]  # type: ignore[operator]

    # decode at TP1 explicitly is what a shared cost gives (same model, same size)
    assert decode_s(d1) == pytest.approx(decode_s(shared))
    # decode at TP2: every request's decode phase and the whole run end sooner
    assert all(b < 0.8 * a for a, b in zip(decode_s(d1), decode_s(d2)))
    assert d2.sim_end_s < d1.sim_end_s
    # prefill computes at TP1's speed, whatever the decode side runs at
    assert prefill_s(d2) == pytest.approx(prefill_s(d1))
    assert d2.instances[0].busy_s == pytest.approx(d1.instances[0].busy_s)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_common(p)
    return p.parse_args(["--mix", "fixed:256:64:1", "--qps", "1", *argv])


def test_gpu_count_counts_each_sides_tp() -> None:
    a = _args("--prefill", "2", "--decode", "3", "--profile", "llama-3-8b@h100x2", "--decode-tp", "1")
    spec = cluster_spec(a)
    assert (spec.prefill_tp, spec.decode_tp, spec.num_gpus) == (2, 1, 2 * 2 + 3 * 1)
    assert "TP2/TP1" in spec.describe()
    assert cost_of(a).name == "llama-3-8b@h100x2" and decode_cost_of(a).name == "llama-3-8b@h100x1"  # type: ignore[union-attr]
    same = cluster_spec(_args("--prefill", "2", "--decode", "3", "--tp", "4"))
    assert (same.num_gpus, same.describe()) == (20, "2P+3D fcfs+continuous")
    assert decode_cost_of(_args()) is None  # no --decode-tp: decode shares prefill's costs
    assert cluster_spec(_args("--colocated", "3", "--tp", "2")).num_gpus == 6
    assert profile_tp("minimax-m2.5@h200x4") == 4 and profile_tp("x.json", 2) == 2


def test_run_prints_the_gpu_count(capsys) -> None:
    assert main(["run", "--mix", "fixed:256:64:1", "--num-requests", "10", "--qps", "2", "--no-progress",
                 "--prefill", "1", "--decode", "2", "--profile", "llama-3-8b@h100", "--tp", "2",
                 "--decode-tp", "1"]) == 0
    assert "cluster: 1P+2D (TP2/TP1) fcfs+continuous on 4 GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("profile", ["prof.json", "minimax-m2.5@h200x4", "kairos"])
def test_decode_tp_refused_for_profiles_that_fix_their_tp(profile: str, capsys) -> None:
    code = main(["run", "--mix", "fixed:256:64:1", "--num-requests", "4", "--qps", "1", "--no-progress",
                 "--profile", profile, "--kv-capacity-tokens", "10000", "--kv-bytes-per-token", "1000",
                 "--decode-tp", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--decode-tp needs an analytic MODEL@HW[xTP] profile" in err and profile in err


def test_decode_tp_refused_for_colocated_and_bad_sizes(capsys) -> None:
    assert main(["run", "--mix", "fixed:256:64:1", "--num-requests", "4", "--qps", "1", "--no-progress",
                 "--colocated", "1", "--decode-tp", "2"]) == 2
    assert "--decode-tp is for PD clusters" in capsys.readouterr().err
    with pytest.raises(ValueError, match="TP must be >= 1"):
        at_tp("llama-3-8b@h100", 0)


def test_plan_tries_mixed_tp_pairs(capsys) -> None:
    """--tp-choices 1,2: candidates at TP1, TP2 and the mixed TP1/2, TP2/1 pairs, each priced at
    prefill instances x prefill TP + decode instances x decode TP GPUs."""
    main(["plan", "--mix", "sharegpt-lengths:1", "--num-requests", "30", "--qps", "10", "--slo-ttft-ms", "2000",
          "--slo-tpot-ms", "100", "--no-progress", "--profile", "llama-3-8b@h100", "--target-attainment", "1.01",
          "--max-gpus", "3", "--tp-choices", "1,2"])
    out = capsys.readouterr().out
    rows = [re.match(r"\s*(\d+) GPUs\s+TP(\d)(?:/(\d))? (\d+)P\+(\d+)D ", line) for line in out.splitlines()]
    seen = set()
    for m in filter(None, rows):
        gpus, tp_p, tp_d, n_p, n_d = m.groups()
        tp_d = tp_d or tp_p
        assert int(gpus) == int(n_p) * int(tp_p) + int(n_d) * int(tp_d) <= 3, m.group(0)
        seen.add((int(tp_p), int(tp_d), int(n_p), int(n_d)))
    # an unreachable target tries every candidate: all shapes of at most 3 GPUs
    assert seen == {(1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 2, 1), (1, 2, 1, 1), (2, 1, 1, 1)}, out
