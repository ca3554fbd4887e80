"""The benchmark grid: arithmetic, grid expansion, resume, per-cell failures, bad input, datasets."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from relaxspec.acceptance import Verdict
from relaxspec.data.mathgen import extract_answer
from relaxspec.engine import CycleRecord, GenerationStats
from relaxspec.engine.proposers.base import Proposal
from relaxspec.errors import RelaxSpecError
from relaxspec.eval import diagnostics
from relaxspec.eval.bench import BenchConfig, plan, run_bench
from relaxspec.eval.datasets import file_examples, load_examples, math_examples
from relaxspec.eval.grid import expand_grid, parse_sets
from relaxspec.eval.results import RECORDS, Cell, build_rows, load_records, speedup, throughput

SAMPLING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 8}


def record(method: str, example: str, tokens: int, seconds: float, seed: int = 0, **params) -> dict:
    stats = GenerationStats(new_tokens=tokens, verifier_calls=max(tokens // 2, 1), total_seconds=seconds)
    return {
        "type": "record",
        "cell": Cell(method, params, "math", seed, SAMPLING).to_dict(),
        "example": example,
        "tokens": list(range(tokens)),
        "seconds": seconds,
        "stats": stats.to_dict(),
        "error": None,
    }


# --- arithmetic on synthetic timings -----------------------------------------------------------


def test_throughput_is_total_tokens_over_total_seconds():
    assert throughput(30, 3.0) == 10.0
    assert throughput(5, 0.0) == 0.0
    assert speedup(20.0, 10.0) == 2.0
    assert speedup(20.0, None) is None and speedup(20.0, 0.0) is None


def test_rows_pool_prompts_and_compare_with_ar_of_the_same_seed():
    records = [
        record("ar", "a", 10, 1.0),
        record("ar", "b", 30, 2.0),  # ar: 40 tokens / 3 s
        record("sd", "a", 10, 0.1, k=4),
        record("sd", "b", 30, 1.9, k=4),  # sd: 40 / 2 s; mean of per-prompt rates would be 57.9
        record("ar", "a", 10, 2.0, seed=1),
        record("sd", "a", 10, 1.0, seed=1, k=4),
    ]
    rows = {(r.method, r.seed): r for r in build_rows(records)}
    assert rows["ar", 0].tokens_per_second == pytest.approx(40 / 3)
    assert rows["sd", 0].tokens_per_second == pytest.approx(20.0)
    assert rows["sd", 0].speedup == pytest.approx(20.0 / (40 / 3))
    assert rows["sd", 1].speedup == pytest.approx(2.0)  # against ar of seed 1, not seed 0
    assert rows["sd", 0].tau == pytest.approx(40 / 20)
    pooled = {r.method: r for r in build_rows(records, combine_seeds=True)}
    assert pooled["sd"].tokens_per_second == pytest.approx(50 / 3.0)
    assert pooled["sd"].speedup == pytest.approx((50 / 3.0) / (50 / 5.0))
    assert pooled["sd"].seeds == [0, 1]


def test_a_named_baseline_sets_speedups_and_paired_quality():
    """``--baseline vllm-ar``: rows verified by the model that peer decodes are compared with it
    (speedup and paired Δ quality), the baseline itself has speedup 1; an unknown name is refused
    before anything runs."""
    records = [
        record("ar", "a", 10, 1.0),
        record("vllm-ar", "a", 10, 2.0, model="block"),
        record("prove-lossless", "a", 10, 0.5, block_size=8),
    ]
    for r, quality in zip(records, (1.0, 0.0, 0.0), strict=True):
        r["quality"], r["metric"] = quality, "exact_match"
    rows = {r.method: r for r in build_rows(records, baseline="vllm-ar")}
    assert rows["prove-lossless"].speedup == pytest.approx(4.0)
    assert rows["vllm-ar"].speedup == pytest.approx(1.0) and rows["ar"].speedup == pytest.approx(2.0)
    paired = rows["prove-lossless"].paired
    assert paired["baseline"] == "vllm-ar" and paired["quality"]["delta"] == 0.0
    assert rows["vllm-ar"].paired is None
    default = {r.method: r for r in build_rows(records)}
    assert default["prove-lossless"].speedup == pytest.approx(2.0)
    assert default["prove-lossless"].paired["quality"]["delta"] == -1.0
    with pytest.raises(RelaxSpecError, match="--baseline 'vllm-sd' names no row"):
        run_bench(BenchConfig(methods=["sd"], peers=[], baseline="vllm-sd", out="/nonexistent"))


def test_agreement_with_greedy_ar():
    records = [record("ar", "a", 6, 1.0), record("sd", "a", 6, 1.0, k=4), record("nsd", "a", 4, 1.0, k=4)]
    records[2]["tokens"] = [0, 1, 9, 9]
    rows = {r.method: r for r in build_rows(records)}
    assert rows["sd"].ar_identical == 1.0 and rows["sd"].ar_prefix == 6
    assert rows["nsd"].ar_identical == 0.0 and rows["nsd"].ar_prefix == 2


def test_a_rerun_supersedes_a_failed_record():
    failed = {**record("sd", "a", 0, 0.0, k=4), "error": "boom", "tokens": []}
    rows = build_rows([record("ar", "a", 4, 1.0), failed, record("sd", "a", 8, 1.0, k=4)])
    sd = next(r for r in rows if r.method == "sd")
    assert sd.errors == 0 and sd.prompts == 1 and sd.new_tokens == 8


# --- grid ------------------------------------------------------------------------------------


def test_parse_sets():
    assert parse_sets(["nsd.theta=0.9,0.95", "k=4,8", "sdd.accept=lenience"]) == {
        "nsd": {"theta": [0.9, 0.95]},
        None: {"k": [4, 8]},
        "sdd": {"accept": ["lenience"]},
    }
    for bad in ("theta", "nsd.theta=", "=3", "nsd.theta=0.9,,1"):
        with pytest.raises(RelaxSpecError, match="--set expects"):
            parse_sets([bad])


def test_grid_is_the_cross_product_and_hf_assisted_follows_sd():
    cells = expand_grid(
        ["sd", "nsd"],
        ["hf-assisted"],
        parse_sets(["nsd.theta=0.9,0.95", "k=4,8"]),
        ["math"],
        [0, 1],
        SAMPLING,
    )
    by = {}
    for c in cells:
        by.setdefault(c.method, []).append(c)
    assert len(by["ar"]) == 2 and len(by["sd"]) == 4 and len(by["nsd"]) == 8
    assert sorted({c.params["k"] for c in by["hf-assisted"]}) == [4, 8]
    assert cells[0].method == "ar"


@pytest.mark.parametrize(
    "methods,peers,sets,match",
    [
        (["sd", "fast"], [], [], "unknown method 'fast'"),
        (["sd"], ["hf-magic"], [], "unknown peer"),
        (["nsd"], [], ["nsd.thetaa=0.9"], "has no parameter thetaa"),
        (["nsd"], [], ["nsd.theta=1.5"], "theta"),
        (["sd"], [], ["nsd.theta=0.9"], "not in --methods"),
        (["sd"], [], ["bogus=1"], "no method in the grid has a parameter 'bogus'"),
        (["sd"], ["hf-assisted"], ["hf-assisted.k=0"], "k of 'hf-assisted'"),
        (["sd"], ["hf-assisted"], ["hf-assisted.confidence=1.5"], "confidence of 'hf-assisted'"),
    ],
)
def test_grid_bad_input(methods, peers, sets, match):
    with pytest.raises(RelaxSpecError, match=match):
        expand_grid(methods, peers, parse_sets(sets), ["math"], [0], SAMPLING)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"limit": 0}, "--limit must be an integer >= 1"),
        ({"seeds": []}, "seeds"),
        ({"seeds": [-1]}, "seeds"),
        ({"methods": []}, "no methods"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": 1.0, "more_temperatures": [-0.5]}, "temperature"),
        ({"temperature": 1.0, "more_temperatures": [1.0]}, "distinct"),
        ({"temperature": 0.0, "more_temperatures": [1.0]}, "all > 0"),
    ],
)
def test_config_bad_input(changes, match):
    with pytest.raises(RelaxSpecError, match=match):
        plan(BenchConfig(**{"methods": ["sd"], **changes}))


def test_a_grid_at_several_temperatures_repeats_every_cell_at_each():
    one = plan(BenchConfig(methods=["sd"], temperature=1.0, top_p=0.95, peers=[]))
    both = plan(BenchConfig(methods=["sd"], temperature=1.0, more_temperatures=[0.9], top_p=0.95, peers=[]))
    assert len(both) == 2 * len(one)
    assert sorted({c.sampling["temperature"] for c in both}) == [0.9, 1.0]
    assert [(c.method, c.params) for c in both if c.sampling["temperature"] == 0.9] == [
        (c.method, c.params) for c in one
    ]


# --- datasets ----------------------------------------------------------------------------------


def test_math_answer_extraction():
    assert extract_answer("Cost: 3 * 4 = 12\n#### 12") == 12
    assert extract_answer("#### -7 and later #### 9") == -7
    assert extract_answer("#### 1,000") == 1
    assert extract_answer("no answer line") is None
    ex = math_examples(1)[0]
    assert ex.metric == "exact_match"
    assert ex.score(f"steps\n#### {ex.answer}") == 1.0
    assert ex.score(f"#### {ex.answer + 1}") == 0.0
    assert ex.score("I do not know") == 0.0


def test_prompt_files(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "2+2=", "answer": "4", "id": "x"}\n\n{"prompt": "hi", "stop": ["\\n"]}\n')
    a, b = file_examples(f, 10)
    assert (a.id, a.answer, a.score("#### 4")) == ("x", 4, 1.0)
    assert (b.id, b.stop, b.metric) == ("line-3", ("\n",), None)
    for text, match in [
        ("not json\n", "not valid JSON"),
        ('{"id": 1}\n', "non-empty string field 'prompt'"),
        ('{"prompt": "a", "answer": "x"}\n', "'answer' must be an integer"),
        ('{"prompt": "a", "stop": "x"}\n', "'stop' must be a list"),
    ]:
        f.write_text(text)
        with pytest.raises(RelaxSpecError, match=match):
            file_examples(f, 10)


def test_dataset_bad_input(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RelaxSpecError, match="empty prompt file"):
        load_examples(str(empty), 5)
    with pytest.raises(RelaxSpecError, match="limit"):
        load_examples("math", 0)
    with pytest.raises(RelaxSpecError, match="unknown dataset"):
        load_examples("gsm8k", 5)
    with pytest.raises(RelaxSpecError, match="not found"):
        load_examples(str(tmp_path / "missing.jsonl"), 5)


# --- runs on tiny models ------------------------------------------------------------------------


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(["w1 w2", "w3", "w4 w4"])
        )
    )
    return f


def config(model_dirs, prompts, out, **kw) -> BenchConfig:
    target, draft = model_dirs
    base = dict(
        methods=["sd", "nsd"],
        datasets=[str(prompts)],
        limit=3,
        max_new_tokens=6,
        sets=["nsd.theta=0.5,0.9", "k=2"],
        peers=["hf-generate", "hf-assisted"],
        models={"target": str(target), "draft": str(draft)},
        out=str(out),
        warmup_tokens=2,
        progress=False,
    )
    return BenchConfig(**{**base, **kw})


def test_grid_run_resume_and_new_cells(model_dirs, prompts, tmp_path):
    out = tmp_path / "results"
    report = run_bench(config(model_dirs, prompts, out, diagnostics=True))
    labels = {r["label"] for r in report["rows"]}
    assert labels == {
        "ar",
        "sd k=2",
        "nsd k=2 theta=0.5",
        "nsd k=2 theta=0.9",
        "hf-generate",
        "hf-assisted k=2",
    }
    assert all(r["prompts"] == 3 and r["errors"] == 0 for r in report["rows"])
    rows = {r["label"]: r for r in report["rows"]}
    assert rows["ar"]["speedup"] == 1.0 and rows["ar"]["speedup_ci"] is None
    speed = rows["sd k=2"]["speedup_ci"]  # 95 % interval over the 3 prompts, paired with ar
    assert speed["n"] == 3 and speed["low"] <= rows["sd k=2"]["speedup"] <= speed["high"]
    assert rows["sd k=2"]["ar_identical"] == 1.0  # greedy sd is lossless
    assert rows["hf-generate"]["ar_identical"] == 1.0  # HF greedy = our greedy AR
    assert "rejections" in rows["nsd k=2 theta=0.5"]["diagnostics"]
    # agreement with greedy AR: n and 95 % interval; paired with ar on the same prompts and seed
    ci = rows["sd k=2"]["ar_identical_ci"]
    assert ci["n"] == 3 and ci["method"] == "wilson" and 0.4 < ci["low"] < ci["high"] == 1.0
    paired = rows["nsd k=2 theta=0.5"]["paired"]
    assert paired["baseline"] == "ar" and paired["n_pairs"] == 3 and paired["quality"] is None
    assert paired["ar_identical"]["n_pairs"] == 3 and rows["ar"]["paired"] is None
    saved = json.loads((out / "results.json").read_text())["rows"]
    assert all("quality_ci" in r and "ar_identical_ci" in r and "paired" in r for r in saved)
    for name in ("results.json", "results.csv", "results.md", "manifest.json"):
        assert (out / name).is_file()
    n = len(load_records(out))
    assert n == 6 * 3

    run_bench(config(model_dirs, prompts, out))  # resume: every cell is finished
    assert len(load_records(out)) == n
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["sessions"]) == 2

    run_bench(config(model_dirs, prompts, out, methods=["sd", "nsd", "topk"]))  # only the new cells run
    new = load_records(out)[n:]
    assert len(new) == 3 and {r["cell"]["method"] for r in new} == {"topk"}


def test_sampling_grid_writes_greedy_references(model_dirs, prompts, tmp_path):
    out = tmp_path / "results"
    report = run_bench(
        config(model_dirs, prompts, out, temperature=1.0, seeds=[0, 1], peers=[], sets=["k=2"])
    )
    assert len([r for r in load_records(out) if r["type"] == "reference"]) == 3
    assert all(r["ar_identical"] is not None for r in report["rows"])
    assert {r["seed"] for r in report["rows"]} == {0, 1}


def test_a_crash_in_one_cell_is_recorded_and_the_grid_goes_on(model_dirs, prompts, tmp_path):
    # lenience has no greedy rule: every prompt of that cell fails, the others run
    report = run_bench(
        config(model_dirs, prompts, tmp_path / "r", methods=["sd", "lenience"], sets=[], peers=[])
    )
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["lenience"]["errors"] == 3 and "no acceptance rule for greedy" in rows["lenience"]["error"]
    assert rows["sd"]["errors"] == 0 and rows["sd"]["prompts"] == 3


def test_changed_models_refuse_to_resume(model_dirs, prompts, tmp_path):
    out = tmp_path / "r"
    run_bench(config(model_dirs, prompts, out, methods=["sd"], sets=[], peers=[], limit=1))
    _, draft = model_dirs
    with pytest.raises(RelaxSpecError, match="different target model"):
        run_bench(config((draft, draft), prompts, out, methods=["sd"], sets=[], peers=[], limit=1))


def test_corrupted_results_file(model_dirs, prompts, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / RECORDS).write_text('{"type": "record", "cell": {"method": "ar"}}\n')
    with pytest.raises(RelaxSpecError, match=r"corrupted results file .*line 1"):
        run_bench(config(model_dirs, prompts, out))


def test_unwritable_output(model_dirs, prompts, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RelaxSpecError, match="cannot write results"):
        run_bench(config(model_dirs, prompts, blocker / "results"))
    with pytest.raises(RelaxSpecError, match=r"not a \.json file"):
        run_bench(config(model_dirs, prompts, tmp_path / "bench.json"))


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``relaxspec ARGS`` in-process (the CLI's ``main``): (exit status, stdout, stderr)."""
    from relaxspec.cli import main

    monkeypatch.setattr(sys, "argv", ["relaxspec", *args])
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_bench(model_dirs, prompts, tmp_path, monkeypatch, capsys):
    target, draft = model_dirs
    common = ["--target", str(target), "--draft", str(draft), "--prompts", str(prompts), "--no-progress"]
    small = ["bench", "--k", "2", "--max-new-tokens", "4", "--limit", "2", "--peers", "none", *common]
    grid = ["--methods", "sd,nsd", "--set", "nsd.theta=0.9", "--seeds", "0", "--out", str(tmp_path / "r")]
    code, out, err = run_cli(monkeypatch, capsys, *small, *grid)
    assert code == 0, err
    assert "nsd k=2" in out and (tmp_path / "r" / "results.md").is_file()
    several = ["--temperature", "1,0.5", "--top-p", "0.95", "--out", str(tmp_path / "t")]
    code, out, err = run_cli(monkeypatch, capsys, *small, "--methods", "sd", *several)
    assert code == 0, err
    assert "sampling at T = 1," in out and "sampling at T = 0.5," in out  # a summary per temperature
    md = (tmp_path / "t" / "results.md").read_text()
    assert "| T |" in md and "| 0.5 |" in md
    for args, message in [
        (["--methods", "sd,warp"], "unknown method 'warp'"),
        (["--set", "sd.theta=0.9"], "has no parameter theta"),
        (["--limit", "0"], "--limit must be"),
        (["--seeds", "x"], "--seeds expects"),
        (["--temperature", "1,hot"], "--temperature expects"),
        (["--temperature", "1,1"], "distinct"),
        (["--out", "/proc/forbidden/results"], "cannot write results"),
    ]:
        code, _, err = run_cli(monkeypatch, capsys, "bench", *args, *common)
        assert code == 2, (args, err)
        assert err.startswith("error: ") and message in err
        assert len(err.strip().splitlines()) == 1


