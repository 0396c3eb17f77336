"""Process helpers the benchmark scripts share: a free port, waiting for /health, stopping a
server (frontend and engine) cleanly. Scripts import it as a sibling module (``scripts/`` is on
``sys.path`` when a script runs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> bool:
    """True once ``url``/health answers 200; False if ``proc`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``. A process started with ``start_new_session``
    gets the signal for its whole group, so a server's engine process gets it too."""
    if proc.poll() is not None:
        return
    group = os.getpgid(proc.pid) == proc.pid  # its own group leader: never signal ours

    def send(sig: int) -> None:
        os.killpg(proc.pid, sig) if group else proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()
