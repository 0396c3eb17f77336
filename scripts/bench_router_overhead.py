"""Router overhead on instant stub backends: ours (sglang_pd_router) vs smg (SGLang's router).

Stub prefill and decode servers (``python -m sglang_pd.bench.stub_server --first-ms 0
--itl-ms 0``) answer at once, so whatever a request spends beyond the direct-to-decode baseline is
the router's. Both routers run at once on the same stubs; in one run the script measures:

- added latency to the first byte and to the last, p50 and p99, on streamed ``/generate``:
  ``--rounds`` rounds of one request in flight at a time, each round visiting the direct path
  and every router once in a fresh random order (paired ordering: a neighbour's burst or a slow
  spell lands on all of them alike). Added = the router's percentile minus the direct path's.
  The direct requests also send the prefill stub the same request (``--baseline pair``, a
  router's prefill leg on raw sockets), so the stubs' core does the same work either way. One
  request at a time measures the path's own latency: before wave 3 session 6 this phase was an
  open loop at 500 req/s, which kept the core shared by the client and the stubs 0.75-0.94
  busy, so the direct path's own p99 was 9-31 ms and the "added" p99 was that core's queueing
  (negative in one run). ``--rate R`` still runs that open loop, printed apart;
- max requests/s: closed loop, non-streamed, ``--concurrency`` in flight, ``--slices`` turns
  per target in rotation, and each router's CPU time per request in that phase
  (``/proc/PID/stat`` utime+stime, all threads): the steadier measure when the machine is
  shared;
- first byte with a late prefill (``--first-ms`` = ``--late-ms`` on the prefill stub only): a
  router that streams decode's answer from its first byte stays near the baseline; one that
  waits for the prefill's response adds the prefill's delay.

smg used for the comparison: ``smg==1.13.0`` from PyPI (a Rust router wheel with no torch;
``pip install smg==1.13.0`` into the same venv). The script ends with ours/smg ratios for the
overhead bars (added first-byte p99, max req/s).

The router process is pinned to one core (``taskset -c 0``) and the stubs and client to the
other when the machine has two or more. Numbers are noisy on a shared machine: say so when
quoting them. Example: ``python scripts/bench_router_overhead.py --runs 3``. ``--ours-from PATH``
adds our router from another checkout (a ``git worktree`` of main, say) as a third router,
``base``, measured in the same rounds and rotation: the A/B of a change to our router's hot
path, with the ours/base ratios printed at the end of each run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from sglang_pd.utils.server_procs import free_port

BODY = {"text": "hello router", "sampling_params": {"max_new_tokens": 4}, "stream": True}


def pinned(cmd: list[str], core: int | None) -> list[str]:
    if core is None or shutil.which("taskset") is None:
        return cmd
    return ["taskset", "-c", str(core), *cmd]


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_stub(first_ms: float, core: int | None) -> Proc:
    """The project's one fake server (sglang_pd.bench.stub_server): instant tokens after
    ``first_ms``, with the info routes smg probes at start-up to detect an SGLang backend."""
    cmd = pinned([sys.executable, "-m", "sglang_pd.bench.stub_server", "--port", "0", "--first-ms",
                  str(first_ms), "--itl-ms", "0", "--lifetime", "900"], core)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("STUB_READY port="):
        proc.kill()
        raise RuntimeError(f"stub did not start: {line!r}")
    return Proc(f"stub({first_ms}ms)", proc, f"http://127.0.0.1:{line.split('=')[1].strip()}")


def start_router(kind: str, prefill: str, decode: str, core: int | None, log_dir: str,
                 ours_from: str | None = None) -> Proc:
    """``kind``: ours, smg, or base (ours from the checkout ``ours_from``: an A/B of two
    versions of our router in one run, e.g. ``--ours-from /tmp/main-worktree``)."""
    port = free_port()
    env = None
    if kind == "base":
        assert ours_from, "the base router needs --ours-from"
        root = os.path.abspath(ours_from)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.join(root, "router"), os.path.join(root, "python"),
             os.environ.get("PYTHONPATH", "")])}
    common = ["--pd-disaggregation", "--prefill", prefill, "8998", "--decode", decode,
              "--host", "127.0.0.1", "--port", str(port), "--prefill-policy", "round_robin",
              "--decode-policy", "round_robin"]
    if kind in ("ours", "base"):
        cmd = [sys.executable, "-m", "sglang_pd_router", *common, "--pool-controller", "off",
               "--log-level", "warning", "--max-concurrent-requests", "4096"]
    else:
        cmd = [sys.executable, "-m", "smg.launch_router", *common, "--log-level", "warn"]
    log = open(os.path.join(log_dir, f"{kind}_{port}.log"), "wb")
    proc = subprocess.Popen(pinned(cmd, core), stdout=log, stderr=subprocess.STDOUT, env=env)
    return Proc(kind, proc, f"http://127.0.0.1:{port}")


async def wait_ready(client: aiohttp.ClientSession, proc: Proc, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.proc.returncode}")
        try:
            async with client.post(proc.url + "/generate", json=BODY) as r:
                if r.status == 200:
                    await r.read()
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.3)
    raise TimeoutError(f"{proc.name} not ready in {limit_s}s")


@dataclass
class Samples:
    first: list[float] = field(default_factory=list)
    last: list[float] = field(default_factory=list)
    errors: int = 0


async def one_stream(client: aiohttp.ClientSession, url: str, out: Samples) -> None:
    t0 = time.perf_counter()
    try:
        async with client.post(url + "/generate", json=BODY) as r:
            first = None
            async for _ in r.content.iter_any():
                if first is None:
                    first = time.perf_counter() - t0
            if r.status != 200 or first is None:
                out.errors += 1
                return
        out.first.append(first)
        out.last.append(time.perf_counter() - t0)
    except aiohttp.ClientError:
        out.errors += 1


class _ShadowConn(asyncio.Protocol):
    """One keep-alive connection of the baseline's prefill shadow: writes a pre-built request
    and waits for the end of the chunked answer, parsing nothing else (cheap for the client)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.tail = b""
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-5:]
        if self.tail == b"0\r\n\r\n" and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("prefill stub closed the connection"))


