"""``relaxspec reproduce``: the papers' headline comparisons at our scale, into ``docs/results.md``.

Each :class:`Experiment` is one benchmark grid (one results directory under ``--results``):

- ``nsd-greedy`` / ``nsd-sampling``: NSD vs SD vs AR over a θ × K grid on the held-out math set,
  with Hugging Face ``generate()``, assisted generation and prompt lookup as peers (NSD Table 1–2);
- ``nsd-code``: the same at T = 1 on held-out code tasks scored by their unit tests (pass@1), the
  regime where NSD's relaxation could matter, over θ;
- ``prove``: ProVe and ProVe-lossless vs SD with the same small model (the draft model is SD's
  drafter and ProVe's small verifier) and MARS (ProVe Table 1);
- ``vs`` / ``vs-kmin``: verifier-skipping signals and baselines vs strict SDD on HumanEval and math, greedy,
  and the k_min sweep behind VS's H2.

Methods that are not registered, or whose models are not bundled, are skipped with a note; so are
``--set`` values a method rejects. Re-running resumes every grid. The report is rendered by
:func:`relaxspec.eval.report.render_report` with the command line, and each grid's bench command and
environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.eval import intervals
from relaxspec.eval.bench import BenchConfig, run_bench
from relaxspec.eval.grid import parse_sets
from relaxspec.eval.peers import PEERS, is_peer, resolve_runner, runner_needs, runner_params
from relaxspec.eval.records import load_records
from relaxspec.eval.rows import Row, Timings, build_rows, cell_timings, speed_between
from relaxspec.eval.tables import format_speedup
from relaxspec.methods import get_method
from relaxspec.models import bundled


@dataclass(frozen=True)
class Experiment:
    """One grid: which methods, datasets, sampling, sweeps and peers."""

    name: str
    title: str
    paper: str  # the headline being reproduced, quoted in the report
    methods: tuple[str, ...]
    datasets: tuple[str, ...] = ("math",)
    temperature: float = 0.0
    top_p: float = 1.0
    seeds: tuple[int, ...] = (0,)
    sets: tuple[str, ...] = ()
    peers: tuple[str, ...] | None = ()  # None: every peer whose models exist
    diagnostics: bool = True


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment(
        "nsd-greedy",
        "NSD vs SD vs AR, greedy decoding (θ × K grid)",
        "NSD: up to 5.16× over AR and 3.15× over SD; τ rises at every model size (NSD §4.2, Table 1-2).",
        ("sd", "nsd"),
        sets=("nsd.theta=0.5,0.8,0.95", "k=4,8"),
        peers=None,
    ),
    Experiment(
        "nsd-sampling",
        "NSD vs SD vs AR, sampling (temperature 1, top-p 0.95; θ × K grid, 3 seeds)",
        "At top-p 0.95, 52.6% of SD-rejected tokens lie in the target nucleus and 81.5% in its top 10; "
        "extra NSD acceptances: 86.65% in the nucleus core, 94.1% in the top 5 (NSD §1, §4.4).",
        ("sd", "nsd"),
        temperature=1.0,
        top_p=0.95,
        seeds=(0, 1, 2),
        sets=("nsd.theta=0.8,0.9,0.95", "k=4,8"),
        peers=None,
    ),
    Experiment(
        "nsd-code",
        "NSD vs SD vs AR on held-out code tasks with unit tests, sampling (temperature 1, top-p 0.95; "
        "θ sweep, 2 seeds)",
        "Where the target is uncertain (sampling, code), 52.6% of SD-rejected tokens lie in its "
        "0.95-nucleus and NSD accepts them at a small quality cost (NSD §1, §4.4); here pass@1 on "
        "held-out code tasks, with its interval, measures that cost.",
        ("sd", "nsd"),
        datasets=("synthcode-combos",),
        temperature=1.0,
        top_p=0.95,
        seeds=(0, 1),
        sets=("nsd.theta=0.5,0.8,0.95", "k=4"),
    ),
    Experiment(
        "prove",
        "ProVe vs SD with the same small model, greedy",
        "ProVe-lossless 2.5× AR throughput, token-identical to greedy AR; ProVe with a small verifier "
        "2.7× at −2.6 points; SD with the same small model 1.63× (ProVe §4.1).",
        ("sd", "mars", "prove", "prove-lossless"),
        sets=("prove.theta=0.01,0.05,0.1,0.3,0.5", "sd.k=4"),
    ),
    Experiment(
        "vs",
        "Verifier skipping vs strict SDD, HumanEval and math, greedy",
        "All three signals save 9.6–13.5% of verifier calls at strict SDD's pass@1; raw confidence "
        "saves the most; lenience 4.6% fewer calls (VS §5).",
        ("sdd", "sdd-skip", "sdd-periodic"),
        datasets=("humaneval", "math"),
        sets=(
            "sdd-skip.signal=raw,marginal,conditional",
            "sdd-skip.tau=0.8,0.9,0.95",
            "sdd.accept=exact,lenience,topk",
            "sdd-skip.shadow=true",
            "sdd-periodic.shadow=true",
        ),
    ),
    Experiment(
        "vs-kmin",
        "Verifier skipping: the k_min sweep (VS H2), HumanEval and math, greedy",
        "Fewer verifier calls need not mean more throughput: short skips add drafting rounds; "
        "throughput peaks at a k_min above the break-even skip length K* (VS §5, H2).",
        ("sdd", "sdd-skip"),
        datasets=("humaneval", "math"),
        sets=("sdd-skip.k_min=0,2,3,4,6,8", "sdd-skip.shadow=true"),  # k_min <= bundled γ = 8
    ),
)


# ---------------------------------------------------------------------------------------------
# Planning: keep what can run here, say what cannot


@dataclass
class Plan:
    experiment: Experiment
    config: BenchConfig | None
    notes: list[str] = field(default_factory=list)


def _available(role: str, models: dict[str, str | None]) -> bool:
    return Path(models.get(role) or bundled(role)).exists()


def usable_methods(methods: Sequence[str], models: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """(methods that are registered and whose models exist, notes on the others)."""
    keep, notes = [], []
    for m in methods:
        try:
            get_method(m)
        except RelaxSpecError:
            notes.append(f"`{m}` is not registered in this version; skipped.")
            continue
        missing = [r for r in runner_needs(m) if not _available(r, models)]
        if missing:
            notes.append(f"`{m}` needs the {', '.join(missing)} model (not bundled yet); skipped.")
            continue
        keep.append(m)
    return keep, notes


def usable_sets(sets: Sequence[str], runners: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--set`` items restricted to ``runners``, parameters they have and values they accept."""
    keep, notes = [], []
    for scope, params in parse_sets(sets).items():
        targets = [scope] if scope is not None else list(runners)
        if scope is not None and scope not in runners:
            continue  # its method was skipped (noted there)
        for name, values in params.items():
            owners = [r for r in targets if name in runner_params(r)]
            if not owners:
                notes.append(
                    f"no method here has a parameter `{name}`; `{_set(scope, name, values)}` dropped."
                )
                continue
            ok = [v for v in values if all(_accepts(r, name, v) for r in owners)]
            if len(ok) < len(values):
                bad = [v for v in values if v not in ok]
                notes.append(f"`{_set(scope, name, bad)}` rejected by the method's validation; dropped.")
            if ok:
                keep.append(_set(scope, name, ok))
    return keep, notes


