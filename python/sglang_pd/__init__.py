"""sglang-pd: SGLang-compatible serving for prefill/decode-disaggregated clusters."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy: importing sglang_pd.protocol must not pull in torch
    if name == "Engine":
        from sglang_pd.offline_engine import Engine

        return Engine
    raise AttributeError(name)
