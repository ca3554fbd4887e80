"""Byte-level BPE tokenizer shared by every bundled model (docs/design.md §5).

Digits are split one per token before BPE so that arithmetic is learnable digit by digit. Three
special tokens are reserved: ``<|endoftext|>`` (BOS, EOS and document separator), ``<|pad|>`` and
``<|mask|>`` (the placeholder of the block proposer and the mask of the diffusion drafter). Every
encoded text starts with ``<|endoftext|>``, as every training document does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from relaxspec.data.chat import CHAT_TEMPLATE
from relaxspec.data.corpus import read_jsonl
from relaxspec.errors import RelaxSpecError

EOS = "<|endoftext|>"
PAD = "<|pad|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = [EOS, PAD, MASK]


def _training_texts(corpus_dir: Path, n_math: int) -> Iterator[str]:
    for row in read_jsonl(corpus_dir / "code_train.jsonl"):
        yield row["text"]
    for row in read_jsonl(corpus_dir / "math_train.jsonl")[:n_math]:
        yield row["text"]


def build_tokenizer(texts: Iterator[str] | list[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``."""
    if not 300 <= vocab_size <= 65_536:
        raise RelaxSpecError(f"vocab_size must be in [300, 65536], got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    eos_id = tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", pair=f"{EOS} $A {EOS} $B", special_tokens=[(EOS, eos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        mask_token=MASK,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE  # saved as chat_template.jinja: vLLM's chat endpoint reads it
    return tokenizer


def train_tokenizer(
    corpus_dir: str | Path, out_dir: str | Path, vocab_size: int = 4096, n_math: int = 30_000
) -> PreTrainedTokenizerFast:
    """``relaxspec train tokenizer``: train on the corpus and save to ``out_dir``."""
    corpus = Path(corpus_dir)
    if not (corpus / "manifest.json").is_file():
        raise RelaxSpecError(f"no corpus at {corpus} (run `relaxspec data build --out {corpus}` first)")
    tokenizer = build_tokenizer(_training_texts(corpus, n_math), vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    (out / "training.json").write_text(
        json.dumps({"corpus": str(corpus), "vocab_size": vocab_size, "n_math": n_math}, indent=2)
    )
    return tokenizer


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer directory offline, with a clear error if it is missing or unusable."""
    p = Path(path)
    if not (p / "tokenizer.json").is_file():
        raise RelaxSpecError(f"no tokenizer at {p} (expected {p / 'tokenizer.json'})")
    try:
        return AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as err:  # corrupt json, wrong class, ...
        raise RelaxSpecError(f"cannot load tokenizer from {p}: {err}") from None
