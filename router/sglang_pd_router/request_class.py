"""A request's prefill class (short/long), the prefill roles, and the headers that carry the
router's class to the servers: one definition for the router, the servers and the simulator.

Torch-free and dependency-free. It lives in the router's package because the router never
imports the server (``sglang_pd``); the server imports it from here, as it does ``limits.py``.

The class is PLA-Serve's (§3.2): a request is short when its new prompt tokens (the prompt less a
cached prefix) are at most the threshold. The default threshold is 256 tokens, PLA-Serve's short
regime and the servers' ``--short-prefill-threshold`` default (docs/prefill_scheduling.md); the
router adopts the servers' own value from ``/get_server_info`` (docs/router.md).

The router sends its class with the request as two headers (``class_headers``): headers, not a
body field, because a server that does not know them (SGLang's) ignores them, while an unknown
body key is refused by strict parsers (ours included); and they work the same for /generate and
the OpenAI routes. A server classifies by itself when they are absent (SGLang's routers do not
send them) and uses them when present and consistent (``resolve_class``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SHORT_PREFILL_THRESHOLD = 256  # new prompt tokens; at most this many: "short"
REQUEST_CLASSES = ("short", "long")
PREFILL_ROLES = ("both", "short", "long")  # which class a prefill instance serves first

CLASS_HEADER = "x-sglang-pd-class"  # "short" | "long", as the router classified
CLASS_TOKENS_HEADER = "x-sglang-pd-class-tokens"  # the prompt token count it classified by


def classify(new_tokens: int, threshold: int = SHORT_PREFILL_THRESHOLD) -> str:
    """PLA-Serve §3.2: "short" when ``new_tokens`` (prompt less cached prefix) <= ``threshold``."""
    return "short" if new_tokens <= threshold else "long"


def class_headers(request_class: str, tokens: int) -> dict[str, str]:
    """The headers the router adds to both legs of a request."""
    return {CLASS_HEADER: request_class, CLASS_TOKENS_HEADER: str(tokens)}


@dataclass(frozen=True)
class SentClass:
    """The class a router sent and the token count it classified by."""

    request_class: str
    tokens: int


def read_class_headers(headers: Mapping[str, str]) -> SentClass | None:
    """The router's class from the request's headers; None when absent or malformed (a server
    then classifies by itself: the headers are advice, never a reason to refuse a request)."""
    cls, tokens = headers.get(CLASS_HEADER), headers.get(CLASS_TOKENS_HEADER)
    if cls not in REQUEST_CLASSES or tokens is None or not tokens.isdigit():
        return None
    return SentClass(cls, int(tokens))


def resolve_class(sent: SentClass | None, tokens: int, threshold: int) -> tuple[str, bool]:
    """The class a server gives a request of ``tokens`` new prompt tokens (its own count, which
    always wins), and whether the router's count disagreed. The router's class is used when its
    count matches (its threshold may differ, and its pool choice was made by it); else the
    server classifies by its own count."""
    if sent is None:
        return classify(tokens, threshold), False
    if sent.tokens != tokens:
        return classify(tokens, threshold), True
    return sent.request_class, False
