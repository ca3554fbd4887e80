"""``relaxspec train diffusion``: the masked-diffusion drafter (docs/design.md §5; VS paper §3).

Objective (LLaDA / MDLM): for a block of γ tokens, draw ``t ~ U(ε, 1)``, mask each block token
with probability t, and minimise the cross-entropy on the masked positions weighted by ``1/t`` (an
upper bound on the block's negative log-likelihood); the context before the block stays clean.
Layout (block diffusion, vectorised): the model reads ``[clean x | noisy x]`` (position ids
``0..T-1`` twice) under :func:`relaxspec.engine.proposers.diffusion.attention_bias`: clean tokens
are causal, a noisy slot sees the clean tokens before its block and its whole block, exactly what
the drafter sees at inference, so one forward trains all T/γ blocks. With the drafter's logit
shift, a block's first token comes from the clean hidden state before it (the AR term,
``ar_weight``), token j ≥ 2 from noisy slot j − 1 (the diffusion term). Initialisation (``init``):
``target`` (embeddings, the first ``layers`` decoder layers, final norm and tied head of the
bundled target), ``draft`` (the whole bundled draft) or ``scratch``; adapting AR weights is what
published diffusion coders do. Models and their figures: docs/models.md.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from relaxspec.data.tokens import training_data
from relaxspec.engine.proposers.diffusion import (
    CFG_BLOCK,
    CFG_FORMAT,
    CFG_GAMMA,
    CFG_MASK,
    CFG_STEPS,
    FORMAT,
    NOT_A_BLOCK,
    attention_bias,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.models import bundled, check_same_tokenizer, load_model
from relaxspec.train.ar import MIXTURE, PRESETS, export_model, llama_config
from relaxspec.train.cards import fmt, table
from relaxspec.train.cards import write_card as write_model_card
from relaxspec.train.loop import TrainConfig, TrainState, check_seq_len, make_config, train, write_run_record
from relaxspec.train.tokenizer import load_tokenizer

INITS = ("target", "draft", "scratch")


@dataclass
class DiffusionRecipe:
    """What is specific to diffusion training (the loop's options live in :class:`TrainConfig`)."""

    gamma: int = 16  # training block length γ
    eps: float = 1e-3  # t ~ U(eps, 1)
    ar_weight: float = 1.0  # weight of the causal next-token term (first token of each block)
    init: str = "target"
    layers: int = 2  # decoder layers taken from the target (init="target")
    scratch_preset: str = "draft"  # shape for init="scratch"
    target: str | None = None  # the target for init="target" (default: the bundled one)
    draft: str | None = None  # the draft for init="draft" (default: the bundled one)
    mixture: dict[str, float] | None = None  # corpus source weights (default: train.ar.MIXTURE)

    def validate(self, seq_len: int) -> None:
        if not (isinstance(self.gamma, int) and self.gamma >= 1):
            raise RelaxSpecError(f"gamma must be an integer >= 1, got {self.gamma!r}")
        if seq_len % self.gamma or seq_len < 2 * self.gamma:
            raise RelaxSpecError(
                f"seq_len ({seq_len}) must be a multiple of gamma ({self.gamma}) holding at least two blocks"
            )
        if not 0 < self.eps < 1:
            raise RelaxSpecError(f"eps must be in (0, 1), got {self.eps!r}")
        if self.ar_weight < 0:
            raise RelaxSpecError(f"ar_weight must be >= 0, got {self.ar_weight!r}")
        if self.init not in INITS:
            raise RelaxSpecError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if not (isinstance(self.layers, int) and self.layers >= 1):
            raise RelaxSpecError(f"layers must be an integer >= 1, got {self.layers!r}")


# ---------------------------------------------------------------------------------------------
# Masking, layout, loss (pure functions)
# ---------------------------------------------------------------------------------------------


def mask_blocks(
    ids: torch.Tensor, gamma: int, mask_token_id: int, generator: torch.Generator, eps: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Noise a batch block by block (MDLM forward process).

    ids: LongTensor[B, T] clean windows (T a multiple of γ). Each block ``b`` of row r draws
    ``t ~ U(eps, 1)`` and masks each of its tokens independently with probability t.
    Returns ``noisy[B, T]`` (ids with masked tokens replaced by ``mask_token_id``),
    ``masked[B, T]`` bool and ``t[B, T]`` (the t of each token's block).
    """
    B, T = ids.shape
    n_blocks = T // gamma
    t_block = eps + (1 - eps) * torch.rand((B, n_blocks), generator=generator)
    t = t_block.repeat_interleave(gamma, dim=1)
    masked = torch.rand((B, T), generator=generator) < t
    return ids.masked_fill(masked, mask_token_id), masked, t


def training_layout(
    T: int, gamma: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids ``LongTensor[2T]`` and the additive mask ``[1, 1, 2T, 2T]`` of ``[clean | noisy]``."""
    pos = torch.arange(T)
    block = pos // gamma
    positions = torch.cat([pos, pos])
    block_ids = torch.cat([torch.full((T,), NOT_A_BLOCK), block])
    visible = torch.cat([pos, block * gamma - 1])  # noisy slots see clean tokens before their block
    return positions, attention_bias(positions, visible, block_ids, positions, block_ids, dtype)


def diffusion_targets(masked: torch.Tensor, gamma: int) -> torch.Tensor:
    """``BoolTensor[B, T−1]``: targets ``i = 1..T−1`` scored by the diffusion term.

    Target i is predicted from noisy slot i − 1, which must be in the same block (i mod γ ≠ 0);
    only masked targets count (an unmasked slot would show the answer).
    """
    T = masked.shape[1]
    same_block = (torch.arange(1, T) % gamma) != 0
    return masked[:, 1:] & same_block[None, :]


def masked_diffusion_ce(
    logits: torch.Tensor, targets: torch.Tensor, t: torch.Tensor, n_positions: int
) -> torch.Tensor:
    """MDLM/LLaDA loss ``Σ_masked CE / t`` divided by the number of block positions.

    logits: FloatTensor[N, V] at the N masked targets; targets: LongTensor[N]; t: FloatTensor[N];
    n_positions: all positions the estimator averages over (masked or not), so the estimate is
    unbiased for the per-token bound whatever the masking rate.
    """
    ce = F.cross_entropy(logits.float(), targets, reduction="none")
    return (ce / t).sum() / max(n_positions, 1)


def diffusion_loss_parts(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], gamma: int
) -> dict[str, torch.Tensor]:
    """Diffusion and AR terms of one batch (see the module docstring).

    batch: ``input_ids[B, T]`` (clean), ``noisy[B, T]``, ``masked[B, T]``, ``t[B, T]``.
    Returns ``{"diffusion", "ar", "masked_correct", "masked_count"}`` (scalars).
    """
    clean, noisy, masked, t = batch["input_ids"], batch["noisy"], batch["masked"].bool(), batch["t"]
    B, T = clean.shape
    positions, bias = training_layout(T, gamma)
    hidden = model.get_decoder()(
        input_ids=torch.cat([clean, noisy], dim=1),
        attention_mask=bias.to(clean.device),
        position_ids=positions.to(clean.device)[None].expand(B, -1),
    ).last_hidden_state  # [B, 2T, H]
    head = model.get_output_embeddings()
    ar_logits = head(hidden[:, : T - 1])
    ar = F.cross_entropy(ar_logits.float().flatten(0, 1), clean[:, 1:].flatten())
    select = diffusion_targets(masked, gamma)  # [B, T-1]
    diff_logits = head(hidden[:, T : 2 * T - 1][select])  # noisy slot i-1 predicts target i
    targets = clean[:, 1:][select]
    n_positions = B * int(((torch.arange(1, T) % gamma) != 0).sum())
    diffusion = masked_diffusion_ce(diff_logits, targets, t[:, 1:][select], n_positions)
    correct = (diff_logits.argmax(-1) == targets).sum()
    return {
        "diffusion": diffusion,
        "ar": ar,
        "masked_correct": correct.float(),
        "masked_count": torch.tensor(float(targets.numel())),
    }


def diffusion_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], gamma: int, ar_weight: float):
    """The training loss: diffusion term + ``ar_weight`` × AR term."""
    parts = diffusion_loss_parts(model, batch, gamma)
    return parts["diffusion"] + ar_weight * parts["ar"]


