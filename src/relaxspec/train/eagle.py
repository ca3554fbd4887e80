"""``relaxspec train eagle``: an EAGLE-style head for a target, trained on its own hidden states.

The head (:class:`~relaxspec.engine.proposers.eagle.EagleHead`: one Llama decoder layer over
``fc([e(x_{t+1}) ; f_t])``) learns to extrapolate the target's last hidden state (EAGLE §3.2).
For a window ``x_0 .. x_{T−1}`` the frozen target gives ``f_0 .. f_{T−1}`` (final normed hidden
states) in one forward; pair t = ``(f_t + u_t, x_{t+1})``, ``t = 0 .. T−2``, is fed at position t
and its output ``f̂_{t+1}`` is trained with

    L = SmoothL1(f̂_{t+1}, f_{t+1}) + w_cls · CE(p_{t+1}, softmax(LMHead(f̂_{t+1})))

where ``p_{t+1} = softmax(LMHead(f_{t+1}))`` is the target's own law of ``x_{t+2}`` (soft labels,
as the paper) and ``u_t ~ U(−noise, noise)`` is the data-noise trick: at decoding the head reads
its own, inexact, predicted features after the first step, so it is trained on perturbed ones.

``unroll = D > 1`` adds EAGLE-3's training-time test (EAGLE-3 §3.3): step j = 2 .. D feeds pair
``(f̂_{t+j−1}, x_{t+j})`` — the head's own prediction of step j − 1 — at position t + j − 1, seeing
what a chain's j-th draft sees at decoding: the real pairs up to t and its own steps 2 .. j at that
chain (:func:`unrolled_mask`); the loss is the mean over the D steps. The target's embedding and LM
head are used frozen and never saved with the head.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.utils import extract_model_from_parallel
from transformers import DynamicCache, PreTrainedModel

from relaxspec.data.tokens import training_data
from relaxspec.engine.proposers.draft_vocab import VOCAB_FILE, load_ranking, save_ranking
from relaxspec.engine.proposers.eagle import (
    EagleHead,
    causal_mask,
    check_fits,
    head_config,
    load_eagle,
    save_eagle,
    target_fingerprint,
)
from relaxspec.errors import RelaxSpecError, check_int, check_real
from relaxspec.models import load_model
from relaxspec.train.ar import MIXTURE
from relaxspec.train.cards import write_card
from relaxspec.train.draft_vocab import eos_first, recorded_mixture, token_ranking
from relaxspec.train.loop import (
    TrainConfig,
    TrainState,
    check_seq_len,
    make_config,
    train,
    window_batches,
    write_run_record,
)

# TrainConfig defaults: the head is ~2M parameters on the bundled target, but every step runs the
# frozen target over the batch too, which dominates a step; fp32 because CPU bf16 autocast is
# slower than fp32 for these shapes (docs/models.md); --max-minutes caps a run (resumable).
DEFAULT_RECIPE: dict[str, Any] = {
    "mixed_precision": "no",
    "steps": 600,
    "batch_size": 8,
    "seq_len": 256,
    "lr": 1e-3,
    "min_lr_ratio": 0.1,
    "warmup": 30,
    "weight_decay": 0.0,
    "eval_every": 100,
    "ckpt_every": 25,
}
# The objective's own settings (EAGLE §3.2 and §4: w_cls = 0.1, uniform noise of width 0.2; unroll:
# the training-time test's depth, 1 = EAGLE-1's single teacher-forced step).
OBJECTIVE: dict[str, float] = {"noise": 0.1, "cls_weight": 0.1, "unroll": 1}
MAX_UNROLL = 8
EVAL_UNROLL = 3  # held-out accuracy is reported for the first three chain steps, whatever the unroll


def target_features(target: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The frozen target's final normed hidden states ``[B, T, H]`` of windows ``input_ids[B, T]``."""
    with torch.no_grad():
        return target.get_decoder()(input_ids=input_ids).last_hidden_state.float()


