"""Tiny models and tokenizers that build in milliseconds, for tests and examples.

``tiny_tokenizer(n_words)`` is a word-level tokenizer over ``w0 w1 …`` plus the three special
tokens of the bundled tokenizer; ``tiny_llama(tokenizer, …)`` a random Llama-style causal LM whose
output logits are scaled so its next-token distributions are far from uniform (which makes the
statistical tests decisive). ``perturbed_copy`` makes a draft that partly agrees with it;
``save_tiny_pair`` writes such a target/draft pair as model directories.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from relaxspec.train.tokenizer import EOS, MASK, PAD


def tiny_tokenizer(n_words: int = 8) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: ids 0-2 are EOS, PAD, MASK; ids 3.. are ``w0``, ``w1``, …."""
    vocab = {EOS: 0, PAD: 1, MASK: 2, **{f"w{i}": i + 3 for i in range(n_words)}, "[UNK]": n_words + 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(single=f"{EOS} $A", special_tokens=[(EOS, 0)])
    tok.add_special_tokens([EOS, PAD, MASK])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD, mask_token=MASK, unk_token="[UNK]"
    )


def tiny_llama(
    vocab_size: int,
    seed: int = 0,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 2,
    context: int = 128,
    logit_scale: float = 8.0,
) -> LlamaForCausalLM:
    """A random Llama-style LM (float32, eval mode) with peaked next-token distributions."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=context,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float = 0.3, seed: int = 5) -> LlamaForCausalLM:
    """A draft that partly agrees with ``model``: its weights plus Gaussian noise.

    Each parameter tensor gets noise of ``noise`` times its own standard deviation, so the copy
    accepts some drafts and rejects others (unlike an unrelated random model, which agrees with
    the target almost never under greedy decoding).
    """
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std())
    return draft.eval()


def save_tiny_pair(out_dir: str | Path, n_words: int = 8, context: int = 128) -> tuple[Path, Path]:
    """Write ``target`` and ``draft`` model directories (with the tokenizer) under ``out_dir``."""
    out = Path(out_dir)
    tokenizer = tiny_tokenizer(n_words)
    paths = []
    target = tiny_llama(len(tokenizer), seed=0, context=context, logit_scale=4.0)
    for name, model in (("target", target), ("draft", perturbed_copy(target))):
        path = out / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]