def make_batch(
    ids: torch.Tensor, gamma: int, mask_token_id: int, seed: int, step: int, micro: int, eps: float
) -> dict[str, torch.Tensor]:
    """A training batch whose noise is a pure function of ``(seed, step, micro)`` (resumable)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + micro)
    noisy, masked, t = mask_blocks(ids, gamma, mask_token_id, gen, eps)
    return {"input_ids": ids, "noisy": noisy, "masked": masked, "t": t}


@torch.no_grad()
def heldout_diffusion(
    model: torch.nn.Module,
    windows: dict[str, torch.Tensor],
    gamma: int,
    mask_token_id: int,
    eps: float = 1e-3,
    batch_size: int = 8,
) -> dict[str, float]:
    """Held-out diffusion loss, AR loss and masked-token accuracy (fixed noise), per source."""
    out = {}
    for name, ids in windows.items():
        sums = {"diffusion": 0.0, "ar": 0.0, "masked_correct": 0.0, "masked_count": 0.0}
        n_batches = 0
        for i in range(0, len(ids), batch_size):
            batch = make_batch(ids[i : i + batch_size], gamma, mask_token_id, 1234, i, 0, eps)
            batch = {k: v.to(model.device) for k, v in batch.items()}
            parts = diffusion_loss_parts(model, batch, gamma)
            for k in sums:
                sums[k] += float(parts[k])
            n_batches += 1
        out[f"{name}_diff_loss"] = sums["diffusion"] / max(n_batches, 1)
        out[f"{name}_ar_loss"] = sums["ar"] / max(n_batches, 1)
        out[f"{name}_masked_acc"] = sums["masked_correct"] / max(sums["masked_count"], 1)
    return out


# ---------------------------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------------------------


def truncated_copy(source: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """A Llama with the embeddings, first ``layers`` decoder layers, final norm and head of ``source``."""
    n_source = source.config.num_hidden_layers
    if layers > n_source:
        raise RelaxSpecError(f"cannot take {layers} layers from a model with {n_source}")
    config = LlamaConfig.from_dict({**source.config.to_dict(), "num_hidden_layers": layers})
    model = LlamaForCausalLM(config)
    state = {
        k: v
        for k, v in source.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RelaxSpecError(f"cannot copy weights: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.float()


def init_drafter(recipe: DiffusionRecipe, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """The drafter before training, from ``recipe.init`` (see the module docstring)."""
    if recipe.init == "scratch":
        if recipe.scratch_preset not in PRESETS:
            raise RelaxSpecError(f"unknown preset {recipe.scratch_preset!r}; choose from {sorted(PRESETS)}")
        model = LlamaForCausalLM(llama_config(PRESETS[recipe.scratch_preset], tokenizer))
    else:
        from_target = recipe.init == "target"
        given = recipe.target if from_target else recipe.draft
        path = Path(given or bundled(recipe.init))
        source = load_model(path)
        check_same_tokenizer(tokenizer, source.tokenizer, f"{recipe.init} model used as initialisation")
        model = truncated_copy(source.model, recipe.layers) if from_target else source.model.float()
    mark_drafter(model, recipe.gamma, tokenizer.mask_token_id)
    return model


def mark_drafter(model: torch.nn.Module, gamma: int, mask_token_id: int | None) -> None:
    """Write the drafter's identity into its config (saved in config.json)."""
    if mask_token_id is None:
        raise RelaxSpecError("the tokenizer has no mask token; the diffusion drafter needs <|mask|>")
    setattr(model.config, CFG_FORMAT, FORMAT)
    setattr(model.config, CFG_BLOCK, int(gamma))
    setattr(model.config, CFG_MASK, int(mask_token_id))


