"""Input limits shared by the router and the servers: ONE definition, importable without torch
(the servers' ``frontend/limits.py`` imports these; the router package never imports the server).

A request over a limit is refused with a 4xx before any work is done on it.
"""

from __future__ import annotations

MAX_BODY_BYTES = 16 << 20  # 16 MiB of JSON: a 128K-token prompt as an id list is under 1 MiB
# A byte-level BPE token covers at most a few dozen characters: a longer text cannot fit the
# context, so it is refused before tokenization (which would otherwise run for seconds)
MAX_CHARS_PER_TOKEN = 32
# JSON nesting the router accepts: orjson parses 1024 levels but serialises only 255, and no
# request of ours nests more than a handful
MAX_JSON_DEPTH = 128
# texts up to this many characters are tokenized inline; longer ones in a worker thread
INLINE_TOKENIZE_CHARS = 8192


def json_too_deep(obj: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``obj`` (parsed JSON) nests containers deeper than ``limit``. Only containers are
    visited, so a flat id list costs one pass over it."""
    stack = [(obj, 1)] if isinstance(obj, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False
