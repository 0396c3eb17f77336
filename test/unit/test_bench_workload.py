"""Benchmark workload pieces: trace loaders, lengths, arrivals, prompts, request bodies, JSONL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

_PY = Path(__file__).resolve().parents[2] / "python"
if str(_PY) not in sys.path:  # when the package is not pip-installed
    sys.path.insert(0, str(_PY))

from sglang_pd.bench.backends import BackendConfig, RequestResult, RequestSpec, build_body  # noqa: E402
from sglang_pd.bench.datasets import (  # noqa: E402
    DatasetSpec,
    WorkItem,
    arrival_times,
    build_items,
    parse_length_mix,
    schedule,
)
from sglang_pd.bench.metrics import SloSpec, compute_metrics  # noqa: E402
from sglang_pd.bench.prompts import PromptFactory, load_tokenizer  # noqa: E402
from sglang_pd.bench.report import format_summary, jsonl_record  # noqa: E402
from sglang_pd.bench.stub_harness import write_toy_tokenizer  # noqa: E402
from sglang_pd.bench.traces import KNOWN_TRACES, load_trace, resolve_trace  # noqa: E402
from sglang_pd.bench.workload import History, build_sessions, extend_history, make_spec  # noqa: E402
from bench_fields import SGLANG_FIELDS, OUR_FIELDS  # noqa: E402


# ---- traces ---------------------------------------------------------------------------------
def test_shipped_traces_load():
    for name in KNOWN_TRACES:
        assert resolve_trace(name).is_file()
    conv = load_trace("azure-conv", limit=3)
    assert [r.input_len for r in conv] == [374, 396, 879]
    assert conv[0].arrival_s == 0.0
    assert conv[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    moon = load_trace("mooncake", limit=2)
    assert moon[0].arrival_s == 0.0 and moon[0].hash_ids[:2] == (0, 1)
    share = load_trace("sharegpt-lengths", limit=2)
    assert share[0].arrival_s is None and (share[0].input_len, share[0].output_len) == (74, 918)


def test_trace_format_errors(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unrecognised trace format"):
        load_trace(str(bad))
    with pytest.raises(FileNotFoundError, match="azure-conv"):
        load_trace(str(tmp_path / "missing.csv"))


# ---- lengths and arrivals -------------------------------------------------------------------
def test_random_lengths_follow_range_ratio():
    items = build_items(
        DatasetSpec(
            num_prompts=200,
            random_input_len=100,
            random_output_len=10,
            random_range_ratio=0.5,
            seed=7,
        )
    )
    ins = [it.input_len for it in items]
    assert min(ins) >= 50 and max(ins) <= 100 and len(set(ins)) > 10
    exact = build_items(
        DatasetSpec(
            num_prompts=5, random_input_len=64, random_output_len=16, random_range_ratio=1.0
        )
    )
    assert {(it.input_len, it.output_len) for it in exact} == {(64, 16)}


def test_length_mix_and_clamps():
    assert parse_length_mix("64:16:0.8,2048:64") == [(64, 16, 0.8), (2048, 64, 1.0)]
    with pytest.raises(ValueError, match="INPUT:OUTPUT"):
        parse_length_mix("64")
    items = build_items(
        DatasetSpec(
            name="mix", length_mix="64:16:3,2048:64:1", num_prompts=400, max_input_len=1000, seed=3
        )
    )
    longs = sum(it.input_len == 1000 for it in items)  # 2048 clamped to 1000
    assert {it.input_len for it in items} == {64, 1000}
    assert 60 < longs < 140  # weight 1/4 of 400


def test_trace_items_keep_order_and_times():
    items = build_items(DatasetSpec(name="azure-conv", num_prompts=4, max_input_len=300))
    assert [it.input_len for it in items] == [300, 300, 300, 91]  # 374, 396, 879 clamped to 300
    assert items[0].arrival_s == 0.0 and items[3].arrival_s > items[2].arrival_s
    scaled = schedule(items, float("inf"), time_scale=0.5)
    assert scaled[1] == pytest.approx(items[1].arrival_s * 0.5)
    untimed = build_items(DatasetSpec(name="azure-conv", num_prompts=4, ignore_trace_times=True))
    assert schedule(untimed, float("inf")) == [0.0] * 4


def test_arrival_process_mean_and_burstiness():
    n = 4000
    poisson = np.diff(arrival_times(n, 10.0, 1.0, seed=1))
    bursty = np.diff(arrival_times(n, 10.0, 0.25, seed=1))
    assert poisson.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.mean() == pytest.approx(0.1, rel=0.1)
    # Gamma(k) gaps have CV 1/sqrt(k): 1 for Poisson, 2 for burstiness 0.25.
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)
    assert arrival_times(3, float("inf")) == [0.0, 0.0, 0.0]


# ---- prompts --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    write_toy_tokenizer(d)
    return load_tokenizer(d)


def test_token_ids_avoid_special_tokens(tokenizer):
    f = PromptFactory(tokenizer, seed=1)
    ids = f.token_ids(5000)
    special = set(tokenizer.get_added_tokens_decoder())
    assert len(ids) == 5000 and not special & set(ids)
    assert max(ids) < tokenizer.get_vocab_size() and min(ids) >= 1
    assert PromptFactory(tokenizer, seed=1).token_ids(50) == PromptFactory(
        tokenizer, seed=1
    ).token_ids(50)


def test_text_prompts_have_exact_token_counts(tokenizer):
    f = PromptFactory(tokenizer, seed=2)
    for n in [1, 2, 3, 7, 31, 32, 100, 1000]:
        text, count = f.text(n)
        assert len(tokenizer.encode(text, add_special_tokens=False).ids) == count
        assert count == n


# ---- request bodies and sessions ------------------------------------------------------------
def test_bodies_carry_ignore_eos_lengths_slo_and_extra():
    spec = RequestSpec(0, [5, 6, 7], 3, 9)
    slo = {"ttft_ms": 200.0, "tpot_ms": 50.0}
    native = build_body(
        BackendConfig(
            "sglang", "http://x", slo=slo, extra_body={"sampling_params": {"top_k": 1}, "rid": "a"}
        ),
        spec,
    )
    assert native["input_ids"] == [5, 6, 7] and native["stream"] is True
    assert native["sampling_params"] == {
        "max_new_tokens": 9,
        "temperature": 0.0,
        "ignore_eos": True,
        "top_k": 1,
    }
    assert native["slo"] == slo and native["rid"] == "a"
    long_cfg = BackendConfig("sglang", "http://x", slo=slo, slo_ttft_ms_long=900.0, long_threshold=3)
    assert build_body(long_cfg, spec)["slo"] == {"ttft_ms": 900.0, "tpot_ms": 50.0}  # 3 >= 3: long
    assert build_body(long_cfg, RequestSpec(1, [5, 6], 2, 9))["slo"] == slo  # short: the base SLO
    oai = build_body(BackendConfig("sglang-oai", "http://x"), RequestSpec(0, "hi", 1, 4))
    assert oai["prompt"] == "hi" and oai["max_tokens"] == 4 and oai["ignore_eos"] is True
    assert oai["stream_options"] == {"include_usage": True} and "slo" not in oai
    chat = build_body(
        BackendConfig("sglang-oai-chat", "http://x", stream=False), RequestSpec(0, "hi", 1, 4)
    )
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "stream_options" not in chat


def test_multi_turn_history_grows(tokenizer):
    items = [WorkItem(8, 4), WorkItem(5, 2), WorkItem(6, 3)]
    f = PromptFactory(tokenizer, seed=4)
    (s,) = build_sessions(items, [0.0], f, native=True, multi_turn=3)
    spec0 = make_spec("sglang", s, 0, History(), f)
    assert spec0.prompt_len == 8
    res = RequestResult(0, 8, 4, output_len=4, success=True, output_ids=[1, 2, 3, 4])
    h = extend_history("sglang", History(), spec0, s.turns[0], res)
    spec1 = make_spec("sglang", s, 1, h, f)
    assert spec1.prompt == list(spec0.prompt) + [1, 2, 3, 4] + list(s.turns[1].new_prompt)
    assert spec1.prompt_len == 8 + 4 + 5
    # Without output ids from the server, same-length filler keeps the sizes right.
    h2 = extend_history(
        "sglang", History(), spec0, s.turns[0], RequestResult(0, 8, 4, output_len=4, success=True)
    )
    assert make_spec("sglang", s, 1, h2, f).prompt_len == 17
    (c,) = build_sessions(items, [0.0], f, native=False, multi_turn=3)
    c0 = make_spec("sglang-oai-chat", c, 0, History(), f)
    hc = extend_history(
        "sglang-oai-chat",
        History(),
        c0,
        c.turns[0],
        RequestResult(0, 8, 4, output_len=4, success=True, generated_text=" a b"),
    )
    c1 = make_spec("sglang-oai-chat", c, 1, hc, f)
    assert [m["role"] for m in c1.prompt] == ["user", "assistant", "user"]
    assert c1.prompt_len == 8 + 4 + 5


# ---- report ---------------------------------------------------------------------------------
def test_jsonl_and_summary_layout():
    rs = [
        RequestResult(
            0, 10, 3, output_len=3, success=True, ttft_s=0.05, itl_s=[0.02, 0.02], e2e_s=0.09
        ),
        RequestResult(1, 10, 3, error_kind="http_400"),
    ]
    m = compute_metrics(rs, 1.0, SloSpec(100.0, 25.0), 2048)
    info = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": float("inf"),
        "max_concurrency": None,
    }
    rec = jsonl_record(m, info, rs)
    json.loads(json.dumps(rec, allow_nan=False))
    for k in SGLANG_FIELDS + OUR_FIELDS + ["input_lens", "output_lens", "ttfts", "itls"]:
        assert k in rec, k
    assert rec["request_rate"] == "inf" and rec["errors"] == {"http_400": 1}
    assert rec["slo_attainment"] == pytest.approx(0.5) and rec["mean_tpot_ms"] == pytest.approx(
        20.0
    )
    assert set(rec["by_class"]) == {"short", "long"}
    text = format_summary(m, info)
    for line in [
        "============ Serving Benchmark Result ============",
        "Successful requests:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Mean TTFT (ms):",
        "Median TTFT (ms):",
        "P99 TTFT (ms):",
        "Mean TPOT (ms):",
        "Mean ITL (ms):",
        "Mean E2E Latency (ms):",
        "SLO attainment, both (%):",
        "Goodput (req/s):",
        "http_400=1",
    ]:
        assert line in text, line


def test_the_rate_offering_a_token_rate_counts_the_callers_intervals() -> None:
    """rate_offering: span = total prompt tokens / token rate, rate = intervals / span; longer
    prompts give a lower rate (bench_cluster counts n requests a span, bench_prefix_replay n - 1)."""
    from sglang_pd.bench.datasets import rate_offering

    assert rate_offering(200.0, [100, 300], 2) == pytest.approx(1.0)  # 400 tokens over 2 s
    assert rate_offering(200.0, [100, 300], 1) == pytest.approx(0.5)
    assert rate_offering(200.0, [200, 600], 2) < rate_offering(200.0, [100, 300], 2)