# ---------------------------------------------------------------------------------------------
# Training entry point and model card
# ---------------------------------------------------------------------------------------------

DEFAULT_TRAIN = {
    "steps": 1500,
    "batch_size": 16,
    "seq_len": 256,
    "lr": 6e-4,
    "warmup": 50,
    "eval_every": 250,
    "ckpt_every": 100,
}


def train_diffusion(
    recipe: DiffusionRecipe,
    corpus_dir: str | Path,
    tokenizer_dir: str | Path,
    run_dir: str | Path,
    export_dir: str | Path | None = None,
    overrides: dict | None = None,
    progress: bool = True,
    command: str | None = None,
    export_partial: bool = False,
) -> tuple[LlamaForCausalLM, TrainState]:
    """Train (or resume) the drafter; export it with a model card when the run is complete.

    ``export_partial``: also export when the run stopped early (``max_minutes``); the card records
    the steps actually done. Rerunning the same command resumes the run either way.
    """
    config = make_config(run_dir, DEFAULT_TRAIN, overrides)
    recipe.validate(config.seq_len)
    tokenizer = load_tokenizer(tokenizer_dir)
    model = init_drafter(recipe, tokenizer)
    check_seq_len(config, model.config.max_position_embeddings)
    weights = recipe.mixture or MIXTURE
    data, heldout = training_data(corpus_dir, tokenizer, weights, config.seq_len, heldout_windows=16)
    mask_id = int(tokenizer.mask_token_id)
    record = {
        "recipe": asdict(recipe),
        "mixture": weights,
        "command": command or shlex.join(["relaxspec", *sys.argv[1:]]),
        "architecture": _architecture(model),
    }
    write_run_record(run_dir, record)

    def batch_fn(step: int, micro: int) -> dict[str, torch.Tensor]:
        index = step * config.grad_accum + micro
        ids = data.batch(config.seed, index, config.batch_size, config.seq_len)
        return make_batch(ids, recipe.gamma, mask_id, config.seed, step, micro, recipe.eps)

    model, state = train(
        model,
        config,
        batch_fn=batch_fn,
        loss_fn=lambda m, b: diffusion_loss(m, b, recipe.gamma, recipe.ar_weight),
        eval_fn=lambda m: heldout_diffusion(m, heldout, recipe.gamma, mask_id, recipe.eps),
        progress=progress,
    )
    if export_dir is not None and (state.step >= config.steps or export_partial):
        mark_drafter(model, recipe.gamma, mask_id)
        export_model(model, tokenizer, export_dir, extra={**record, **_finished(model, config, state)})
        write_card(export_dir)
    return model, state