# --- diagnostics (pure) -------------------------------------------------------------------------


def test_rank_entropy_and_merge():
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    assert [diagnostics.rank_of(p, t) for t in range(4)] == [0, 1, 1, 3]
    assert diagnostics.entropy(torch.tensor([0.5, 0.5])) == pytest.approx(0.6931, abs=1e-4)
    merged = diagnostics.merge_counters(
        {"n": 1, "xs": [1], "h": {"0": 1}}, {"n": 2, "xs": [2], "h": {"0": 1, "1": 1}}
    )
    assert merged == {"n": 3, "xs": [1, 2], "h": {"0": 2, "1": 1}}


def test_rejection_analysis_on_a_synthetic_cycle():
    # target p at 3 draft positions (+ bonus); draft tokens 0, 2, 3; strict accepts 1, relaxed accepts 2
    p = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.5, 0.1, 0.4, 0.0], [0.1, 0.1, 0.1, 0.7], [0.25] * 4])[None]
    q = torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])[None]
    proposal = Proposal(torch.tensor([[0, 2, 3]]), q, torch.tensor([[0.9, 1.0, 1.0]]))
    verdict = Verdict(torch.tensor([2]), torch.tensor([1]), exact_accepted=torch.tensor([1]))
    cycle = CycleRecord(
        position=3, proposal=proposal, skipped=0, target_probs=p, verdict=verdict, chunk=[0, 2, 1]
    )
    c = diagnostics.rejection_counters([cycle], theta=0.9)
    s = diagnostics.rejection_summary(c)
    assert s["strict_rejected"] == 1 and s["rejected_in_nucleus"] == 1.0 and s["rejected_in_top10"] == 1.0
    assert s["extra_accepted"] == 1 and s["extra_by_rank"]["1"] == 1.0
    assert s["extra_in_nucleus_core"] == 0.0  # rank 1 is outside the 0.5-nucleus {token 0}
    assert s["extra_entropy_draft"] == pytest.approx(0.0)
    g = diagnostics.gate_summary(diagnostics.gate_counters([cycle]))
    assert g["positions"] == 2 and g["match_rate"] == 0.5  # position 1 matches, position 2 does not


