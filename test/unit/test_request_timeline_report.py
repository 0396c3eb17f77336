"""sglang_pd.bench.ttft_stages and scripts/request_timeline_report.py: engine lines joined by room
into a PD request's stages, and the simulator's tracks split the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from request_timeline_report import main
from sglang_pd.bench.ttft_stages import join, parse_line, read_lines, summarise

PREFIX = "[2026-11-28 08:00:00 EngineProcess] INFO sglang_pd.engine.request_log: "


def _line(room: str, mode: str, arrival: float, queue: str, first: str, end: float, cls: str = "short",
          prompt: int = 50, status: str = "ok") -> str:
    return (f"{PREFIX}request rid=r{room} room={room} mode={mode} class={cls} prompt={prompt} cached=0 "
            f"out=1 arrival={arrival:.4f} queue_ms={queue} first_ms={first} end_ms={end:.1f} status={status}\n")


def test_stages_of_one_request() -> None:
    p = parse_line(_line("7", "prefill", 100.0, "200.0", "500.0", 520.0))
    d = parse_line(_line("7", "decode", 100.010, "710.0", "700.0", 2000.0))
    assert p is not None and d is not None and p.room == 7 and p.queue_ms == 200.0
    [t] = join([d, p], short_threshold=256)
    assert t.stages_ms["prefill_queue"] == pytest.approx(200.0)
    assert t.stages_ms["prefill_forward"] == pytest.approx(300.0)
    # decode's first token at 100.010 + 0.700 = 100.710; prefill's at 100.500
    assert t.stages_ms["kv_to_decode"] == pytest.approx(210.0, abs=0.2)
    assert t.stages_ms["ttft_server"] == pytest.approx(710.0, abs=0.2)
    assert t.stages_ms["decode_skew"] == pytest.approx(10.0, abs=0.2)


def test_unpaired_failed_and_unstarted_are_left_out() -> None:
    lines = [parse_line(s) for s in (
        _line("1", "prefill", 1.0, "5.0", "9.0", 10.0),                   # no decode line
        _line("2", "decode", 1.0, "-", "-", 10.0, status="503"),            # no prefill, failed
        _line("3", "prefill", 1.0, "-", "-", 3.0, status="500"),            # failed before a step
        _line("3", "decode", 1.0, "-", "-", 3.0, status="500"),
    )]
    assert join([ln for ln in lines if ln is not None], 256) == []
    assert parse_line("INFO uvicorn: GET /health 200") is None


def test_class_from_prompt_when_the_line_has_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "a.log"
    log.write_text("".join([
        _line("1", "prefill", 0.0, "10.0", "30.0", 31.0, cls="-", prompt=300),
        _line("1", "decode", 0.0, "60.0", "50.0", 90.0, cls="-", prompt=300),
        _line("2", "prefill", 0.0, "1.0", "3.0", 4.0, cls="-", prompt=20),
        _line("2", "decode", 0.0, "9.0", "8.0", 20.0, cls="-", prompt=20),
        _line("3", "prefill", 0.0, "3.0", "7.0", 8.0, cls="-", prompt=30),
        _line("3", "decode", 0.0, "12.0", "10.0", 20.0, cls="-", prompt=30),
    ]))
    timelines = join(read_lines([log]), short_threshold=256)
    summary = summarise(timelines)
    assert set(summary) == {"long", "short"}
    assert summary["long"]["ttft_server"] == (pytest.approx(50.0), pytest.approx(50.0))
    assert summary["short"]["prefill_queue"][0] == pytest.approx(2.0)  # median of 1 and 3
    assert main([str(log)]) == 0
    out = capsys.readouterr().out
    assert "3 PD requests joined from 6 lines" in out and "| short | 2 |" in out


def test_no_pairs_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("nothing here\n")
    assert main([str(log)]) == 1


def test_simulator_tracks_split_the_same_way() -> None:
    from sglang_pd.scheduling.config import PolicyConfig
    from sglang_pd.sim.cluster import Cluster
    from sglang_pd.sim.cluster_spec import ClusterSpec
    from sglang_pd.sim.profiles import build_cost
    from sglang_pd.sim.workload import Arrival, Workload

    from sglang_pd.bench.ttft_stages import from_tracks

    spec = ClusterSpec(num_prefill=1, num_decode=1, cfg=PolicyConfig(slo_ttft_ms=2000, slo_tpot_ms=100))
    arrivals = [Arrival(0.0, 3000, 4), Arrival(0.001, 100, 4), Arrival(0.002, 50_000, 2)]  # the last never fits
    res = Cluster(spec, build_cost("llama-3-8b@h100", kv_capacity_tokens=20_000)).run(Workload(arrivals))
    assert res.tracks[2].error
    timelines = {t.room: t for t in from_tracks(res.tracks)}
    assert set(timelines) == {0, 1}
    first, second = timelines[0], timelines[1]
    assert first.stages_ms["prefill_queue"] == pytest.approx(0.0)  # an idle cluster runs it at once
    assert second.stages_ms["prefill_queue"] > 0  # fcfs: behind the first's first chunk at least
    for t in (first, second):
        s = t.stages_ms
        assert min(s.values()) >= 0 and s["decode_skew"] == 0.0
        assert s["ttft_server"] == pytest.approx(s["prefill_queue"] + s["prefill_forward"] + s["kv_to_decode"])
        track = res.tracks[t.room]
        assert track.first_token is not None
        assert s["ttft_server"] == pytest.approx(1e3 * (track.first_token - track.arrival))
    for track in res.tracks:  # as sim_fidelity_cluster.replay adds a calibrated TTFT overhead
        track.first_token = None if track.first_token is None else track.first_token + 0.5
    shifted = {t.room: t for t in from_tracks(res.tracks, shift_s=0.5)}
    for room in (0, 1):
        assert shifted[room].stages_ms == pytest.approx(timelines[room].stages_ms)
