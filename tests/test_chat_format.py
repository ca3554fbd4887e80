"""One chat format for both engines: our server's :class:`ChatTemplate` and the Jinja chat template
the bundled tokenizers carry (what vLLM's ``/v1/chat/completions`` renders) give the same prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer

from relaxspec.data.chat import CHAT_TEMPLATE, ROLE_LABELS, render_chat
from relaxspec.serve.server import ChatMessage, ChatTemplate

MODELS = Path(__file__).resolve().parent.parent / "models"
TOKENIZER_DIRS = sorted(p.parent for p in MODELS.glob("*/tokenizer.json"))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODELS / "target", local_files_only=True)


def test_every_bundled_tokenizer_carries_the_template():
    assert {p.name for p in TOKENIZER_DIRS} >= {"tokenizer", "target", "draft"}
    for where in TOKENIZER_DIRS:
        assert (where / "chat_template.jinja").read_text() == CHAT_TEMPLATE, where
        loaded = AutoTokenizer.from_pretrained(where, local_files_only=True)
        assert loaded.chat_template == CHAT_TEMPLATE, where


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
content = st.one_of(
    st.none(), text, st.lists(text.map(lambda t: {"type": "text", "text": t}), min_size=1, max_size=3)
)
message = st.fixed_dictionaries({"role": st.sampled_from(sorted(ROLE_LABELS)), "content": content})


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(message, min_size=1, max_size=4))
def test_jinja_template_renders_what_our_server_renders(tokenizer, messages):
    ours = ChatTemplate().render([ChatMessage(**m) for m in messages])
    theirs = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert theirs == tokenizer.bos_token + ours
    # the token ids: chat prompts are tokenized without special tokens, our server's with them
    ids = tokenizer(theirs, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(ours)["input_ids"]


def test_known_prompt_and_unknown_role(tokenizer):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "2?"}]},
    ]
    expected = "System: Be brief.\nUser: 2+2?\nAssistant:"
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|endoftext|>" + expected
    assert render_chat([("developer", "Be brief."), ("user", "2+2?")]) == expected
    without_cue = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without_cue == rendered.removesuffix("\nAssistant:")
    with pytest.raises(TemplateError, match="unsupported chat role: tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_a_newly_trained_tokenizer_carries_the_template(tmp_path):
    from relaxspec.train.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["def f(x):\n    return x + 1\n"] * 20, vocab_size=300)
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").read_text() == CHAT_TEMPLATE
