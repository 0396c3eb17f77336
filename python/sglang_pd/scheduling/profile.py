"""Measured step times: the one versioned profile that cost models and the simulator read.

A profile is a JSON file per (model, hardware, dtype, attention backend), written by the profiler
(``sglang_pd.tools.profile_cost_model``) and read as a prior by ``PrefillCostModel`` (and the
decode cost model and the simulator). Format, units and an example: docs/profile.md.

Pure: no torch, no engine imports. The only I/O is reading or writing the JSON text at a given
path (``load_profile`` / ``dump_profile``); ``decode_profile`` / ``encode_profile`` work on bytes.

Grids are row-major: ``seconds[i][j]`` belongs to ``rows[i]`` and ``columns[j]``. A cell may be
``null`` (not measured: e.g. beyond the model's context length); every other cell is a finite
time in seconds > 0. Axes are strictly ascending.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from collections.abc import Iterator, Sequence

import msgspec

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = (1,)

__all__ = [
    "SCHEMA_VERSION", "SUPPORTED_VERSIONS", "ProfileError", "ProfileMeta", "PrefillCoeffsSpec",
    "PrefillBatchGrid", "PrefillGrid", "DecodeGrid", "Profile", "validate_profile",
    "decode_profile", "encode_profile", "load_profile", "dump_profile",
]


class ProfileError(ValueError):
    """A profile that cannot be read: names the bad field and the supported schema version."""


Grid = list[list[float | None]]


class ProfileMeta(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the numbers come from. Strings are free text unless noted."""

    model: str  # model name or path it was measured with, e.g. "meta-llama/Llama-3.1-8B"
    arch: str  # HF architecture, e.g. "LlamaForCausalLM"
    device: str  # e.g. "NVIDIA H100 80GB HBM3", "cpu"
    dtype: str  # e.g. "bfloat16", "float32"
    page_size: int  # KV page size in tokens (> 0)
    attention_backend: str  # e.g. "torch", "triton", "flashinfer"
    created: str  # ISO 8601 date or date-time, e.g. "2026-05-09" or "2026-05-09T12:00:00Z"
    tool: str = "sglang_pd.tools.profile_cost_model"
    tool_version: str = "0"
    tp_size: int = 1  # tensor-parallel ranks the step ran on (> 0)
    repeats: int = 1  # timed runs per cell (their mean is stored; > 0)
    notes: str = ""


class PrefillCoeffsSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """PLA-Serve §2.1 coefficients (cost_model.PrefillCoeffs), fitted from compute- and
    memory-bound parts timed apart. Seconds per unit; all finite and >= 0."""

    launch_s: float = 0.0  # per forward
    per_req_s: float = 0.0  # per request in the step
    a: float = 0.0  # per token pair: a·L(L + 2H)
    b: float = 0.0  # per new token, compute
    g_w: float = 0.0  # per new token, KV write
    g_r: float = 0.0  # per context token, KV read


