"""The GPU execution path, checked on CPU: backend registry and "auto", the Triton backend
(under the Triton interpreter) against the torch backend, CUDA-graph bucketing and padding,
memory reservation, flags, and that CPU runs stay on the old path.

Triton is in the ``gpu`` extra; tests that run its kernels skip without it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings, strategies as st

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from model_helpers import PagedRequests, make_pool
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine import attention as attn, memory
from sglang_pd.engine.attention.torch_backend import TorchAttnBackend
from sglang_pd.engine.cuda_graph import _Statics, decode_batch_buckets, pick_bucket
from sglang_pd.server_args import ServerArgs, parse_server_args

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (the gpu extra)")
HQ, HKV, D, LAYERS = 8, 2, 16, 2
# Kernel tests run where the kernels do: on the GPU when there is one (the interpreter only
# without CUDA, above), so that this file passes on a GPU host too.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---- registry ------------------------------------------------------------------------------
def test_registry_names_and_cli_choices() -> None:
    assert {"torch", "triton", "flashinfer", "auto"} <= set(attn.ATTENTION_BACKENDS)
    assert ServerArgs(model_path="m").attention_backend == "torch"  # the CPU default stays
    args = parse_server_args(["--model-path", "m", "--attention-backend", "auto",
                              "--cuda-graph-max-bs", "8", "--disable-cuda-graph"])
    assert (args.attention_backend, args.cuda_graph_max_bs, args.disable_cuda_graph) == ("auto", 8, True)
    assert parse_server_args(["--model-path", "m"]).disable_cuda_graph is False
    with pytest.raises(ValueError, match="cuda-graph-max-bs"):
        ServerArgs(model_path="m", cuda_graph_max_bs=0)


def test_auto_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" never pairs CUDA graphs with a backend that lacks them: FlashInfer (no graph
    support here) only with graphs off."""
    assert attn.resolve_attention_backend("auto", "cpu") == "torch"
    assert attn.resolve_attention_backend("triton", "cpu") == "triton"  # explicit names stay
    real = importlib.util.find_spec
    for present in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, _p=present: (object() if _p else None) if name == "flashinfer"
                            else real(name, *a))
        assert attn.resolve_attention_backend("auto", "cuda:0") == "triton"  # graphs on: default
        assert attn.resolve_attention_backend("auto", "cuda:0", cuda_graph=True) == "triton"
        assert attn.resolve_attention_backend("auto", "cuda:0", cuda_graph=False) == (
            "flashinfer" if present else "triton")
    monkeypatch.undo()
    assert isinstance(attn.create_attention_backend("auto", "cpu"), TorchAttnBackend)


def test_graphs_and_their_memory_only_with_a_backend_that_captures() -> None:
    """The engine's wiring: no graphs (so no reserved graph memory) off CUDA, when disabled, or
    with a backend without graph support (FlashInfer, torch); a capturing backend gets them."""
    from sglang_pd.engine.cuda_graph import graph_max_bs

    class Capturing(TorchAttnBackend):
        supports_cuda_graph = True

    assert graph_max_bs("cuda:0", False, 160, Capturing()) == 160
    assert graph_max_bs("cuda", True, 160, Capturing()) == 0
    assert graph_max_bs("cpu", False, 160, Capturing()) == 0
    assert graph_max_bs("cuda:0", False, 160, TorchAttnBackend()) == 0
    flashinfer = importlib.util.find_spec("flashinfer") and attn.create_attention_backend("flashinfer")
    if flashinfer:
        assert not flashinfer.supports_cuda_graph
        assert graph_max_bs("cuda:0", False, 160, flashinfer) == 0
    if HAS_TRITON:  # what "auto" picks on CUDA with graphs on does capture
        assert attn.create_attention_backend("auto", "cuda:0", cuda_graph=True).supports_cuda_graph