def test_nucleus_share_interval_clusters_rejections_by_prompt():
    from relaxspec.eval import intervals
    from relaxspec.eval.tables import _cell

    def rec(example: str, rejected: int, in_nucleus: int) -> dict:
        rej = {"strict_rejected": rejected, "rejected_in_nucleus": in_nucleus}
        return {"example": example, "diagnostics": {"rejections": rej}}

    # 40 prompts: half reject only in-nucleus drafts, half only outside it (10 rejections each), so the
    # rejections of one prompt agree and the share is known from far fewer than 400 independent draws
    records = [rec(f"p{i}", 10, 10 if i % 2 else 0) for i in range(40)]
    ci = diagnostics.nucleus_share_interval(records)
    flat = intervals.wilson(200, 400)
    assert ci["estimate"] == pytest.approx(0.5) and ci["clusters"] == 40 and ci["n"] == 400
    assert ci["low"] < flat.low and ci["high"] > flat.high  # clustered: wider than 400 independent ones
    assert ci["n_effective"] == pytest.approx(40)  # perfectly correlated within a prompt
    # rejections spread evenly over prompts are as informative as independent ones
    even = diagnostics.nucleus_share_interval([rec(f"p{i}", 10, 5) for i in range(40)])
    assert even["n_effective"] == pytest.approx(400) and even["low"] == pytest.approx(flat.low)
    assert diagnostics.nucleus_share_interval([rec("p0", 0, 0), {"example": "p1"}]) is None
    assert _cell(ci, "{:.1%}") == f"[{ci['low']:.1%}–{ci['high']:.1%}]"


