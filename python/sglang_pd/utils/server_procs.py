"""Helpers for code that starts server processes and drives them over HTTP (the benchmark
scripts under ``scripts/``, the GPU check's stages): a free port, starting a server in its own
process group with its output in a log, waiting for /health with a deadline, stopping it (frontend and
engine) cleanly. One home, so every starter waits with a timeout and stops the whole group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def popen_own_group(cmd: Sequence[str], stdout: IO[Any] | int,
                    env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start a server in a process group of its own, so :func:`stop` signals the whole group (its
    engine process too), but in the caller's session, its stderr with its stdout. Not a new
    session (``start_new_session``): that is also a new scheduler autogroup (Linux
    CONFIG_SCHED_AUTOGROUP, on by default in most distributions), and the kernel shares a core
    between autogroups before it weighs threads by their nice values, so a server reniced to
    give way to another on its core (``bench_cluster --pin-layout priority``) gave way only now
    and then (measured: docs/bench_cluster.md, session 12)."""
    if sys.version_info >= (3, 11):
        return subprocess.Popen(list(cmd), stdout=stdout, stderr=subprocess.STDOUT, env=env, process_group=0)
    # Python 3.10 has no process_group; setpgrp is async-signal-safe (one syscall in the child)
    return subprocess.Popen(list(cmd), stdout=stdout, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=os.setpgrp)  # noqa: PLW1509


def spawn_logged(cmd: Sequence[str], log: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (so :func:`stop` reaches its engine process too), its
    stdout and stderr appended to ``log`` after a header line naming the command."""
    with open(log, "a") as f:
        f.write(f"===== {' '.join(cmd[1:])}\n")
        f.flush()
        return popen_own_group(cmd, f)


def health_error(url: str, proc: subprocess.Popen, timeout_s: float) -> Exception | None:
    """None once ``url``/health answers 200; otherwise why not, as the error to raise: a
    RuntimeError if ``proc`` exited first, a TimeoutError if ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return RuntimeError(f"server exited with {proc.returncode} before /health answered")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(0.3)
    return TimeoutError(f"/health did not answer within {timeout_s} s")


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> bool:
    """True once ``url``/health answers 200; False if ``proc`` exits or ``timeout_s`` passes."""
    return health_error(url, proc, timeout_s) is None


def require_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Like :func:`wait_healthy`, but a failure raises with its reason (for callers that record
    errors rather than branch on them)."""
    err = health_error(url, proc, timeout_s)
    if err is not None:
        raise err


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``. A process started in its own group
    (:func:`popen_own_group`) gets the signal for its whole group, so a server's engine process gets it too."""
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
        proc.wait(10)  # SIGKILL cannot be caught; this only bounds a process stuck in the kernel
