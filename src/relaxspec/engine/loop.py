"""The decode loop: propose → schedule → verify → rule → commit, one cycle at a time.

Every method is this one loop with different parts (docs/design.md §4):

- AR decoding: no proposer; each cycle verifies an empty draft and emits the bonus token.
- Speculative decoding (SD, NSD, top-k, typical, lenience): a :class:`DraftModel` proposer and an
  acceptance rule from :mod:`relaxspec.core.acceptance`.
- Verifier skipping: a scheduler that sometimes commits a draft prefix without verification.

The committed sequence ``ids[1, n]`` is the only source of truth. Each model keeps a KV cache of a
prefix of it and, after every commit, is rolled back to the part of its cache that matches the
committed tokens (see :mod:`relaxspec.engine.kv`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tokenizers.decoders import ByteLevel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from relaxspec.core.acceptance import Gate, Greedy, Rule, Verdict, verify_unchecked
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.draft_length import GoodputDraftLength
from relaxspec.engine.logprobs import LogprobRecorder, LogprobsUnsupported
from relaxspec.engine.proposers.base import Proposal, Proposer
from relaxspec.engine.schedulers import Scheduler, SchedulerState, Strict
from relaxspec.engine.stats import GenerationResult, GenerationStats
from relaxspec.engine.verifier import Verifier
from relaxspec.errors import Cancelled, RelaxSpecError

ChunkCallback = Callable[[str, list[int]], None]  # (new text, new token ids) per committed chunk


@dataclass
class CycleRecord:
    """What happened in one cycle, for diagnostics (``Engine.generate(on_cycle=...)``).

    position: committed length n before the cycle; proposal: the draft (None for an AR step);
    skipped: tokens committed without verification (0 = verified); target_probs: ``p_1..p_{K+1}``
    ``[1, K+1, V]`` when verified; verdict: the rule's decision (None for AR and skipped rounds);
    chunk: the tokens committed (before EOS / budget / stop-string cuts); strict_accepted: on a
    skipped round audited by a shadow verifier, the prefix length ``L_b`` the rule would have
    accepted from the same draft (else None).
    """

    position: int
    proposal: Proposal | None
    skipped: int
    target_probs: torch.Tensor | None
    verdict: Verdict | None
    chunk: list[int]
    strict_accepted: int | None = None


CycleCallback = Callable[[CycleRecord], None]


CYCLE_SAMPLE = 4  # a row reports one whole-cycle time in this many to the adaptive draft length


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class _TextTracker:
    """Incremental detokenisation with stop strings and safe streaming.

    Holds back text that may still change: an incomplete UTF-8 character (decoded as U+FFFD) and
    a tail that could be the start of a stop string. ``text`` is always the decode of all tokens;
    with a byte-level tokenizer (:func:`_decodes_additively`) only the tokens after the last
    complete character are decoded again, not the whole sequence at every step.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.tokens: list[int] = []
        self.emitted = 0  # characters already streamed
        self.text = ""
        self.additive = _decodes_additively(tokenizer)
        self.settled = 0  # tokens whose text (``text[:settled_chars]``) no later token can change
        self.settled_chars = 0

    def _decode(self, tokens: list[int]) -> str:
        """The text of ``tokens``, which extend the settled ones (a prefix of :attr:`tokens`)."""
        if self.additive:
            return self.text[: self.settled_chars] + self._full(tokens[self.settled :])
        return self._full(tokens)

    def _full(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _settle(self) -> None:
        """Past a complete character, the text so far is final: bytes decode character by character."""
        if self.additive and not self.text.endswith("\ufffd"):
            self.settled, self.settled_chars = len(self.tokens), len(self.text)

    def _scan_from(self, text: str) -> int:
        """Where a stop string may start in ``text`` (the previous text plus new tokens): scanning
        covers only the new text and the longest stop string's tail before it, not all of it.
        Text the decoder revised (an incomplete character completed) is rescanned from there."""
        old = self.text
        if not text.startswith(old):
            old = old.rstrip("\ufffd")
            if not text.startswith(old):
                return 0
        return max(0, len(old) - self.longest + 1)

    def _stop_at(self, text: str, start: int = 0) -> int:
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else -1

    def add(self, chunk: list[int]) -> tuple[list[int], bool]:
        """Append tokens; return the ones kept (cut after a stop string) and whether one was hit."""
        text = self._decode(self.tokens + chunk)
        start = self._scan_from(text) if self.stop else 0
        if self.stop and self._stop_at(text, start) >= 0:
            # keep tokens up to the first one that completes the stop string
            for j in range(1, len(chunk) + 1):
                shorter = self._decode(self.tokens + chunk[:j])
                if self._stop_at(shorter, self._scan_from(shorter)) >= 0:
                    chunk = chunk[:j]
                    break
            self.tokens += chunk
            self.text = text[: self._stop_at(text, start)]
            self.additive = False  # the text is cut: no later decode builds on it
            return chunk, True
        self.tokens += chunk
        self.text = text
        self._settle()
        return chunk, False

    def delta(self, final: bool) -> str:
        """Text not streamed yet that can no longer change."""
        safe = len(self.text)
        if not final:
            safe = len(self.text.rstrip("\ufffd"))
            for s in self.stop:  # hold back a suffix that is a proper prefix of a stop string
                for L in range(min(len(s) - 1, safe), 0, -1):
                    if self.text[safe - L : safe] == s[:L]:
                        safe = min(safe, safe - L)
                        break
        out = self.text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return out


class _Committed:
    """The committed token ids of one generation in a buffer sized for its budget: each cycle's
    ``ids[1, n]`` is a view of the first n (committed tokens never change), not a new tensor."""

    def __init__(self, prompt: torch.Tensor, budget: int) -> None:
        self.n = prompt.shape[1]
        self.buffer = torch.empty((1, self.n + budget), dtype=torch.long)
        self.buffer[:, : self.n] = prompt
        self.rows = self.buffer.numpy()  # writes from a list without a tensor per chunk

    def extend(self, chunk: list[int]) -> torch.Tensor:
        """Append ``chunk``; the committed ids ``[1, n]`` after it."""
        self.rows[0, self.n : self.n + len(chunk)] = chunk
        self.n += len(chunk)
        return self.buffer[:, : self.n]


def _decodes_additively(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``decode(a + b) == decode(a) + decode(b)`` whenever ``a``'s bytes end a character:
    a byte-level decoder (GPT-2's: tokens to bytes, bytes to UTF-8) with no clean-up of spaces."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return isinstance(decoder, ByteLevel) and not getattr(tokenizer, "clean_up_tokenization_spaces", True)


@dataclass
class _Run:
    """Per-generation state of :meth:`Engine.generate` (the engine itself holds none)."""

    params: SamplingParams
    rule: Rule | None
    generator: torch.Generator
    shadow_generator: torch.Generator
    stats: GenerationStats
    state: SchedulerState = field(default_factory=SchedulerState)
    recorder: LogprobRecorder | None = None


def default_eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens that end a generation: the model's generation config, else the tokenizer's EOS."""
    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    return list(eos) if isinstance(eos, list) else [eos] if eos is not None else []


class Engine:
    """Compose a proposer, an acceptance rule and a scheduler around a verifier model.

    ``rule`` is used when the request samples (temperature > 0) and ``greedy_rule`` when it is
    greedy (temperature 0); with no proposer the engine decodes autoregressively. ``shadow`` (a
    model, normally the target) audits skipped rounds: it computes the prefix the rule would have
    accepted (stats ``shadow_*``, ``CycleRecord.strict_accepted``) without affecting the output,
    the timings or the verifier call count. ``draft_length`` (optional) picks each cycle's draft
    length in ``0 .. k`` for goodput (:mod:`relaxspec.engine.draft_length`; the server sets it).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        proposer: Proposer | None = None,
        rule: Rule | None = None,
        greedy_rule: Rule | None = None,
        scheduler: Scheduler | None = None,
        k: int = 8,
        eos_token_ids: Sequence[int] | None = None,
        shadow: PreTrainedModel | None = None,
    ) -> None:
        if not isinstance(k, int) or k < 1:
            raise RelaxSpecError(f"k (draft length) must be an integer >= 1, got {k!r}")
        if proposer is not None and rule is None and greedy_rule is None:
            raise RelaxSpecError("a proposer needs an acceptance rule (rule= and/or greedy_rule=)")
        self.verifier = Verifier(target)
        bind = getattr(proposer, "bind_verifier", None)
        if bind is not None:  # a proposer that drafts from the verifier's hidden states (EAGLE)
            bind(self.verifier)
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.rule = rule
        self.greedy_rule = greedy_rule if greedy_rule is not None else (Greedy() if rule is None else None)
        self.scheduler = scheduler or Strict()
        self.k = k
        self.shadow = Verifier(shadow, name="shadow verifier") if shadow is not None else None
        self.draft_length: GoodputDraftLength | None = None
        self.eos_token_ids = set(
            default_eos_ids(target, tokenizer) if eos_token_ids is None else eos_token_ids
        )

    def _extra_token(self, rule: Rule | None) -> int:
        """1 if a cycle may emit a token beyond the draft (recovered or bonus), else 0."""
        if isinstance(rule, Gate) or getattr(self.scheduler, "commit_first", False):
            return 0
        return 1

    def _rule_for(self, params: SamplingParams) -> Rule:
        rule = self.greedy_rule if params.greedy else self.rule
        if rule is None:
            mode = "greedy (temperature 0)" if params.greedy else "sampling (temperature > 0)"
            raise RelaxSpecError(f"this method has no acceptance rule for {mode} decoding")
        return rule

    def encode(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """Prompt text or token ids -> ``LongTensor[1, n]``, validated against the context."""
        if isinstance(prompt, str):
            if prompt == "":
                raise RelaxSpecError("the prompt is empty")
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        else:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            if ids.numel() == 0:
                raise RelaxSpecError("the prompt is empty")
            vocab = self.verifier.lm.model.get_output_embeddings().weight.shape[0]
            if int(ids.min()) < 0 or int(ids.max()) >= vocab:
                raise RelaxSpecError(f"prompt token ids must be in [0, {vocab})")
        context = self.context_length
        if ids.shape[1] >= context:
            raise RelaxSpecError(
                f"the prompt has {ids.shape[1]} tokens but the model's context window is "
                f"{context}; shorten it"
            )
        return ids

    @property
    def context_length(self) -> int:
        lengths = [self.verifier.context_length]
        lm = getattr(self.proposer, "lm", None)
        if lm is not None:
            lengths.append(lm.context_length)
        return min(lengths)

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        on_chunk: ChunkCallback | None = None,
        on_cycle: CycleCallback | None = None,
        cancel: threading.Event | None = None,
        logprobs: LogprobRecorder | None = None,
    ) -> GenerationResult:
        """Generate a continuation of ``prompt``.

        ``on_chunk(text, token_ids)`` streams each committed chunk; ``on_cycle(record)`` receives
        a :class:`CycleRecord` per cycle (diagnostics; its cost counts as "other" time); once
        ``cancel`` is set, the next cycle raises :class:`~relaxspec.errors.Cancelled` instead.
        ``logprobs`` receives the target's logits of every committed token (and of the prompt,
        if it asks) before ``on_chunk`` sees the chunk (:mod:`relaxspec.engine.logprobs`).
        """
        params = params or SamplingParams()
        rule = self._rule_for(params) if self.proposer is not None else None
        ids = self.encode(prompt)
        run = self._new_run(params, rule, ids.shape[1], logprobs)
        text = _TextTracker(self.tokenizer, params.stop)
        budget = min(params.max_new_tokens, self.context_length - ids.shape[1])
        committed = _Committed(ids, budget)
        calls_before = self._calls()

        started = _now(self.device)
        for part in filter(None, (self.verifier, self.shadow, self.proposer)):
            part.start(ids)
        finish, generated, previous_k = "length", 0, -1
        while generated < budget:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            remaining = budget - generated
            k = self._max_k(remaining, rule)
            adapt = self.draft_length if k > 0 else None
            if adapt is not None:
                k = adapt.choose(k)
                cycle_started = _now(self.device)
            record = self._cycle(ids, k, run)
            run.state.rounds += 1
            run.stats.cycles += 1
            if on_cycle is not None:
                on_cycle(record)
            chunk, finish = self._cut(record.chunk, remaining, params, text)
            ids = committed.extend(chunk)
            generated += len(chunk)
            self._emit(record, chunk, finish, remaining, text, logprobs, on_chunk)
            if adapt is not None and k == previous_k:
                self._time_cycle(adapt, k, run.stats.cycles, cycle_started)
            previous_k = k
            if finish != "length":
                break
            self._rollback(ids.shape[1] - 1)

        self._close_stats(run.stats, started, calls_before, generated, finish)
        if on_chunk is not None and (tail := text.delta(final=True)):
            on_chunk(tail, [])
        return GenerationResult(text=text.text, tokens=text.tokens, stats=run.stats)

    def _emit(
        self,
        record: CycleRecord,
        chunk: list[int],
        finish: str,
        remaining: int,
        text: _TextTracker,
        logprobs: LogprobRecorder | None,
        on_chunk: ChunkCallback | None,
    ) -> None:
        """Hand a committed ``chunk`` to the logprob recorder, then to the stream, and count it
        for the draft-length policy."""
        if logprobs is not None:
            self._record_logprobs(record, self._with_eos(record.chunk, chunk, finish, remaining), logprobs)
        if on_chunk is not None and chunk:
            on_chunk(text.delta(final=finish != "length"), chunk)
        if self.draft_length is not None:
            self.draft_length.observe_tokens(len(chunk))

    def _rollback(self, keep: int) -> None:
        """Roll every cache back to the committed tokens it may keep (all but the last)."""
        self.verifier.rollback(keep)
        if self.proposer is not None:
            self.proposer.rollback(keep)

    def _time_cycle(self, adapt: GoodputDraftLength, k: int, cycles: int, started: float) -> None:
        """Report a whole cycle at an unchanged K to the draft-length policy: the whole cycle,
        waits on a shared batch and text work included; not the first at a new K (the draft's
        catch-up, rows still finishing the old K). One cycle in CYCLE_SAMPLE per row: the cycle
        model only prices cells never measured, and every row of a 16-32-row batch taking the
        policy's locks each step costs throughput (docs/performance.md §6)."""
        if cycles % CYCLE_SAMPLE == 0:
            adapt.observe_cycle(k, _now(self.device) - started)

    @staticmethod
    def _new_run(
        params: SamplingParams, rule: Rule | None, prompt_tokens: int, recorder: LogprobRecorder | None
    ) -> _Run:
        """One generation's state: its random streams (from ``params.seed``, else a fresh seed),
        stats and logprob recorder."""
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        return _Run(
            params=params,
            rule=rule,
            generator=torch.Generator(device="cpu").manual_seed(seed),
            shadow_generator=torch.Generator(device="cpu").manual_seed(seed ^ 0x5AD0),
            stats=GenerationStats(prompt_tokens=prompt_tokens),
            recorder=recorder,
        )

    def _max_k(self, remaining: int, rule: Rule | None) -> int:
        """The longest draft the budget allows (0 without a proposer). A verified cycle can emit
        k + 1 tokens (recovered/bonus); Gate and always-commit schedulers (MARS) emit at most k,
        so the last token of the budget is drafted too."""
        return min(self.k, remaining - self._extra_token(rule)) if self.proposer is not None else 0

    def _calls(self) -> tuple[int, int]:
        """Forward passes so far of the verifier and the proposer."""
        return self.verifier.calls, self.proposer.calls if self.proposer is not None else 0

    def _close_stats(
        self,
        stats: GenerationStats,
        started: float,
        calls_before: tuple[int, int],
        generated: int,
        finish: str,
    ) -> None:
        stats.total_seconds = _now(self.device) - started - stats.shadow_seconds
        stats.new_tokens = generated
        calls = self._calls()
        stats.verifier_calls, stats.draft_calls = calls[0] - calls_before[0], calls[1] - calls_before[1]
        stats.finish_reason = finish

    @property
    def device(self) -> torch.device:
        return self.verifier.lm.device

    def _cycle(self, ids: torch.Tensor, k: int, run: _Run) -> CycleRecord:
        """One propose → schedule → verify → rule cycle on committed ``ids[1, n]``.

        Returns what the cycle decided to commit (before EOS / budget / stop-string cuts).
        """
        stats, n = run.stats, ids.shape[1]
        if k == 0:  # plain AR step: the "bonus" token of an empty draft
            return self._ar_step(ids, run)
        assert self.proposer is not None and run.rule is not None
        if getattr(self.proposer, "fused", False):
            return self._fused_cycle(ids, k, run)
        t0 = _now(self.device)
        proposal = self.proposer.propose(ids, k, run.params, run.generator)
        stats.draft_seconds += _now(self.device) - t0
        if proposal.k == 0:  # nothing to draft from yet (an EAGLE head before the target's features)
            return self._ar_step(ids, run)

        skip = min(self.scheduler.skip_length(proposal, run.state), proposal.k)
        if skip > 0:  # commit a prefix without calling the verifier
            stats.skipped_rounds += 1
            stats.skipped_tokens += skip
            run.state.unverified_run += skip
            strict = self._audit(ids, proposal, skip, run) if self.shadow is not None else None
            return CycleRecord(n, proposal, skip, None, None, proposal.tokens[0, :skip].tolist(), strict)

        target_probs = self._score(ids, proposal.tokens, run)
        verdict = verify_unchecked(
            run.rule, proposal.tokens, _draft_probs(run.rule, proposal), target_probs, run.generator
        )
        self._count(proposal.k, verdict, stats)  # a chain may stop before k (draft_chain)
        chunk = verdict.emitted(proposal.tokens)
        run.state.unverified_run = 0
        return CycleRecord(n, proposal, 0, target_probs, verdict, chunk)

    def _ar_step(self, ids: torch.Tensor, run: _Run) -> CycleRecord:
        """One verifier forward over an empty draft; emits its token (argmax or a sample)."""
        target_probs = self._score(ids, torch.empty((1, 0), dtype=torch.long), run)
        run.state.unverified_run = 0
        return CycleRecord(ids.shape[1], None, 0, target_probs, None, [_ar_token(target_probs[0, 0], run)])

    def _fused_cycle(self, ids: torch.Tensor, k: int, run: _Run) -> CycleRecord:
        """One verifier forward that verifies the drafts the last one drew and draws the next
        block (:class:`~relaxspec.engine.proposers.block.FusedBlockProposer`, ProVe §2 layout).

        Feeds ``[d_1..d_r, placeholder × m]`` after the committed ``ids[1, n]``; the laws
        ``[1, r + 1 + m, V]`` verify the r drafts with the cycle's rule (the law after ``d_r`` gives
        the token after them) and, when all r are accepted and that token is emitted, the m laws at
        the placeholders are the next cycle's drafts.
        """
        assert self.proposer is not None and run.rule is not None
        stats, n = run.stats, ids.shape[1]
        proposal = self.proposer.propose(ids, k, run.params, run.generator)
        r = proposal.k
        holes = self.proposer.placeholders(min(k, self.context_length - n - r), ids.device)
        laws = self._score(ids, torch.cat([proposal.tokens, holes], dim=1), run)  # [1, r+1+m, V]
        target_probs = laws[:, : r + 1]
        verdict = verify_unchecked(
            run.rule, proposal.tokens, _draft_probs(run.rule, proposal), target_probs, run.generator
        )
        accepted = self._count(r, verdict, stats) if r else 0
        chunk = verdict.emitted(proposal.tokens)
        if accepted == r and len(chunk) == r + 1 and holes.shape[1]:
            self.proposer.receive(n + r + 1, laws[0, r + 1 :], run.params, run.generator)
        run.state.unverified_run = 0
        if not r:  # nothing verified: the verifier's own token (and a block drawn), like an AR step
            return CycleRecord(n, None, 0, target_probs, None, chunk)
        return CycleRecord(n, proposal, 0, target_probs, verdict, chunk)

    def _count(self, k: int, verdict: Verdict, stats: GenerationStats) -> int:
        """Record a verified cycle of ``k`` drafts (per-position acceptance, acceptances owed to
        the relaxation, the draft-length policy); returns the accepted count."""
        accepted = int(verdict.accepted[0])
        exact = None if verdict.exact_accepted is None else int(verdict.exact_accepted[0])
        stats.record_positions(k, accepted, exact)  # per position, and the relaxation's share
        if self.draft_length is not None:
            self.draft_length.observe(k, accepted)
        return accepted

    def _score(self, ids: torch.Tensor, draft: torch.Tensor, run: _Run) -> torch.Tensor:
        """The verifier pass (timed): processed target laws ``[1, K+1, V]``.

        A recorder that wants the prompt's logprobs gets them from the first pass, the prompt's
        prefill, which then keeps the logits of every position it feeds (``ids`` all unseen).
        """
        t0 = _now(self.device)
        keep_fed = run.recorder is not None and run.recorder.wants_prompt
        target_probs = self.verifier.score(ids, draft, run.params, keep_fed)
        run.stats.verify_seconds += _now(self.device) - t0
        if keep_fed:
            assert run.recorder is not None and self.verifier.fed_logits is not None
            run.recorder.add_prompt(self.verifier.fed_logits[0, : ids.shape[1] - 1], ids[0])
        return target_probs

    def _with_eos(self, full: list[int], kept: list[int], finish: str, remaining: int) -> list[int]:
        """``kept`` and the EOS token that ended it, if one did: its logprob is reported (as vLLM
        does; lm-eval's loglikelihood drops the one token a request generates), its text is not."""
        n = len(kept)
        if finish == "eos" and n < min(len(full), remaining) and full[n] in self.eos_token_ids:
            return [*kept, full[n]]
        return kept

    def _record_logprobs(self, record: CycleRecord, chunk: list[int], recorder: LogprobRecorder) -> None:
        """The target's logprobs of a committed ``chunk`` (a prefix of ``record.chunk``): rows
        ``0 .. len(chunk) − 1`` of the cycle's verifier logits, no extra forward."""
        if not chunk:
            return
        logits = self.verifier.last_logits
        if record.skipped or record.target_probs is None or logits is None:
            raise LogprobsUnsupported("logprobs need every token verified: this cycle skipped verification")
        recorder.add(logits[0], chunk)

    def _cut(
        self, chunk: list[int], remaining: int, params: SamplingParams, text: _TextTracker
    ) -> tuple[list[int], str]:
        """Cut a chunk at EOS, the token budget and stop strings; return it and the finish reason."""
        finish = "length"
        for j, token in enumerate(chunk):
            if token in self.eos_token_ids and not params.ignore_eos:
                chunk, finish = chunk[:j], "eos"
                break
        chunk, hit_stop = text.add(chunk[:remaining])
        return chunk, "stop" if hit_stop else finish

    def _audit(self, ids: torch.Tensor, proposal: Proposal, skip: int, run: _Run) -> int:
        """Shadow verification of a skipped round: the prefix length ``L_b`` the rule accepts.

        Uses its own cache and generator and is excluded from the timings, so the audited
        generation and its measurements are unchanged.
        """
        assert self.shadow is not None and run.rule is not None
        t0 = _now(self.device)
        target_probs = self.shadow.score(ids, proposal.tokens, run.params)
        self.shadow.rollback(ids.shape[1])
        verdict = verify_unchecked(
            run.rule, proposal.tokens, _draft_probs(run.rule, proposal), target_probs, run.shadow_generator
        )
        strict = int(verdict.accepted[0])
        stats = run.stats
        stats.shadow_seconds += _now(self.device) - t0
        stats.shadow_rounds += 1
        stats.shadow_agreed_tokens += min(skip, strict)
        stats.shadow_full_prefix += int(strict >= skip)
        return strict


def _draft_probs(rule: Rule, proposal: Proposal) -> torch.Tensor | None:
    """What :func:`verify` needs of the proposal: ``q[1, K, V]``, ``q(d)[1, K]`` (Gate) or None."""
    if not rule.needs_draft_probs:
        return None
    return proposal.probs if rule.needs_full_draft_probs else proposal.confidence


def _ar_token(p: torch.Tensor, run: _Run) -> int:
    """Plain AR: argmax (greedy) or one draw from the processed target law ``p[V]``."""
    if run.params.greedy:
        return int(p.argmax())
    return int(torch.multinomial(p, 1, generator=run.generator))