class PrefillShadow:
    """The direct baseline's stand-in for a router's prefill leg: the same streamed request to
    the prefill stub for each baseline request, so the stubs' core carries the same stub work
    with and without a router (otherwise the routed runs' extra prefill-stub work on the shared
    core is charged to the router). Sent on raw keep-alive sockets so the client adds little."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        body = orjson.dumps(BODY)
        self.request = (f"POST /generate HTTP/1.1\r\nHost: {url.removeprefix('http://')}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                        ).encode() + body
        self.idle: list[_ShadowConn] = []
        self.errors = 0

    async def send(self) -> None:
        loop = asyncio.get_running_loop()
        conn: _ShadowConn | None = None
        try:
            if self.idle:
                conn = self.idle.pop()
            else:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(_ShadowConn, self.host, self.port), 10)
            assert conn is not None
            conn.tail, conn.done = b"", loop.create_future()
            assert conn.transport is not None
            conn.transport.write(self.request)
            await asyncio.wait_for(conn.done, 30)
            self.idle.append(conn)
        except (OSError, asyncio.TimeoutError):
            self.errors += 1
            if conn is not None and conn.transport is not None:
                conn.transport.close()

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()


async def open_loop(client: aiohttp.ClientSession, url: str, rate: float, duration: float,
                    shadow: PrefillShadow | None = None) -> Samples:
    out = Samples()
    tasks = []
    start = time.perf_counter()
    n = int(rate * duration)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if shadow is not None:
            tasks.append(asyncio.ensure_future(shadow.send()))
        tasks.append(asyncio.ensure_future(one_stream(client, url, out)))
    await asyncio.gather(*tasks)
    return out


async def closed_loop(client: aiohttp.ClientSession, url: str, concurrency: int,
                      duration: float) -> tuple[float, int]:
    body = {**BODY, "stream": False}
    done = 0
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            async with client.post(url + "/generate", json=body) as r:
                await r.read()
                done += r.status == 200

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0), done


def cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_busy() -> dict[int, tuple[int, int]]:
    """Per-core (busy, total) jiffies from /proc/stat (Linux), all processes."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                ticks = [int(v) for v in vals]
                idle = ticks[3] + ticks[4]  # idle + iowait
                out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def busy_share(before: dict[int, tuple[int, int]], core: int | None) -> float:
    """Share of ``core``'s time spent busy since ``before`` (nan when unknown)."""
    if core is None or core not in before:
        return float("nan")
    after = core_busy()[core]
    busy, total = after[0] - before[core][0], after[1] - before[core][1]
    return busy / total if total else float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass
