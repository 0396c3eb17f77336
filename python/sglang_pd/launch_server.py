"""Start a server: ``python -m sglang_pd.launch_server --model-path DIR [--mode ...] --port P``.

Process layout: this process runs the HTTP server and the TokenizerManager; the engine runs
in a spawned child. The child is a daemon, and it also watches for our death, so it never
outlives the server. Shutdown on SIGTERM/SIGINT: stop accepting, give in-flight requests a
bounded grace period, ask the engine to exit, join it (kill it if it hangs), remove the ipc
directory, exit 0.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any
from collections.abc import Callable

import uvicorn

from sglang_pd.entrypoints.http_server import create_app
from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.frontend.tokenizer import TokenizerBundle, TokenizerLoadError, load_tokenizer
from sglang_pd.frontend.tokenizer_manager import TokenizerManager
from sglang_pd.protocol import EngineReady, decode_engine_ready
from sglang_pd.server_args import ServerArgs, parse_server_args
from sglang_pd.utils.logging_setup import setup_logging

logger = logging.getLogger("sglang_pd.launch_server")

EngineEntry = Callable[[ServerArgs, Connection], None]
DEFAULT_ENGINE_ENTRY = "sglang_pd.engine.engine_process:run_engine_process"
# Internal knobs (deliberately not CLI flags): tests swap in a fake engine with the first.
ENGINE_ENTRY_ENV = "SGLANG_PD_ENGINE_ENTRY"  # "package.module:function"
ENGINE_READY_TIMEOUT_ENV = "SGLANG_PD_ENGINE_READY_TIMEOUT_S"
SHUTDOWN_GRACE_ENV = "SGLANG_PD_SHUTDOWN_GRACE_S"
DRAIN_MARGIN_S = 0.5  # answer the stragglers this long before uvicorn's grace ends
ENGINE_JOIN_TIMEOUT_S = 10.0


class EngineStartError(RuntimeError):
    pass


class ListenError(RuntimeError):
    pass


class _StopRequested(BaseException):
    """Raised by our signal handler while we are still starting up (before uvicorn)."""


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def resolve_engine_entry(entry: str | EngineEntry | None = None) -> EngineEntry:
    """The engine process target: a callable, "module:function", or the env/default one."""
    if callable(entry):
        return entry
    spec = entry or os.environ.get(ENGINE_ENTRY_ENV) or DEFAULT_ENGINE_ENTRY
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise EngineStartError(f"engine entry must look like 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EngineStartError(f"cannot import engine module {module_name!r}: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise EngineStartError(f"{module_name!r} has no function {func_name!r}")
    return func


def start_engine(server_args: ServerArgs, entry: EngineEntry) -> tuple[BaseProcess, Connection]:
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=entry, args=(server_args, child_conn), daemon=True,
                       name="sglang-pd-engine")
    proc.start()
    child_conn.close()  # so recv() sees EOF if the child dies before answering
    return proc, parent_conn


def wait_engine_ready(proc: BaseProcess, conn: Connection, timeout: float) -> EngineReady:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if conn.poll(0.2):
                ready = decode_engine_ready(conn.recv_bytes())
                if not ready.ok:
                    raise EngineStartError(f"the engine failed to start: {ready.error}")
                return ready
        except (EOFError, OSError):
            pass  # the child closed its end: it died; reported below
        if not proc.is_alive():
            proc.join(1.0)
            raise EngineStartError(f"the engine process exited with code {proc.exitcode} "
                                   "before it was ready (see its log above)")
        if time.monotonic() > deadline:
            raise EngineStartError(f"the engine was not ready within {timeout:g}s "
                                   f"(raise {ENGINE_READY_TIMEOUT_ENV} for slow loads)")


def stop_engine(proc: BaseProcess, timeout: float = ENGINE_JOIN_TIMEOUT_S) -> None:
    proc.join(timeout)
    if proc.is_alive():
        logger.warning("engine did not exit within %gs; terminating it", timeout)
        proc.terminate()
        proc.join(5.0)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _remove_ipc_dir(server_args: ServerArgs) -> None:
    ipc = server_args.ipc_dir
    if os.path.basename(os.path.normpath(ipc)).startswith("sglang_pd_ipc_"):
        shutil.rmtree(ipc, ignore_errors=True)  # the directory ServerArgs created for us
        return
    for name in ("to_engine", "to_frontend"):  # a user-given directory: only our sockets
        try:
            os.remove(os.path.join(ipc, name))
        except OSError:
            pass


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP port before the engine loads, so a taken port fails in seconds."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e}") from e
    sock.set_inheritable(False)  # the engine child must not hold the port open
    return sock


@dataclass
class _Signals:
    """Signal handling across the phases of a server's life (no module globals).

    Start-up: a signal aborts loading (``_StopRequested``). Serving: uvicorn installs its own
    handlers; around them ours only record the request and tell uvicorn to exit, which also
    covers a signal that lands just before uvicorn takes over.
    """

    server: uvicorn.Server | None = None
    stop_requested: bool = False
    originals: dict[int, Any] = field(default_factory=dict)

    def install(self, handler: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # programmatic use from a worker thread: the caller owns signals
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(sig, handler)
            self.originals.setdefault(sig, previous)

    def restore(self) -> None:
        for sig, handler in self.originals.items():
            signal.signal(sig, handler)
        self.originals.clear()

    def raise_stop(self, signum: int, frame: Any) -> None:
        raise _StopRequested(signum)

    def note_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True
        if self.server is not None:
            self.server.should_exit = True


async def _serve(server_args: ServerArgs, engine_info: EngineReady,
                 tokenizer: TokenizerBundle | None, proc: BaseProcess,
                 sock: socket.socket, signals: _Signals) -> int:
    model_name = server_args.served_model_name or engine_info.served_model_name or \
        server_args.model_path
    tm = TokenizerManager(server_args, engine_info, tokenizer, FrontendMetrics(model_name),
                          engine_alive=proc.is_alive)
    app = create_app(server_args, tm)
    config = uvicorn.Config(app, host=server_args.host, port=server_args.port, log_config=None,
                            access_log=server_args.log_requests, lifespan="off",
                            timeout_graceful_shutdown=max(int(_env_float(SHUTDOWN_GRACE_ENV, 30)), 1))
    server = uvicorn.Server(config)
    signals.server = server
    server.should_exit = signals.stop_requested
    exit_code = 0

    def on_engine_death() -> None:
        nonlocal exit_code
        if server.should_exit:
            # Shutdown was already underway (e.g. the whole process group got SIGTERM).
            logger.info("the engine exited during shutdown")
            return
        logger.error("the engine process died; shutting the server down (exit code 1)")
        exit_code = 1
        server.should_exit = True

    tm.on_engine_death = on_engine_death
    grace = _env_float(SHUTDOWN_GRACE_ENV, 30)

    async def end_drain() -> None:
        """Uvicorn cancels handlers when its grace period ends (plain-text 500s, cut streams):
        just before that, fail what is still running so each client gets a JSON error or a
        final SSE error event."""
        while not server.should_exit:
            await asyncio.sleep(0.1)
        await asyncio.sleep(max(grace - DRAIN_MARGIN_S, 0.0))
        tm.fail_all(503, "the server is shutting down (drain period over); retry elsewhere")

    await tm.start()
    drain = asyncio.create_task(end_drain(), name="end-drain")
    try:
        logger.info("sglang-pd ready: http://%s:%d model=%s mode=%s context_length=%d",
                    server_args.host, server_args.port, model_name,
                    server_args.disaggregation_mode, engine_info.context_length)
        await server.serve(sockets=[sock])
        if not server.started and exit_code == 0:
            exit_code = 1  # uvicorn could not start; it logged why
    finally:
        drain.cancel()
        logger.info("shutting down: stopping the engine")
        await tm.shutdown_engine()
        await tm.close()
    return exit_code


def launch_server(server_args: ServerArgs, engine_entry: str | EngineEntry | None = None) -> int:
    """Run a server until SIGTERM/SIGINT; returns the process exit code (0 = clean).

    ``engine_entry`` (internal) replaces the engine process target, e.g. with a fake
    engine in tests; ``SGLANG_PD_ENGINE_ENTRY=module:function`` does the same.
    """
    setup_logging(server_args.log_level)
    proc: BaseProcess | None = None
    sock: socket.socket | None = None
    signals = _Signals()
    signals.install(signals.raise_stop)
    try:
        sock = bind_listen_socket(server_args.host, server_args.port)
        tokenizer = None
        if not server_args.skip_tokenizer_init:
            tokenizer = load_tokenizer(server_args.tokenizer_dir)
        entry = resolve_engine_entry(engine_entry)
        proc, conn = start_engine(server_args, entry)
        engine_info = wait_engine_ready(proc, conn,
                                        _env_float(ENGINE_READY_TIMEOUT_ENV, 1800.0))
        conn.close()
        signals.install(signals.note_stop)
        return _run_loop(_serve(server_args, engine_info, tokenizer, proc, sock, signals))
    except (EngineStartError, TokenizerLoadError, ListenError) as e:
        logger.error("%s", e)
        return 1
    except _StopRequested:
        logger.info("stopped during start-up")
        return 0
    finally:
        signals.install(signals.note_stop)  # cleanup below is bounded; let it finish
        if sock is not None:
            sock.close()
        if proc is not None:
            stop_engine(proc)
            logger.info("engine process stopped (exit code %s)", proc.exitcode)
        _remove_ipc_dir(server_args)
        signals.restore()


def _run_loop(coro: Any) -> int:
    try:
        import uvloop
        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # uvloop is optional (e.g. Windows)
        factory = None
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    if factory is not None:  # pragma: no cover - Python 3.10
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return asyncio.run(coro)  # pragma: no cover


def main(argv: list[str] | None = None) -> None:
    try:
        server_args = parse_server_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(launch_server(server_args))


if __name__ == "__main__":
    main()