def _set(scope: str | None, name: str, values: Sequence[Any]) -> str:
    text = ",".join("true" if v is True else "false" if v is False else str(v) for v in values)
    return f"{scope + '.' if scope else ''}{name}={text}"


def _accepts(runner: str, name: str, value: Any) -> bool:
    try:
        resolve_runner(runner, {name: value})
    except RelaxSpecError:
        return False
    return True


def plan_experiment(
    exp: Experiment,
    results: Path,
    models: dict[str, str | None],
    limit: int,
    max_new_tokens: int,
    progress: bool,
) -> Plan:
    """The :class:`BenchConfig` of ``exp`` with what this checkout can run, and notes on the rest."""
    methods, notes = usable_methods(exp.methods, models)
    if not methods:
        return Plan(exp, None, [*notes, "nothing to compare with AR here; experiment skipped."])
    peers = exp.peers
    if peers is not None:
        peers = tuple(p for p in peers if all(_available(r, models) for r in PEERS[p].needs))
    runners = ["ar", *methods, *(peers if peers is not None else [p for p in PEERS if is_peer(p)])]
    sets, set_notes = usable_sets(exp.sets, runners)
    config = BenchConfig(
        methods=methods,
        datasets=list(exp.datasets),
        limit=limit,
        temperature=exp.temperature,
        top_p=exp.top_p,
        seeds=list(exp.seeds),
        max_new_tokens=max_new_tokens,
        sets=sets,
        peers=None if peers is None else list(peers),
        models=dict(models),
        out=str(results / exp.name),
        diagnostics=exp.diagnostics,
        progress=progress,
        command=bench_command(exp, methods, sets, peers, limit, max_new_tokens, results),
    )
    return Plan(exp, config, notes + set_notes)


