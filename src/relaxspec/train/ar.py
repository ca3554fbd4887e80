"""``relaxspec train ar``: Llama-style causal LMs (the bundled ``target`` and ``draft``).

A model preset is a ``LlamaConfig`` shape plus a training recipe. Training samples packed windows
from the corpus mixture (:class:`~relaxspec.data.tokens.TokenMixture`), evaluates the per-token
loss on the held-out code modules and math problems, and exports the final weights in bf16
safetensors with the tokenizer, loadable by ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from relaxspec.data.tokens import training_data
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.evaluate import heldout_losses
from relaxspec.models import load_model
from relaxspec.train.cards import write_card
from relaxspec.train.grow import grow_state_dict
from relaxspec.train.loop import (
    TrainConfig,
    TrainState,
    check_seq_len,
    finished_run_record,
    make_config,
    train,
    window_batches,
    write_run_record,
)
from relaxspec.train.tokenizer import load_tokenizer


@dataclass
class ModelPreset:
    """Shape of a Llama-style model and the recipe used to train it."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    max_position_embeddings: int = 1024
    train: dict = field(default_factory=dict)  # TrainConfig overrides


PRESETS: dict[str, ModelPreset] = {
    # ~19M parameters; 10 layers deep so that one forward costs >= 8 draft forwards on a CPU.
    "target": ModelPreset(
        384, 10, 1024, 6, train={"steps": 2000, "batch_size": 24, "lr": 1e-3, "warmup": 150}
    ),
    # ~26M parameters: the target grown to 14 layers (``--init`` from a 10-layer target, train/grow.py)
    # for more capacity at the same width, when the 10-layer one plateaus on held-out math.
    "target-deep": ModelPreset(
        384, 14, 1024, 6, train={"steps": 2000, "batch_size": 24, "lr": 2e-4, "warmup": 50}
    ),
    # ~1.8M parameters, one layer, 256 wide: the cheap draft and ProVe's small verifier. On a CPU a
    # forward this small is bound by overhead and by the bytes of weights read (mostly the 4096-row
    # tied head), so depth and width both set its cost: about 1/10 of the target's per token.
    "draft": ModelPreset(256, 1, 688, 4, train={"steps": 750, "batch_size": 24, "lr": 2e-3, "warmup": 100}),
    # The earlier, wider one-layer draft (2.6M): better alone, no better after distillation, slower.
    "draft-320": ModelPreset(
        320, 1, 864, 5, train={"steps": 1000, "batch_size": 24, "lr": 2e-3, "warmup": 100}
    ),
    # For tests: builds and trains in seconds.
    "tiny": ModelPreset(
        64,
        2,
        128,
        2,
        max_position_embeddings=256,
        train={"steps": 20, "batch_size": 4, "seq_len": 64, "lr": 3e-3, "warmup": 2},
    ),
}

# Share of training windows drawn from each source (by windows, hence by tokens). Math dominates
# because task accuracy is what the evaluation measures; code keeps the models general enough
# for code prompts (HumanEval) and gives a held-out loss.
MIXTURE = {"math": 0.7, "code": 0.3}