def test_target_entropy_is_binned_at_every_emitted_position_and_at_the_strict_rejection():
    # K = 3 drafts; the strict rule rejects the second (at a uniform target, H = ln 4 ≈ 1.39 nats),
    # the relaxed rule accepts it and the third, so the bonus token at position 3 is emitted too
    sure, flat, mid = [0.99, 0.01, 0.0, 0.0], [0.25] * 4, [0.5, 0.5, 0.0, 0.0]  # H 0.056, 1.386, 0.693
    p = torch.tensor([sure, flat, mid, flat])[None]
    proposal = Proposal(torch.tensor([[0, 2, 1]]), None, torch.tensor([[1.0, 1.0, 1.0]]))
    verdict = Verdict(torch.tensor([3]), torch.tensor([0]), exact_accepted=torch.tensor([1]))
    cycle = CycleRecord(
        position=3, proposal=proposal, skipped=0, target_probs=p, verdict=verdict, chunk=[0, 2, 1]
    )
    c = diagnostics.rejection_counters([cycle], theta=0.95)
    assert c["entropy_emitted"] == {"0-0.1": 1, "0.1-0.5": 0, "0.5-1": 1, "1-2": 2, "2+": 0}  # 4 emitted
    assert c["entropy_rejected"] == {"0-0.1": 0, "0.1-0.5": 0, "0.5-1": 0, "1-2": 1, "2+": 0}
    s = diagnostics.rejection_summary(c)
    assert s["entropy_emitted_uncertain"] == 0.75 and s["entropy_rejected_uncertain"] == 1.0
    assert s["entropy_emitted_by_bin"]["1-2"] == 0.5
    old = {k: v for k, v in c.items() if not k.startswith("entropy_")}  # counters of an older run
    assert diagnostics.rejection_summary(old)["entropy_emitted_uncertain"] is None


