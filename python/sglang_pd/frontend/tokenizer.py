"""Loading a Hugging Face tokenizer directory with the `tokenizers` library only.

We read tokenizer.json (the fast tokenizer) and tokenizer_config.json (special token
strings, chat template) ourselves instead of going through transformers: it is the only
part of transformers the server would need, and it keeps start-up fast.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from sglang_pd.frontend.chat_template import ChatTemplate

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerLoadError(RuntimeError):
    pass


def _token_str(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _pick_chat_template(config: dict[str, Any], directory: str) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str) and template:
        return template
    # Newer checkpoints ship the template as a separate file.
    path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return None


@dataclass
class TokenizerBundle:
    """The fast tokenizer plus what tokenizer_config.json adds to it."""

    tokenizer: Tokenizer
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token -> "<s>", ...
    chat_template: ChatTemplate | None = None
    path: str = ""
    # token id -> text for logprob listings: at most one entry per vocabulary token, and a
    # streamed response re-lists its tokens on every update
    _token_texts: dict[int, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """Text of one token for logprob listings (may hold a lone U+FFFD for byte pieces)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id],
                                                                       skip_special_tokens=False)
        return text

    def token_str(self, token_id: int) -> str:
        """The vocabulary string of a token (OpenAI logprobs show these)."""
        return self.tokenizer.id_to_token(token_id) or ""

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        if self.chat_template is None:
            raise ValueError("this model has no chat template (tokenizer_config.json has no "
                             "chat_template); use /v1/completions or /generate")
        return self.chat_template.render(messages, **kwargs)


def load_tokenizer(directory: str) -> TokenizerBundle:
    """Load ``directory``/tokenizer.json and, if present, tokenizer_config.json."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        raise TokenizerLoadError(
            f"no tokenizer.json in {directory!r}; pass --tokenizer-path DIR or start the "
            "server with --skip-tokenizer-init (then only input_ids are accepted)")
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises plain Exception subclasses
        raise TokenizerLoadError(f"cannot load {path}: {e}") from e
    config: dict[str, Any] = {}
    config_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    special = {k: s for k in _SPECIAL_KEYS if (s := _token_str(config.get(k))) is not None}
    source = _pick_chat_template(config, directory)
    template = ChatTemplate(source, special) if source else None
    return TokenizerBundle(tokenizer=tokenizer, special_tokens=special,
                           chat_template=template, path=directory)
