"""Sampling parameters and SLOs of a request, parsed once for every entry point.

The HTTP frontend (``frontend/inputs.py``, which turns a ``ValueError`` into a 400) and the offline
``Engine`` (``offline_engine.py``, which raises it) share these, so a request means the same thing
whichever way it comes in. No HTTP, no torch: only the wire's dicts and the typed messages.

SLOs are resolved here, once, into ``protocol.Slo`` (seconds): per field the body's value, else
the ``x-slo-ttft-ms`` / ``x-slo-tpot-ms`` header, else the server's ``--slo-ttft-ms`` /
``--slo-tpot-ms`` default; what is still unset is "no SLO" (docs/scheduling.md, "SLOs").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from sglang_pd.protocol import SamplingParams, Slo

SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
# SGLang sampling keys we accept as long as they are unset/empty (clients send them as null).
UNSUPPORTED_WHEN_SET = frozenset({
    "json_schema", "regex", "ebnf", "structural_tag", "logit_bias", "custom_params",
    "stop_regex", "lora_path", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_sequence_breakers",
})
# SGLang sampling keys that are harmless to ignore whatever their value.
IGNORED = frozenset({"stream_interval", "no_repeat_ngram_size"})

SLO_KEYS = ("ttft_ms", "tpot_ms")  # the wire's names (milliseconds), body and headers
SLO_HEADERS = {"ttft_ms": "x-slo-ttft-ms", "tpot_ms": "x-slo-tpot-ms"}


class _SloMs(msgspec.Struct):
    """The wire's form, milliseconds (only while parsing: ``Slo`` is what travels on)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


def parse_sampling_params(raw: Any) -> SamplingParams:
    """SGLang's ``sampling_params`` dict -> SamplingParams; a ValueError names what is wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"sampling_params must be an object, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in SAMPLING_FIELDS and k not in
                     UNSUPPORTED_WHEN_SET and k not in IGNORED and k != "sampling_seed")
    if unknown:
        raise ValueError(f"unknown sampling_params keys: {', '.join(unknown)}")
    unsupported = sorted(k for k in raw if k in UNSUPPORTED_WHEN_SET and raw[k] not in
                         (None, "", [], {}))
    if unsupported:
        raise ValueError(f"sampling_params not supported by this server: {', '.join(unsupported)}")
    clean = {k: v for k, v in raw.items() if k in SAMPLING_FIELDS and v is not None}
    if raw.get("sampling_seed") is not None and "seed" not in clean:
        clean["seed"] = raw["sampling_seed"]  # SGLang's name for the per-request seed
    if isinstance(clean.get("stop"), str):
        clean["stop"] = [clean["stop"]]
    try:
        return msgspec.convert(clean, SamplingParams)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid sampling_params: {e}") from None


def default_slo(slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> Slo | None:
    """The server's ``--slo-ttft-ms`` / ``--slo-tpot-ms`` as the default ``parse_slo`` fills in."""
    return Slo.from_ms(slo_ttft_ms, slo_tpot_ms)


def parse_slo(body_slo: Any, headers: Mapping[str, str] | None = None,
              default: Slo | None = None) -> Slo | None:
    """The request's resolved SLO (module docstring); None when it has none at all."""
    values: dict[str, Any] = {}
    for key, header in SLO_HEADERS.items():
        if headers and header in headers:
            try:
                values[key] = float(headers[header])
            except ValueError:
                raise ValueError(f"header {header} must be a number, got {headers[header]!r}") from None
    if body_slo is not None:
        if not isinstance(body_slo, dict):
            raise ValueError("slo must be an object like {\"ttft_ms\": 500, \"tpot_ms\": 50}")
        unknown = sorted(str(k) for k in body_slo if k not in SLO_KEYS)
        if unknown:  # a misspelt target must not silently fall back to the default
            raise ValueError(f"unknown slo keys: {', '.join(unknown)} (allowed: ttft_ms, tpot_ms)")
        values.update({k: v for k, v in body_slo.items() if v is not None})
    try:
        ms = msgspec.convert(values, _SloMs, strict=False)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid slo: {e}") from None
    for key in SLO_KEYS:
        value = getattr(ms, key)
        if value is not None and not (value > 0 and math.isfinite(value)):  # NaN fails too
            raise ValueError(f"slo.{key} must be a positive finite number of ms, got {value}")
    own = Slo.from_ms(ms.ttft_ms, ms.tpot_ms)
    if default is None:
        return own
    if own is None:
        return default
    return Slo(own.ttft_s if own.ttft_s is not None else default.ttft_s,
               own.tpot_s if own.tpot_s is not None else default.tpot_s)
