"""A model forward must never read a device tensor back to the host.

Such a read (``int(t)``, ``t.item()``, ``bool(t)``, ``t.tolist()``, ``t.cpu()``) stalls the GPU
every step and makes CUDA-graph capture fail, so the server would not start with graphs on.
The CPU cannot show a sync, so the model runs on the ``meta`` device here: every tensor the
forward reads is a meta tensor (weights, KV pool, the batch's device tensors), only the lengths
the runner keeps on the host are real, and any read of a meta tensor's value raises.

Out-of-range positions are then caught on the host, where the model runner builds the batch.
"""

from __future__ import annotations

import pytest
import torch

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.torch_backend import TorchAttnBackend
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.model_runner import ModelRunner, check_positions
from sglang_pd.engine.request import Req
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.llama import LlamaForCausalLM
from sglang_pd.protocol import SamplingParams

META = torch.device("meta")
PAGE = 4


def _config(arch: str) -> ModelConfig:
    cfg = {"architectures": [arch], "model_type": "x", "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 96,
           "vocab_size": 101, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
           "tie_word_embeddings": arch == "Qwen3ForCausalLM"}
    return ModelConfig.from_dict(cfg)


def _meta_batch(mode: ForwardMode, seq_lens: list[int], extend_lens: list[int], pool: KVPool,
                backend: TorchAttnBackend) -> ForwardBatch:
    """Device tensors on meta; lengths on the host, as ModelRunner/HostStaging lay them out."""
    t = sum(extend_lens)

    def dev(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.long, device=META)

    return ForwardBatch(mode=mode, input_ids=dev(t), positions=dev(t), out_cache_loc=dev(t),
                        seq_lens=torch.tensor(seq_lens), extend_lens=torch.tensor(extend_lens),
                        token_slots=dev(len(seq_lens), max(seq_lens)), kv_pool=pool,
                        attn_backend=backend, device_lens=dev(2, len(seq_lens)))


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_model_forward_reads_no_device_value(arch: str) -> None:
    cfg = _config(arch)
    with META:
        model = LlamaForCausalLM(cfg, torch.float32)
    pool = KVPool(cfg.num_layers, 16, PAGE, cfg.num_kv_heads, cfg.head_dim, torch.float32, META)
    # decode (what graphs capture), then a mixed step: a decode row riding with two prompts
    steps = [(ForwardMode.DECODE, [7, 3, 12], [1, 1, 1]),
             (ForwardMode.EXTEND, [9, 5, 4], [1, 5, 3])]
    for mode, seq_lens, extend_lens in steps:
        backend = TorchAttnBackend("loop")  # its metadata is built from host lengths only
        batch = _meta_batch(mode, seq_lens, extend_lens, pool, backend)
        backend.init_forward_metadata(batch)  # per step, before the forward
        with torch.inference_mode():  # as ModelRunner.forward runs it
            logits = model.forward(batch)  # raises on any read of a device value
        assert logits.shape == (len(seq_lens), cfg.vocab_size) and logits.device == META


def _req(prompt_len: int, kv_len: int) -> Req:
    req = Req("r", list(range(prompt_len)), SamplingParams(max_new_tokens=4), arrival=0.0)
    req.output_ids = [1]
    req.kv_len = kv_len
    req.pages = list(range(1, 9))  # room for 32 tokens
    return req


def test_runner_checks_positions_on_the_host() -> None:
    pool = KVPool(1, 64, PAGE, 2, 8, torch.float32)
    runner = ModelRunner(torch.nn.Identity(), pool, TorchAttnBackend(), max_positions=16)
    ok = runner.build_decode([_req(8, 15)])  # position 15: the last one the RoPE table has
    assert ok.positions.tolist() == [15]
    with pytest.raises(ValueError, match="position 16 exceeds max_position_embeddings 16"):
        runner.build_decode([_req(8, 16)])
    with pytest.raises(ValueError, match="position 17 exceeds"):
        runner.build_extend([(_req(18, 0), 18)])
    runner.build_extend([(_req(16, 0), 16)])
    check_positions([3, 5], None)  # unchecked when the runner is not told a limit
