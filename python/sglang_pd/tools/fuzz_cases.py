"""The cases of the hostile-input fuzzer (fuzz_http.py, which sends them and checks the
answers): valid bodies of /generate, /v1/completions, /v1/chat/completions and /abort_request
with one field replaced by a hostile value, fields dropped, unknown fields added, raw bodies,
hostile headers and GETs; deterministic for a seed. Split from the runner so each file holds one
job."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

NAN = float("nan")
HOSTILE: list[Any] = [
    None, True, False, "yes", "false", "", "x" * 200_000, -1, 0, 1, 2**31, 2**63, -(2**63), 10**30,
    1e308, -1e308, 1e-45, 1e-38, 5e-324, NAN, float("inf"), float("-inf"), 0.5, -0.5, "NaN", "1",
    [], [[]], [None], list(range(50_000)), {}, {"a": 1}, ["a", 7, None], "\u0000\ufffd\U0001F600",
    [""] * 1000, ["x" * 5000] * 40, {"type": "json_object"}, [{"role": "user"}], 7000, 100_000,
    {"tools": [], "messages": [], "add_generation_prompt": False}, "required", "none", "auto",
]
SAMPLING_KEYS = ["max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "min_new_tokens", "stop", "stop_token_ids",
                 "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                 "seed", "n", "regex", "json_schema", "ebnf"]


VALID = "valid"  # ``what`` of the unchanged greedy bodies: every answer must be the same text


@dataclass
class Case:
    method: str
    path: str
    body: bytes
    what: str
    headers: dict[str, str] = field(default_factory=dict)


def base_bodies(model: str, pd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    sp = {"max_new_tokens": 4, "temperature": 0}
    return {
        "/generate": {"text": "The river flows", "sampling_params": sp, **pd},
        "/v1/completions": {"model": model, "prompt": "The river flows", "max_tokens": 4,
                            "temperature": 0, **pd},
        "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                 "max_tokens": 4, "temperature": 0, **pd},
        "/abort_request": {"rid": "nope"},
    }


EXTRA_KEYS = {
    "/generate": ["input_ids", "stream", "return_logprob", "top_logprobs_num", "rid", "slo",
                  "bootstrap_host", "bootstrap_port", "bootstrap_room", "logprob_start_len",
                  "return_text_in_logprobs", "image_data", "lora_path"],
    "/v1/completions": ["n", "stream", "logprobs", "echo", "stop", "seed", "best_of", "suffix",
                        "logit_bias", "stream_options", "response_format", "regex", "json_schema",
                        "ebnf", "top_p", "presence_penalty", "frequency_penalty", "user",
                        "min_tokens", "ignore_eos", "chat_template_kwargs", "guided_json"],
    "/v1/chat/completions": ["n", "stream", "logprobs", "top_logprobs", "stop", "seed", "tools",
                             "tool_choice", "functions", "function_call", "response_format",
                             "chat_template_kwargs", "max_completion_tokens", "stream_options",
                             "top_p", "regex", "guided_regex", "separate_reasoning"],
    "/abort_request": ["rid", "abort_all"],
}


def _dump(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


def make_cases(n: int, seed: int, model: str, pd: dict[str, Any]) -> list[Case]:
    rng = random.Random(seed)
    bases = base_bodies(model, pd)
    raw = [b"", b"{", b"[]", b"null", b"42", b'"text"', b'{"text": NaN}', b'{"text": Infinity}',
           b'{"text": "\xff\xfe"}', b'{"text": "\\ud800"}', b"\xff" * 100, b'{"a": ' * 5000 + b'1' + b'}' * 5000,
           b'{"text": "a", "text": 5}', b" " * 10, b'{"sampling_params": []}']
    cases: list[Case] = []
    for path in bases:
        for body in raw:
            cases.append(Case("POST", path, body, f"raw {body[:30]!r}"))
    cases.append(Case("POST", "/generate", b'{"text": "' + b"a" * (40 << 20) + b'"}', "40 MB body"))
    gen, comp, chat = bases["/generate"], bases["/v1/completions"], bases["/v1/chat/completions"]
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):  # greedy: one answer
        cases += [Case("POST", path, _dump(bases[path]), VALID) for _ in range(4)]
    targeted: list[tuple[str, dict[str, Any]]] = [  # classes of bugs found by hand (issue 22)
        *[("/generate", {**gen, "return_logprob": True, "top_logprobs_num": k}) for k in (7000, 10**6, -1)],
        *[("/v1/completions", {**comp, "logprobs": k}) for k in (7000, 10**6, -1, True)],
        *[("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": k}) for k in (7000, -1, "3")],
        *[("/v1/chat/completions", {**chat, "chat_template_kwargs": {k: []}})
          for k in ("tools", "messages", "add_generation_prompt", "documents")],
        ("/generate", {**gen, "sampling_params": {"stop": ["ab"] * 10_000}}),
        ("/generate", {**gen, "sampling_params": {"stop": ["x" * (1 << 20)]}}),
        ("/generate", {**gen, "sampling_params": {"n": 10**6}}),
        ("/generate", {**gen, "text": ["hi"] * 100_000}),
        ("/generate", {**gen, "sampling_params": {"temperature": 1e-38, "max_new_tokens": 2}}),
        ("/generate", {**gen, "sampling_params": {"top_p": 1e-38, "max_new_tokens": 2}}),
        ("/generate", {**gen, "return_logprob": "yes"}),
        ("/v1/completions", {**comp, "response_format": {"type": "json_object"}}),
        ("/v1/completions", {**comp, "regex": "[a-z]+"}),
        ("/v1/chat/completions", {**chat, "tool_choice": "required", "tools": []}),
        ("/v1/chat/completions", {**chat, "functions": [{"name": "f"}]}),
        ("/abort_request", {"abort_all": "false"}),
    ]
    for path, obj in targeted:
        cases.append(Case("POST", path, _dump(obj), "targeted " + _short(obj)[:60]))
    for hdr in ({"x-slo-ttft-ms": "nan"}, {"x-slo-tpot-ms": "-1"}, {"x-slo-ttft-ms": "1e400"},
                {"content-type": "text/plain"}):
        cases.append(Case("POST", "/generate", _dump(bases["/generate"]), f"header {hdr}", hdr))
    for path in ("/get_load", "/get_server_info", "/v1/models", "/health_generate", "/metrics",
                 "/get_model_info", "/nope", "/generate"):
        cases.append(Case("GET", path + "?x=" + "y" * rng.randint(0, 3000), b"", f"GET {path}"))
    while len(cases) < n:
        path = rng.choice(list(bases))
        body = json.loads(json.dumps(bases[path]))
        kind = rng.random()
        value = rng.choice(HOSTILE)
        if kind < 0.3:
            key = rng.choice(list(body) + EXTRA_KEYS[path])
            body[key] = value
            what = f"{key}={_short(value)}"
        elif kind < 0.55 and path == "/generate":
            key = rng.choice(SAMPLING_KEYS)
            body["sampling_params"] = {**body["sampling_params"], key: value}
            what = f"sampling_params.{key}={_short(value)}"
        elif kind < 0.65 and path == "/v1/chat/completions":
            msg_key = rng.choice(["role", "content", "name", "tool_calls"])
            body["messages"] = [{"role": "user", "content": "Hi", msg_key: value}]
            what = f"messages[0].{msg_key}={_short(value)}"
        elif kind < 0.75 and body:
            key = rng.choice(list(body))
            del body[key]
            what = f"drop {key}"
        elif kind < 0.85:
            # two hostile fields at once, one of them possibly streaming
            for _ in range(2):
                key = rng.choice(list(body) + EXTRA_KEYS[path])
                body[key] = rng.choice(HOSTILE)
            body["stream"] = rng.random() < 0.5
            what = "two fields + stream"
        else:
            body[f"unknown_{rng.randint(0, 99)}"] = value
            what = "unknown field"
        cases.append(Case("POST", path, _dump(body), what))
    return cases[:n]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."


def _pin_pd_fields(cases: list[Case], pd: dict[str, Any], rng: random.Random) -> None:
    """PD: every case gets its own valid room (hostile invalid rooms stay) and the real
    bootstrap address. A shared room, or a well-formed address where no prefill listens, is
    a client error that correctly ends in a transfer failure (502/503) after the PD timeouts;
    the validator of malformed addresses is fuzzed in colocated mode and unit-tested."""
    for c in cases:
        try:
            body = json.loads(c.body)
        except (ValueError, RecursionError):
            continue  # raw hostile bodies stay as they are
        if not isinstance(body, dict) or "bootstrap_room" not in body:
            continue
        room = body["bootstrap_room"]
        if isinstance(room, int) and not isinstance(room, bool) and 0 <= room < 2**63:
            body["bootstrap_room"] = rng.randrange(1, 2**62)
        body.update(bootstrap_host=pd["bootstrap_host"], bootstrap_port=pd["bootstrap_port"])
        c.body = _dump(body)

