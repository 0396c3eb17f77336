"""Start real sglang-pd servers for tests: free loopback ports, wait on /health, always stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sglang_pd.utils.server_procs import free_port  # (one home; tests import it from here too)

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ServerHandle:
    base_url: str
    model_dir: str
    proc: subprocess.Popen
    log_path: Path
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_server(model_dir: str, log_dir: Path, *extra: str, port: int | None = None,
                 ready_timeout: float = 180.0, env: dict[str, str] | None = None) -> ServerHandle:
    port = port or free_port()
    args = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", model_dir,
            "--host", "127.0.0.1", "--port", str(port), *extra]
    log_path = log_dir / f"server_{port}.log"
    full_env = {**os.environ, "UCX_NET_DEVICES": "lo", "NIXL_LOG_LEVEL": "WARN", **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    handle = ServerHandle(f"http://127.0.0.1:{port}", model_dir, proc, log_path, args)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before ready:\n{handle.log()[-4000:]}")
        try:
            if httpx.get(handle.base_url + "/health", timeout=2.0).status_code == 200:
                return handle
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    handle.stop()
    raise TimeoutError(f"server not healthy after {ready_timeout}s:\n{handle.log()[-4000:]}")
