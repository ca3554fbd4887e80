"""Loading Hugging Face causal LMs and checking that a proposer and a verifier fit together."""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from relaxspec.errors import RelaxSpecError

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_DIR = REPO_ROOT / "models"


def bundled(name: str) -> Path:
    """Path of a bundled model (``target``, ``draft``, ``block``, ``diffusion``, …)."""
    return BUNDLED_DIR / name


def model_dir(
    role: str, given: str | Path | None = None, needed_by: str = "", required: bool = True
) -> Path | None:
    """Where the ``role`` model lives: the ``given`` directory, else the bundled ``models/<role>``.

    The one resolver behind the CLI, the method presets, the benchmark and the server. A missing
    required model is one clear error naming the flag (``needed_by`` says who needs it); a missing
    optional one is None. A given directory is returned as is: its loader reports what is wrong.
    """
    if given is not None:
        return Path(given)
    path = bundled(role)
    if path.exists():
        return path
    if not required:
        return None
    who = f"{needed_by} needs a {role} model" if needed_by else f"no {role} model given"
    raise RelaxSpecError(f"{who}: pass --{role} DIR (no bundled model at {path})")


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    path: Path

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer from a local directory, offline.

    Weights are cast to ``dtype`` (float32 by default: what training and transformers' forward
    use). What the engines' decoding forwards run on is chosen separately, per role, by
    :func:`relaxspec.methods.load_role` (``--kernels``; :mod:`relaxspec.engine.packed`).
    """
    p = Path(path)
    if not p.is_dir():
        raise RelaxSpecError(f"model directory not found: {p}")
    if not (p / "config.json").is_file():
        raise RelaxSpecError(f"{p} is not a Hugging Face model directory (no config.json)")
    hf_logging.disable_progress_bar()  # no "Loading weights" bars on the CLI's stderr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(p, dtype=dtype, local_files_only=True)
    except Exception as err:
        raise RelaxSpecError(f"cannot load model from {p}: {type(err).__name__}: {err}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as err:
        raise RelaxSpecError(f"cannot load the tokenizer of {p}: {type(err).__name__}: {err}") from None
    model.to(device).eval()
    return LoadedModel(model, tokenizer, p)


def check_compatible(verifier: PreTrainedModel, proposer: PreTrainedModel, what: str = "draft") -> None:
    """Proposer and verifier must index the same vocabulary (docs/design.md §4)."""
    v_vocab = verifier.get_output_embeddings().weight.shape[0]
    p_vocab = proposer.get_output_embeddings().weight.shape[0]
    if v_vocab != p_vocab:
        raise RelaxSpecError(
            f"vocabulary mismatch: the {what} model has {p_vocab} output tokens, the verifier has "
            f"{v_vocab}; speculative decoding needs both to share one tokenizer"
        )


_SAME_VOCABULARY: dict[tuple[int, int], tuple[weakref.ref, weakref.ref]] = {}


def check_same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase, what: str = "draft") -> None:
    """Same vocabulary mapping (token string -> id), not just the same size.

    A pair found equal is remembered (while both tokenizers live): a server builds an engine per
    request, and comparing two vocabularies costs about a millisecond."""
    known = _SAME_VOCABULARY.get((id(a), id(b)))
    if known is not None and known[0]() is a and known[1]() is b:
        return
    if a is not b and a.get_vocab() != b.get_vocab():
        raise RelaxSpecError(
            f"vocabulary mismatch: the {what} tokenizer maps tokens to different ids than the "
            "verifier's; both models must share one tokenizer"
        )
    if len(_SAME_VOCABULARY) > 64:
        _SAME_VOCABULARY.clear()
    _SAME_VOCABULARY[id(a), id(b)] = (weakref.ref(a), weakref.ref(b))
