"""PD (prefill/decode) test helpers: start prefill and decode servers, and send a request to a
prefill and a decode at once, the way SGLang's router does.

The router's contract (docs/disaggregation.md): the same body goes to both servers with
``bootstrap_host`` / ``bootstrap_port`` (the prefill's bootstrap port) / ``bootstrap_room`` added;
the decode server's response is the client's answer, the prefill's carries the first token only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import httpx
import pytest
from server_utils import ServerHandle, free_port, start_server

# The same paging and chunking as the colocated fixture (test/conftest.py), so outputs compare.
PD_FLAGS = ("--page-size", "4", "--chunked-prefill-size", "64", "--max-total-tokens", "16384",
            "--max-running-requests", "128")

# Small disaggregation timeouts for fault tests: a dead peer is noticed in about a second.
FAST_FAULT_ENV = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "5",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "5",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}


@dataclass
class Prefill:
    server: ServerHandle
    bootstrap_port: int

    @property
    def base_url(self) -> str:
        return self.server.base_url


def _env(env: dict[str, str] | None) -> dict[str, str]:
    # Several engines share the test machine's cores: one intra-op thread each. With torch's
    # default (one per core) the engines' OpenMP threads oversubscribe the cores and a PD run
    # was 5-8x slower here. The numbers do not change: the parity tests compare against a
    # colocated server that runs with the default thread count.
    return {"OMP_NUM_THREADS": "1", **(env or {})}


def nixl_missing() -> str | None:
    """None if NIXL imports, else why not. PD servers move KV with NIXL (the only transfer
    backend), so without it a prefill or decode server cannot start. (The same check as
    ``nixl_transport.nixl_available``, copied so that the test process need not import torch.)"""
    try:
        import nixl._api  # noqa: F401
    except (ImportError, OSError) as e:  # missing package, or a broken native library
        return f"{type(e).__name__}: {e}"
    return None


def require_nixl() -> None:
    """Skip the calling test or fixture, with the reason, when NIXL cannot be imported.
    start_prefill / start_decode / start_all call it, so every PD test skips instead of
    erroring; a module can also mark itself with ``pytest.mark.skipif(nixl_missing() ...)``."""
    why = nixl_missing()
    if why is not None:
        pytest.skip(f"PD needs NIXL, which cannot be imported ({why}); "
                    "install it with scripts/setup_env.sh or `pip install --no-deps nixl nixl-cu13`")


def start_prefill(model_dir: str, log_dir: Path, *flags: str, env: dict[str, str] | None = None,
                  port: int | None = None, bootstrap_port: int | None = None) -> Prefill:
    require_nixl()
    bootstrap_port = bootstrap_port or free_port()
    server = start_server(model_dir, log_dir, "--mode", "prefill",
                          "--disaggregation-bootstrap-port", str(bootstrap_port), *PD_FLAGS, *flags,
                          port=port, env=_env(env))
    return Prefill(server, bootstrap_port)


def start_decode(model_dir: str, log_dir: Path, *flags: str, env: dict[str, str] | None = None,
                 port: int | None = None) -> ServerHandle:
    require_nixl()
    return start_server(model_dir, log_dir, "--mode", "decode", *PD_FLAGS, *flags, port=port,
                        env=_env(env))


def distinct_ports(n: int) -> list[int]:
    """n free loopback ports, all different (held open together while they are picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_all(model_dir: str, log_dir: Path, n_prefill: int, n_decode: int,
              env: dict[str, str] | None = None, prefill_flags: tuple[str, ...] = (),
              decode_flags: tuple[str, ...] = ()) -> tuple[list[Prefill], list[ServerHandle]]:
    """Start the servers in parallel (much of a start is process spawn and imports); on any
    failure stop the ones that did start."""
    return start_mixed(model_dir, log_dir, [prefill_flags] * n_prefill, n_decode, env=env,
                       decode_flags=decode_flags)


def stop_all(prefills: list[Prefill], decodes: list[ServerHandle]) -> None:
    """Stop every server, in parallel (each drains and joins its engine)."""
    def stop(handle: ServerHandle) -> None:
        try:
            handle.stop()
        except (subprocess.TimeoutExpired, OSError):  # a stuck server must not keep others up
            kill_server(handle)

    handles = [p.server for p in prefills] + list(decodes)
    if handles:
        with ThreadPoolExecutor(len(handles)) as pool:
            list(pool.map(stop, handles))


def _descendants(pid: int) -> list[int]:
    """Child processes, grandchildren first-level order, read from /proc (no psutil here)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tp_rank_pids(server_pid: int) -> list[int]:
    """The TP rank processes (ranks 1..N-1) a server started, from their command lines."""
    out = []
    for pid in _descendants(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"sglang_pd.engine.tp.worker" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def kill_server(handle: ServerHandle) -> None:
    """SIGKILL a server's frontend and every process under it (its engine), as a crash would.
    Only this server's own process tree: tests share the pytest process group."""
    pids = _descendants(handle.proc.pid) + [handle.proc.pid]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    handle.proc.wait(10)


def new_room() -> int:
    return random.getrandbits(63)


def load(base_url: str) -> dict[str, Any]:
    r = httpx.get(base_url + "/get_load", timeout=10)
    r.raise_for_status()
    body = r.json()
    return body[0] if isinstance(body, list) else body


def wait_free_pages(base_url: str, expected: int, timeout: float = 20.0) -> dict[str, Any]:
    """Poll /get_load until num_free_pages == expected (bounded); return the last load."""
    deadline = time.monotonic() + timeout
    while True:
        current = load(base_url)
        if current["num_free_pages"] == expected and current["num_reqs"] == 0:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"{base_url}: free pages did not return to {expected} within "
                                 f"{timeout:g}s; last /get_load: {current}")
        time.sleep(0.1)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def with_bootstrap(body: dict[str, Any], prefill: Prefill, room: int | None = None,
                   host: str = "127.0.0.1") -> dict[str, Any]:
    return {**body, "bootstrap_host": host, "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": new_room() if room is None else room}