def test_flashinfer_plan_inputs_from_host_lengths_for_a_mixed_step() -> None:
    """FlashInfer's CSR tables come from the host lengths (plan() reads them on the host), and
    a mixed step's decode rows are one-token extends in qo_indptr; the device-side gather of the
    used pages from the step's page table picks exactly each request's pages."""
    from sglang_pd.engine.attention.paged_index import paged_plan_inputs, use_tensor_cores

    reqs = PagedRequests(make_pool(LAYERS, HKV, D, 64, 4), TorchAttnBackend(), seed=5)
    reqs.batch(ForwardMode.EXTEND, {0: [1] * 6, 1: [1] * 3})
    mixed = reqs.batch(ForwardMode.EXTEND, {2: [1] * 9, 0: [2], 1: [3]})  # a prompt + 2 decodes
    ps = reqs.pool.page_size
    page_table = mixed.token_slots[:, ::ps] // ps
    plan = paged_plan_inputs(mixed.seq_lens.tolist(), mixed.extend_lens.tolist(), ps,
                             int(page_table.shape[1]))
    for t in (plan.kv_indptr, plan.kv_last_page_len, plan.qo_indptr, plan.page_rows):
        assert t.device.type == "cpu"
    assert plan.qo_indptr.tolist() == [0, 9, 10, 11]
    assert plan.kv_indptr.tolist() == [0, 3, 5, 6] and plan.kv_last_page_len.tolist() == [1, 3, 4]
    kv_indices = page_table.reshape(-1).index_select(0, plan.page_rows)
    assert kv_indices.tolist() == reqs.seqs[2].pages + reqs.seqs[0].pages + reqs.seqs[1].pages
    decode = paged_plan_inputs([5, 1], None, ps, 2)
    assert decode.qo_indptr is None and decode.kv_indptr.tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="page table has 1"):
        paged_plan_inputs([5], None, ps, 1)
    assert use_tensor_cores(32, 8) and not use_tensor_cores(16, 8) and not use_tensor_cores(8, 8)


def test_flashinfer_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flashinfer" else real(name, *a))
    with pytest.raises(RuntimeError, match="pip install flashinfer-python"):
        attn.create_attention_backend("flashinfer")


def test_importing_the_registry_loads_no_gpu_library() -> None:
    code = ("import sys, sglang_pd.engine.attention, sglang_pd.server_args; "
            "print(sorted(m for m in ('torch', 'triton', 'flashinfer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- Triton backend vs torch backend -------------------------------------------------------
def _pair(seed: int) -> tuple[PagedRequests, PagedRequests]:
    """The same requests on the same pages, one pool per backend."""
    tri = attn.create_attention_backend("triton")
    return (PagedRequests(make_pool(LAYERS, HKV, D, 64, 4, device=DEVICE), TorchAttnBackend(), seed=seed),
            PagedRequests(make_pool(LAYERS, HKV, D, 64, 4, device=DEVICE), tri, seed=seed))


@needs_triton
def test_triton_backend_matches_torch_backend_extend_then_decode() -> None:
    ref, tri = _pair(seed=2)
    gen = torch.Generator().manual_seed(0)
    steps = [(ForwardMode.EXTEND, {0: 9, 1: 5, 2: 1}), (ForwardMode.EXTEND, {1: 6, 3: 17}),
             (ForwardMode.DECODE, {0: 1, 1: 1, 2: 1, 3: 1}),
             (ForwardMode.EXTEND, {0: 1, 4: 7})]  # last: a decode riding with a prompt (mixed)
    for mode, new in steps:
        batches = [r.batch(mode, {rid: [0] * n for rid, n in new.items()}) for r in (ref, tri)]
        t = batches[0].num_tokens
        for layer in range(LAYERS):
            q, k, v = (torch.randn(t, h, D, generator=gen).to(DEVICE) for h in (HQ, HKV, HKV))
            outs = []
            for r, b in zip((ref, tri), batches):
                if layer == 0:
                    r.backend.init_forward_metadata(b)
                outs.append(r.backend.forward(q, k, v, layer, b, D**-0.5))
            torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tri.pool.kv_buffer, ref.pool.kv_buffer)
    assert not tri.pool.kv_buffer[:, :, 0].any(), "dummy page 0 was written"


