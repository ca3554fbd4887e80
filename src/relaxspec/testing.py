"""Tiny models and tokenizers that build in milliseconds, for tests and examples.

``tiny_tokenizer(n_words)`` is a word-level tokenizer over ``w0 w1 …`` plus the three special
tokens of the bundled tokenizer; ``tiny_llama(tokenizer, …)`` a random Llama-style causal LM whose
output logits are scaled so its next-token distributions are far from uniform (which makes the
statistical tests decisive). ``perturbed_copy`` makes a draft that partly agrees with it;
``save_tiny_pair`` writes such a target/draft pair as model directories. ``exact_joint``,
``sample_continuations`` and ``chi_square_pvalue`` make the sequence-level exactness tests.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from relaxspec.core.sampling import processed_probs
from relaxspec.engine.kv import model_logits, new_cache
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


def counting_windows(n: int, length: int, n_words: int = 8, seed: int = 0) -> torch.Tensor:
    """``LongTensor[n, length]`` of a toy language: EOS, then ``w_{(s + i·step) mod n_words}``.

    The step (1, 2 or 3) and the start are drawn per window. Word ``wj`` has id ``j + 3`` (see
    :func:`tiny_tokenizer`); each window starts with EOS (id 0) like the encoded prompts. Every
    word after the second is determined by the two before it, so a block proposer can learn to
    predict whole blocks.
    """
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, n_words, (n, 1), generator=gen)
    step = torch.randint(1, 4, (n, 1), generator=gen)
    words = (start + step * torch.arange(length - 1)) % n_words + 3
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), words], dim=1)  # documents start with EOS


def tiny_block_proposer(
    tokenizer: PreTrainedTokenizerFast,
    block_size: int = 4,
    steps: int = 80,
    seed: int = 0,
    out_dir: str | Path | None = None,
) -> LlamaForCausalLM:
    """A tiny block proposer trained for a few seconds on :func:`counting_windows` (float32, eval).

    Uses the real objective (:func:`relaxspec.train.block.block_loss`) and training loop.
    """
    import tempfile

    from relaxspec.train.block import block_loss, prepare_base_model
    from relaxspec.train.loop import TrainConfig, train

    n_words = len(tokenizer) - 4  # EOS, PAD, MASK, [UNK]
    model = tiny_llama(len(tokenizer), seed=seed, hidden_size=64, logit_scale=1.0)
    mask_id = prepare_base_model(model, tokenizer, block_size)
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(
            out_dir=str(out_dir or tmp),
            steps=steps,
            batch_size=16,
            seq_len=24,
            lr=1e-2,
            warmup=5,
            weight_decay=0.0,
            eval_every=10**9,
            ckpt_every=10**9,
            seed=seed,
        )
        model, _ = train(
            model,
            config,
            batch_fn=lambda step, micro: {"input_ids": counting_windows(16, 24, n_words, seed=step)},
            loss_fn=lambda m, batch: block_loss(m, batch, block_size, mask_id),
            resume=False,
            progress=False,
        )
    from accelerate.utils import extract_model_from_parallel

    # the loop returns the model with accelerate's autocast wrapper on forward: remove it
    return extract_model_from_parallel(model, keep_fp32_wrapper=False).float().eval()


def chi_square_pvalue(samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """Chi-square goodness of fit of sampled outcomes to exact probabilities (needs scipy).

    Cells with expected count < 5 are pooled into one; a sampled outcome of probability 0 gives
    p-value 0.
    """
    from scipy.stats import chisquare

    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    if set(counts) - set(expected):
        return 0.0
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, prob in expected.items():
        if prob * n >= 5:
            obs.append(counts.get(cell, 0))
            exp.append(prob * n)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += prob * n
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    elif pooled_obs > 0:
        return 0.0
    return float(chisquare(obs, exp).pvalue)


def law_chi2_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square goodness of fit of token ``counts[V]`` to a ``law[V]`` (needs scipy); asserts no
    counts fall outside the law's support (a point mass: that check is the whole test, p = 1)."""
    from scipy.stats import chisquare

    law = law.double()
    support = law > 1e-7
    assert counts[~support].sum() == 0, f"counts outside the support: {counts.tolist()}"
    if support.sum() == 1:
        return 1.0
    expected = law[support] / law[support].sum() * counts[support].sum()
    return float(chisquare(counts[support].double().numpy(), expected.numpy()).pvalue)


