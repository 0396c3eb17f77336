"""A prefill policy may hold (a batching window): nothing is aborted, the engine loop sleeps
instead of spinning, and the requests complete once the hold ends. Colocated and PD prefill
servers, with the test-only plugin policy test/plugins/hold_policy.py (holds 50 ms)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx

from pd_utils import _descendants, async_client, pd_request, start_decode, start_prefill, stop_all
from server_utils import ServerHandle, start_server

PLUGIN_ENV = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "plugins"),
                                             os.environ.get("PYTHONPATH", "")]),
              "SGLANG_PD_POLICY_PLUGINS": "hold_policy"}
HOLD_S = 0.05
N_REQUESTS = 20
BODY = {"input_ids": [11, 12, 13, 14, 15], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _engine_pid(server: ServerHandle) -> int:
    children = _descendants(server.proc.pid)
    assert children, "the engine process should be a child of the server"
    return max(children, key=_cpu_s)  # the engine (the busiest child: it loaded the model)


def _report(label: str, cpu_s: float, held_s: float) -> None:
    print(f"\n[{label}] engine CPU {cpu_s * 1e3:.0f} ms over {N_REQUESTS} holds of {HOLD_S * 1e3:.0f} ms "
          f"({held_s * 1e3:.0f} ms held): {cpu_s / held_s:.0%} of the hold time")


def test_hold_on_colocated_server(tiny_model_dir: str, tmp_path: Path) -> None:
    # one intra-op thread: idle OpenMP workers spin-wait after each op and would blur the figure
    server = start_server(tiny_model_dir, tmp_path, "--schedule-policy", "test-hold",
                          env={**PLUGIN_ENV, "OMP_NUM_THREADS": "1"})
    try:
        engine = _engine_pid(server)
        cpu0 = _cpu_s(engine)
        for _ in range(N_REQUESTS):
            t0 = time.monotonic()
            r = httpx.post(server.base_url + "/generate", json=BODY, timeout=30)
            assert r.status_code == 200, r.text
            assert len(r.json()["output_ids"]) == 2  # completed after its hold, not aborted
            assert time.monotonic() - t0 >= HOLD_S  # it did wait its window
        cpu_s = _cpu_s(engine) - cpu0
        _report("colocated", cpu_s, N_REQUESTS * HOLD_S)
        # a spinning loop burns the whole hold (>= 100%); a sleeping one a small part of it
        assert cpu_s < 0.6 * N_REQUESTS * HOLD_S
    finally:
        server.stop()


def test_hold_on_prefill_server(tiny_model_dir: str, tmp_path: Path) -> None:
    prefill = start_prefill(tiny_model_dir, tmp_path, "--schedule-policy", "test-hold", env=PLUGIN_ENV)
    decode = start_decode(tiny_model_dir, tmp_path)
    try:
        engine = _engine_pid(prefill.server)

        async def run() -> float:
            cpu0 = _cpu_s(engine)
            async with async_client() as client:
                for _ in range(N_REQUESTS):
                    res = await pd_request(client, prefill, decode.base_url, BODY)
                    assert res.prefill_status == 200, res.prefill_body
                    assert res.decode_status == 200, res.decode_body
                    assert len(res.decode_body["output_ids"]) == 2
            return _cpu_s(engine) - cpu0

        cpu_s = asyncio.run(run())
        _report("prefill", cpu_s, N_REQUESTS * HOLD_S)
        assert cpu_s < 0.6 * N_REQUESTS * HOLD_S
    finally:
        stop_all([prefill], [decode])
