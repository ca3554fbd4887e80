"""Statistics of a generation, and the one definition of τ (docs/design.md §1).

Counters are kept once: totals that a per-position list already holds (proposed and accepted
draft tokens) are derived from it, as in vLLM's ``SpecDecodingStats``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def tau(tokens: int, verifier_calls: int, cycles: int = 0) -> float:
    """τ: tokens emitted per verifier call — the one definition every report uses.

    A method without a verifier (``mars``) reports tokens committed per cycle instead, the same
    "tokens per expensive forward" (its one forward per cycle is the proposer's); 0.0 when
    nothing ran.
    """
    if verifier_calls:
        return tokens / verifier_calls
    return tokens / cycles if cycles else 0.0


@dataclass
class GenerationStats:
    """Counters of one generation (or, merged, of a benchmark cell).

    ``position_proposed[i]`` / ``position_accepted[i]``: how often draft position i+1 was verified
    and how often it was accepted (vLLM's per-position acceptance). ``accepted_by_relaxation``:
    accepted draft tokens beyond the prefix the ``Exact`` rule would have accepted under the same
    uniforms (greedy rules: beyond the argmax-matching prefix) — the tokens a relaxed rule gains;
    ``position_relaxed[i]``: how often draft position i+1 was one of them (vLLM's
    ``relaxed_per_pos``).

    Shadow audit of skipped rounds (VS paper §3; ``Engine(shadow=...)``): ``shadow_rounds`` skipped
    rounds audited, ``shadow_agreed_tokens`` = Σ min(K_b, L_b) and ``shadow_full_prefix`` = #{L_b ≥ K_b}
    over them (K_b committed unverified, L_b what strict verification accepts). ``shadow_seconds``
    is excluded from ``total_seconds`` and the shadow's calls from ``verifier_calls``.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    cycles: int = 0
    verifier_calls: int = 0
    draft_calls: int = 0
    accepted_by_relaxation: int = 0
    skipped_rounds: int = 0
    skipped_tokens: int = 0
    shadow_rounds: int = 0
    shadow_agreed_tokens: int = 0
    shadow_full_prefix: int = 0
    position_proposed: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    position_relaxed: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    shadow_seconds: float = 0.0
    finish_reason: str = ""

    @property
    def tau(self) -> float:
        return tau(self.new_tokens, self.verifier_calls, self.cycles)

    @property
    def proposed_tokens(self) -> int:
        return sum(self.position_proposed)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.position_accepted)

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_seconds - self.verify_seconds)

    @property
    def strict_agreement(self) -> float | None:
        """Share of committed draft tokens strict verification accepts (None: unaudited skips)."""
        if self.shadow_rounds < self.skipped_rounds:
            return None
        committed = self.accepted_tokens + self.skipped_tokens
        return (self.accepted_tokens + self.shadow_agreed_tokens) / committed if committed else 1.0

    @property
    def full_prefix_acceptance(self) -> float | None:
        """Share of rounds whose whole committed prefix strict verification accepts (None: unaudited)."""
        if self.shadow_rounds < self.skipped_rounds:
            return None
        verified = self.cycles - self.skipped_rounds
        return (verified + self.shadow_full_prefix) / self.cycles if self.cycles else 1.0

    @property
    def position_acceptance(self) -> list[float]:
        return [
            a / p if p else 0.0 for a, p in zip(self.position_accepted, self.position_proposed, strict=True)
        ]

    def record_positions(self, proposed: int, accepted: int, exact: int | None = None) -> None:
        """One verified cycle: ``proposed`` drafts, the first ``accepted`` accepted, of which those
        from ``exact`` on (the strict rule's prefix on the same draws) only by the relaxation."""
        grow = proposed - len(self.position_proposed)
        if grow > 0:
            self.position_proposed += [0] * grow
            self.position_accepted += [0] * grow
        self.position_relaxed += [0] * (len(self.position_proposed) - len(self.position_relaxed))
        for i in range(proposed):
            self.position_proposed[i] += 1
        for i in range(accepted):
            self.position_accepted[i] += 1
        for i in range(accepted if exact is None else min(exact, accepted), accepted):
            self.position_relaxed[i] += 1
            self.accepted_by_relaxation += 1

    def merge(self, other: GenerationStats) -> GenerationStats:
        """Sum of two stats: counters and seconds added, per-position lists added element-wise."""
        out = GenerationStats()
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                n = max(len(mine), len(theirs))
                mine, theirs = mine + [0] * (n - len(mine)), theirs + [0] * (n - len(theirs))
                setattr(out, f.name, [a + b for a, b in zip(mine, theirs, strict=True)])
            elif not isinstance(mine, str):
                setattr(out, f.name, mine + theirs)
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tau=self.tau,
            proposed_tokens=self.proposed_tokens,
            accepted_tokens=self.accepted_tokens,
            other_seconds=self.other_seconds,
            position_acceptance=self.position_acceptance,
            strict_agreement=self.strict_agreement,
            full_prefix_acceptance=self.full_prefix_acceptance,
        )
        return d


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]  # generated token ids (no prompt, no EOS)
    stats: GenerationStats