def unrolled_mask(T: int, j: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive ``[1, 1, T−j, Σ_{i≤j} (T−i)]`` for unroll step j over windows of T tokens.

    The cache holds steps 1 .. j − 1 (step i: ``T − i`` pairs, element t at position t + i − 1)
    then step j's own pairs. Element t of step j sees step 1's elements 0 .. t (real features: the
    committed prefix) and element t of each step 2 .. j (the same chain's earlier drafts)."""
    n = T - j
    t = torch.arange(n)[:, None]
    parts = [torch.arange(T - 1)[None, :] <= t]
    parts += [torch.arange(T - i)[None, :] == t for i in range(2, j + 1)]
    allowed = torch.cat(parts, dim=1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def head_outputs(
    head: EagleHead,
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    features: torch.Tensor,
    noise: float,
    unroll: int = 1,
) -> list[torch.Tensor]:
    """Step j's predictions ``f̂_{t+j}`` ``[B, T−j, H]`` for j = 1 .. ``unroll`` (module doc).

    Step 1 reads pairs ``(f_t + u_t, x_{t+1})``, t = 0 .. T−2; step j > 1 reads step j − 1's
    output with tokens ``x_{t+j}`` at positions t + j − 1, through one cache of all steps."""
    B, T = input_ids.shape
    inputs = features[:, :-1]
    if noise > 0:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * noise
    embed = target.get_input_embeddings()
    cache = DynamicCache(config=head.config) if unroll > 1 else None
    outputs: list[torch.Tensor] = []
    for j in range(1, unroll + 1):
        n = T - j
        with torch.no_grad():
            embeds = embed(input_ids[:, j:])
        positions = torch.arange(j - 1, j - 1 + n, device=input_ids.device).expand(B, n)
        mask = causal_mask(n) if j == 1 else unrolled_mask(T, j)
        outputs.append(head(inputs, embeds, positions, mask.to(input_ids.device), cache))
        inputs = outputs[-1][:, :-1]
    return outputs


def eagle_losses(
    head: EagleHead,
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    noise: float,
    unroll: int = 1,
    features: torch.Tensor | None = None,
    inputs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per unroll step j: ``reg_j`` (smooth L1 of features), ``cls_j`` (CE against the target's
    law), ``acc_j`` (head's top-1 equals the target's; teacher-forced tokens, the head's own
    features after step 1); ``reg`` and ``cls`` their means over the steps; windows ``input_ids[B, T]``.

    ``features``: the target's final features ``[B, T, H]`` if already computed; ``inputs``: what
    step 1 reads in their place (default: the features themselves; scripts/eagle_fusion_probe.py
    gives it fused layers), while the objective stays the final features."""
    features = target_features(target, input_ids) if features is None else features
    lm_head = target.get_output_embeddings().weight.detach().float()
    losses: dict[str, torch.Tensor] = {}
    read = features if inputs is None else inputs
    for j, predicted in enumerate(head_outputs(head, target, input_ids, read, noise, unroll), 1):
        wanted = features[:, j:]
        log_q = F.log_softmax(F.linear(predicted.float(), lm_head), dim=-1)
        with torch.no_grad():
            target_logits = F.linear(wanted, lm_head)
            p = F.softmax(target_logits, dim=-1)
        losses[f"reg_{j}"] = F.smooth_l1_loss(predicted.float(), wanted)
        losses[f"cls_{j}"] = -(p * log_q).sum(-1).mean()
        losses[f"acc_{j}"] = (log_q.argmax(-1) == target_logits.argmax(-1)).float().mean()
    for name in ("reg", "cls"):
        losses[name] = torch.stack([losses[f"{name}_{j}"] for j in range(1, unroll + 1)]).mean()
    return losses


def eagle_loss(
    head: EagleHead,
    target: PreTrainedModel,
    batch: dict[str, torch.Tensor],
    objective: dict[str, float],
) -> torch.Tensor:
    """The training loss ``reg + cls_weight · cls`` (module doc) under ``objective`` (:data:`OBJECTIVE`)."""
    losses = eagle_losses(head, target, batch["input_ids"], objective["noise"], int(objective["unroll"]))
    return losses["reg"] + objective["cls_weight"] * losses["cls"]


@torch.no_grad()
def eagle_metrics(
    head: EagleHead, target: PreTrainedModel, windows: torch.Tensor, batch_size: int = 8
) -> dict[str, float]:
    """Held-out ``reg``, ``cls`` (step 1), ``acc@1`` and the chain's steps 2 .. 3 accuracy
    (:data:`EVAL_UNROLL`, no noise) averaged over ``windows[n, T]``."""
    sums: dict[str, float] = {}
    for start in range(0, len(windows), batch_size):
        ids = windows[start : start + batch_size]
        depth = min(EVAL_UNROLL, ids.shape[1] - 1)  # a window of T tokens holds T − 1 chain steps
        chain = eagle_losses(head, target, ids, noise=0.0, unroll=depth)  # step 1 is EAGLE-1's
        values = {"eagle_reg": chain["reg_1"], "eagle_cls": chain["cls_1"], "eagle_acc@1": chain["acc_1"]}
        values |= {f"eagle_step{j}_acc": chain[f"acc_{j}"] for j in range(2, depth + 1)}
        for name, value in values.items():
            sums[name] = sums.get(name, 0.0) + value.item() * len(ids)
    n = max(len(windows), 1)
    return {name: total / n for name, total in sums.items()}


CODE_EVAL_SETS = ("codevar_combos_eval", "synthcode_eval", "code_eval")  # the first one mixed in


def heldout_metrics(
    head: EagleHead, target: PreTrainedModel, heldout: dict[str, torch.Tensor]
) -> dict[str, float]:
    """:func:`eagle_metrics` on the held-out math windows, and as ``code_*`` on the first code set
    of :data:`CODE_EVAL_SETS` the run's mixture tracks (code and math drafts differ in accuracy)."""
    code = next(name for name in CODE_EVAL_SETS if name in heldout)
    metrics = eagle_metrics(head, target, heldout["math_eval"])
    return metrics | {f"code_{k}": v for k, v in eagle_metrics(head, target, heldout[code]).items()}


def split_overrides(overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, float]]:
    """``--set`` items: (TrainConfig fields, objective settings :data:`OBJECTIVE`), validated."""
    rest, objective = dict(overrides or {}), dict(OBJECTIVE)
    for name in OBJECTIVE:
        if name in rest:
            value = rest.pop(name)
            if name == "unroll":
                objective[name] = check_int(name, value, 1, MAX_UNROLL)
            else:
                objective[name] = float(check_real(name, value, 0, 10))
    return rest, objective


EAGLE_CARD_SUMMARY = (
    "An EAGLE-1 drafter head (EAGLE §3): `fc([embedding of the next token ; target hidden state])` "
    "(no bias), then one Llama decoder layer without its input norm, predicts the target's next hidden "
    "state; the target's own LM head turns it into draft probabilities. It reuses the target's embedding "
    "and LM head, which are not stored here: `config.json` names the target it fits (hidden size, "
    "vocabulary, hashes of its embedding and LM head), and any other target is refused. Use it on every "
    "command that takes `--draft` (`relaxspec generate --method sd --draft DIR`), or as the `eagle` role "
    "(`--set drafter=eagle`). The directory is also vLLM's EAGLE-1 checkpoint: with `--engine vllm` it "
    "runs on vLLM's `eagle` proposer under relaxspec's rules."
)
EAGLE_CARD_OBJECTIVE = [
    "`SmoothL1(f̂, f) + w_cls · CE(p_target, softmax(LMHead(f̂)))` on the frozen target's final hidden "
    "states over the corpus mixture, with uniform noise on the input features (the data-noise trick); "
    "with `unroll` > 1, averaged over that many chain steps, each fed the head's own predicted features "
    "(EAGLE-3's training-time test); see `relaxspec.train.eagle`.",
]


def write_eagle_card(model_dir: str | Path, metrics: dict[str, Any] | None = None) -> Path:
    """(Re)write ``README.md`` of an EAGLE head export from its ``training.json``."""
    model_dir = Path(model_dir)
    record = json.loads((model_dir / "training.json").read_text())
    summary = EAGLE_CARD_SUMMARY
    if record.get("complete") is False:
        summary += (
            f"\n\n**Partially trained**: exported at step {record.get('steps_done')} of "
            f"{record.get('train_config', {}).get('steps')}; rerun the command to finish."
        )
    sections = [
        ("Objective", [*EAGLE_CARD_OBJECTIVE, f"Settings: `{json.dumps(record.get('objective', {}))}`."]),
        ("Target", [f"`{record.get('target_dir')}`: `{json.dumps(record.get('target', {}))}`"]),
    ]
    if record.get("init"):
        sections.append(("Initialised from", [f"`{record['init']}` (fine-tuned from that head's weights)"]))
    ranked = load_ranking(model_dir, int(record.get("target", {}).get("vocab_size", 0)))
    if ranked is not None:
        size = f"its {ranked[1]} most frequent tokens" if ranked[1] else "the full vocabulary (default 0)"
        sections.append(("Draft vocabulary", [
            f"`{VOCAB_FILE}` ranks every token by training-data frequency (EAGLE-3's draft vocabulary); "
            f"the head drafts over {size}; `--set eagle_vocab=n` picks another size (0: all tokens); "
            "`relaxspec train eagle-vocab` rewrites it.",
        ]))  # fmt: skip
    return write_card(model_dir, "eagle — EAGLE-style drafter head", summary, sections, metrics)


def _initial_head(init: str | Path, target: PreTrainedModel) -> EagleHead:
    """A trained head to fine-tune, refused unless it was trained for this target."""
    loaded = load_eagle(init)
    check_fits(loaded.target, target, where=f"the --init head {init}")
    return loaded.head.train()


def _check_run_target(run_dir: Path, fingerprint: dict[str, Any]) -> None:
    """A run resumed with another target would mix two heads' training: refuse it."""
    path = run_dir / "run.json"
    if path.is_file():
        recorded = json.loads(path.read_text()).get("target")
        if recorded is not None and recorded != fingerprint:
            raise RelaxSpecError(
                f"{run_dir} holds a run for another target ({recorded}); use a new --run-dir"
            )


def train_eagle(
    target_dir: str | Path,
    corpus_dir: str | Path,
    run_dir: str | Path,
    export_dir: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    command: str | None = None,
    mixture: dict[str, float] | None = None,
    init: str | Path | None = None,
) -> tuple[EagleHead, TrainState]:
    """Train (or resume) an EAGLE head for the target at ``target_dir``; export when complete.

    ``overrides``: ``TrainConfig`` fields on :data:`DEFAULT_RECIPE`, the objective's settings
    (:data:`OBJECTIVE`), and ``draft_vocab`` (the default size of the export's draft vocabulary,
    train/draft_vocab.py; 0, the default: the full vocabulary; the ranking is written either way).
    ``mixture``: the corpus sources to read; default the mixture the target was last trained on
    (its ``training.json``; a head drafts well where its features were learnt), else the
    pre-training mixture. ``init``: a head directory for this target to start from (fine-tuning,
    e.g. with a deeper unroll); a resumed checkpoint takes precedence. The export
    (:func:`_export`) happens only once all steps are done; an interrupted run resumes from its
    newest checkpoint in ``run_dir``.
    """
    loaded = load_model(target_dir)
    target, tokenizer = loaded.model, loaded.tokenizer
    vocab_size, overrides = int(target.get_output_embeddings().weight.shape[0]), dict(overrides or {})
    draft_vocab = check_int("draft_vocab", overrides.pop("draft_vocab", 0), 0, vocab_size)
    train_overrides, objective = split_overrides(overrides)
    config, run = make_config(run_dir, DEFAULT_RECIPE, train_overrides), Path(run_dir)
    check_seq_len(config, loaded.context_length)
    if objective["unroll"] >= config.seq_len:
        raise RelaxSpecError(f"unroll must be below seq_len ({config.seq_len}), got {objective['unroll']}")
    target.requires_grad_(False)
    fingerprint = target_fingerprint(target)
    _check_run_target(run, fingerprint)

    weights = mixture or recorded_mixture(target_dir) or MIXTURE  # where the target was last taught
    data, heldout = training_data(corpus_dir, tokenizer, weights, config.seq_len, heldout_windows=16)
    settings = {"objective": objective, "mixture": weights, "draft_vocab": draft_vocab}
    record = _run_record(target_dir, fingerprint, settings, init, command)
    write_run_record(run, record)

    torch.manual_seed(config.seed)
    head = EagleHead(head_config(target)) if init is None else _initial_head(init, target)
    started = time.perf_counter()
    head, state = train(
        head,
        config,
        batch_fn=window_batches(data, config),
        loss_fn=lambda m, batch: eagle_loss(m, target, batch, objective),
        eval_fn=lambda m: heldout_metrics(m, target, heldout),
        progress=progress,
    )
    head = extract_model_from_parallel(head, keep_fp32_wrapper=False).float().eval()
    if export_dir is not None and state.step >= config.steps:
        check_fits(fingerprint, target)  # the target was not changed under the run
        record["session_seconds"] = time.perf_counter() - started
        ranking = token_ranking(data, vocab_size, first=eos_first(tokenizer))
        _export(head, target, state, config, record, export_dir, (ranking, draft_vocab))
    return head, state


def _run_record(
    target_dir: str | Path,
    fingerprint: dict[str, Any],
    settings: dict[str, Any],
    init: str | Path | None,
    command: str | None,
) -> dict[str, Any]:
    """What ``run.json`` and the export's ``training.json`` record of a run before it trains."""
    return {
        "kind": "eagle-head",
        "target_dir": str(target_dir),
        "target": fingerprint,
        **settings,
        "init": None if init is None else str(init),
        "command": command or shlex.join(["relaxspec", *sys.argv[1:]]),
    }


def _export(
    head: EagleHead,
    target: Any,
    state: TrainState,
    config: TrainConfig,
    record: dict[str, Any],
    export_dir: str | Path,
    vocab: tuple[torch.Tensor, int],
) -> None:
    """The head's weights and config, its draft vocabulary ``(ranking, default size)``,
    ``training.json`` (the run record and its history) and a card."""
    record.update(
        train_config=asdict(config),
        parameters=sum(p.numel() for p in head.parameters()),
        steps_done=state.step,
        complete=True,
        tokens_seen=state.tokens_seen,
        wall_seconds=state.elapsed_seconds,
        history=state.history,
    )
    save_eagle(head, target, export_dir)
    save_ranking(export_dir, *vocab)
    (Path(export_dir) / "training.json").write_text(json.dumps(record, indent=1))
    write_eagle_card(export_dir)
