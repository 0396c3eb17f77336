"""Hostile-input fuzzer for a running server: no request may get a 5xx, kill the engine, or leak.

Cases (built in fuzz_cases.py) are valid bodies of /generate, /v1/completions,
/v1/chat/completions and /abort_request with one field (top level or inside sampling_params /
messages) replaced by a hostile value (wrong types, strings for booleans, NaN, huge and tiny
numbers, huge strings and lists, deep nesting), fields dropped, unknown fields added, and raw bodies (broken JSON, NaN literals,
non-objects, invalid UTF-8, oversized). Afterwards the server must answer /health and have
every KV page free again. With a prefill (PD, as a router sends them) its half is checked the
same way: no 5xx or timeout, no answer left open, its pages back, healthy. Deterministic for a seed.

  python -m sglang_pd.tools.fuzz_http --url http://127.0.0.1:30000 --cases 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from .fuzz_cases import VALID, Case, _pin_pd_fields, base_bodies, make_cases

# the cases live in fuzz_cases.py; these names stay importable from here (tests, scripts)
__all__ = ["CLOSED", "VALID", "Case", "Result", "answer_text", "base_bodies", "is_json_error",
           "make_cases", "run_fuzz"]

CLOSED = -3  # PD: the prefill half was still open after the grace and was closed, as a router does


@dataclass
class Result:
    status: int
    case: Case
    error: str = ""
    body: bytes = b""  # kept for answers under 1 MB (texts of 200s, error shapes of 4xx)
    prefill: Result | None = None  # PD: the prefill half's answer to the same body


def answer_text(path: str, body: bytes) -> str | None:
    """The generated text of a non-streamed 200 answer of ``path`` (None when not one)."""
    try:
        obj = json.loads(body)
        if path == "/generate":
            return obj["text"] if isinstance(obj["text"], str) else None
        choice = obj["choices"][0]
        return choice["text"] if path == "/v1/completions" else choice["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def is_json_error(body: bytes) -> bool:
    """The documented error shape: {"error": {"message": str, ...}} (docs/api.md)."""
    try:
        err = json.loads(body)["error"]
        return isinstance(err["message"], str) and bool(err["message"])
    except (ValueError, KeyError, TypeError):
        return False


async def _send(session: aiohttp.ClientSession, base: str, case: Case, timeout: float,
                prefill: str | None = None, grace: float = 10.0) -> Result:
    """With ``prefill`` (PD), the same body also goes there, as a router sends it."""
    if prefill is not None and case.method == "POST" and case.path != "/abort_request":
        # as a router: the decode half is what the client sees; once it is answered the
        # prefill half is given ``grace`` to answer too, then its connection is closed (the
        # prefill aborts it). A valid request's prefill half has answered before its decode
        # can: the decode needs its KV.
        other = asyncio.ensure_future(_send(session, prefill, case, timeout))
        res = await _send(session, base, case, timeout)
        done, _ = await asyncio.wait({other}, timeout=grace)
        if done:
            res.prefill = other.result()
        else:
            other.cancel()
            res.prefill = Result(CLOSED, case, f"no answer {grace:g} s after the decode's")
        return res
    headers = {"content-type": "application/json", **case.headers}
    try:
        async with session.request(case.method, base + case.path, data=case.body or None, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = await resp.read()  # streams included: drain to the end
            return Result(resp.status, case, body=body if len(body) < 1 << 20 else b"")
    except asyncio.TimeoutError:
        return Result(-1, case, "client timeout")
    except aiohttp.ClientError as exc:
        return Result(-2, case, f"{type(exc).__name__}: {exc}")


async def _load(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(base + "/get_load") as resp:
        body = await resp.json()
    return body[0] if isinstance(body, list) else body


async def _settle(session: aiohttp.ClientSession, base: str, free0: int) -> dict[str, Any]:
    """/get_load once ``base`` is idle with ``free0`` pages free again (or after 30 s):
    aborted streams give their pages back shortly."""
    deadline = time.monotonic() + 30
    while True:
        load = await _load(session, base)
        if (load["num_free_pages"] == free0 and load.get("num_reqs", 0) == 0) or time.monotonic() > deadline:
            return load
        await asyncio.sleep(0.2)


async def _healthy(session: aiohttp.ClientSession, base: str) -> bool:
    async with session.get(base + "/health", timeout=aiohttp.ClientTimeout(total=30)) as resp:
        return resp.status == 200


def _failure(r: Result) -> dict[str, Any]:
    return {"status": r.status, "path": r.case.path, "what": r.case.what, "error": r.error}


def _answer(r: Result) -> dict[str, Any]:
    """One row per case: both halves' statuses, the text of a 200, whether a 4xx is JSON."""
    row: dict[str, Any] = {"path": r.case.path, "what": r.case.what, "status": r.status,
                           "text": answer_text(r.case.path, r.body) if r.status == 200 else None,
                           "json_error": is_json_error(r.body) if 400 <= r.status < 500 else None}
    if r.prefill is not None:
        p = r.prefill
        row.update(prefill_status=p.status, prefill_error=p.error,
                   prefill_json_error=is_json_error(p.body) if 400 <= p.status < 500 else None)
    return row


