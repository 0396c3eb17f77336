"""Sessions: the prompts of a run, grouped into (possibly multi-turn) conversations.

Single-turn runs are sessions of one turn. With ``--multi-turn N`` consecutive work items form a
session of N turns; the session arrives at its first item's arrival time, and each later turn is
sent as soon as the previous reply is complete, re-sending the whole history (earlier prompts and
replies) plus the new user message: the re-prefill case a prefix cache should absorb.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from sglang_pd.bench.backends import RequestResult, RequestSpec
from sglang_pd.bench.datasets import WorkItem
from sglang_pd.bench.prompts import PromptFactory


@dataclass
class Turn:
    index: int  # global request index
    new_prompt: list[int] | str  # the new user message: ids (native) or text
    new_len: int  # its token count
    output_len: int
    # Native history needs the reply's token ids; if the server does not return them we put
    # this many random ids in their place (same length, so prompt sizes stay right).
    filler_ids: list[int] | None = None


@dataclass
class Session:
    session_id: int
    arrival_s: float  # planned send time of the first turn, seconds since start
    turns: list[Turn]


@dataclass
class History:
    """Conversation so far, in the form the backend sends."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt_len: int = 0  # tokens of the history (our count)


def build_sessions(
    items: list[WorkItem],
    arrivals: list[float],
    factory: PromptFactory,
    native: bool,
    multi_turn: int = 1,
) -> list[Session]:
    """Group items into sessions of ``multi_turn`` turns and draw every prompt up front.

    ``arrivals`` has one entry per session (see :func:`session_heads`).
    """
    if multi_turn < 1:
        raise ValueError("--multi-turn must be >= 1")
    sessions: list[Session] = []
    for start in range(0, len(items), multi_turn):
        turns: list[Turn] = []
        for i in range(start, min(start + multi_turn, len(items))):
            it = items[i]
            if native:
                prompt: list[int] | str = (factory.block_ids(it.hash_ids, it.input_len) if it.hash_ids
                                           else factory.token_ids(it.input_len))
                n = it.input_len
            else:
                prompt, n = factory.text(it.input_len)
            filler = factory.token_ids(it.output_len) if native and multi_turn > 1 else None
            turns.append(Turn(i, prompt, n, it.output_len, filler))
        sessions.append(Session(len(sessions), arrivals[len(sessions)], turns))
    return sessions


def session_heads(items: list[WorkItem], multi_turn: int) -> list[WorkItem]:
    """The first item of each session: the ones whose arrival times the schedule decides."""
    return items[:: max(multi_turn, 1)]


def make_spec(
    backend: str, s: Session, k: int, hist: History, factory: PromptFactory | None
) -> RequestSpec:
    """The request for turn ``k`` of ``s`` given the history so far."""
    t = s.turns[k]
    prompt: Any
    if backend == "sglang":
        prompt = hist.ids + list(t.new_prompt)
        n = len(prompt)
    elif backend == "sglang-oai":
        prompt = (hist.text + "\n" + str(t.new_prompt)) if hist.text else t.new_prompt
        n = _count(factory, prompt, hist.prompt_len + t.new_len)
    else:
        prompt = [*hist.messages, {"role": "user", "content": str(t.new_prompt)}]
        n = hist.prompt_len + t.new_len
    return RequestSpec(t.index, prompt, n, t.output_len, session=s.session_id, turn=k)


def _count(factory: PromptFactory | None, text: Any, fallback: int) -> int:
    if factory is not None and factory.tokenizer is not None and isinstance(text, str):
        return factory.count(text)
    return fallback


def extend_history(
    backend: str, hist: History, spec: RequestSpec, t: Turn, res: RequestResult
) -> History:
    """History after turn ``t`` got reply ``res``."""
    if backend == "sglang":
        reply = res.output_ids if res.output_ids and len(res.output_ids) == res.output_len else None
        ids: list[int] = list(cast("list[int]", spec.prompt))  # the native backend sends ids
        ids += reply if reply is not None else list(t.filler_ids or [])
        return History(ids=ids, prompt_len=len(ids))
    if backend == "sglang-oai":
        text = str(spec.prompt) + res.generated_text
        return History(text=text, prompt_len=spec.prompt_len + res.output_len)
    msgs = [*cast("list[dict[str, str]]", spec.prompt), {"role": "assistant", "content": res.generated_text}]
    return History(messages=msgs, prompt_len=spec.prompt_len + res.output_len)