class PrefillBatchGrid(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Batched short prefills: B requests of L new tokens each (over H context tokens each) in
    one forward. ``seconds[i][j]``: batch_sizes[i] x new_tokens[j]."""

    batch_sizes: list[int]  # B, >= 1, ascending
    new_tokens: list[int]  # L per request, >= 1, ascending
    seconds: Grid
    context_tokens: int = 0  # H per request, >= 0
    std_seconds: Grid | None = None  # spread over the repeats, same shape, >= 0


class PrefillGrid(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One request's prefill step T(L, H): ``seconds[i][j]`` for new_tokens[i] = L new tokens
    over context_tokens[j] = H tokens already in the KV cache (prefix hit or earlier chunks)."""

    new_tokens: list[int]  # L, >= 1, ascending
    context_tokens: list[int]  # H, >= 0, ascending
    seconds: Grid
    std_seconds: Grid | None = None
    batched: PrefillBatchGrid | None = None
    coeffs: PrefillCoeffsSpec | None = None

    def points(self) -> Iterator[tuple[int, int, int, float]]:
        """Every measured step as (batch size, sum L, sum H, seconds), batched points included."""
        for l, row in zip(self.new_tokens, self.seconds):
            for h, t in zip(self.context_tokens, row):
                if t is not None:
                    yield 1, l, h, t
        g = self.batched
        if g is not None:
            for b, row in zip(g.batch_sizes, g.seconds):
                for l, t in zip(g.new_tokens, row):
                    if t is not None:
                        yield b, b * l, b * g.context_tokens, t


class DecodeGrid(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One decode step (one new token per request): ``seconds[i][j]`` for batch_sizes[i]
    requests holding context_tokens[j] KV tokens (``context_key`` says which figure: the
    batch's total, as ``StepProfile.context_tokens``, or the mean or longest request's)."""

    batch_sizes: list[int]  # >= 1, ascending
    context_tokens: list[int]  # >= 0, ascending
    seconds: Grid
    context_key: Literal["total", "mean", "max"] = "total"
    std_seconds: Grid | None = None

    def cells(self) -> Iterator[tuple[int, int, float]]:
        """Every measured cell as (batch size, context tokens, seconds)."""
        for b, row in zip(self.batch_sizes, self.seconds):
            for c, t in zip(self.context_tokens, row):
                if t is not None:
                    yield b, c, t


class Profile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    schema_version: int
    meta: ProfileMeta
    prefill: PrefillGrid | None = None
    decode: DecodeGrid | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)  # tool-specific, not read here


# ---------------------------------------------------------------------------- validation
def _fail(path: str, msg: str) -> None:
    raise ProfileError(f"profile field `{path}`: {msg} (supported schema_version: {SCHEMA_VERSION})")


def _check_axis(path: str, axis: Sequence[int], lo: int) -> None:
    if not axis:
        _fail(path, "must not be empty")
    for i, v in enumerate(axis):
        if v < lo:
            _fail(f"{path}[{i}]", f"must be >= {lo}, got {v}")
        if i and v <= axis[i - 1]:
            _fail(f"{path}[{i}]", f"axis must be strictly ascending, got {axis[i - 1]} then {v}")


def _check_grid(path: str, grid: Grid, n_rows: int, n_cols: int, rows: str, cols: str,
                spread: bool = False) -> None:
    if len(grid) != n_rows:
        _fail(path, f"has {len(grid)} rows, expected {n_rows} (one per `{rows}` value)")
    for i, row in enumerate(grid):
        if len(row) != n_cols:
            _fail(f"{path}[{i}]", f"has {len(row)} cells, expected {n_cols} (one per `{cols}` value)")
        for j, t in enumerate(row):
            if t is None:
                continue
            ok = math.isfinite(t) and (t >= 0 if spread else t > 0)
            if not ok:
                _fail(f"{path}[{i}][{j}]", f"must be a finite number of seconds "
                      f"{'>= 0' if spread else '> 0'} or null, got {t}")


def _measured(grid: Grid) -> bool:
    return any(t is not None for row in grid for t in row)


def _check_table(path: str, seconds: Grid, std: Grid | None, rows: tuple[str, Sequence[int]],
                 cols: tuple[str, Sequence[int]], need_measured: bool = True) -> None:
    """A seconds grid (and its optional spread) over two named axes."""
    shape = (len(rows[1]), len(cols[1]), rows[0], cols[0])
    _check_grid(f"{path}.seconds", seconds, *shape)
    if need_measured and not _measured(seconds):
        _fail(f"{path}.seconds", "has no measured cell (all null)")
    if std is not None:
        _check_grid(f"{path}.std_seconds", std, *shape, spread=True)


def validate_profile(p: Profile) -> Profile:
    """Check what types alone cannot (versions, axes, shapes, times); returns ``p``."""
    if p.schema_version not in SUPPORTED_VERSIONS:
        _fail("schema_version", f"unsupported version {p.schema_version}; supported: "
              f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
    m = p.meta
    for name in ("page_size", "tp_size", "repeats"):
        if getattr(m, name) < 1:
            _fail(f"meta.{name}", f"must be >= 1, got {getattr(m, name)}")
    for name in ("model", "arch", "device", "dtype", "attention_backend"):
        if not getattr(m, name).strip():
            _fail(f"meta.{name}", "must not be empty")
    try:
        datetime.fromisoformat(m.created.replace("Z", "+00:00"))
    except ValueError:
        _fail("meta.created", f"must be an ISO 8601 date or date-time, got {m.created!r}")
    if p.prefill is None and p.decode is None:
        _fail("prefill", "a profile needs a `prefill` or a `decode` section (or both)")
    if (g := p.prefill) is not None:
        _check_axis("prefill.new_tokens", g.new_tokens, 1)
        _check_axis("prefill.context_tokens", g.context_tokens, 0)
        _check_table("prefill", g.seconds, g.std_seconds, ("prefill.new_tokens", g.new_tokens),
                     ("prefill.context_tokens", g.context_tokens))
        if (bg := g.batched) is not None:
            _check_axis("prefill.batched.batch_sizes", bg.batch_sizes, 1)
            _check_axis("prefill.batched.new_tokens", bg.new_tokens, 1)
            if bg.context_tokens < 0:
                _fail("prefill.batched.context_tokens", f"must be >= 0, got {bg.context_tokens}")
            _check_table("prefill.batched", bg.seconds, bg.std_seconds,
                         ("prefill.batched.batch_sizes", bg.batch_sizes),
                         ("prefill.batched.new_tokens", bg.new_tokens), need_measured=False)
        if (c := g.coeffs) is not None:
            for name in PrefillCoeffsSpec.__struct_fields__:
                v = getattr(c, name)
                if not (math.isfinite(v) and v >= 0):
                    _fail(f"prefill.coeffs.{name}", f"must be a finite number >= 0, got {v}")
    if (d := p.decode) is not None:
        _check_axis("decode.batch_sizes", d.batch_sizes, 1)
        _check_axis("decode.context_tokens", d.context_tokens, 0)
        _check_table("decode", d.seconds, d.std_seconds, ("decode.batch_sizes", d.batch_sizes),
                     ("decode.context_tokens", d.context_tokens))
    return p


# ---------------------------------------------------------------------------- reading / writing
def _json_path(msgspec_path: str) -> str:
    """msgspec says ``$.prefill.seconds[0]``; we say ``prefill.seconds[0]``."""
    return msgspec_path[2:] if msgspec_path.startswith("$.") else msgspec_path.lstrip("$") or "<root>"


def decode_profile(data: bytes | str, source: str = "<profile>") -> Profile:
    """Parse and validate a profile's JSON text."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise ProfileError(f"{source}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: a profile is a JSON object, got {type(raw).__name__}")
    version = raw.get("schema_version")
    if version is None:
        raise ProfileError(f"{source}: profile field `schema_version` is missing "
                           f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise ProfileError(f"{source}: profile field `schema_version`: unsupported version {version!r}; "
                           f"this build reads {', '.join(map(str, SUPPORTED_VERSIONS))}")
    try:
        prof = msgspec.convert(raw, Profile)
    except msgspec.ValidationError as e:
        msg = str(e)
        where = ""
        if " - at `" in msg:
            msg, _, rest = msg.partition(" - at `")
            where = f"field `{_json_path(rest.rstrip('`'))}`: "
        raise ProfileError(f"{source}: profile {where}{msg} "
                           f"(supported schema_version: {SCHEMA_VERSION})") from None
    try:
        return validate_profile(prof)
    except ProfileError as e:
        raise ProfileError(f"{source}: {e}") from None


def _write(obj: Any, indent: int, out: list[str]) -> None:
    """Indented JSON with each list of scalars (an axis, a grid row) on one line."""
    pad = "  " * (indent + 1)
    if isinstance(obj, dict) and obj:
        out.append("{\n")
        for i, (k, v) in enumerate(obj.items()):
            out.append(f"{pad}{msgspec.json.encode(k).decode()}: ")
            _write(v, indent + 1, out)
            out.append(",\n" if i < len(obj) - 1 else "\n")
        out.append("  " * indent + "}")
    elif isinstance(obj, list) and obj and any(isinstance(v, (list, dict)) for v in obj):
        out.append("[\n")
        for i, v in enumerate(obj):
            out.append(pad)
            _write(v, indent + 1, out)
            out.append(",\n" if i < len(obj) - 1 else "\n")
        out.append("  " * indent + "]")
    else:
        out.append(msgspec.json.encode(obj).decode().replace(",", ", ") if isinstance(obj, list)
                   else msgspec.json.encode(obj).decode())


def encode_profile(profile: Profile) -> bytes:
    """Validate and serialise: indented JSON, fields in schema order, grid rows one per line."""
    validate_profile(profile)
    out: list[str] = []
    _write(msgspec.to_builtins(profile), 0, out)
    return ("".join(out) + "\n").encode()


def load_profile(path: str | Path) -> Profile:
    """Read and validate the profile at ``path``; ``ProfileError`` (a ValueError) names the bad
    field and the supported schema version."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ProfileError(f"cannot read profile {p}: {e.strerror or e}") from None
    return decode_profile(data, source=str(p))


def dump_profile(profile: Profile, path: str | Path) -> None:
    """Validate and write ``profile`` as JSON to ``path``."""
    Path(path).write_bytes(encode_profile(profile))