@dataclass
class PDResult:
    prefill_status: int
    prefill_body: Any
    decode_status: int
    decode_body: Any  # parsed JSON, or for a stream the list of parsed SSE events
    first_event_s: float | None = None  # stream: seconds until the first data event


async def _post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = await client.post(url, json=body)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


async def read_sse(client: httpx.AsyncClient, url: str, body: dict[str, Any]
                   ) -> tuple[int, list[Any], float | None]:
    """POST a streaming request; return (status, parsed events without [DONE], time to first)."""
    t0 = time.monotonic()
    first: float | None = None
    events: list[Any] = []
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            try:
                return resp.status_code, [resp.json()], None
            except ValueError:
                return resp.status_code, [resp.text], None
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            if first is None:
                first = time.monotonic() - t0
            events.append(json.loads(data))
    return 200, events, first


async def pd_request(client: httpx.AsyncClient, prefill: Prefill, decode_url: str,
                     body: dict[str, Any], path: str = "/generate", room: int | None = None
                     ) -> PDResult:
    """Send ``body`` to a prefill and a decode at once, as the router does."""
    full = with_bootstrap(body, prefill, room)
    if full.get("stream"):
        (ps, pb, _), (ds, events, first) = await asyncio.gather(
            read_sse(client, prefill.base_url + path, full),
            read_sse(client, decode_url + path, full))
        return PDResult(ps, pb, ds, events, first)
    (ps, pb), (ds, db) = await asyncio.gather(_post_json(client, prefill.base_url + path, full),
                                              _post_json(client, decode_url + path, full))
    return PDResult(ps, pb, ds, db)


def async_client(timeout: float = 120.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=200))


@dataclass
class RouterHandle:
    base_url: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _launch_router(module: str, prefills: list[Prefill], decodes: list[ServerHandle], log_dir: Path,
                   extra: tuple[str, ...], log_level: str, ready_path: str, ready_timeout: float) -> RouterHandle:
    """Start a PD router (``python -m module``) in front of the servers; return once
    ``ready_path`` reports every worker healthy."""
    port = free_port()
    cmd = [sys.executable, "-m", module, "--pd-disaggregation",
           "--host", "127.0.0.1", "--port", str(port), "--log-level", log_level, *extra]
    for p in prefills:
        cmd += ["--prefill", p.base_url, str(p.bootstrap_port)]
    for d in decodes:
        cmd += ["--decode", d.base_url]
    log_path = log_dir / f"{module.split('.')[0]}_{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    router = RouterHandle(f"http://127.0.0.1:{port}", proc, log_path)
    want = len(prefills) + len(decodes)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited with {proc.returncode}:\n{router.log()[-4000:]}")
        try:
            r = httpx.get(router.base_url + ready_path, timeout=2.0)
            if r.status_code == 200 and r.json().get("healthy_workers") == want:
                return router
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    router.stop()
    raise TimeoutError(f"router not ready after {ready_timeout}s:\n{router.log()[-4000:]}")


