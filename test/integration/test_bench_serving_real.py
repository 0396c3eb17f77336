"""The serving benchmark against the real colocated server (tiny model on CPU).

``colocated_server`` comes from test/conftest.py: it has ``.base_url`` and ``.model_dir``.
Each backend runs 8 prompts of exactly 32 tokens with 8 output tokens (ignore_eos), so the
token totals are known exactly and no request may fail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "python") not in sys.path:  # when the package is not pip-installed
    sys.path.insert(0, str(REPO / "python"))

from sglang_pd.bench.app import run_benchmark  # noqa: E402
from sglang_pd.bench.cli import build_parser  # noqa: E402
from bench_fields import SGLANG_FIELDS, OUR_FIELDS  # noqa: E402

N, IN_LEN, OUT_LEN = 8, 32, 8


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_bench_against_colocated_server(colocated_server, tmp_path, backend):
    out = tmp_path / "bench.jsonl"
    flags = [
        "--backend",
        backend,
        "--base-url",
        colocated_server.base_url,
        "--dataset-name",
        "random",
        "--num-prompts",
        str(N),
        "--random-input-len",
        str(IN_LEN),
        "--random-output-len",
        str(OUT_LEN),
        "--random-range-ratio",
        "1",
        "--request-rate",
        "inf",
        "--slo-ttft-ms",
        "60000",
        "--slo-tpot-ms",
        "60000",  # generous: CPU model, check plumbing
        "--request-timeout",
        "120",
        "--output-file",
        str(out),
        "--disable-tqdm",
    ]
    if backend != "sglang":  # text prompts need the tokenizer; the native run finds it itself
        flags += ["--tokenizer", str(colocated_server.model_dir)]
    run_benchmark(build_parser().parse_args(flags))
    rec = json.loads(out.read_text().strip().splitlines()[-1])
    for k in SGLANG_FIELDS + OUR_FIELDS:
        assert k in rec, f"JSONL line lacks {k!r}"
    assert rec["errors"] == {}, rec["errors"]
    assert rec["completed"] == N
    assert rec["tokenizer"], "no tokenizer: GET /get_model_info should give a readable model_path"
    assert rec["total_input_tokens"] == N * IN_LEN
    assert rec["total_output_tokens"] == N * OUT_LEN  # ignore_eos: exactly max tokens each
    assert rec["mean_ttft_ms"] > 0 and rec["mean_e2e_latency_ms"] >= rec["mean_ttft_ms"]
    assert rec["mean_itl_ms"] > 0 and rec["mean_tpot_ms"] > 0
    assert rec["slo_attainment"] == 1.0 and rec["goodput_rps"] > 0