@needs_triton
def test_graph_padding_rows_touch_only_the_zero_dummy_page() -> None:
    """Replay semantics without a GPU: a decode batch padded to a bucket through the graph
    statics and the backend's static page table gives the eager rows, and page 0 stays zero."""
    _, tri = _pair(seed=4)
    backend = tri.backend
    gen = torch.Generator().manual_seed(1)
    tri.batch(ForwardMode.EXTEND, {0: [0] * 6, 1: [0] * 11, 2: [0] * 3})  # reserve prompt slots
    for layer in range(LAYERS):
        n = sum(tri.seqs[r].length for r in (0, 1, 2))
        slots = torch.tensor(tri.slots_of(0) + tri.slots_of(1) + tri.slots_of(2), device=DEVICE)
        tri.pool.k_cache(layer)[slots] = torch.randn(n, HKV, D, generator=gen).to(DEVICE)
        tri.pool.v_cache(layer)[slots] = torch.randn(n, HKV, D, generator=gen).to(DEVICE)
    eager = tri.batch(ForwardMode.DECODE, {0: [5], 1: [6], 2: [7]})
    backend.init_forward_metadata(eager)
    q, k, v = (torch.randn(3, h, D, generator=gen).to(DEVICE) for h in (HQ, HKV, HKV))
    want = backend.forward(q, k, v, 0, eager, D**-0.5)

    buckets = decode_batch_buckets(8)
    padded = pick_bucket(buckets, eager.batch_size)
    assert padded == 4
    statics = _Statics.allocate(buckets[-1], DEVICE)
    backend.init_cuda_graph_state(buckets[-1], 64, tri.pool)
    static_batch = statics.batch(padded, tri.pool, backend)
    backend.init_forward_metadata_capture(static_batch)
    statics.fill(eager, padded)
    backend.init_forward_metadata_replay(eager, padded)
    assert statics.out_cache_loc[3] == 0 and statics.lens[0, 3] == 1
    q_pad = torch.cat([q, torch.randn(1, HQ, D, device=DEVICE)])
    ones = torch.ones(1, HKV, D, device=DEVICE)
    k_pad, v_pad = torch.cat([k, ones]), torch.cat([v, ones])
    got = backend.forward(q_pad, k_pad, v_pad, 0, static_batch, D**-0.5)
    torch.testing.assert_close(got[:3], want, atol=1e-5, rtol=1e-5)
    assert not got[3].any(), "a padding row reads only the zero dummy page"
    assert not tri.pool.kv_buffer[:, :, 0].any(), "a padding row wrote into dummy page 0"


@needs_triton
def test_triton_backend_serves_the_tiny_model_like_torch(tiny_model_factory) -> None:
    """EngineCore end to end (on CPU under the interpreter; on a GPU host on CUDA, graphs on):
    greedy tokens equal the torch backend's, and a sampled request (top-p, top-k, seed) is
    served alongside."""
    from sglang_pd.engine.engine_core import EngineCore
    from sglang_pd.protocol import GenerateReq, SamplingParams

    prompts = [[11, 12, 13], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7] * 6]
    params = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_new_tokens=5, temperature=0.8, top_p=0.9, top_k=20, seed=3,
                             ignore_eos=True)

    def run(backend: str) -> list[list[int]]:
        core = EngineCore(ServerArgs(model_path=tiny_model_factory("llama"), page_size=4, device=str(DEVICE),
                                     max_total_tokens=2048, dtype="float32", attention_backend=backend,
                                     decode_policy="slack"))
        # the torch backend pads decode attention to the longest request, paged kernels do not:
        # the decode policy's cost model is told which (decode_cost_model.py)
        assert core.policy_config.decode_attention_padded is (backend == "torch")
        assert core.scheduler.decode_policy.model.padded is (backend == "torch")
        got: dict[str, list[int]] = {str(i): [] for i in range(len(prompts) + 1)}
        for i, ids in enumerate(prompts):
            core.add_request(GenerateReq(rid=str(i), input_ids=ids, sampling_params=params, stream=True))
        core.add_request(GenerateReq(rid=str(len(prompts)), input_ids=[5, 6, 7],
                                     sampling_params=sampled, stream=True))
        for _ in range(200):
            for out in core.step():
                assert out.error_status == 0, out.finish_reason
                got[out.rid].extend(out.new_token_ids)
            if all(len(t) == 5 for t in got.values()):
                break
        assert len(got[str(len(prompts))]) == 5  # the sampled request was served
        return [got[str(i)] for i in range(len(prompts))]

    want = run("torch")
    assert all(len(t) == 5 for t in want)
    assert run("triton") == want


