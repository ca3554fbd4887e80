"""Admitting prompts cheaply: refuse an over-long prompt before tokenizing it, bound the
tokenization that does run, and give memory back after large requests (issue 35, finding 3).

Tokenizing is the expensive part of refusing a prompt that cannot fit: a 2 MB prompt is about
400,000 tokens, seconds of CPU and hundreds of megabytes of encodings, all to learn that it does
not fit a 1,024-token context. :class:`PromptGate` answers that question from the character count
when it can (:func:`char_limit`), counts the rest in context-sized slices that stop as soon as the
count passes the context (:meth:`PromptGate.count`), and lets at most ``concurrency`` long prompts
be tokenized at a time. :func:`release_memory` hands freed heap pages back to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Text every lossless tokenizer gives back unchanged: runs of spaces, tabs and newlines, a
# combining accent (NFC would merge it), a compatibility ligature (NFKC would split it), CJK, emoji.
_ROUND_TRIP_PROBE = "  a\tb\n\n c  e\u0301 \ufb01 \u4e2d \U0001f600 \r\n x  "

SMALL_PROMPT_CHARS = 4096  # prompts this short skip the tokenization semaphore
SLICE_CUT_SLACK = 2  # tokens one slice cut may add to a count (a word split in two, a space run)


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters of text one token can stand for: the longest token string.

    A vocabulary string never covers more input characters than it has: byte-level BPE writes one
    character per byte (and a character is at least one byte), SentencePiece writes a space as
    ``▁``, and WordPiece's ``##`` and byte-fallback ``<0x0A>`` only overstate it.
    """
    strings = list(tokenizer.get_vocab()) + list(tokenizer.get_added_vocab())
    return max(1, *(len(s) for s in strings))


def is_lossless(tokenizer: Any) -> bool:
    """Whether decoding the encoding gives the text back (no character dropped or merged)."""
    try:
        ids = tokenizer(_ROUND_TRIP_PROBE, add_special_tokens=False)["input_ids"]
        return tokenizer.decode(ids) == _ROUND_TRIP_PROBE
    except Exception:
        return False


def char_limit(tokenizer: Any, context_length: int) -> int | None:
    """The most characters a prompt that fits ``context_length`` tokens can have (None: no bound).

    For a lossless tokenizer every input character is part of some token, and a token stands for
    at most ``M`` = :func:`longest_token_chars` characters, so a prompt of ``c`` characters has at
    least ``ceil(c / M)`` tokens. A prompt fits when it leaves room for one new token (``tokens <
    context_length``), so one of more than ``(context_length − 1) · M`` characters cannot fit:
    refusing it is always right. A tokenizer that drops text (whitespace splitting, normalizers)
    has no such bound: :meth:`PromptGate.count` slices its prompts instead.
    """
    if not is_lossless(tokenizer):
        return None
    return (context_length - 1) * longest_token_chars(tokenizer)


@dataclass
class PromptGate:
    """Counts prompt tokens for admission with bounded cost.

    ``max_chars`` (from :func:`char_limit`) refuses without tokenizing; a longer-than-small prompt
    waits for one of ``concurrency`` tokenization slots; without ``max_chars`` a long prompt is
    counted in slices of ``slice_chars`` characters (cut after whitespace where possible), and the
    count stops once it shows that the prompt cannot fit.
    """

    tokenizer: Any
    context_length: int
    max_chars: int | None
    concurrency: int = 2
    _slots: threading.BoundedSemaphore = field(init=False)

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.concurrency)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, context_length: int, concurrency: int = 2) -> PromptGate:
        return cls(tokenizer, context_length, char_limit(tokenizer, context_length), concurrency)

    @property
    def slice_chars(self) -> int:
        return self.context_length * longest_token_chars(self.tokenizer)

    def too_long(self, prompt: str) -> bool:
        """Whether the character count alone proves that ``prompt`` does not fit (no tokenizing)."""
        return self.max_chars is not None and len(prompt) > self.max_chars

    def count(self, prompt: str) -> int | None:
        """Tokens of ``prompt`` as the engine encodes it; None once it is known not to fit (more
        than :attr:`max_chars` characters, or slices holding too many tokens)."""
        if self.too_long(prompt):
            return None
        if len(prompt) <= SMALL_PROMPT_CHARS:
            return self._tokens(prompt)
        with self._slots:
            if self.max_chars is None and self._sliced_count_exceeds(prompt):
                return None
            return self._tokens(prompt)

    def _tokens(self, text: str, special: bool = True) -> int:
        return len(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _sliced_count_exceeds(self, prompt: str) -> bool:
        """Whether slices of ``prompt``, tokenized one by one, already hold more tokens than the
        context allows (each cut may add :data:`SLICE_CUT_SLACK` tokens, which are discounted)."""
        total, start, cuts = 0, 0, 0
        while start < len(prompt):
            end = _cut(prompt, start, self.slice_chars)
            total += self._tokens(prompt[start:end], special=False)
            cuts += end < len(prompt)
            if total - SLICE_CUT_SLACK * cuts >= self.context_length:
                return True
            start = end
        return False


def _cut(text: str, start: int, size: int) -> int:
    """End of the slice of ``text`` from ``start`` of at most ``size`` characters, just after its
    last whitespace when it has one in its second half (so words stay whole)."""
    end = min(len(text), start + size)
    if end == len(text):
        return end
    space = max(text.rfind(c, start + size // 2, end) for c in " \n\t")
    return space + 1 if space >= 0 else end


# ---------------------------------------------------------------------------------------------
# Giving memory back


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_memory() -> bool:
    """Return the allocator's free heap pages to the OS (glibc keeps them in its arenas after a
    burst of large requests, so the process's RSS would stay at its peak). False: not glibc."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
