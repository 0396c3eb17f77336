"""Chat templates: rendering, template errors, sandboxing, loading from a model dir."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from sglang_pd.frontend.chat_template import ChatTemplate, ChatTemplateError
from sglang_pd.frontend.tokenizer import TokenizerLoadError, load_tokenizer

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_chatml_rendering() -> None:
    out = ChatTemplate(CHATML).render([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n")
    no_gen = ChatTemplate(CHATML).render([{"role": "user", "content": "Hi"}],
                                         add_generation_prompt=False)
    assert not no_gen.endswith("assistant\n")


def test_special_tokens_and_raise_exception() -> None:
    source = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
              "{{ raise_exception('System role not supported') }}{% endif %}"
              "[{{ m['content'] }}]{% endfor %}")
    tmpl = ChatTemplate(source, {"bos_token": "<s>"})
    assert tmpl.render([{"role": "user", "content": "x"}]) == "<s>[x]"
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        tmpl.render([{"role": "system", "content": "x"}])


def test_tojson_is_not_html_escaped_and_tools_are_passed() -> None:
    tmpl = ChatTemplate("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert tmpl.render([], tools=[{"name": "a<b>&c"}]) == '[{"name": "a<b>&c"}]'


def test_sandbox_blocks_internals() -> None:
    tmpl = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        tmpl.render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% for %}")


def _write_dir(path: Any, config: dict[str, Any], jinja: str | None = None) -> str:
    tok = Tokenizer(models.WordLevel({"hi": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    if jinja is not None:
        with open(os.path.join(path, "chat_template.jinja"), "w") as f:
            f.write(jinja)
    return str(path)


def test_load_tokenizer_template_forms(tmp_path: Any) -> None:
    a = tmp_path / "a"
    a.mkdir()
    bundle = load_tokenizer(_write_dir(a, {
        "eos_token": {"content": "</s>", "special": True}, "bos_token": "<s>",
        "chat_template": [{"name": "tool_use", "template": "T"},
                          {"name": "default", "template": "{{ bos_token }}D"}]}))
    assert bundle.special_tokens == {"eos_token": "</s>", "bos_token": "<s>"}
    assert bundle.apply_chat_template([]) == "<s>D"
    assert bundle.encode("hi", add_special_tokens=False) == [0]
    b = tmp_path / "b"
    b.mkdir()
    assert load_tokenizer(_write_dir(b, {}, jinja="J")).apply_chat_template([]) == "J"
    c = tmp_path / "c"
    c.mkdir()
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(_write_dir(c, {})).apply_chat_template([])


def test_missing_tokenizer_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(TokenizerLoadError, match="--skip-tokenizer-init"):
        load_tokenizer(str(tmp_path))
