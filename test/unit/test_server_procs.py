"""sglang_pd.utils.server_procs, the one home of the scripts' and the GPU check's process
helpers: the health wait tells a dead server from a slow one, and stop reaches the whole
process group (a server's engine process too)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sglang_pd.utils.server_procs import (
    free_port,
    popen_own_group,
    require_healthy,
    spawn_logged,
    stop,
    wait_healthy,
)

# a /health server on the port given as argv[1]; it answers 200 once it listens
HEALTH_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# a parent that starts a child sleeping in the same group, prints the child's pid, then waits
PARENT_WITH_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped by its dead parent yet) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_healthy_server_is_seen_and_stopped(tmp_path):
    port = free_port()
    log = tmp_path / "s.log"
    proc = spawn_logged([sys.executable, "-c", HEALTH_SERVER, str(port)], log)
    try:
        assert wait_healthy(f"http://127.0.0.1:{port}", proc, timeout_s=30)
        require_healthy(f"http://127.0.0.1:{port}", proc, timeout_s=30)
    finally:
        stop(proc, grace_s=5)
    assert proc.returncode is not None
    assert log.read_text().startswith("===== -c")  # the header line names the command


def test_exited_server_is_a_runtime_error_not_a_wait(tmp_path):
    proc = spawn_logged([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "s.log")
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    assert not wait_healthy(url, proc, timeout_s=120)
    with pytest.raises(RuntimeError, match="exited with 3"):
        require_healthy(url, proc, timeout_s=120)
    assert time.monotonic() - t0 < 60  # it noticed the exit, it did not sit out the timeout


def test_silent_server_times_out(tmp_path):
    proc = spawn_logged([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    url = f"http://127.0.0.1:{free_port()}"
    try:
        assert not wait_healthy(url, proc, timeout_s=0.5)
        with pytest.raises(TimeoutError):
            require_healthy(url, proc, timeout_s=0.5)
    finally:
        stop(proc, grace_s=5)


def test_stop_reaches_the_whole_group(tmp_path):
    proc = popen_own_group([sys.executable, "-c", PARENT_WITH_CHILD], subprocess.PIPE)
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
    finally:
        stop(proc, grace_s=5)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_spawned_server_leads_its_group_in_our_session(tmp_path):
    """A group of its own (stop reaches its engine), but our session: a new session would be a
    new scheduler autogroup, where nice values between servers stop counting (server_procs.py)."""
    proc = spawn_logged([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log")
    try:
        assert os.getpgid(proc.pid) == proc.pid
        assert os.getsid(proc.pid) == os.getsid(0)
    finally:
        stop(proc, grace_s=5)
    assert proc.returncode is not None


def test_stop_without_own_group_signals_only_the_process():
    # no group of its own: the process shares our group, so stop must not killpg (that would
    # signal this test run too); reaching here alive is the assertion
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop(proc, grace_s=5)
    assert proc.returncode is not None