async def run_fuzz(base: str, n: int, seed: int = 0, concurrency: int = 8, timeout: float = 120.0,
                   pd: dict[str, Any] | None = None, prefill: str | None = None,
                   progress: bool = True) -> dict[str, Any]:
    """Run ``n`` cases against ``base``; return a summary (failures listed; ``answers``: one row
    per case, see ``_answer``). With ``prefill`` the summary has its pages and health too."""
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        load0 = await _load(session, base)
        free0, total = int(load0["num_free_pages"]), int(load0["num_total_pages"])
        pload0 = await _load(session, prefill) if prefill else None
        cases = make_cases(n, seed, model, pd or {})
        if pd:
            _pin_pd_fields(cases, pd, random.Random(seed + 1))
        sem = asyncio.Semaphore(concurrency)
        done = 0
        t0 = time.monotonic()

        async def one(case: Case) -> Result:
            nonlocal done
            async with sem:
                res = await _send(session, base, case, timeout, prefill)
            done += 1
            if progress and done % 200 == 0:
                print(f"  {done}/{len(cases)} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            return res

        results = await asyncio.gather(*(one(c) for c in cases))
        free = int((await _settle(session, base, free0))["num_free_pages"])
        healthy = await _healthy(session, base)
        summary: dict[str, Any] = {}
        if prefill and pload0 is not None:
            pload = await _settle(session, prefill, int(pload0["num_total_pages"]))
            summary["prefill"] = {
                "healthy_after": await _healthy(session, prefill),
                "free_pages_before": pload0["num_free_pages"], "free_pages_after": pload["num_free_pages"],
                "total_pages": pload["num_total_pages"], "num_reqs_after": pload.get("num_reqs", 0),
                "cached_pages_after": pload["num_cached_pages"],
                "evictable_pages_after": pload["num_evictable_pages"],
                "failures": [_failure(r.prefill) for r in results
                             if r.prefill is not None and (r.prefill.status >= 500 or r.prefill.status < 0)]}
    bad = [r for r in results if r.status >= 500 or r.status < 0]
    by_status: dict[int, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    return {"cases": len(results), "by_status": dict(sorted(by_status.items())),
            "failures": [_failure(r) for r in bad],
            "free_pages_before": free0, "free_pages_after": free, "total_pages": total,
            "healthy_after": healthy, "wall_s": time.monotonic() - t0,
            "answers": [_answer(r) for r in results], **summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    ap.add_argument("--bootstrap", help="HOST:PORT of a prefill's bootstrap server: add PD fields")
    ap.add_argument("--prefill-url", help="send each PD body to this prefill too (as a router does)")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    pd: dict[str, Any] = {}
    if args.bootstrap:
        host, _, port = args.bootstrap.rpartition(":")
        pd = {"bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 12345}
    summary = asyncio.run(run_fuzz(args.url.rstrip("/"), args.cases, args.seed, args.concurrency, args.timeout, pd=pd,
                                    prefill=args.prefill_url.rstrip("/") if args.prefill_url else None))
    for f in summary["failures"][:50]:
        print(f"  FAIL {f['status']} {f['path']} {f['what']} {f['error']}")
    print(f"{summary['cases']} cases in {summary['wall_s']:.0f} s; statuses {summary['by_status']}; "
          f"{len(summary['failures'])} failures (5xx, timeouts, dropped connections); free pages "
          f"{summary['free_pages_before']} -> {summary['free_pages_after']} of {summary['total_pages']}; "
          f"healthy after: {summary['healthy_after']}")
    pre = summary.get("prefill")
    pre_ok = True
    if pre is not None:
        for f in pre["failures"][:50]:
            print(f"  PREFILL FAIL {f['status']} {f['path']} {f['what']} {f['error']}")
        pre_ok = not pre["failures"] and pre["healthy_after"] and pre["free_pages_after"] == pre["total_pages"]
        print(f"prefill: {len(pre['failures'])} failures; free pages {pre['free_pages_before']} -> "
              f"{pre['free_pages_after']} of {pre['total_pages']}; healthy after: {pre['healthy_after']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    sys.exit(0 if not summary["failures"] and summary["healthy_after"] and pre_ok
             and summary["free_pages_after"] == summary["free_pages_before"] else 1)


if __name__ == "__main__":
    main()
