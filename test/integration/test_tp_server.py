"""--tp-size 2 through the real server (frontend, rank 0, rank 1 on CPU with gloo), on the tiny
llama with one KV head (replicated on both ranks): HTTP greedy equals --tp-size 1; SIGTERM with
a request in flight drains it and stops every rank; a rank that dies takes the server down
(exit, /health fails, no process left); an N the heads do not allow is refused at start."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
from pd_utils import _descendants, greedy_reference, load, tp_rank_pids, wait_until
from server_utils import start_server
from sglang_pd.server_args import ServerArgs

FLAGS = ("--tp-size", "2", "--page-size", "4", "--chunked-prefill-size", "64",
         "--max-total-tokens", "4096")
PROMPTS = [[11, 12, 13], list(range(100, 170)), list(range(3000, 3017))]
NEW = 10


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False



def _generate(base_url: str, ids: list[int], n: int = NEW, timeout: float = 60) -> httpx.Response:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0,
                                                  "ignore_eos": True}}
    return httpx.post(base_url + "/generate", json=body, timeout=timeout)


def _tp1_reference(model_dir: str) -> list[list[int]]:
    args = ServerArgs(model_path=model_dir, page_size=4, max_total_tokens=4096, dtype="float32")
    return greedy_reference(args, PROMPTS, NEW, steps=200)


def test_tp2_server_equals_tp1_and_sigterm_drains_every_rank(tiny_llama_kv1: str, tmp_path) -> None:
    want = _tp1_reference(tiny_llama_kv1)
    server = start_server(tiny_llama_kv1, tmp_path, *FLAGS)
    try:
        tree = _descendants(server.proc.pid)
        assert len(tp_rank_pids(server.proc.pid)) == 1, server.log()[-3000:]
        for ids, expected in zip(PROMPTS, want):
            r = _generate(server.base_url, ids)
            assert r.status_code == 200, r.text
            assert r.json()["output_ids"] == expected
        # SIGTERM with a long request in flight: it finishes, then every rank stops
        result: dict[str, httpx.Response] = {}
        t = threading.Thread(target=lambda: result.setdefault("r", _generate(
            server.base_url, [5, 6, 7], n=150, timeout=120)))
        t.start()
        wait_until(lambda: load(server.base_url)["num_running_reqs"] > 0, 30, "the request runs")
        server.proc.send_signal(signal.SIGTERM)
        t.join(120)
        assert result["r"].status_code == 200, result["r"].text
        assert len(result["r"].json()["output_ids"]) == 150
        assert server.proc.wait(60) == 0
        # a rank the engine could not wait for (the frontend's join gave up first under load)
        # ends through its parent-death signal: within seconds, never left behind
        wait_until(lambda: not [p for p in tree if _alive(p)], 15, "every rank to exit with its server")
    finally:
        server.stop()


def test_a_dead_rank_takes_the_server_down(tiny_llama_kv1: str, tmp_path) -> None:
    server = start_server(tiny_llama_kv1, tmp_path, *FLAGS)
    try:
        tree = _descendants(server.proc.pid)
        (worker,) = tp_rank_pids(server.proc.pid)
        result: dict[str, object] = {}

        def call() -> None:
            try:
                result["r"] = _generate(server.base_url, [5, 6, 7], n=400, timeout=60)
            except httpx.HTTPError as e:
                result["r"] = e

        t = threading.Thread(target=call)
        t.start()
        wait_until(lambda: load(server.base_url)["num_running_reqs"] > 0, 30, "the request runs")
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        code = server.proc.wait(30)
        took = time.monotonic() - start
        t.join(30)
        # proc.wait(30) is the hang guard; how fast it exits is printed, not asserted (no timing
        # bars in the suite: issue 32)
        print(f"server exited in {took:.1f}s (code {code})")
        assert code != 0, (code, took)
        r = result["r"]  # the client gets an error, not a hang and not a full answer
        assert isinstance(r, httpx.HTTPError) or r.status_code >= 500, r
        with pytest.raises(httpx.HTTPError):
            httpx.get(server.base_url + "/health", timeout=2)
        wait_until(lambda: not [p for p in tree if _alive(p)], 10, "every rank exits")
    finally:
        server.stop()


def test_tp_size_the_heads_do_not_allow_is_refused_at_start(tiny_model_dir: str, tmp_path) -> None:
    with pytest.raises(RuntimeError, match="exited with 1") as info:
        start_server(tiny_model_dir, tmp_path, "--tp-size", "3", ready_timeout=120)
    assert "--tp-size 3 cannot split this LlamaForCausalLM model" in str(info.value)
