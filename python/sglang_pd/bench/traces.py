"""Loaders for the request traces kept in ``data/traces/``.

Every loader returns a list of :class:`TraceRecord`: the arrival time in seconds relative to the
first request of the file (``None`` for length-only sets) and the input/output token counts.
Token counts come from whatever tokenizer the trace owner used; treat them as counts only.

The module depends on the standard library alone so the simulator and the offline benchmark
can import it without pulling in aiohttp or numpy.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

# The repository root is three levels above this file (python/sglang_pd/bench/traces.py).
_REPO_ROOT = Path(__file__).resolve().parents[3]

# Short names for the traces shipped in data/traces/ (paths relative to that folder).
KNOWN_TRACES: dict[str, str] = {
    "azure-conv": "azure2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure2023/AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake/conversation_trace.jsonl",
    "sharegpt-lengths": "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
}


@dataclass(frozen=True)
class TraceRecord:
    """One request of a trace."""

    arrival_s: float | None  # seconds since the first request; None for length-only sets
    input_len: int  # prompt tokens
    output_len: int  # generated tokens
    hash_ids: tuple[int, ...] = field(default=())  # Mooncake 512-token prefix-block ids


def traces_dir() -> Path:
    """Folder holding the shipped traces.

    ``SGLANG_PD_TRACES_DIR`` overrides it (for installs without the repository checkout);
    otherwise the repository's ``data/traces`` is used, then ``./data/traces``.
    """
    env = os.environ.get("SGLANG_PD_TRACES_DIR")
    if env:
        return Path(env)
    repo = _REPO_ROOT / "data" / "traces"
    if repo.is_dir():
        return repo
    return Path.cwd() / "data" / "traces"


def resolve_trace(name_or_path: str) -> Path:
    """Map a short name from :data:`KNOWN_TRACES` or a file path to an existing file."""
    if name_or_path in KNOWN_TRACES:
        path = traces_dir() / KNOWN_TRACES[name_or_path]
    else:
        path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(KNOWN_TRACES))
        raise FileNotFoundError(
            f"trace {name_or_path!r} not found (looked at {path}); "
            f"give a file path or one of: {known}"
        )
    return path


def _parse_azure_time(stamp: str) -> datetime:
    # Azure writes 7 fractional digits; datetime accepts at most 6, so cut the last one
    # (100 ns resolution is far below what a client can reproduce anyway).
    stamp = stamp.strip()
    if "." in stamp:
        head, frac = stamp.split(".", 1)
        stamp = f"{head}.{frac[:6]}"
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")


def load_azure_csv(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Azure LLM inference trace 2023: ``TIMESTAMP,ContextTokens,GeneratedTokens``."""
    out: list[TraceRecord] = []
    t0: datetime | None = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if limit is not None and len(out) >= limit:
                break
            ts = _parse_azure_time(row["TIMESTAMP"])
            t0 = ts if t0 is None else t0
            out.append(
                TraceRecord(
                    arrival_s=(ts - t0).total_seconds(),
                    input_len=int(row["ContextTokens"]),
                    output_len=int(row["GeneratedTokens"]),
                )
            )
    return out


def load_mooncake_jsonl(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Mooncake FAST'25 trace: JSON lines with ``timestamp`` in milliseconds."""
    out: list[TraceRecord] = []
    t0: float | None = None
    with open(path) as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            ts_ms = float(rec["timestamp"])
            t0 = ts_ms if t0 is None else t0
            out.append(
                TraceRecord(
                    arrival_s=(ts_ms - t0) / 1000.0,
                    input_len=int(rec["input_length"]),
                    output_len=int(rec["output_length"]),
                    hash_ids=tuple(int(h) for h in rec.get("hash_ids", ())),
                )
            )
    return out


def load_length_csv(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Length-only sets (ShareGPT stats etc.): ``num_prefill_tokens,num_decode_tokens,...``."""
    out: list[TraceRecord] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if limit is not None and len(out) >= limit:
                break
            out.append(
                TraceRecord(
                    arrival_s=None,
                    input_len=int(row["num_prefill_tokens"]),
                    output_len=int(row["num_decode_tokens"]),
                )
            )
    return out


def load_trace(name_or_path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Load any supported trace, picking the parser from the file's header.

    ``limit`` keeps the first N records (file order, which is arrival order for timed traces).
    """
    path = resolve_trace(str(name_or_path))
    with open(path, newline="") as f:
        head = f.readline().strip()
    if head.startswith("{"):
        return load_mooncake_jsonl(path, limit)
    columns = {c.strip() for c in head.split(",")}
    if "TIMESTAMP" in columns:
        return load_azure_csv(path, limit)
    if "num_prefill_tokens" in columns:
        return load_length_csv(path, limit)
    raise ValueError(
        f"unrecognised trace format in {path}: expected Azure CSV (TIMESTAMP,...), "
        f"Mooncake JSON lines, or a length CSV (num_prefill_tokens,...); header was {head[:80]!r}"
    )


def arrivals_and_lengths(
    name_or_path: str | Path, limit: int | None = None
) -> tuple[list[float] | None, list[int], list[int]]:
    """Convenience for other tools: (arrival seconds or None, input lengths, output lengths)."""
    recs = load_trace(name_or_path, limit)
    arrivals = None if not recs or recs[0].arrival_s is None else [r.arrival_s or 0.0 for r in recs]
    return arrivals, [r.input_len for r in recs], [r.output_len for r in recs]