def llama_config(preset: ModelPreset, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The ``LlamaConfig`` of a preset on a tokenizer (vocabulary and special ids from it)."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_attention_heads,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def causal_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over a batch of windows ``input_ids[B, T]``."""
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


@torch.no_grad()
def export_model(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, extra: dict | None = None
) -> Path:
    """Save ``model`` in bf16 safetensors with ``tokenizer`` (and a ``training.json`` record)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if extra is not None:
        (out / "training.json").write_text(json.dumps(extra, indent=1))
        write_model_card(out)
    return out


AR_CARD_SUMMARY = {
    "target": (
        "The bundled target: a Llama-style causal LM trained from scratch on the project's offline "
        "corpus (synthetic grade-school math and Python standard-library source, docs/design.md §5). Every "
        "method verifies against it by default."
    ),
    "draft": (
        "The bundled draft: a one-layer Llama-style causal LM on the same tokenizer and corpus, about "
        "a tenth of the target's per-token cost. `sd`, `nsd` and the other draft-model methods "
        "propose with it; ProVe uses it as the small verifier."
    ),
}


def write_model_card(model_dir: str | Path, metrics: dict | None = None) -> Path:
    """(Re)write the ``README.md`` of an AR export from its ``training.json``, merging ``metrics``."""

    record_path = Path(model_dir) / "training.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    preset = record.get("preset", "model")
    summary = AR_CARD_SUMMARY.get(preset, "A Llama-style causal LM trained with `relaxspec train ar`.")
    if record.get("notes"):
        summary += "\n\n" + record["notes"]
    if record.get("complete") is False:
        summary += (
            f"\n\n**Partially trained**: exported from step {record.get('checkpoint_step')} of "
            f"{record.get('train_config', {}).get('steps')}; rerun the command to finish."
        )
    return write_card(model_dir, f"{preset} — Llama-style causal LM", summary, metrics=metrics)


def export_checkpoint(
    run_dir: str | Path, preset_name: str, tokenizer_dir: str | Path, out_dir: str | Path
) -> Path:
    """Export the newest checkpoint of a run (possibly unfinished) as a bf16 model directory.

    The ``training.json`` record says which step it is, so a partially trained export is never
    mistaken for a finished one.
    """
    from safetensors.torch import load_file

    from relaxspec.train.loop import latest_checkpoint

    if preset_name not in PRESETS:
        raise RelaxSpecError(f"unknown model config {preset_name!r}; choose from {sorted(PRESETS)}")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise RelaxSpecError(f"no checkpoint in {run_dir}")
    tokenizer = load_tokenizer(tokenizer_dir)
    model = LlamaForCausalLM(llama_config(PRESETS[preset_name], tokenizer))
    try:
        weights = load_file(str(ckpt / "model.safetensors"))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:  # the tied head is not stored
            raise ValueError(f"missing {missing}, unexpected {unexpected}")
    except Exception as err:
        raise RelaxSpecError(f"corrupt checkpoint {ckpt}: {err}") from None
    model.tie_weights()
    state = TrainState(**json.loads((ckpt / "trainer_state.json").read_text()))
    run = (
        json.loads((Path(run_dir) / "run.json").read_text()) if (Path(run_dir) / "run.json").is_file() else {}
    )
    config = TrainConfig(**json.loads((ckpt / "train_config.json").read_text()))
    return export_model(model, tokenizer, out_dir, extra={**run, **finished_run_record(model, config, state)})


def _load_initial_weights(model: LlamaForCausalLM, init: str | Path) -> None:
    """Copy ``init``'s weights into ``model``; a shallower source of the same width is grown."""
    source = load_model(init).model
    mine, theirs = model.state_dict(), source.state_dict()
    n_mine, n_theirs = model.config.num_hidden_layers, source.config.num_hidden_layers
    if n_theirs < n_mine:
        theirs = grow_state_dict(theirs, n_theirs, n_mine)
    shapes = {name: tuple(t.shape) for name, t in mine.items()}
    if {name: tuple(t.shape) for name, t in theirs.items() if name in shapes} != shapes:
        raise RelaxSpecError(f"{init} does not match this preset's architecture and vocabulary; cannot init")
    model.load_state_dict({name: theirs[name].float() for name in mine})


def _preset(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise RelaxSpecError(f"unknown model config {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]


def train_ar(
    preset_name: str,
    corpus_dir: str | Path,
    tokenizer_dir: str | Path,
    run_dir: str | Path,
    export_dir: str | Path | None = None,
    overrides: dict | None = None,
    progress: bool = True,
    command: str | None = None,
    mixture: dict[str, float] | None = None,
    init: str | Path | None = None,
) -> tuple[LlamaForCausalLM, TrainState]:
    """Train (or resume) a preset; export it to ``export_dir`` when the run is complete.

    ``mixture`` overrides the sources' sampling weights (default :data:`MIXTURE`), e.g. more code
    for a drafter meant for code prompts; resuming with other weights continues from the
    checkpoint on the new mixture. ``init``: a model directory of the same preset and tokenizer
    whose weights the run starts from (fine-tuning; a checkpoint in ``run_dir`` still wins), or of
    the same width and fewer layers, grown to the preset's depth (:mod:`relaxspec.train.grow`).
    """
    preset = _preset(preset_name)
    tokenizer = load_tokenizer(tokenizer_dir)
    config = make_config(run_dir, preset.train, overrides)
    check_seq_len(config, preset.max_position_embeddings)
    weights = dict(mixture or MIXTURE)
    mixture_data, heldout = training_data(corpus_dir, tokenizer, weights, config.seq_len, heldout_windows=32)
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(llama_config(preset, tokenizer))
    if init is not None:
        _load_initial_weights(model, init)
    record = {
        "command": command or f"relaxspec train ar --config {preset_name}",
        "preset": preset_name,
        "model": asdict(preset),
        "mixture": weights,
        "init": str(init) if init is not None else None,
        "stream_tokens": {k: len(v) for k, v in mixture_data.streams.items()},
    }
    write_run_record(run_dir, record)

    model, state = train(
        model,
        config,
        batch_fn=window_batches(mixture_data, config),
        loss_fn=causal_lm_loss,
        eval_fn=lambda m: heldout_losses(m, heldout),
        progress=progress,
    )
    if export_dir is not None and state.step >= config.steps:
        export_model(
            model, tokenizer, export_dir, extra={**record, **finished_run_record(model, config, state)}
        )
    return model, state
