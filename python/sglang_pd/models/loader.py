"""Build a model from a HF directory: config.json + safetensors, or random ("dummy") weights."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from sglang_pd.models.config import ModelConfig
from sglang_pd.models.fused import fused_kernels_on
from sglang_pd.models.parallel import TPGroup, check_tp_size
from sglang_pd.models.registry import get_model_class

LOAD_FORMATS: tuple[str, ...] = ("auto", "dummy")
DUMMY_SEED = 0
DUMMY_STD = 0.02
DUMMY_BLOCK = 1_048_573  # prime
_STR_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def resolve_dtype(dtype: torch.dtype | str, cfg: ModelConfig) -> torch.dtype:
    """A torch.dtype, or "auto" (the checkpoint's torch_dtype), "float32", "bfloat16", "float16"."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return cfg.torch_dtype
    if dtype not in _STR_DTYPES:
        raise ValueError(
            f"unsupported dtype {dtype!r}; supported: ['auto', {', '.join(map(repr, _STR_DTYPES))}]"
        )
    return _STR_DTYPES[dtype]


def load_model(
    model_path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    load_format: str = "auto",
    tp: TPGroup | None = None,
) -> tuple[nn.Module, ModelConfig]:
    """Returns (model in eval mode with grads off, its ModelConfig).

    load_format "auto" reads *.safetensors (sharded via model.safetensors.index.json or not);
    "dummy" needs only config.json and fills weights from a fixed seed. ``tp``: this rank's
    tensor-parallel group; the model holds, and reads from disk, only this rank's shard.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(
            f"unsupported load_format {load_format!r}; supported: {list(LOAD_FORMATS)}"
        )
    path = Path(model_path)
    cfg = ModelConfig.from_pretrained(path)
    torch_dtype = resolve_dtype(dtype, cfg)
    cls = get_model_class(cfg.architecture)
    tp = tp or TPGroup.single()
    check_tp_size(cfg, tp.size)
    # Build on the meta device, then allocate uninitialised storage: no time spent on
    # default random init that the checkpoint overwrites anyway.
    # gate/up merged into one matmul only where the SiLU-and-mul kernel reads it (CUDA by
    # default; see models/fused.py): on CPU two matmuls are faster.
    with torch.device("meta"):
        if tp.size == 1:  # the model classes that predate tensor parallelism take no tp
            model = cls(cfg, torch_dtype, merge_gate_up=fused_kernels_on(device))
        else:
            model = cls(cfg, torch_dtype, merge_gate_up=fused_kernels_on(device), tp=tp)
    model = model.to_empty(device=device)
    if tp.size > 1:  # vocabulary padding rows are never loaded: zeros, not garbage
        for param in model.parameters():
            param.data.zero_()
    if load_format == "dummy":
        init_dummy_weights(model)
    else:
        load_safetensors(model, path)
    model.eval()
    model.requires_grad_(False)
    return model, cfg


def _dummy_units(model: nn.Module) -> list[tuple[str, torch.Tensor, Any]]:
    """(checkpoint name, the rows it fills, its WeightTarget or None) in the checkpoint's terms
    where the model maps them, so dummy values do not depend on how parameters are fused
    (gate/up merged or not) nor on how they are split over tensor-parallel ranks."""
    params = dict(model.named_parameters())
    if not hasattr(model, "hf_weight_map"):
        return [(name, p, None) for name, p in params.items()]
    return [
        (name, params[t.param][t.row_start : t.row_start + t.rows], t)
        for name, t in cast(Any, model).hf_weight_map().items()
    ]


def init_dummy_weights(model: nn.Module, seed: int = DUMMY_SEED) -> None:
    """Norm weights 1, everything else uniform with std DUMMY_STD, from a fixed seed.

    Only one block of DUMMY_BLOCK random values is drawn and tiled over every checkpoint tensor
    in turn, continuing where the previous one stopped (so no two tensors are equal): drawing
    135M values takes seconds on CPU, copying a block is memory-bound. The block length is
    prime, so consecutive rows of a matrix see shifted, not repeated, values.
    """
    units = _dummy_units(model)
    if not units:
        return
    device, dtype = units[0][1].device, units[0][1].dtype
    if any(t is not None and t.shard_dim is not None for _, _, t in units):
        _init_dummy_shards(units, seed)
        return
    gen = torch.Generator(device="cpu").manual_seed(seed)
    bound = DUMMY_STD * 3**0.5
    block = (torch.rand(DUMMY_BLOCK, generator=gen) * (2 * bound) - bound).to(
        device=device, dtype=dtype
    )
    offset = 0
    with torch.no_grad():
        for name, rows, _ in units:
            if name.endswith("norm.weight"):
                rows.fill_(1.0)
                continue
            flat = rows.view(-1)  # whole rows of a contiguous parameter: a view
            done = 0
            while done < flat.numel():
                n = min(DUMMY_BLOCK - offset, flat.numel() - done)
                flat[done : done + n].copy_(block[offset : offset + n])
                done += n
                offset = (offset + n) % DUMMY_BLOCK


def _init_dummy_shards(units: list[tuple[str, torch.Tensor, Any]], seed: int) -> None:
    """init_dummy_weights for one tensor-parallel rank: the same values as one process would
    draw, sliced. Each checkpoint tensor is built whole on the host from the tiled block (the
    offset runs over whole tensors), then this rank's slice is copied in."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    bound = DUMMY_STD * 3**0.5
    block = torch.rand(DUMMY_BLOCK, generator=gen) * (2 * bound) - bound
    offset = 0
    with torch.no_grad():
        for name, rows, t in units:
            if name.endswith("norm.weight"):
                rows.fill_(1.0)
                continue
            shape = list(rows.shape)
            if t is not None and t.shard_dim is not None:
                shape[t.shard_dim] = t.full
            n = math.prod(shape)
            idx = (torch.arange(n, dtype=torch.int64) + offset) % DUMMY_BLOCK
            offset = (offset + n) % DUMMY_BLOCK
            full = block[idx].view(shape)
            if t is not None and t.shard_dim is not None:
                full = full.narrow(t.shard_dim, t.shard_start, t.shard_len)
            rows.copy_(full.to(rows.dtype))


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [path / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{index.name} lists shard files that do not exist in {path}: {missing}"
            )
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        raise FileNotFoundError(
            f"no *.safetensors checkpoint in {path} (found {present}); only safetensors is "
            "supported -- use load_format='dummy' for random weights from config.json alone"
        )
    return files


def _ignorable(name: str, model: nn.Module) -> bool:
    # Precomputed RoPE buffers some exporters save; lm_head duplicated into tied checkpoints.
    if name.endswith("rotary_emb.inv_freq"):
        return True
    return name == "lm_head.weight" and getattr(model, "lm_head", 0) is None


def load_safetensors(model: nn.Module, path: Path) -> None:
    from safetensors import safe_open

    targets = model.hf_weight_map()  # type: ignore[operator]
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for file in checkpoint_files(path):
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    target = targets.get(name)
                    if target is None:
                        if not _ignorable(name, model):
                            unexpected.append(name)
                        continue
                    param = params[target.param]
                    want = (target.rows, *param.shape[1:])
                    tensor = _read(f, name, target, want, file.name)
                    if tuple(tensor.shape) != want:
                        raise ValueError(
                            f"checkpoint tensor {name!r} in {file.name} has shape "
                            f"{tuple(tensor.shape)}, "
                            f"config.json implies {want}"
                        )
                    param[target.row_start : target.row_start + target.rows].copy_(tensor)
                    loaded.add(name)
    if unexpected:
        raise ValueError(
            f"checkpoint {path} has {len(unexpected)} tensor(s) this {cast(Any, model).config.architecture} "
            f"config does not use: {_names(unexpected)}"
        )
    missing = [n for n in targets if n not in loaded]
    if missing:
        raise ValueError(
            f"checkpoint {path} is missing {len(missing)} tensor(s): {_names(missing)}"
        )


def _read(f: Any, name: str, target: Any, want: tuple[int, ...], file: str) -> torch.Tensor:
    """The checkpoint tensor, or only this rank's slice of it (read from disk alone)."""
    if target.shard_dim is None:
        return f.get_tensor(name)
    sl = f.get_slice(name)
    full = list(want)
    full[target.shard_dim] = target.full
    if list(sl.get_shape()) != full:
        raise ValueError(f"checkpoint tensor {name!r} in {file} has shape {tuple(sl.get_shape())}, "
                         f"config.json implies {tuple(full)}")
    lo, hi = target.shard_start, target.shard_start + target.shard_len
    return sl[lo:hi] if target.shard_dim == 0 else sl[:, lo:hi]


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
