"""Rendering Hugging Face chat templates (jinja2) without transformers.

Templates come from the model directory, i.e. from whoever published the checkpoint, so
they run in jinja2's immutable sandbox: no attribute access to internals, no mutation of
the objects we pass in.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template rejected the conversation (raise_exception) or failed to render."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's built-in tojson HTML-escapes <, > and &, which corrupts tool schemas in
    # prompts; templates written for transformers expect plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from e
        self.source = source
        self._special = dict(special_tokens or {})

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        context: dict[str, Any] = {**self._special, **extra}
        context.update(messages=messages, add_generation_prompt=add_generation_prompt)
        if tools:
            context["tools"] = tools
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as e:
            raise ChatTemplateError(f"chat template failed to render the messages: {e}") from e