def start_router(prefills: list[Prefill], decodes: list[ServerHandle], log_dir: Path,
                 *extra: str, ready_timeout: float = 60.0) -> RouterHandle:
    """SGLang's router (package sglang-router) in PD mode in front of our servers."""
    return _launch_router("sglang_router.launch_router", prefills, decodes, log_dir, extra, "warn",
                          "/readiness", ready_timeout)


def start_mixed(model_dir: str, log_dir: Path, prefill_flags: list[tuple[str, ...]], n_decode: int,
                env: dict[str, str] | None = None, decode_flags: tuple[str, ...] = ()
                ) -> tuple[list[Prefill], list[ServerHandle]]:
    """Start prefills (each with its own flags, e.g. one ``--prefill-role short``, one ``long``)
    and decodes in parallel; on any failure stop the ones that did start."""
    require_nixl()
    n_prefill = len(prefill_flags)
    ports = distinct_ports(2 * n_prefill + n_decode)
    with ThreadPoolExecutor(n_prefill + n_decode) as pool:
        p_futs = [pool.submit(start_prefill, model_dir, log_dir, *flags, env=env,
                              port=ports[2 * i], bootstrap_port=ports[2 * i + 1])
                  for i, flags in enumerate(prefill_flags)]
        d_futs = [pool.submit(start_decode, model_dir, log_dir, *decode_flags, env=env,
                              port=ports[2 * n_prefill + i]) for i in range(n_decode)]
        wait(p_futs + d_futs)
    prefills = [f.result() for f in p_futs if f.exception() is None]
    decodes = [f.result() for f in d_futs if f.exception() is None]
    errors = [f.exception() for f in p_futs + d_futs if f.exception() is not None]
    if errors:
        stop_all(prefills, decodes)
        raise errors[0]
    return prefills, decodes


# our router's admin API (/workers) is off without an admin key: tests give this one
ROUTER_ADMIN_KEY = "test-admin"
ROUTER_ADMIN_HEADERS = {"Authorization": f"Bearer {ROUTER_ADMIN_KEY}"}


@contextlib.contextmanager
def routed_cluster(model_dir: str, log_dir: Path, prefill_flags: list[tuple[str, ...]],
                   n_decode: int, router_flags: tuple[str, ...] = (),
                   env: dict[str, str] | None = None
                   ) -> Iterator[tuple[RouterHandle, list[Prefill], list[ServerHandle]]]:
    """start_mixed's servers behind our router; router and servers stopped on the way out."""
    prefills, decodes = start_mixed(model_dir, log_dir, prefill_flags, n_decode, env=env)
    router = None
    try:
        router = start_pd_router(prefills, decodes, log_dir, *router_flags)
        yield router, prefills, decodes
    finally:
        if router is not None:
            router.stop()
        stop_all(prefills, decodes)


def start_pd_router(prefills: list[Prefill], decodes: list[ServerHandle], log_dir: Path,
                    *extra: str, ready_timeout: float = 60.0) -> RouterHandle:
    """Our router (``python -m sglang_pd_router``) in front of the servers."""
    if "--admin-api-key" not in extra and "--api-key" not in extra:
        extra = ("--admin-api-key", ROUTER_ADMIN_KEY, *extra)
    return _launch_router("sglang_pd_router", prefills, decodes, log_dir, extra, "info", "/health",
                          ready_timeout)


async def read_sse_events(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict]:
    """POST ``body`` and return the JSON events of the SSE answer (200 asserted, [DONE] dropped)."""
    events = []
    async with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    return events


def metric_value(base_url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus sample ``name`` over the series whose labels include ``labels``
    (0 when none)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def greedy_reference(args: Any, prompts: list[list[int]], new: int, steps: int = 300
                     ) -> list[list[int]]:
    """Greedy tokens of ``prompts`` from an in-process colocated engine built from ``args``
    (the reference the TP and PD+TP parity tests compare against)."""
    from sglang_pd.engine.tp.inprocess import engine_core
    from sglang_pd.protocol import GenerateReq, SamplingParams

    params = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    with engine_core(args) as (core, _):
        for i, ids in enumerate(prompts):
            core.add_request(GenerateReq(rid=str(i), input_ids=ids, sampling_params=params))
        for _ in range(steps):
            for out in core.step():
                got[out.rid].extend(out.new_token_ids)
    return [got[str(i)] for i in range(len(prompts))]
