"""sglang_pd.bench.host_usage: the /proc parsing a benchmark uses to say where a run's CPU time
went (the server's process group, the client, everything else)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_pd.bench import host_usage as hu


def _stat(pid: int, comm: str, pgid: int, minflt: int, majflt: int, utime: int, stime: int) -> str:
    # fields 1-15 of /proc/<pid>/stat (the session, field 6, differs from the group), then zeros
    return (f"{pid} ({comm}) S 1 {pgid} {pgid + 1000} 0 -1 4194560 {minflt} 0 {majflt} 0 {utime} {stime} 0 0 20 0 "
            + " ".join("0" for _ in range(36)) + "\n")


def test_stat_line_fields_after_a_command_name_with_spaces_and_parens() -> None:
    line = _stat(42, "python (engine) x", 7, minflt=11, majflt=3, utime=100, stime=25)
    assert hu.parse_stat_line(line) == (7, 125, 3, 11)


def test_group_usage_sums_only_that_groups_processes(tmp_path: Path) -> None:
    for pid, pgid, ut in ((10, 7, 100), (11, 7, 50), (12, 9, 1000)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, "p", pgid, minflt=pid, majflt=1, utime=ut, stime=0))
    (tmp_path / "self").mkdir()  # not a pid: skipped
    (tmp_path / "13").mkdir()  # exited between listing and reading: skipped
    cpu, major, minor, rss, huge = hu.group_usage(7, tmp_path)
    assert cpu == pytest.approx(150 / hu._TICK) and major == 2 and minor == 21 and rss == huge == 0


def test_process_cpu_is_one_process_and_zero_once_gone(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "stat").write_text(_stat(10, "engine", 7, minflt=0, majflt=0, utime=300, stime=40))
    assert hu.process_cpu_s(10, tmp_path) == pytest.approx(340 / hu._TICK)
    assert hu.process_cpu_s(11, tmp_path) == 0.0


def test_machine_busy_leaves_out_idle_and_iowait() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    busy = hu.parse_machine_busy("cpu  100 5 20 1000 50 1 2 3 7 0")
    assert busy == pytest.approx((100 + 5 + 20 + 1 + 2 + 3) / hu._TICK)


def test_since_splits_the_machine_time_into_server_client_and_other() -> None:
    a = hu.Usage(10.0, 100.0, 20.0, 1, 5, 1024, 0, 2.0)
    b = hu.Usage(40.0, 160.0, 50.0, 4, 105, 3072, 2048, 7.0)
    d = b.since(a)
    assert d["wall_s"] == 30.0 and d["server_cpu_s"] == 30.0 and d["client_cpu_s"] == 5.0
    assert d["other_cpu_s"] == 25.0 and d["server_major_faults"] == 3 and d["server_minor_faults"] == 100
    assert d["server_rss_mb"] == 2.0 and d["server_huge_mb"] == 2.0


def test_snapshot_reads_this_host() -> None:
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc")
    # our own process group always holds this pytest process, which has spent CPU by now (a
    # session id is not a group id: under CI the session leader's group can be empty)
    u = hu.snapshot(os.getpgid(0))
    assert u.server_cpu_s > 0 and u.machine_busy_s > 0 and u.client_cpu_s > 0


def test_metric_sum_adds_every_label_set_of_exactly_that_name() -> None:
    text = ("# HELP sglang:engine_step_seconds x\n"
            'sglang:engine_step_seconds_sum{mode="extend"} 1.5\n'
            'sglang:engine_step_seconds_sum{mode="decode"} 2.0\n'
            'sglang:engine_step_seconds_count{mode="extend"} 9\n'
            "sglang:engine_step_seconds_sum_other 100\n")
    assert hu.metric_sum(text, "sglang:engine_step_seconds_sum") == pytest.approx(3.5)
    assert hu.metric_sum(text, "sglang:missing") == 0.0


def test_rollup_reads_rss_and_huge_pages() -> None:
    text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:  2048 kB\nPss: 1000 kB\nAnonHugePages:  1024 kB\n"
    assert hu.parse_rollup(text) == (2048, 1024)
    assert hu.parse_rollup("") == (0, 0)