def bench_command(
    exp: Experiment,
    methods: Sequence[str],
    sets: Sequence[str],
    peers: Sequence[str] | None,
    limit: int,
    max_new_tokens: int,
    results: Path,
) -> str:
    """The equivalent ``relaxspec bench`` command line (recorded in the results manifest)."""
    import shlex

    args = ["relaxspec", "bench", "--methods", ",".join(methods), "--dataset", ",".join(exp.datasets)]
    args += ["--limit", str(limit), "--temperature", str(exp.temperature), "--top-p", str(exp.top_p)]
    args += ["--seeds", ",".join(map(str, exp.seeds)), "--max-new-tokens", str(max_new_tokens)]
    for s in sets:
        args += ["--set", s]
    args += ["--peers", "auto" if peers is None else ",".join(peers) or "none"]
    args += ["--out", str(results / exp.name)] + (["--diagnostics"] if exp.diagnostics else [])
    return shlex.join(args)


# ---------------------------------------------------------------------------------------------
# Headlines: the numbers the papers lead with, from our rows


def _pick(rows: Sequence[Row], method: str, **params: Any) -> list[Row]:
    return [
        r
        for r in rows
        if r.method == method and r.prompts and all(r.params.get(k) == v for k, v in params.items())
    ]


def _q(r: Row | None) -> str:
    """Quality with its 95 % interval and n: ``0.80 [0.58–0.92] (n=20)``."""
    if r is None or r.quality is None:
        return "-"
    if r.quality_ci is None:
        return f"{r.quality:.3f}"
    return f"{intervals.format_interval(r.quality_ci)} (n={r.quality_ci['n']})"


def _delta(r: Row) -> str:
    """The row's paired quality difference from its baseline: ``; Δ vs ar -0.05 [...] p=0.62 n=20``."""
    p = (r.paired or {}).get("quality")
    if p is None:
        return ""
    return f"; Δ vs {r.paired['baseline']} {intervals.format_paired(p)}"


def _over(x: Row, y: Row, times: dict[str, Timings] | None) -> str:
    """Speed of ``x`` over ``y`` with its interval where ``times`` are given: ``1.31× [1.22–1.40]``."""
    return format_speedup(*speed_between(x, y, times))


