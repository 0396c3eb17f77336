"""A real server with dual prefill queues: outputs equal the single-queue server's, /get_load
reports the per-class signals, the role switches at runtime, SLO counters count per class."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from conftest import SMALL_SERVER_FLAGS
from server_utils import start_server

SHORT = {"input_ids": list(range(3, 13)), "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
LONG = {"input_ids": [(7 * i) % 200 + 3 for i in range(90)],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


def _counter(text: str, name: str, cls: str) -> float:
    m = re.search(rf'^{re.escape(name)}\{{[^}}]*request_class="{cls}"[^}}]*\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_dual_queue_server_signals_role_and_slo_counters(tiny_model_dir: str, colocated_server,
                                                         tmp_path: Path) -> None:
    server = start_server(tiny_model_dir, tmp_path, "--prefill-queues", "dual",
                          "--short-prefill-threshold", "32", "--slo-ttft-ms", "60000",
                          *SMALL_SERVER_FLAGS)
    try:
        url = server.base_url
        for body in (SHORT, LONG):
            mine = httpx.post(url + "/generate", json=body, timeout=60).json()
            ref = httpx.post(colocated_server.base_url + "/generate", json=body, timeout=60).json()
            assert mine["output_ids"] == ref["output_ids"]  # the queues change order, not tokens
        load = httpx.get(url + "/get_load", timeout=10).json()
        assert load["prefill_role"] == "both" and load["short_prefill_threshold"] == 32
        for name in ("num_queue_reqs_short", "num_queue_prefill_tokens_long", "slo_ttft_deviation_short",
                     "busy_fraction"):
            assert name in load
        assert load["slo_ttft_deviation_short"] < 0  # far inside a 60 s SLO
        assert 0 < load["busy_fraction"] <= 1
        r = httpx.post(url + "/set_prefill_role", json={"role": "long"}, timeout=10)
        assert r.status_code == 200 and r.json() == {"prefill_role": "long"}
        assert httpx.get(url + "/get_load", timeout=10).json()["prefill_role"] == "long"
        bad = httpx.post(url + "/set_prefill_role", json={"role": "medium"}, timeout=10)
        assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
        # still serves both classes after the switch
        assert httpx.post(url + "/generate", json=SHORT, timeout=60).status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert _counter(metrics, "sglang:slo_ttft_met_total", "short") == 2
        assert _counter(metrics, "sglang:slo_ttft_met_total", "long") == 1
        assert _counter(metrics, "sglang:slo_ttft_missed_total", "short") == 0
        assert re.search(r"^sglang:num_queue_reqs_short\{", metrics, re.M)
    finally:
        server.stop()


def test_role_switch_needs_dual_queues(colocated_server) -> None:
    r = httpx.post(colocated_server.base_url + "/set_prefill_role", json={"role": "short"}, timeout=10)
    assert r.status_code == 400 and "--prefill-queues dual" in r.json()["error"]["message"]
