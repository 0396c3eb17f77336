"""Stage pd: prefill/decode disaggregation over NIXL (VRAM to VRAM on one GPU, two processes)
against colocated serving. Greedy outputs of a prefill + decode pair, driven the way SGLang's
router drives them (the same body to both, with bootstrap host/port/room), must equal the
colocated server's token for token, and both sides' KV pages must come back afterwards.

nixl-cu13 is 59 MB: it does not travel with the tree in one call (64 MiB), so this stage runs
only where NIXL was carried (docs/gpu.md section 3.5: two halves in two calls) and imports."""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sglang_pd.tools.gpu_check.common import Ctx, Skip, attempt
from sglang_pd.tools.gpu_check.serving_stage import START_TIMEOUT_S, STOP_GRACE_S, _exit_on_term
from sglang_pd.utils.server_procs import free_port, require_healthy, spawn_logged, stop

PROMPT_LENS = (3, 17, 64, 65, 200, 513, 900, 1500)
GREEDY = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
# small pages and chunks: a prompt spans many pages and chunks, so transfers are exercised
FLAGS = ("--page-size", "16", "--chunked-prefill-size", "256", "--max-total-tokens", "65536")


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 6000) for _ in range(n)] for n in PROMPT_LENS]


def post(url: str, body: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500]


def get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def start(ctx: Ctx, mode: str, extra: tuple[str, ...] = ()) -> tuple[Any, str]:
    import sys

    port = free_port()
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", str(ctx.tiny_model),
           "--host", "127.0.0.1", "--port", str(port), "--device", ctx.device,
           "--dtype", ctx.dtype_name, "--attention-backend", "torch" if ctx.dry_run else "triton",
           "--mode", mode, *FLAGS, *extra]
    return spawn_logged(cmd, ctx.work / f"pd_{mode}.log"), f"http://127.0.0.1:{port}"


def reference(ctx: Ctx, batch: list[list[int]]) -> list[list[int]]:
    proc, url = start(ctx, "colocated")
    try:
        require_healthy(url, proc, START_TIMEOUT_S)
        with ThreadPoolExecutor(len(batch)) as pool:
            outs = list(pool.map(lambda ids: post(url + "/generate", {"input_ids": ids,
                                                                        "sampling_params": GREEDY}),
                                 batch))
    finally:
        stop(proc, STOP_GRACE_S)
    bad = [o for o in outs if o[0] != 200]
    if bad:
        raise RuntimeError(f"colocated answered {bad[0][0]}: {bad[0][1]}")
    return [o[1]["output_ids"] for o in outs]


def pages_back(url: str, expected: int, timeout_s: float = 10.0) -> bool:
    """True once the server's free pages are back to ``expected`` with no request left (the
    last transfers' pages are released after their done notices), False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load = get(url + "/get_load")
        if load["num_free_pages"] == expected and load["num_reqs"] == 0:
            return True
        time.sleep(0.1)
    return False


def run_pd(ctx: Ctx, batch: list[list[int]], ref: list[list[int]]) -> dict[str, Any]:
    boot = free_port()
    prefill, p_url = start(ctx, "prefill", ("--disaggregation-bootstrap-port", str(boot)))
    decode, d_url = None, ""
    try:
        decode, d_url = start(ctx, "decode")
        require_healthy(p_url, prefill, START_TIMEOUT_S)
        require_healthy(d_url, decode, START_TIMEOUT_S)
        pages0 = {"prefill": get(p_url + "/get_load")["num_free_pages"],
                  "decode": get(d_url + "/get_load")["num_free_pages"]}

        def one(ids: list[int]) -> tuple[int, Any, int, Any]:
            body = {"input_ids": ids, "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1",
                    "bootstrap_port": boot, "bootstrap_room": random.getrandbits(63)}
            with ThreadPoolExecutor(2) as two:
                pf = two.submit(post, p_url + "/generate", body)
                df = two.submit(post, d_url + "/generate", body)
                return (*pf.result(), *df.result())

        t0 = time.monotonic()
        with ThreadPoolExecutor(len(batch)) as pool:
            outs = list(pool.map(one, batch))
        wall = time.monotonic() - t0
        got = [o[3]["output_ids"] if o[2] == 200 else None for o in outs]
        back = {"prefill": pages_back(p_url, pages0["prefill"]),
                "decode": pages_back(d_url, pages0["decode"])}
    finally:
        for proc in (decode, prefill):
            if proc is not None:
                stop(proc, STOP_GRACE_S)
    return {"statuses": [[o[0], o[2]] for o in outs], "identical": sum(g == r for g, r in zip(got, ref)),
            "prompts": len(ref), "wall_s": round(wall, 3), "free_pages": pages0, "pages_back": back,
            "errors": [str(o[3])[:300] for o in outs if o[2] != 200]}


def run(ctx: Ctx, rec: Any) -> str:
    importable = importlib.util.find_spec("nixl") is not None
    rec.data.update(nixl_importable=importable)
    if not importable:
        raise Skip("skipped: NIXL not present (nixl-cu13 is 59 MB, over what one call carries "
                   "with the tree: carry it in two halves, docs/gpu.md section 3.5)")
    signal.signal(signal.SIGTERM, _exit_on_term)  # unwind through finally: servers stopped
    batch = prompts()
    ref = attempt(rec, "colocated", lambda: {"greedy": reference(ctx, batch)})
    if "error" in ref:
        rec.piece["status"] = "fail"
        return f"colocated reference failed: {ref['error'][:150]}"
    pd = attempt(rec, "pd_nixl", lambda: run_pd(ctx, batch, ref["greedy"]))
    if "error" in pd:
        rec.piece["status"] = "fail"
        return f"PD failed: {pd['error'][:200]}"
    back = all(pd["pages_back"].values())
    if pd["identical"] != pd["prompts"] or not back:
        rec.piece["status"] = "fail"
    return (f"NIXL PD vs colocated: {pd['identical']}/{pd['prompts']} identical, "
            f"{len(pd['errors'])} errors, {pd['wall_s']} s, pages back on both sides: {back}")