# ---- graph buckets, memory, CPU runner -----------------------------------------------------
def test_decode_buckets() -> None:
    assert decode_batch_buckets(1) == [1]
    assert decode_batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert decode_batch_buckets(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    b = decode_batch_buckets(160)
    assert pick_bucket(b, 3) == 4 and pick_bucket(b, 17) == 24 and pick_bucket(b, 161) is None
    with pytest.raises(ValueError):
        decode_batch_buckets(0)


def test_pool_pages_reserves_graph_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 1000 * 4096)
    kw = dict(max_total_tokens=None, mem_fraction_static=0.5, device="cuda:0", page_size=4,
              bytes_per_token=4096)
    assert memory.pool_pages(**kw) == 500 // 4 + 1
    assert memory.pool_pages(**kw, reserved_bytes=200 * 4096) == 400 // 4 + 1


def test_graph_reserve_is_sized_from_the_model() -> None:
    """The reserve counts the one shared float32 logits buffer plus a layer's transients per row
    (CudaGraphRunner.capture measures the real figure and warns above it). For Llama-3-8B at
    the default 160 rows it is ~0.53 GB: above the shared logits buffer and the per-row
    transients, below the 0.87 GB that one float32 output per bucket used to keep live."""
    from sglang_pd.engine.cuda_graph import graph_reserve_bytes
    from sglang_pd.models.config import ModelConfig
    from sglang_pd.tools.make_dummy_config import PRESETS

    cfg = ModelConfig.from_dict(PRESETS["llama-3-8b"])
    got = graph_reserve_bytes(160, cfg, torch.bfloat16)
    logits = 160 * cfg.vocab_size * 4
    one_layer_rows = 160 * 2 * (cfg.hidden_size + cfg.q_size + 2 * cfg.kv_size + 2 * cfg.intermediate_size)
    assert logits + one_layer_rows + (256 << 20) < got < sum(decode_batch_buckets(160)) * cfg.vocab_size * 4
    assert graph_reserve_bytes(8, cfg, torch.bfloat16) < got  # grows with the captured batch
    assert graph_reserve_bytes(160, cfg, torch.float32) > got  # and with the activations' dtype


