"""Core pinning for CPU benchmarks: the model engines on their cores, everything else elsewhere.

On a small CPU host a server's engine (the process that steps the model) takes turns with its
own frontend, the router and the load generator; its steps then run slower under load than
alone, by an amount that moves with whatever else happens to be busy. Pinning every engine to
the first core and every other process to the rest makes a run repeatable and fair between
setups: a router or client that costs more CPU (a Python router against a Rust one) no longer
slows the engines, and engines share their core only among themselves (processor sharing, which
the simulator can model: ``sim_fidelity_cluster.py --cores``). Used by ``scripts/sim_fidelity.py``
(one engine alone on its core) and ``scripts/bench_cluster.py`` (a PD cluster on 2 cores: the
prefill engines share the first core, the decode engine runs on the other beside the light
processes, as a PD cluster gives decode its own device). Linux only (``/proc``,
``sched_setaffinity``); elsewhere nothing is pinned and the caller is told so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def threads(pid: int) -> list[int]:
    """Every thread of process ``pid`` (affinity is per thread); [] once it is gone."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after "(comm)"
                kids.append(int(d))
    return kids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def engine_pids(server_pid: int) -> list[int]:
    """A ``launch_server`` process's engine: its multiprocessing child that is not the
    resource tracker (engine/engine_process.py starts it with the spawn method)."""
    return [p for p in children(server_pid)
            if b"spawn_main" in _cmdline(p) and b"resource_tracker" not in _cmdline(p)]


def set_affinity(pids: Iterable[int], cores: set[int]) -> None:
    """Every thread of each process onto ``cores`` (threads it starts later inherit them)."""
    for pid in pids:
        for tid in threads(pid):
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:  # the thread ended meanwhile
                pass


def pin_engines(server_pids: Iterable[int], other_pids: Iterable[int] = (),
                rest_servers: Iterable[int] = ()) -> str:
    """The engines of ``server_pids`` on the first usable core; everything else on the rest:
    the engines of ``rest_servers``, every server's frontend and other children, ``other_pids``
    (and their children) and this process, so that what it starts later (the load generator)
    runs there too. Returns what was done, for the report; "not pinned: ..." where it cannot be
    (one core, a server without its engine)."""
    cores = sorted(os.sched_getaffinity(0))
    first, second = list(server_pids), list(rest_servers)
    engines = [e for s in first for e in engine_pids(s)]
    rest_engines = [e for s in second for e in engine_pids(s)]
    if len(cores) < 2 or len(engines) != len(first) or len(rest_engines) != len(second):
        return (f"not pinned ({len(cores)} cores, {len(engines) + len(rest_engines)} engines for "
                f"{len(first) + len(second)} servers)")
    engine_core, rest = {cores[0]}, set(cores[1:])
    set_affinity(engines, engine_core)
    others = [*first, *second, *other_pids]
    others += [k for p in others for k in children(p) if k not in engines]
    set_affinity([*others, os.getpid()], rest)
    with_rest = f" with {len(rest_engines)} engine(s)" if rest_engines else ""
    return f"{len(engines)} engine(s) on core {cores[0]}, the rest{with_rest} on {sorted(rest)}"


def lower_priority(server_pids: Iterable[int], niceness: int) -> str:
    """The engines of ``server_pids`` at ``niceness`` (every thread: Linux keeps a nice value
    per thread). On a shared core the kernel then gives them ~10% of it at +10 while a default
    process has work (CFS weights 110 vs 1024), the rest when it has none. Returns what was done."""
    engines = [e for s in server_pids for e in engine_pids(s)]
    for pid in engines:
        for tid in threads(pid):
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            except OSError:  # the thread ended meanwhile
                pass
    return f"{len(engines)} engine(s) at nice {niceness:+d}"


def restore_self(cores: set[int]) -> None:
    """This process back on ``cores`` (what ``os.sched_getaffinity(0)`` said before
    :func:`pin_engines`), before it starts the next servers: they would inherit the rest."""
    set_affinity([os.getpid()], cores)
