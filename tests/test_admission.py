"""Issue 35, finding 3: a prompt that cannot fit is refused before it is tokenized (the character
bound of ``relaxspec.serve.admission``), and the bound never refuses a prompt that fits."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from relaxspec.models import bundled
from relaxspec.serve.admission import PromptGate, char_limit, is_lossless, longest_token_chars

CONTEXT = 1024


@pytest.fixture(scope="module")
def bpe():
    """The bundled byte-level BPE tokenizer (lossless: every character is in some token)."""
    if not bundled("tokenizer").exists():
        pytest.skip("no bundled tokenizer")
    return AutoTokenizer.from_pretrained(bundled("tokenizer"), local_files_only=True)


class Spy:
    """A tokenizer that records the length of every text it is asked to encode."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.encoded: list[int] = []

    def __call__(self, text: str, **kwargs):
        self.encoded.append(len(text))
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def _longest_pieces(tokenizer, n: int = 40) -> list[str]:
    """The texts of the ``n`` longest vocabulary entries (what packs most characters per token)."""
    ids = sorted(tokenizer.get_vocab().values(), key=lambda i: -len(tokenizer.convert_ids_to_tokens(i)))
    return [tokenizer.decode([i]) for i in ids[:n]]


def test_the_bound_of_a_lossless_tokenizer(bpe):
    assert is_lossless(bpe)
    longest = longest_token_chars(bpe)
    assert char_limit(bpe, CONTEXT) == (CONTEXT - 1) * longest
    assert len(max(_longest_pieces(bpe), key=len)) == longest  # the bound is attained by a token


def test_a_prompt_just_under_the_context_is_counted_one_over_is_refused_untokenized(bpe):
    spy = Spy(bpe)
    gate = PromptGate.for_tokenizer(spy, CONTEXT)
    assert gate.max_chars is not None
    spy.encoded.clear()
    # the most characters a fitting prompt can have: CONTEXT - 1 tokens (with BOS) of the longest
    # vocabulary entry each, written so that they do not merge ("\n" + 44 spaces, repeated)
    longest = max(_longest_pieces(bpe), key=len)
    fits = longest * (CONTEXT - 2)
    tokens = len(bpe(fits)["input_ids"])
    assert tokens < CONTEXT and len(fits) > gate.max_chars - 2 * len(longest)
    assert gate.count(fits) == tokens  # counted (and it fits)
    assert spy.encoded == [len(fits)]
    spy.encoded.clear()
    over = "a" * (gate.max_chars + 1)
    assert gate.count(over) is None
    assert gate.count("x" * 2_000_000) is None
    assert spy.encoded == []  # refused without the tokenizer ever seeing it


@settings(max_examples=60, deadline=None)
@given(data=st.data(), context=st.integers(2, 40))
def test_the_bound_never_refuses_a_prompt_that_fits(bpe, data, context):
    """Texts packed with the longest tokens, spaces, newlines and multi-byte characters: a text
    over the bound always has at least ``context`` tokens (so it could not fit)."""
    pieces = [*_longest_pieces(bpe), " ", "\n", "é", "中", "😀", "ab", "\t\t"]
    parts = data.draw(st.lists(st.sampled_from(pieces), min_size=1, max_size=200))
    text = "".join(parts)
    tokens = len(bpe(text)["input_ids"])
    assert tokens >= math.ceil(len(text) / longest_token_chars(bpe))
    if len(text) > char_limit(bpe, context):
        assert tokens >= context


def test_a_lossy_tokenizer_is_counted_in_slices_that_stop_early(tokenizer):
    """The tiny word-level tokenizer drops whitespace (no character bound): a long prompt is
    counted slice by slice and refused once the slices hold more than the context; a prompt of
    mostly whitespace that fits is counted in full and accepted."""
    assert not is_lossless(tokenizer) and char_limit(tokenizer, 128) is None
    spy = Spy(tokenizer)
    gate = PromptGate.for_tokenizer(spy, 128)
    spy.encoded.clear()
    prompt = "w1 " * 600_000  # 1.8 MB, 600,000 tokens
    assert gate.count(prompt) is None
    assert sum(spy.encoded) < 5 * gate.slice_chars  # a few slices, not 1.8 MB
    spy.encoded.clear()
    spaced = " " * 1_000_000 + "w1 w2"
    assert gate.count(spaced) == len(tokenizer(spaced)["input_ids"]) == 3  # BOS w1 w2: it fits
    assert gate.count("w1 " * 127) == 128  # short prompts: counted exactly (the server refuses it)
