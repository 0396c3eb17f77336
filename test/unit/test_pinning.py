"""utils/pinning.py on real processes: a server-like parent whose engine is a multiprocessing
spawn child (as launch_server starts it). The engine's threads land on the first core, the
parent, an "other" process and this process on the rest; restore_self undoes this process's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sglang_pd.utils.pinning import children, engine_pids, lower_priority, pin_engines, restore_self, threads

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="needs Linux with at least 2 usable cores")

SERVER = """
import multiprocessing as mp, threading, time
def engine():
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a second thread
    time.sleep(60)
if __name__ == "__main__":
    mp.set_start_method("spawn")
    p = mp.Process(target=engine, daemon=True)
    p.start()
    print("up", flush=True)
    time.sleep(60)
"""


def _affinity(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(t)) for t in threads(pid)}


def _start(script) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def _engine(server: subprocess.Popen, deadline: float) -> int:
    while not engine_pids(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    (engine,) = engine_pids(server.pid)
    assert engine in children(server.pid)
    while len(threads(engine)) < 2 and time.monotonic() < deadline:  # its second thread
        time.sleep(0.05)
    assert len(threads(engine)) >= 2
    return engine


def test_engines_on_the_first_core_everything_else_on_the_rest(tmp_path) -> None:
    """A "prefill" server's engine on the first core; a "decode" server's engine (rest_servers),
    both frontends, an other process and this one on the rest."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    saved = os.sched_getaffinity(0)
    cores = sorted(saved)
    prefill, decode = _start(script), _start(script)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 20
        p_engine, d_engine = _engine(prefill, deadline), _engine(decode, deadline)
        what = pin_engines([prefill.pid], [other.pid], rest_servers=[decode.pid])
        assert what.startswith("1 engine(s) on core") and "with 1 engine(s)" in what, what
        assert _affinity(p_engine) == {frozenset({cores[0]})}
        rest = frozenset(cores[1:])
        for pid in (d_engine, prefill.pid, decode.pid, other.pid, os.getpid()):
            assert _affinity(pid) == {rest}
        # a server whose engine is missing is refused, nothing half-pinned is claimed
        assert pin_engines([other.pid]).startswith("not pinned")
    finally:
        restore_self(saved)
        for p in (prefill, decode, other):
            p.kill()
            p.wait()
    assert _affinity(os.getpid()) == {frozenset(saved)}


def test_lower_priority_reaches_every_engine_thread_and_only_the_engine(tmp_path) -> None:
    """bench_cluster --pin-layout priority: a server's engine threads at the niceness asked for,
    its frontend untouched."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = _start(script)
    try:
        engine = _engine(server, time.monotonic() + 20)
        before = os.getpriority(os.PRIO_PROCESS, server.pid)
        if before > 14:
            pytest.skip(f"already at nice {before}: no room to lower it by 5")
        assert lower_priority([server.pid], before + 5) == f"1 engine(s) at nice {before + 5:+d}"
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads(engine)} == {before + 5}
        assert os.getpriority(os.PRIO_PROCESS, server.pid) == before
    finally:
        server.kill()
        server.wait()
