"""Input limits (docs/api.md lists them): one client must never be able to hurt another.

Every limit answers 400 (413 for the body) with a message naming the limit, before any work
is done; the queue limit answers 503 with Retry-After.
"""

from __future__ import annotations

from sglang_pd.protocol import (GREEDY_TEMPERATURE, GREEDY_TOP_P, MAX_STOP_STRING_CHARS,  # noqa: F401
                                MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS)

# the body and text bounds are the router's too: one definition in its torch-free package
from sglang_pd_router.limits import MAX_BODY_BYTES, MAX_CHARS_PER_TOKEN  # noqa: F401

MAX_BATCH_PROMPTS = 512  # prompts in one /generate or /v1/completions call
MAX_TOP_LOGPROBS = 20  # OpenAI's chat limit; used for /generate and /v1/completions too
RETRY_AFTER_S = 1