def _architecture(model: LlamaForCausalLM) -> dict[str, int]:
    c = model.config
    return {
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
    }


def _finished(model: LlamaForCausalLM, config: TrainConfig, state: TrainState) -> dict:
    """What the export's ``training.json`` adds about the run (complete or stopped early)."""
    return {
        "train_config": asdict(config),
        "steps_done": state.step,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_seen": state.tokens_seen,
        "wall_seconds": state.elapsed_seconds,
        "history": state.history,
    }


DIFFUSION_CARD_SUMMARY = (
    "Block-diffusion drafter for speculative diffusion decoding (docs/design.md §4-5): a Llama stack with a "
    "causal, cached context and one bidirectional block of γ `<|mask|>` slots; LLaDA/MDLM loss "
    "(t ~ U(ε,1) per block, CE on masked positions weighted 1/t) plus a next-token term for the first "
    "block token. Load with `relaxspec.engine.proposers.diffusion.load_diffusion`."
)


def _sweep_lines(sweep: dict | None) -> list[str]:
    if not sweep:
        return ["Not run yet: `relaxspec train diffusion-sweep` fills this table."]
    lines = [
        f"Prompts: {sweep.get('prompts', 'n/a')}; max_new_tokens {sweep.get('max_new_tokens')}; "
        f"AR throughput {fmt(sweep.get('ar_tokens_per_s'))} tok/s in the same run.",
        "",
        "| γ | S | τ | draft forwards/token | tok/s | speedup vs AR |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['gamma']} | {r['steps']} | {fmt(r['tau'])} | {fmt(r['draft_calls_per_token'])} | "
        f"{fmt(r['tokens_per_s'])} | {fmt(r['speedup'])} |"
        for r in sweep["rows"]
    ]
    chosen = sweep.get("chosen", {})
    return [
        *lines,
        "",
        f"Chosen: γ = {chosen.get('gamma')}, S = {chosen.get('steps')} ({sweep.get('criterion', '')}).",
    ]


def record_sweep(model_dir: str | Path, result: dict) -> None:
    """Store a (γ, S) sweep (:func:`relaxspec.eval.sdd_sweep.sweep_operating_points`) as the
    drafter's operating point: ``sweep.json``, the presets' defaults in its config.json, its card."""
    out = Path(model_dir)
    (out / "sweep.json").write_text(json.dumps(result, indent=1))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[CFG_GAMMA], cfg[CFG_STEPS] = result["chosen"]["gamma"], result["chosen"]["steps"]
    cfg_path.write_text(json.dumps(cfg, indent=2))
    write_card(out)


def write_card(model_dir: str | Path) -> Path:
    """(Re)write ``README.md`` from ``training.json`` and, if present, ``sweep.json`` (docs/design.md §5)."""
    out = Path(model_dir)
    training = json.loads((out / "training.json").read_text()) if (out / "training.json").is_file() else {}
    sweep = json.loads((out / "sweep.json").read_text()) if (out / "sweep.json").is_file() else None
    config = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
    recipe = training.get("recipe", {})
    init = recipe.get("init", "n/a") + (
        f" (first {recipe.get('layers')} layers)" if recipe.get("init") == "target" else ""
    )
    drafter = table(
        {
            "mask token id": config.get(CFG_MASK),
            "training block length γ": config.get(CFG_BLOCK),
            "initialisation": init,
            "t ~ U(ε, 1), ε": recipe.get("eps", "n/a"),
            "AR-term weight": recipe.get("ar_weight", "n/a"),
            "bundled operating point (γ, S)": (
                config.get(CFG_GAMMA, "not swept"),
                config.get(CFG_STEPS, "-"),
            ),
        }
    )
    sections = [("Drafter", drafter), ("Operating-point sweep (strict SDD, greedy)", _sweep_lines(sweep))]
    return write_model_card(out, "diffusion — masked-diffusion drafter", DIFFUSION_CARD_SUMMARY, sections)
