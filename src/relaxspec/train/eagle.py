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
The target's embedding and LM head are used frozen and never saved with the head.
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
from transformers import PreTrainedModel

from relaxspec.data.tokens import training_data
from relaxspec.engine.proposers.eagle import (
    EagleHead,
    causal_mask,
    check_fits,
    head_config,
    save_eagle,
    target_fingerprint,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.models import load_model
from relaxspec.train.ar import MIXTURE
from relaxspec.train.cards import write_card
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
# The objective's own settings (EAGLE §3.2 and §4: w_cls = 0.1, uniform noise of width 0.2).
OBJECTIVE: dict[str, float] = {"noise": 0.1, "cls_weight": 0.1}


def target_features(target: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The frozen target's final normed hidden states ``[B, T, H]`` of windows ``input_ids[B, T]``."""
    with torch.no_grad():
        return target.get_decoder()(input_ids=input_ids).last_hidden_state.float()


def head_outputs(
    head: EagleHead, target: PreTrainedModel, input_ids: torch.Tensor, features: torch.Tensor, noise: float
) -> torch.Tensor:
    """``f̂_1 .. f̂_{T−1}`` ``[B, T−1, H]`` from pairs ``(f_t + u_t, x_{t+1})``, t = 0 .. T−2."""
    B, T = input_ids.shape
    inputs = features[:, :-1]
    if noise > 0:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * noise
    with torch.no_grad():
        embeds = target.get_input_embeddings()(input_ids[:, 1:])
    positions = torch.arange(T - 1, device=input_ids.device).expand(B, T - 1)
    return head(inputs, embeds, positions, causal_mask(T - 1).to(input_ids.device))


def eagle_losses(
    head: EagleHead, target: PreTrainedModel, input_ids: torch.Tensor, noise: float
) -> dict[str, torch.Tensor]:
    """``reg`` (smooth L1 of features), ``cls`` (CE against the target's law), ``acc`` (head's top-1
    equals the target's, teacher-forced one step) on windows ``input_ids[B, T]``."""
    features = target_features(target, input_ids)
    predicted = head_outputs(head, target, input_ids, features, noise).float()
    wanted = features[:, 1:]
    lm_head = target.get_output_embeddings().weight.detach().float()
    log_q = F.log_softmax(F.linear(predicted, lm_head), dim=-1)
    with torch.no_grad():
        target_logits = F.linear(wanted, lm_head)
        p = F.softmax(target_logits, dim=-1)
    return {
        "reg": F.smooth_l1_loss(predicted, wanted),
        "cls": -(p * log_q).sum(-1).mean(),
        "acc": (log_q.argmax(-1) == target_logits.argmax(-1)).float().mean(),
    }


def eagle_loss(
    head: EagleHead, target: PreTrainedModel, batch: dict[str, torch.Tensor], noise: float, cls_weight: float
) -> torch.Tensor:
    """The training loss ``reg + cls_weight · cls`` (module doc)."""
    losses = eagle_losses(head, target, batch["input_ids"], noise)
    return losses["reg"] + cls_weight * losses["cls"]


@torch.no_grad()
def eagle_metrics(
    head: EagleHead, target: PreTrainedModel, windows: torch.Tensor, batch_size: int = 8
) -> dict[str, float]:
    """Held-out ``reg``, ``cls`` and ``acc@1`` (no noise) averaged over ``windows[n, T]``."""
    sums = {"reg": 0.0, "cls": 0.0, "acc": 0.0}
    for start in range(0, len(windows), batch_size):
        ids = windows[start : start + batch_size]
        losses = eagle_losses(head, target, ids, noise=0.0)
        for name in sums:
            sums[name] += losses[name].item() * len(ids)
    n = max(len(windows), 1)
    return {"eagle_reg": sums["reg"] / n, "eagle_cls": sums["cls"] / n, "eagle_acc@1": sums["acc"] / n}


def split_overrides(overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, float]]:
    """``--set`` items: (TrainConfig fields, objective settings ``noise``/``cls_weight``), validated."""
    rest, objective = dict(overrides or {}), dict(OBJECTIVE)
    for name in OBJECTIVE:
        if name in rest:
            value = rest.pop(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 10:
                raise RelaxSpecError(f"{name} must be a number in [0, 10], got {value!r}")
            objective[name] = float(value)
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
    "see `relaxspec.train.eagle`.",
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
    return write_card(model_dir, "eagle — EAGLE-style drafter head", summary, sections, metrics)


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
) -> tuple[EagleHead, TrainState]:
    """Train (or resume) an EAGLE head for the target at ``target_dir``; export when complete.

    ``overrides``: ``TrainConfig`` fields on :data:`DEFAULT_RECIPE`, plus ``noise`` and
    ``cls_weight`` (:data:`OBJECTIVE`). The export (:func:`_export`) happens only once all steps
    are done; an interrupted run resumes from its newest checkpoint in ``run_dir``.
    """
    loaded = load_model(target_dir)
    target, tokenizer = loaded.model, loaded.tokenizer
    train_overrides, objective = split_overrides(overrides)
    config, run = make_config(run_dir, DEFAULT_RECIPE, train_overrides), Path(run_dir)
    check_seq_len(config, loaded.context_length)
    target.requires_grad_(False)
    fingerprint = target_fingerprint(target)
    _check_run_target(run, fingerprint)

    weights = mixture or MIXTURE
    data, heldout = training_data(corpus_dir, tokenizer, weights, config.seq_len, heldout_windows=16)
    record: dict[str, Any] = {
        "kind": "eagle-head",
        "target_dir": str(target_dir),
        "target": fingerprint,
        "objective": objective,
        "mixture": weights,
        "command": command or shlex.join(["relaxspec", *sys.argv[1:]]),
    }
    write_run_record(run, record)

    torch.manual_seed(config.seed)
    head = EagleHead(head_config(target))
    started = time.perf_counter()
    head, state = train(
        head,
        config,
        batch_fn=window_batches(data, config),
        loss_fn=lambda m, batch: eagle_loss(m, target, batch, objective["noise"], objective["cls_weight"]),
        eval_fn=lambda m: eagle_metrics(m, target, heldout["math_eval"]),
        progress=progress,
    )
    head = extract_model_from_parallel(head, keep_fp32_wrapper=False).float().eval()
    if export_dir is not None and state.step >= config.steps:
        check_fits(fingerprint, target)  # the target was not changed under the run
        _export(
            head,
            target,
            state,
            config,
            {**record, "session_seconds": time.perf_counter() - started},
            export_dir,
        )
    return head, state


def _export(
    head: EagleHead,
    target: Any,
    state: TrainState,
    config: TrainConfig,
    record: dict[str, Any],
    export_dir: str | Path,
) -> None:
    """The head's weights and config, ``training.json`` (the run record and its history) and a card."""
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
    (Path(export_dir) / "training.json").write_text(json.dumps(record, indent=1))
    write_eagle_card(export_dir)