def test_fingerprint_ignores_card_records_but_not_weights(tmp_path):
    from relaxspec.eval.results import model_fingerprint

    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "training.json").write_text('{"metrics": {}}')
    before = model_fingerprint(tmp_path)
    (tmp_path / "training.json").write_text('{"metrics": {"math_accuracy": 0.8}}')  # a card update
    (tmp_path / "README.md").write_text("# card")
    assert model_fingerprint(tmp_path) == before
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    assert model_fingerprint(tmp_path) != before


def test_each_prompt_of_a_cell_samples_with_its_own_seed():
    """A grid seed is spread into one sampler seed per prompt (one shared stream made
    AR's T = 1 pass@1 0.15 on 20 prompts at seed 0 and 0.62 on seeds 1-3): stable, distinct per
    prompt and per grid seed, and the same for every row (paired)."""
    from relaxspec.eval.bench import example_seed, run_cell

    ids = [f"math/{i}" for i in range(200)]
    seeds = {example_seed(0, i) for i in ids}
    assert len(seeds) == len(ids) and all(0 <= s < 2**63 for s in seeds)
    assert example_seed(0, ids[0]) == example_seed(0, ids[0]) != example_seed(1, ids[0])
    seen = []

    def runner(ex, seed, max_new_tokens):
        seen.append(seed)
        return {"tokens": [1], "text": "#### 3", "seconds": 0.1, "stats": {}}

    ex = math_examples(2)
    for method_runner in (runner, runner):  # two rows of one grid
        for e in ex:
            assert run_cell(method_runner, e, 7, 5.0)["error"] is None
    assert seen[:2] == seen[2:] == [example_seed(7, e.id) for e in ex] and seen[0] != seen[1]