class Target:
    """Where the latency phase sends a request: a router, or the decode stub directly (with
    the prefill shadow beside it, ``--baseline pair``)."""
    name: str
    url: str
    shadow: PrefillShadow | None = None
    samples: Samples = field(default_factory=Samples)


async def one_target(client: aiohttp.ClientSession, target: Target) -> None:
    if target.shadow is None:
        await one_stream(client, target.url, target.samples)
        return
    shadow = asyncio.ensure_future(target.shadow.send())
    await one_stream(client, target.url, target.samples)
    await shadow


async def sequential(client: aiohttp.ClientSession, targets: list[Target], rounds: int,
                     seed: int) -> None:
    """The latency phase: one request in flight at a time, each round visiting every target
    once in a fresh random order, so the direct path and both routers see the same moments of
    the machine (a neighbour's burst lands on all of them alike) and no request of ours queues
    behind another of ours. The client's collector is off meanwhile: its pauses are not a
    router's."""
    rng = random.Random(seed)
    order = list(targets)
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            rng.shuffle(order)
            for target in order:
                await one_target(client, target)
    finally:
        gc.enable()


async def interleaved_max(client: aiohttp.ClientSession, targets: list[tuple[str, str, int | None]],
                          concurrency: int, duration: float, slices: int
                          ) -> dict[str, tuple[float, float | None]]:
    """Max req/s per target (closed loop, ``concurrency`` in flight), the time split into
    ``slices`` turns per target taken in rotation, so a slow spell of the machine is shared;
    with each router's CPU per request (utime+stime, None for the direct path)."""
    done = {name: 0 for name, _, _ in targets}
    spent = {name: 0.0 for name, _, _ in targets}
    cpu = {name: 0.0 for name, _, _ in targets}
    for k in range(slices):
        turn = targets[k % len(targets):] + targets[:k % len(targets)]
        for name, url, pid in turn:
            cpu0 = cpu_s(pid) if pid is not None else 0.0
            t0 = time.perf_counter()
            _, n = await closed_loop(client, url, concurrency, duration / slices)
            spent[name] += time.perf_counter() - t0
            done[name] += n
            if pid is not None:
                cpu[name] += cpu_s(pid) - cpu0
    return {name: (done[name] / spent[name],
                   None if pid is None else cpu[name] / max(done[name], 1) * 1e6)
            for name, _, pid in targets}


@dataclass
class Row:
    name: str
    samples: Samples  # the latency phase (sequential, streamed)
    rps: float  # closed loop
    late: Samples | None  # late prefill (None for the baseline)
    cpu_us: float | None  # router CPU per request in the closed loop (None for the baseline)
    loaded: Samples | None = None  # the open loop at --rate (None when not run)
    seq_cpu_us: float | None = None  # router CPU per request in the latency phase


