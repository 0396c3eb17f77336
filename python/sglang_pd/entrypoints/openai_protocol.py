"""OpenAI request bodies (msgspec structs) and their mapping onto SamplingParams.

Unknown fields are ignored, as OpenAI clients and the SGLang router send many optional
ones; fields that would change the result but are not implemented give a 400.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from sglang_pd.frontend.errors import bad_request
from sglang_pd.frontend.inputs import check_batch_size
from sglang_pd.frontend.limits import MAX_TOP_LOGPROBS
from sglang_pd.protocol import SamplingParams

T = TypeVar("T", bound=msgspec.Struct)


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(msgspec.Struct, kw_only=True):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    rid: str | list[str] | None = None
    # SGLang router extras: accepted; hidden states are not produced by this server.
    return_hidden_states: bool = False
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    slo: dict[str, Any] | None = None
    # structured output (SGLang and vLLM names): refused until supported, never silently ignored
    regex: Any = None
    json_schema: Any = None
    ebnf: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    response_format: dict[str, Any] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Common, kw_only=True):
    prompt: Any  # str | list[str] | list[int] | list[list[int]]: checked in prompts()
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False


def parse_body(body: dict[str, Any], cls: type[T]) -> T:
    try:
        return msgspec.convert(body, cls)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid request: {e}") from None


_STRUCTURED = ("regex", "json_schema", "ebnf", "guided_json", "guided_regex", "guided_choice",
               "guided_grammar", "structural_tag")
# chat_template_kwargs may not override what the server itself passes to the template
_RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt"})


def check_supported(req: _Common) -> None:
    given = [name for name in _STRUCTURED if getattr(req, name) not in (None, "", [], {})]
    if given:
        raise bad_request(f"structured output is not supported by this server: {', '.join(given)}")
    fmt = (req.response_format or {}).get("type", "text") if isinstance(req.response_format, dict) else "text"
    if fmt != "text":
        raise bad_request(f"response_format type {fmt!r} is not supported (only 'text')")
    if req.n != 1:
        raise bad_request(f"n must be 1 (parallel sampling is not supported), got {req.n}")
    if req.logit_bias:
        raise bad_request("logit_bias is not supported")
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise bad_request("echo=true is not supported")
        if req.best_of not in (None, 1):
            raise bad_request(f"best_of must be 1, got {req.best_of}")
        if req.suffix:
            raise bad_request("suffix is not supported")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.logprobs}")
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {req.top_logprobs}")
        if req.functions or req.function_call not in (None, "none", "auto"):
            raise bad_request("functions / function_call are not supported (tool calling is not "
                              "implemented)")
        if req.tool_choice not in (None, "none", "auto"):
            raise bad_request(f"tool_choice {req.tool_choice!r} is not supported (tool calling is "
                              "not implemented; only 'none' or 'auto')")
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & set(req.chat_template_kwargs or {}))
        if reserved:
            raise bad_request(f"chat_template_kwargs may not set {', '.join(reserved)} (the server "
                              "sets them from the request)")


def to_sampling_params(req: _Common, max_new_tokens: int | None) -> SamplingParams:
    """OpenAI names -> SGLang SamplingParams; None means "the SGLang default"."""
    values: dict[str, Any] = {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "min_p": req.min_p, "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "seed": req.seed,
        "max_new_tokens": max_new_tokens, "min_new_tokens": req.min_tokens,
        "stop": [req.stop] if isinstance(req.stop, str) else req.stop,
        "stop_token_ids": req.stop_token_ids, "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "no_stop_trim": req.no_stop_trim,
    }
    return SamplingParams(**{k: v for k, v in values.items() if v is not None})


def completion_prompts(prompt: Any) -> tuple[list[str | list[int]], bool]:
    """(prompts, is_batch): a string, a token list, or a list of either."""
    if isinstance(prompt, str) and prompt:
        return [prompt], False
    if isinstance(prompt, list) and prompt:
        if isinstance(prompt[0], int) and not isinstance(prompt[0], bool):
            # one token list: check_input_ids checks its length before scanning every id
            return [prompt], False
        check_batch_size(len(prompt))  # before scanning a list of millions of prompts
        if all(isinstance(p, str) for p in prompt):
            if not all(prompt):
                raise bad_request("the prompt is empty")
            return list(prompt), len(prompt) > 1
        if all(isinstance(p, list) for p in prompt):
            return list(prompt), len(prompt) > 1
    if prompt == [] or prompt == "":
        raise bad_request("the prompt is empty")
    raise bad_request("prompt must be a string, a list of token ids, or a list of either")


def message_text(content: Any, index: int) -> str | None:
    """A chat message's content as text (parts of type 'text' are joined)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"messages[{index}]: content part type {kind!r} is not "
                                  "supported (text only)")
            if not isinstance(part.get("text"), str):  # not str() of whatever came
                raise bad_request(f"messages[{index}]: a text part needs a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"messages[{index}].content must be a string or a list of parts")
