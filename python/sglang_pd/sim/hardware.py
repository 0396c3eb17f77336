"""Model shapes and hardware specs the analytic cost profiles are built from.

Numbers are public spec-sheet figures (dense peak FLOP/s without sparsity, HBM bandwidth and
capacity per GPU) and the models' published configs. Efficiency factors are assumptions, named
here and in docs/simulator.md: they scale peaks to what a tuned serving engine reaches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float  # all weights (MoE: every expert)
    layers: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    active_params: float | None = None  # MoE: weights one token passes through; None = dense
    num_experts: int = 0  # MoE routed experts per layer (0 = dense)
    experts_per_token: int = 0
    expert_share: float = 0.0  # fraction of ``params`` held by routed experts
    weight_bytes: float = 2.0  # bytes per weight (bf16 2, fp8 1)
    kv_bytes: float = 2.0  # bytes per KV element

    @property
    def active(self) -> float:
        return self.active_params if self.active_params is not None else self.params

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token (all TP ranks together)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def attn_dim(self) -> int:
        return self.heads * self.head_dim

    def weight_bytes_read(self, batch_tokens: int) -> float:
        """Weights one forward over ``batch_tokens`` tokens reads: dense weights once, and for
        MoE the experts at least one token is routed to (uniform routing, an assumption)."""
        total = self.params * self.weight_bytes
        if not self.num_experts:
            return total
        expert = total * self.expert_share
        touched = 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(batch_tokens, 1)
        return total - expert + expert * touched


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s per GPU
    hbm_bytes_s: float  # HBM bandwidth per GPU
    memory_bytes: float  # HBM capacity per GPU
    fp8_speedup: float = 1.0  # fp8 weights: peak FLOP/s multiplier (Hopper 2x)
    compute_eff: float = 0.5  # assumption: model FLOPs utilisation of prefill GEMMs
    attn_eff: float = 0.4  # assumption: attention kernels
    mem_eff: float = 0.7  # assumption: achieved share of HBM bandwidth
    tp_eff: float = 0.85  # assumption: share kept at TP > 1 (all-reduces)
    mem_util: float = 0.9  # --mem-fraction-static: pool + weights share of HBM


MODELS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape("llama-3-8b", 8.03e9, 32, 32, 8, 128),
    "llama-3-70b": ModelShape("llama-3-70b", 70.6e9, 80, 64, 8, 128),
    "qwen2.5-14b": ModelShape("qwen2.5-14b", 14.7e9, 48, 40, 8, 128),
    "qwen2.5-32b": ModelShape("qwen2.5-32b", 32.8e9, 64, 40, 8, 128),
    # MiniMax-M2.5-like MoE (Kairos §4.1: 229B, FP8): 62 layers, 48 query / 8 KV heads of 128,
    # 256 experts top-8, ~10B active; the expert share of the weights is an assumption
    "minimax-m2.5": ModelShape("minimax-m2.5", 229e9, 62, 48, 8, 128, active_params=10e9,
                               num_experts=256, experts_per_token=8, expert_share=0.95,
                               weight_bytes=1.0),
}

HARDWARE: dict[str, HardwareSpec] = {
    "h100": HardwareSpec("h100", 989e12, 3.35e12, 80e9, fp8_speedup=2.0),
    "h200": HardwareSpec("h200", 989e12, 4.8e12, 141e9, fp8_speedup=2.0),
    "a100": HardwareSpec("a100", 312e12, 2.0e12, 80e9),
}


def model_shape(name: str) -> ModelShape:
    if name not in MODELS:
        raise ValueError(f"unknown model shape {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def hardware_spec(name: str) -> HardwareSpec:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)}")
    return HARDWARE[name]