async def bench(args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    router_core, other_core = (0, 1) if cores >= 2 and not args.no_pin else (None, None)
    if other_core is not None:
        os.sched_setaffinity(0, {other_core})
    log_dir = args.log_dir
    os.makedirs(log_dir, exist_ok=True)
    fast_prefill = start_stub(0, other_core)
    late_prefill = start_stub(args.late_ms, other_core)
    decode = start_stub(0, other_core)
    procs = [fast_prefill, late_prefill, decode]
    kinds = [k for k in args.routers if k != "smg" or _has_smg()]
    if args.ours_from:
        kinds.append("base")
    if len(kinds) < len(args.routers):
        print("smg is not installed (pip install smg): skipped")
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as client:
            await wait_ready(client, decode)
            shadow = None if args.baseline == "decode" else PrefillShadow(fast_prefill.url)
            direct = Target("direct (baseline)", decode.url, shadow)
            routers = {k: start_router(k, fast_prefill.url, decode.url, router_core, log_dir,
                                       args.ours_from) for k in kinds}  # both up at once, idle while the other is measured
            procs.extend(routers.values())
            targets = [direct]
            for kind, router in routers.items():
                await wait_ready(client, router)
                targets.append(Target(kind, router.url, None))
            await sequential(client, targets, args.warmup_rounds, args.seed)  # warm-up
            for t in targets:
                t.samples = Samples()
            ticks = core_busy()
            cpu0 = {k: cpu_s(r.proc.pid) for k, r in routers.items()}
            await sequential(client, targets, args.rounds, args.seed + 1)
            busy = (busy_share(ticks, router_core), busy_share(ticks, other_core))
            seq_cpu = {k: (cpu_s(r.proc.pid) - cpu0[k]) / max(args.rounds, 1) * 1e6
                       for k, r in routers.items()}  # us per request, one at a time
            loaded: dict[str, Samples] = {}
            if args.rate > 0:  # the old phase: a fixed open-loop rate, near saturation here
                for t in targets:
                    loaded[t.name] = await open_loop(client, t.url, args.rate, args.duration,
                                                     t.shadow)
            if shadow is not None:
                shadow.close()
                direct.samples.errors += shadow.errors
            rates = await interleaved_max(
                client, [(t.name, t.url, routers[t.name].proc.pid if t.name in routers
                          else None) for t in targets],
                args.concurrency, args.duration, args.slices)
            for router in routers.values():
                router.stop()
            rows = []
            for t in targets:
                late_samples = None
                if t.name in routers:
                    late = start_router(t.name, late_prefill.url, decode.url, router_core,
                                        log_dir, args.ours_from)
                    procs.append(late)
                    await wait_ready(client, late)
                    late_samples = Samples()
                    for _ in range(args.late_requests):
                        await one_stream(client, late.url, late_samples)
                    late.stop()
                rps, cpu_us = rates[t.name]
                rows.append(Row(t.name, t.samples, rps, late_samples, cpu_us,
                                loaded.get(t.name), seq_cpu.get(t.name)))
    finally:
        for p in procs:
            p.stop()
    print_table(rows, direct.samples, busy, args)


def _has_smg() -> bool:
    return importlib.util.find_spec("smg") is not None


def print_table(rows: list[Row], base: Samples, busy: tuple[float, float],
                args: argparse.Namespace) -> None:
    ms = 1000.0
    print(f"\nlatency: {args.rounds} rounds, one streamed /generate (4 tokens) in flight at a "
          f"time, targets in a random order each round; busy in that phase: router core "
          f"{busy[0]:.2f}, client+stubs core {busy[1]:.2f} (all processes); max req/s: closed "
          f"loop, {args.concurrency} in flight, {args.slices} turns each in rotation; late "
          f"prefill: {args.late_ms:g} ms, {args.late_requests} sequential requests; cpu us 1x: the "
          f"router's CPU per request in the latency phase, cpu us/req: in the max req/s phase")
    print(f"{'router':<18} {'n':>6} {'err':>4} {'+first p50':>11} {'+first p99':>11} "
          f"{'+last p50':>10} {'+last p99':>10} {'cpu us 1x':>9} {'max req/s':>10} "
          f"{'cpu us/req':>10} {'late-prefill first p50':>23}")

    def added(values: list[float], ref: list[float], q: float) -> str:
        return f"{(pct(values, q) - pct(ref, q)) * ms:.2f}"

    for r in rows:
        s, late, cpu = r.samples, r.late, r.cpu_us
        late_text = "-" if late is None else (
            f"{statistics.median(late.first) * ms:.1f} ms" if late.first else "errors")
        print(f"{r.name:<18} {len(s.first):>6} {s.errors:>4} {added(s.first, base.first, 50):>11} "
              f"{added(s.first, base.first, 99):>11} {added(s.last, base.last, 50):>10} "
              f"{added(s.last, base.last, 99):>10} "
              f"{'-' if r.seq_cpu_us is None else f'{r.seq_cpu_us:.0f}':>9} {r.rps:>10.0f} "
              f"{'-' if cpu is None else f'{cpu:.0f}':>10} {late_text:>23}")
    loaded_base = rows[0].loaded
    if loaded_base is not None:
        print(f"open loop at {args.rate:g} req/s for {args.duration:g} s (added to the direct "
              f"path's percentiles; near this machine's saturation, so mostly queueing):")
        for r in rows:
            if r.loaded is not None:
                print(f"  {r.name:<18} n {len(r.loaded.first)} err {r.loaded.errors} +first "
                      f"p50 {added(r.loaded.first, loaded_base.first, 50)} p99 "
                      f"{added(r.loaded.first, loaded_base.first, 99)} ms")
    by_name = {r.name: r for r in rows}
    if "ours" in by_name and "smg" in by_name:
        ours, smg = by_name["ours"], by_name["smg"]
        p99 = [(pct(x.samples.first, 99) - pct(base.first, 99)) * ms for x in (ours, smg)]
        ratio = p99[0] / p99[1] if p99[1] > 0 else float("inf")
        cpu_ratio = (ours.cpu_us or 0.0) / (smg.cpu_us or float("nan"))
        print(f"ours/smg: added first p99 {p99[0]:.2f}/{p99[1]:.2f} ms = {ratio:.2f}x "
              f"(bar: under 2 ms and at most 1.5x); max req/s {ours.rps / smg.rps:.2f}x "
              f"(bar: at least 0.9x); cpu/request {cpu_ratio:.2f}x")
    if "ours" in by_name and "base" in by_name:
        ours, old = by_name["ours"], by_name["base"]
        p50 = [(pct(x.samples.first, 50) - pct(base.first, 50)) * ms for x in (ours, old)]
        p99 = [(pct(x.samples.first, 99) - pct(base.first, 99)) * ms for x in (ours, old)]
        print(f"ours/base (--ours-from {args.ours_from}): added first p50 {p50[0]:.2f}/"
              f"{p50[1]:.2f} ms, p99 {p99[0]:.2f}/{p99[1]:.2f} ms; max req/s "
              f"{ours.rps / old.rps:.2f}x; cpu/request one at a time "
              f"{(ours.seq_cpu_us or 0.0) / (old.seq_cpu_us or float('nan')):.2f}x, in the max "
              f"phase {(ours.cpu_us or 0.0) / (old.cpu_us or float('nan')):.2f}x")
    print(f"(baseline absolute: first p50 {pct(base.first, 50) * ms:.2f} ms, "
          f"p99 {pct(base.first, 99) * ms:.2f} ms; added = router percentile - baseline's)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2000,
                   help="latency phase: rounds of one request to each target, in turn")
    p.add_argument("--warmup-rounds", type=int, default=200)
    p.add_argument("--seed", type=int, default=35)
    p.add_argument("--rate", type=float, default=0.0,
                   help="also an open loop at this rate per target (the measurement before "
                   "wave 3 session 6; 0: not run)")
    p.add_argument("--duration", type=float, default=5.0,
                   help="seconds of the max req/s phase per target (and of the open loop)")
    p.add_argument("--slices", type=int, default=5,
                   help="max req/s: turns per target, taken in rotation")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--late-ms", type=float, default=500.0)
    p.add_argument("--late-requests", type=int, default=10)
    p.add_argument("--routers", nargs="+", default=["ours", "smg"], choices=["ours", "smg"])
    p.add_argument("--ours-from", metavar="PATH",
                   help="also run our router from the checkout at PATH (its router/ and "
                   "python/ first on PYTHONPATH) as 'base', interleaved with the others in "
                   "every phase: an A/B of two versions in one run")
    p.add_argument("--baseline", choices=["pair", "decode"], default="pair",
                   help="pair: each direct request also sends the prefill stub the same request "
                   "(a router's prefill leg), so the stubs' core does the same work in every "
                   "phase; decode: the decode stub only (the measurement before wave 3 session 5)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    p.add_argument("--log-dir", default="/tmp/bench_router_overhead")
    p.add_argument("--runs", type=int, default=1,
                   help="repeat the whole measurement (fresh stubs and routers) this many times")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    for run in range(args.runs):
        if args.runs > 1:
            print(f"\n=== run {run + 1} of {args.runs}")
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
