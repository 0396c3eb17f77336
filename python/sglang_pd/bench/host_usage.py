"""Where a benchmark's CPU time went on a Linux host: the server's processes (one session),
the client (this process), and everything else, from /proc. A benchmark on a shared CPU reads
this beside its latencies, so that a slow run can be told apart from a run that shared the
machine with something else (the "other" share) or paid page faults (major faults: code or
files read from disk)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Usage:
    """Cumulative counters at one instant (seconds of CPU, fault counts)."""

    wall_s: float
    machine_busy_s: float  # all CPUs, every process and the kernel (not idle, not iowait)
    server_cpu_s: float  # user + system of the server session's live processes
    server_major_faults: int
    server_minor_faults: int  # page faults served without I/O (first touches of fresh memory)
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
                "server_minor_faults": float(self.server_minor_faults - before.server_minor_faults)}


def parse_stat_line(text: str) -> tuple[int, int, int, int]:
    """(session id, utime + stime ticks, major faults, minor faults) from a /proc/<pid>/stat
    line. The command name may hold spaces and parentheses, so the fields are counted after its
    last ')'."""
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): session is field 6, minflt 10, majflt 12, utime 14, stime 15
    return int(fields[3]), int(fields[11]) + int(fields[12]), int(fields[9]), int(fields[7])


def parse_machine_busy(cpu_line: str) -> float:
    """Busy seconds from /proc/stat's aggregate ``cpu`` line: every column but idle and iowait
    (guest time is already inside user)."""
    vals = [int(v) for v in cpu_line.split()[1:]]
    total = sum(vals[:8])  # user nice system idle iowait irq softirq steal
    return (total - vals[3] - vals[4]) / _TICK


def session_usage(sid: int, proc: Path = Path("/proc")) -> tuple[float, int, int]:
    """(CPU seconds, major faults, minor faults) summed over the live processes of session
    ``sid``."""
    ticks = major = minor = 0
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            s, t, f, m = parse_stat_line((d / "stat").read_text())
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
        if s == sid:
            ticks, major, minor = ticks + t, major + f, minor + m
    return ticks / _TICK, major, minor


def snapshot(server_sid: int) -> Usage:
    with open("/proc/stat") as f:
        busy = parse_machine_busy(f.readline())
    cpu, major, minor = session_usage(server_sid)
    return Usage(time.monotonic(), busy, cpu, major, minor, time.process_time())


def metric_sum(text: str, name: str) -> float:
    """Sum of a Prometheus sample over all its label sets (e.g. a histogram's ``_sum``)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(None, 1)[1])
    return total