def test_the_table_ends_in_a_plain_summary():
    """Under the table, per dataset and regime: the fastest row with its interval, and AR's quality."""
    from relaxspec.eval.rows import Row
    from relaxspec.eval.tables import plain_summary

    def row(method: str, label: str, speedup: float, low: float, high: float, quality: float) -> Row:
        return Row(
            key=label, method=method, label=label, family=method, peer=False, params={}, dataset="math",
            seed=0, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=8, prompts=20, speedup=speedup,
            speedup_ci={"low": low, "high": high}, quality=quality, quality_metric="exact_match",
        )  # fmt: skip

    rows = [row("ar", "ar", 1.0, 1.0, 1.0, 0.9), row("sd", "sd k=4", 1.6, 1.4, 1.8, 0.9),
            row("nsd", "nsd k=4", 1.7, 1.5, 1.9, 0.85)]  # fmt: skip
    lines = plain_summary(rows)
    assert lines[0].startswith("math, greedy, 20 prompts: fastest is nsd k=4 at 1.70× AR's speed [1.50–1.90]")
    assert "quality 0.850 exact_match" in lines[0] and "(AR: 0.900 exact_match)" in lines[0]
    assert plain_summary([rows[0]]) == []  # nothing beside AR: nothing to say


def test_our_cells_wait_out_vllms_idle_polling():
    from relaxspec.eval.bench import is_vllm_cell
    from relaxspec.integrations.vllm.runners import POLL_SECONDS, EnginePool

    slept: list[float] = []
    pool = EnginePool()
    pool.settle(sleep=slept.append)  # nothing ran in vLLM yet: no wait
    pool.last_run = time.monotonic()
    pool.settle(sleep=slept.append)  # ours right after vLLM: wait
    assert len(slept) == 1 and 0 < slept[0] <= POLL_SECONDS
    pool.last_run = time.monotonic() - 2 * POLL_SECONDS  # already idle
    pool.settle(sleep=slept.append)
    assert len(slept) == 1
    assert is_vllm_cell(Cell("vllm-ar", {}, "math", 0, {}))
    assert is_vllm_cell(Cell("nsd", {}, "math", 0, {"engine": "vllm"}))
    assert not is_vllm_cell(Cell("nsd", {}, "math", 0, {}))
