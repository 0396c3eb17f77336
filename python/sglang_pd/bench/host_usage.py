"""Where a benchmark's CPU time went on a Linux host: the server's processes (one process group),
the client (this process), and everything else, from /proc. A benchmark on a shared CPU reads
this beside its latencies, so that a slow run can be told apart from a run that shared the
machine with something else (the "other" share) or paid page faults (major faults: code or
files read from disk)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Usage:
    """Cumulative counters at one instant (seconds of CPU, fault counts)."""

    wall_s: float
    machine_busy_s: float  # all CPUs, every process and the kernel (not idle, not iowait)
    server_cpu_s: float  # user + system of the server group's live processes
    server_major_faults: int
    server_minor_faults: int  # page faults served without I/O (first touches of fresh memory)
    server_rss_kb: int  # resident memory of the group's processes
    server_huge_kb: int  # of which in transparent huge pages (AnonHugePages)
    client_cpu_s: float  # this process, every thread

    def since(self, before: Usage) -> dict[str, float]:
        """The counters' growth from ``before`` to this instant; ``other_cpu_s`` is the machine's
        busy time that neither the server nor the client spent (other jobs, the kernel)."""
        busy = self.machine_busy_s - before.machine_busy_s
        server = self.server_cpu_s - before.server_cpu_s
        client = self.client_cpu_s - before.client_cpu_s
        return {"wall_s": self.wall_s - before.wall_s, "machine_busy_s": busy, "server_cpu_s": server,
                "client_cpu_s": client, "other_cpu_s": max(0.0, busy - server - client),
                "server_major_faults": float(self.server_major_faults - before.server_major_faults),
                "server_minor_faults": float(self.server_minor_faults - before.server_minor_faults),
                "server_rss_mb": (self.server_rss_kb - before.server_rss_kb) / 1024,
                "server_huge_mb": (self.server_huge_kb - before.server_huge_kb) / 1024}


def parse_stat_line(text: str) -> tuple[int, int, int, int]:
    """(process group id, utime + stime ticks, major faults, minor faults) from a /proc/<pid>/stat
    line. The command name may hold spaces and parentheses, so the fields are counted after its
    last ')'."""
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): pgrp is field 5, minflt 10, majflt 12, utime 14, stime 15
    return int(fields[2]), int(fields[11]) + int(fields[12]), int(fields[9]), int(fields[7])


def parse_machine_busy(cpu_line: str) -> float:
    """Busy seconds from /proc/stat's aggregate ``cpu`` line: every column but idle and iowait
    (guest time is already inside user)."""
    vals = [int(v) for v in cpu_line.split()[1:]]
    total = sum(vals[:8])  # user nice system idle iowait irq softirq steal
    return (total - vals[3] - vals[4]) / _TICK


def parse_rollup(text: str) -> tuple[int, int]:
    """(Rss, AnonHugePages) in kB from /proc/<pid>/smaps_rollup."""
    vals = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "AnonHugePages"):
            vals[key] = int(rest.split()[0])
    return vals.get("Rss", 0), vals.get("AnonHugePages", 0)


def group_usage(pgid: int, proc: Path = Path("/proc")) -> tuple[float, int, int, int, int]:
    """(CPU seconds, major faults, minor faults, Rss kB, AnonHugePages kB) summed over the live
    processes of process group ``pgid`` (a server started by ``server_procs.popen_own_group``:
    its frontend and engine)."""
    ticks = major = minor = rss = huge = 0
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            g, t, f, m = parse_stat_line((d / "stat").read_text())
            if g != pgid:
                continue
            r, h = parse_rollup((d / "smaps_rollup").read_text()) if (d / "smaps_rollup").exists() else (0, 0)
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
        ticks, major, minor, rss, huge = ticks + t, major + f, minor + m, rss + r, huge + h
    return ticks / _TICK, major, minor, rss, huge


def process_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system, every thread) of one process; 0.0 once it is gone."""
    try:
        return parse_stat_line((proc / str(pid) / "stat").read_text())[1] / _TICK
    except (OSError, ValueError, IndexError):
        return 0.0


def snapshot(server_pgid: int) -> Usage:
    with open("/proc/stat") as f:
        busy = parse_machine_busy(f.readline())
    cpu, major, minor, rss, huge = group_usage(server_pgid)
    return Usage(time.monotonic(), busy, cpu, major, minor, rss, huge, time.process_time())


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample named exactly ``name`` in a Prometheus text page (a histogram's ``_sum``,
    say), with its labels: the one reader of the servers' /metrics for the benchmarks
    (prometheus_client's parser)."""
    return [(s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def metric_sum(text: str, name: str) -> float:
    """Sum of a Prometheus sample over all its label sets (e.g. a histogram's ``_sum``)."""
    return sum(value for _, value in metric_samples(text, name))