def test_forward_time_from_cuda_events_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the host returns once kernels are queued: forward_s comes from events recorded
    around the forward and read after sampling; on CPU from the host clock."""
    import time

    from sglang_pd.engine import forward_timer

    class FakeEvent:
        log: ClassVar[list[str]] = []

        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.name = "start" if not FakeEvent.log else "end"
            FakeEvent.log.append(f"new {self.name}")

        def record(self) -> None:
            FakeEvent.log.append(f"record {self.name}")

        def synchronize(self) -> None:
            FakeEvent.log.append(f"sync {self.name}")

        def elapsed_time(self, end: FakeEvent) -> float:
            return 12.5  # milliseconds

    monkeypatch.setattr(forward_timer.torch.cuda, "Event", FakeEvent)
    clock = iter([100.0, 100.25])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    timer = forward_timer.ForwardTimer("cuda:0")
    assert timer.seconds() == 0.0
    timer.start()
    timer.stop()
    assert timer.seconds() == 0.0125 and timer.seconds() == 0.0125
    assert FakeEvent.log == ["new start", "new end", "record start", "record end", "sync end"]
    cpu = forward_timer.ForwardTimer("cpu")  # the host clock, twice
    cpu.start()
    cpu.stop()
    assert cpu.seconds() == 0.25


def test_cpu_runner_keeps_the_host_path() -> None:
    from sglang_pd.engine.model_runner import ModelRunner

    pool = make_pool(LAYERS, HKV, D)
    runner = ModelRunner(torch.nn.Identity(), pool, TorchAttnBackend(), cuda_graph_max_bs=160)
    assert runner.device.type == "cpu" and runner.graph_runner is None and runner._staging is None
    assert not TorchAttnBackend.supports_cuda_graph


def test_one_copy_layout_round_trips() -> None:
    """The packed layout HostStaging copies in one go gives back every field of the batch."""
    from sglang_pd.engine.cuda_graph import pack_step, packed_size, unpack_step

    reqs = PagedRequests(make_pool(LAYERS, HKV, D), TorchAttnBackend(), seed=3)
    reqs.batch(ForwardMode.EXTEND, {0: [1] * 5, 1: [2] * 2})
    want = reqs.batch(ForwardMode.EXTEND, {0: [3, 4], 1: [5], 2: [6, 7, 8, 9, 10, 11, 12]})
    ids, pos, loc = (t.tolist() for t in (want.input_ids, want.positions, want.out_cache_loc))
    seq, ext = want.seq_lens.tolist(), want.extend_lens.tolist()
    packed = torch.full((packed_size(len(ids), len(seq), want.token_slots.numel()),), -1)
    wide = torch.cat([want.token_slots, torch.zeros_like(want.token_slots)], 1)
    slots_view = wide[:, : want.token_slots.shape[1]]  # non-contiguous, as ModelRunner's slice is
    pack_step(packed, ids, pos, loc, seq, ext, slots_view)
    got = unpack_step(packed, want.mode, seq, ext, tuple(want.token_slots.shape), want.kv_pool,
                      want.attn_backend)
    for name in ("input_ids", "positions", "out_cache_loc", "seq_lens", "extend_lens", "token_slots"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(got.device_lens, torch.stack([want.seq_lens, want.extend_lens]))
    assert got.seq_lens.device.type == "cpu" and got.extend_lens.device.type == "cpu"


@settings(max_examples=200, deadline=None)
@given(bsz=st.integers(1, 40), extra=st.integers(0, 300), width=st.integers(1, 70))
def test_packed_segments_start_16_byte_aligned(bsz: int, extra: int, width: int) -> None:
    """Every tensor a kernel receives from the packed step starts on a 16-byte boundary whatever
    the step's token and request counts: Triton specialises on pointer alignment, and segments
    at count-dependent offsets made it compile new kernel variants under live load on the H200."""
    from sglang_pd.engine.cuda_graph import pack_step, packed_size, unpack_step

    n = bsz + extra
    ids, seq, ext = list(range(n)), [n + i for i in range(bsz)], [1] * (bsz - 1) + [extra + 1]
    slots = torch.arange(bsz * width).view(bsz, width)
    packed = torch.full((packed_size(n, bsz, slots.numel()),), -1)
    assert packed.data_ptr() % 16 == 0
    pack_step(packed, ids, [i + 7 for i in ids], [i + 9 for i in ids], seq, ext, slots)
    got = unpack_step(packed, ForwardMode.EXTEND, seq, ext, tuple(slots.shape), None, None)  # type: ignore[arg-type]
    views = (got.input_ids, got.positions, got.out_cache_loc, got.token_slots, got.device_lens[0],
             got.device_lens[1])
    assert all(v.data_ptr() % 16 == 0 for v in views)
    assert got.input_ids.tolist() == ids and got.positions.tolist() == [i + 7 for i in ids]
    assert got.out_cache_loc.tolist() == [i + 9 for i in ids] and torch.equal(got.token_slots, slots)
    assert got.device_lens[0].tolist() == seq and got.device_lens[1].tolist() == ext