def nsd_headline(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[str]:
    """Best NSD setting vs SD at the same K and vs AR; τ and quality alongside."""
    ar = next(iter(_pick(rows, "ar")), None)
    nsd = sorted(_pick(rows, "nsd"), key=lambda r: r.speedup or 0, reverse=True)
    if not nsd or ar is None:
        return []
    best = nsd[0]
    sd = next(iter(_pick(rows, "sd", k=best.params.get("k"))), None)
    line = (
        f"best NSD ({best.label}): {format_speedup(best.speedup, best.speedup_ci)} over AR"
        + (f", {_over(best, sd, times)} over SD ({sd.label})" if sd and sd.tokens_per_second else "")
        + f"; τ {best.tau:.2f}"
        + (f" vs SD {sd.tau:.2f}" if sd and sd.tau else "")
        + f"; quality {_q(best)} vs SD {_q(sd)} vs AR {_q(ar)}"
        + _delta(best)
    )
    return [line]


def rejection_headline(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[str]:
    """Share of SD-rejected tokens in the nucleus / top 10, from the sd rows' diagnostics."""
    out = []
    for r in _pick(rows, "sd"):
        d = r.diagnostics.get("rejections", {})
        if d.get("strict_rejected"):
            out.append(
                f"{r.label}: of {d['strict_rejected']} rejected tokens, {d['rejected_in_nucleus']:.1%} lie "
                f"in the target's 0.95-nucleus and {d['rejected_in_top10']:.1%} in its top 10"
            )
    for r in _pick(rows, "nsd")[:1]:
        d = r.diagnostics.get("rejections", {})
        if d.get("extra_accepted"):
            out.append(
                f"{r.label}: {d['extra_accepted']} extra acceptances, {d['extra_in_nucleus_core']:.1%} in "
                f"the nucleus core, {d['extra_in_top5']:.1%} in the top 5"
            )
    return out


def prove_headline(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[str]:
    ar = next(iter(_pick(rows, "ar")), None)
    out = []
    for r in _pick(rows, "prove-lossless"):
        # lossless w.r.t. the *proposer's* greedy AR (the block model), not the target's
        rate = r.diagnostics.get("prove", {}).get("non_matching_rate")
        own = "-" if rate is None else f"{rate:.2%}"
        out.append(
            f"{r.label}: {format_speedup(r.speedup, r.speedup_ci)} over the target's AR; tokens differing "
            "from the proposer's own "
            f"greedy AR: {own}; quality {_q(r)} vs the target's AR {_q(ar)}"
        )
    for r in sorted(_pick(rows, "prove"), key=lambda r: r.speedup or 0, reverse=True)[:1]:
        speed = format_speedup(r.speedup, r.speedup_ci)
        out.append(f"best {r.label}: {speed} over AR at quality {_q(r)} vs AR {_q(ar)}{_delta(r)}")
    for r in _pick(rows, "sd"):
        speed = format_speedup(r.speedup, r.speedup_ci)
        out.append(f"{r.label} with the same small model: {speed} over AR, quality {_q(r)}")
    return out


def vs_headline(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[str]:
    strict = next(iter(_pick(rows, "sdd", accept="exact")), None)
    if strict is None or not strict.verifier_calls_per_token:
        return []
    out = []
    for r in _pick(rows, "sdd-skip") + _pick(rows, "sdd-periodic") + _pick(rows, "sdd"):
        if r is strict or r.verifier_calls_per_token is None:
            continue
        saved = 1 - r.verifier_calls_per_token / strict.verifier_calls_per_token
        out.append(
            f"{r.label}: {saved:+.1%} verifier calls saved vs strict SDD, quality {_q(r)} vs {_q(strict)}, "
            f"speedup {format_speedup(r.speedup, r.speedup_ci)} vs "
            f"{format_speedup(strict.speedup, strict.speedup_ci)}"
        )
    return out


def hf_headline(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[str]:
    from relaxspec.eval.report import hf_comparisons

    return [
        f"{c['comparison']}: {format_speedup(c['ratio'], c['ratio_ci'])}"
        + (f" (goal ≥ {c['goal']:.1f}×: {'met' if c['met'] else 'not met'})" if c["goal"] else "")
        for c in hf_comparisons(rows, times)
        if c["ratio"] is not None
    ]


def nsd_frontier_headline(rows: Sequence[Row], times: dict[str, Timings] | None = None) -> list[str]:
    """Each NSD setting against SD at the same K: speed ratio and quality (the θ frontier)."""
    out = []
    for r in sorted(_pick(rows, "nsd"), key=lambda r: (r.params.get("k") or 0, r.params.get("theta") or 0)):
        sd = next(iter(_pick(rows, "sd", k=r.params.get("k"))), None)
        if sd is None or not sd.tokens_per_second:
            continue
        out.append(
            f"{r.label}: {_over(r, sd, times)} SD, "
            f"τ {r.tau:.2f} vs {sd.tau:.2f}; quality {_q(r)} vs SD {_q(sd)}" + _delta(r)
        )
    return out


# Each takes one group's pooled rows and their cell_timings (speed ratios between rows get intervals)
HEADLINES = {
    "nsd-greedy": (nsd_headline, rejection_headline, hf_headline),
    "nsd-sampling": (nsd_headline, rejection_headline, hf_headline),
    "nsd-code": (nsd_frontier_headline, rejection_headline),
    "prove": (prove_headline,),
    "vs": (vs_headline,),
    "vs-kmin": (vs_headline,),
}


def headlines(exp: Experiment, records_dir: Path) -> list[str]:
    """Headline bullets of one finished experiment (per dataset / temperature group)."""
    from relaxspec.eval.report import groups

    records = load_records(records_dir)
    rows = build_rows(records, combine_seeds=True)
    times = cell_timings(records, combine_seeds=True)
    out = []
    for key, group in groups(rows).items():
        lines = [line for fn in HEADLINES.get(exp.name, ()) for line in fn(group, times)]
        out += [f"- {key[0]}, T={key[1]:g}: {line}" for line in lines]
    return out


# ---------------------------------------------------------------------------------------------
# The command


def reproduce(
    out: str | Path,
    results: str | Path,
    limit: int = 30,
    max_new_tokens: int = 128,
    only: Sequence[str] | None = None,
    models: dict[str, str | None] | None = None,
    progress: bool = True,
    command: str = "relaxspec reproduce",
) -> Path:
    """Run (or resume) every experiment that can run here, then write the report to ``out``."""
    from relaxspec.eval.report import render_report

    names = [e.name for e in EXPERIMENTS]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise RelaxSpecError(f"unknown experiment {', '.join(unknown)}; choose from {', '.join(names)}")
    results, models = Path(results), models or {}
    done: list[tuple[Experiment, Path]] = []
    sections = []
    for exp in EXPERIMENTS:
        if only and exp.name not in only:
            continue
        plan = plan_experiment(exp, results, models, limit, max_new_tokens, progress)
        if plan.config is not None:
            try:
                run_bench(plan.config)
                done.append((exp, Path(plan.config.out)))
            except RelaxSpecError as err:
                plan.notes.append(f"the grid could not run: {err}")
        sections.append(plan)
    intro = summary(sections, done, command)
    if not done:
        raise RelaxSpecError("no experiment could run here:\n" + intro)
    return render_report(
        [path for _, path in done],
        out,
        title="relaxspec: the papers' headline comparisons at our scale",
        intro=intro,
        names=[f"{exp.name}: {exp.title}" for exp, _ in done],
        command=command,
        html=False,
    )


QUALITY_REPORTING = (
    "**How quality is reported.** Every quality figure (math exact match, pass@1, agreement with "
    "greedy AR) is shown as `mean [95 % interval]` with its n: a Wilson score interval for a "
    "proportion; with seeds pooled, the Wilson interval at the effective sample size of prompts × "
    "seeds clustered by prompt (a prompt's seeds are not independent evidence; a percentile "
    "bootstrap over prompts for non-binary figures). Each row is also compared with the "
    "`ar` row (else `sd`) of the same run on the same prompts and seeds, matched by (dataset, "
    "example, seed): Δ is the paired difference with its paired-bootstrap 95 % interval, p the exact "
    "McNemar test on the discordant pairs (0/1 scores), n the number of pairs. A Δ interval that "
    "contains 0 means no measured difference, not equal quality. On n = 20–30 prompts an interval "
    "spans about ±0.1–0.2 (±0.03–0.07 at n = 200): headline quality claims rest on n ≥ 200 prompts "
    "(or prompts × seeds). Every speed ratio (over AR, over SD, over HF) is shown as `ratio× "
    "[95 % interval]`: the ratio of total tokens over total seconds of the two rows on the same "
    "prompts, its interval a delete-a-prompt jackknife of the log ratio (a prompt's timings under "
    "both rows, all its seeds, left out together); it covers prompt-to-prompt variation, not "
    "drift between separate runs. Whether a sampling row's tokens are draws from the target's law "
    "(what a lossless method promises at T > 0) is checked per token by `relaxspec calibrate "
    "RESULTS` (docs/design.md §6).\n"
)


def summary(plans: Sequence[Plan], done: Sequence[tuple[Experiment, Path]], command: str) -> str:
    """The report's opening: how to reproduce, what each experiment found next to the paper's claim,
    and what was skipped."""
    finished = dict(done)
    parts = [
        "Reproduce with the command above (re-running resumes every grid; each section lists its "
        "exact `relaxspec bench` command and environment). Throughput is total new tokens / total "
        "in-flight seconds; speedups are against our AR measured in the same run, on the bundled "
        "models, on CPU. These machines are noisy: compare ratios within a run.\n",
        QUALITY_REPORTING,
    ]
    for plan in plans:
        exp = plan.experiment
        parts.append(f"**{exp.name}** — {exp.title}.\n\n- paper: {exp.paper}")
        if exp in finished:
            parts += headlines(exp, finished[exp]) or ["- (no headline numbers: see the tables below)"]
        parts += [f"- note: {n}" for n in plan.notes]
        parts.append("")
    return "\n".join(parts) + "\n"
