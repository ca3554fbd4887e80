"""Log-probabilities of emitted (and prompt) tokens under the target, from the verifier's logits.

The verifier already computes the target's logits at every position it verifies: position
``n + j`` of a cycle is row ``j - 1`` of the forward over ``[last committed, d_1..d_K]``, and the
token a cycle emits there (an accepted draft, or the recovered / bonus token) is ``chunk[j - 1]``.
So the logprobs of every emitted token cost no extra forward: the engine hands those rows to a
:class:`LogprobRecorder`. With ``prompt=True`` the first verifier forward (the prompt's prefill)
keeps the logits of every prompt position too, for the prompt's log-likelihood (``echo``).

The values are the target's **raw** distribution, ``log_softmax(logits)`` at temperature 1 with
no top-k / top-p, as vLLM returns by default (``logprobs_mode="raw_logprobs"``), whatever the
request's sampling parameters or the method's acceptance rule.

Only tokens the target verified have such logits: methods that commit tokens without a target
forward (verifier skipping, MARS) or verify with another model (ProVe's small verifier) cannot
report them (:func:`check_supported`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from relaxspec.errors import RelaxSpecError

MAX_TOP_LOGPROBS = 20  # vLLM's default max_logprobs


class LogprobsUnsupported(RelaxSpecError):
    """The request asks for logprobs a method cannot give (a token not verified by the target)."""


@dataclass
class TokenLogprobs:
    """Per-token logprobs of a run of tokens.

    ``logprobs[i]`` is ``log p(tokens[i] | tokens before it)`` (None for a sequence's first
    token, which nothing predicts); ``top[i]`` the ``(token id, logprob)`` pairs of the most likely
    tokens at that position, best first (None where ``logprobs[i]`` is).
    """

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top: list[list[tuple[int, float]] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, other: TokenLogprobs) -> None:
        self.tokens += other.tokens
        self.logprobs += other.logprobs
        self.top += other.top


def score_tokens(logits: torch.Tensor, tokens: torch.Tensor, top_n: int) -> TokenLogprobs:
    """Logprobs of ``tokens[T]`` under ``logits[T, V]`` (row i predicts token i) and the ``top_n``
    best tokens of each row: ``log_softmax(logits)[i, tokens[i]]``, in float64 for the sums."""
    logp = torch.log_softmax(logits.double(), dim=-1)  # [T, V]
    chosen = logp.gather(-1, tokens.long()[:, None]).squeeze(-1)  # [T]
    out = TokenLogprobs(tokens.tolist(), chosen.tolist(), [[] for _ in range(len(tokens))])
    if top_n > 0:
        values, ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1)  # [T, n]
        out.top = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return out


class LogprobRecorder:
    """Collects the logprobs of one generation (the engine calls :meth:`add_prompt` and :meth:`add`).

    ``top_n``: how many top alternatives per position (0: only the token's own logprob);
    ``prompt``: also score the prompt (the first prompt token gets None).
    """

    def __init__(self, top_n: int = 0, prompt: bool = False) -> None:
        if not isinstance(top_n, int) or isinstance(top_n, bool) or not 0 <= top_n <= MAX_TOP_LOGPROBS:
            raise RelaxSpecError(f"top logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_n!r}")
        self.top_n = top_n
        self.prompt = prompt
        self.prompt_logprobs: TokenLogprobs | None = None
        self.generated = TokenLogprobs()
        self._taken = 0

    @property
    def wants_prompt(self) -> bool:
        """Whether the next verifier forward must keep the prompt's logits."""
        return self.prompt and self.prompt_logprobs is None

    def add_prompt(self, logits: torch.Tensor, prompt: torch.Tensor) -> None:
        """``logits[n - 1, V]`` of the prompt positions 1..n-1 (row i predicts ``prompt[i + 1]``)
        for ``prompt[n]``; the first token has no logprob."""
        scored = score_tokens(logits, prompt[1:], self.top_n)
        first = TokenLogprobs([int(prompt[0])], [None], [None])
        first.extend(scored)
        self.prompt_logprobs = first

    def add(self, logits: torch.Tensor, chunk: list[int]) -> None:
        """The target's ``logits[len(chunk), V]`` at the positions where ``chunk`` was emitted."""
        if chunk:
            self.generated.extend(score_tokens(logits[: len(chunk)], torch.tensor(chunk), self.top_n))

    def take(self) -> TokenLogprobs:
        """The generated tokens' logprobs not taken yet (for streaming)."""
        g, a = self.generated, self._taken
        self._taken = len(g)
        return TokenLogprobs(g.tokens[a:], g.logprobs[a:], g.top[a:])


def check_supported(engine: Any, target: Any) -> None:
    """Raise :class:`LogprobsUnsupported` unless every token ``engine`` emits is verified by the
    ``target`` model (its verifier is the target and its scheduler never skips verification)."""
    verifier_model = engine.verifier.lm.model
    skips = getattr(engine.scheduler, "name", "strict") != "strict"
    if target is None or verifier_model is not target or skips:
        reason = "commits tokens without verifying them" if skips else "verifies with another model"
        raise LogprobsUnsupported(
            f"logprobs and echo need every token scored by the target model; this method {reason} "
            "(use ar, sd, nsd or another target-verified method)"
        )