def exact_joint(
    model: LlamaForCausalLM, prompt_ids: list[int], params, n_tokens: int
) -> dict[tuple[int, ...], float]:
    """P(x_1..x_n | prompt) under ``model``'s processed law, for every continuation of n tokens.

    One batched forward over all V^n continuations (keep V and n small), through the engine's
    model call (:func:`relaxspec.engine.kv.model_logits`): the law of the kernels the model's
    decoding forwards run on (``--kernels``), which is the law the engines must reproduce.
    """

    prompt = torch.tensor(prompt_ids)
    V = model.config.vocab_size
    tails = list(itertools.product(range(V), repeat=n_tokens))
    seqs = torch.stack([torch.cat([prompt, torch.tensor(t)]) for t in tails])
    with torch.inference_mode():
        logits = model_logits(model, seqs, new_cache(model))
        probs = processed_probs(logits[:, len(prompt) - 1 : -1], params).double()
    joint = probs.gather(-1, seqs[:, len(prompt) :, None]).squeeze(-1).prod(-1)
    joint = joint / joint.sum()  # float32 softmax rounding
    return dict(zip(tails, joint.tolist(), strict=True))


def sample_continuations(engine, prompt: str, n: int, params, n_tokens: int) -> list[tuple[int, ...]]:
    """The first ``n_tokens`` generated by ``engine`` for seeds ``0..n-1`` (EOS ignored)."""

    return [
        tuple(
            engine.generate(
                prompt, replace(params, seed=seed, max_new_tokens=n_tokens, ignore_eos=True)
            ).tokens
        )
        for seed in range(n)
    ]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``relaxspec <args>`` in a subprocess with this interpreter; capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "relaxspec.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def vllm_server(method: str, args: Sequence[str], log_dir: Path, api_key: str | None = None,
                timeout: float = 600.0) -> Iterator[str]:  # fmt: skip
    """The load test's spawned vLLM server (:class:`~relaxspec.serve.loadtest.SpawnedServer`:
    ``relaxspec.integrations.vllm.serve --method METHOD ARGS`` on a free loopback port), up and
    answering ``/health``; yields its base URL and stops it after. ``timeout``: seconds to start
    (a loaded 2-core machine can take minutes to start vLLM)."""
    from relaxspec.serve.loadtest import LoadtestConfig, SpawnedServer

    config = LoadtestConfig(concurrency=[1], spawn_args=list(args), api_key=api_key, engine="vllm")
    server = SpawnedServer(method, config, log_dir)
    try:
        server.wait_ready(timeout)
        yield server.url
    finally:
        server.stop()


# The in-process vLLM engines of the tests: a 512-token context and a 0.25 GiB KV cache (8k float32
# tokens of the bundled target; vLLM's 1 GiB default, touched at start, held 13 GB in one module).
VLLM_SMALL: dict[str, Any] = {"max_model_len": 512, "kv_cache_gib": 0.25}
VLLM_SMALL_FP32: dict[str, Any] = {**VLLM_SMALL, "llm_kwargs": {"dtype": "float32"}}


# (p, q) pairs for the statistical rule tests: a generic law and one with ties and zeros (the tied
# boundary decides membership).
LAW_CASES = {
    "generic": (
        [0.33, 0.22, 0.15, 0.12, 0.08, 0.06, 0.04, 0.0],
        [0.08, 0.30, 0.28, 0.04, 0.12, 0.06, 0.07, 0.05],
    ),
    "ties": (
        [0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.0, 0.0],
        [0.05, 0.30, 0.30, 0.05, 0.10, 0.10, 0.10, 0.0],
    ),
}
