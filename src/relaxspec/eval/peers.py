"""Runners that are not our engine: Hugging Face decoding as peers in the benchmark (docs/design.md §6).

``hf-generate`` (plain ``generate()``), ``hf-assisted`` (assisted generation with the draft model,
``assistant_model=``, K tokens per round) and ``hf-lookup`` (prompt lookup decoding,
``prompt_lookup_num_tokens=``) run on the same models, prompts, budget and stop strings as our
methods and are reported as their own rows. The helpers here also answer, for any runner name
(method preset or peer), which models it needs and which parameters it takes.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from relaxspec.core.sampling import SamplingParams
from relaxspec.errors import RelaxSpecError, check_int, check_real
from relaxspec.eval.datasets import Example, truncate
from relaxspec.integrations import llamacpp
from relaxspec.integrations.vllm import runners as vllm_runners
from relaxspec.methods import ModelSet, get_method, resolve_params
from relaxspec.models import LoadedModel
from relaxspec.params import DEFAULT_K

Runner = Callable[[Example, int, int | None], dict[str, Any]]  # (example, seed, max_new_tokens) -> record


@dataclass(frozen=True)
class PeerSpec:
    """A Hugging Face ``generate()`` configuration run as a peer (``kwargs`` builds its arguments)."""

    name: str
    summary: str
    needs: tuple[str, ...]
    params: dict[str, Any]
    kwargs: Callable[[ModelSet, dict[str, Any]], dict[str, Any]]


def _assisted_kwargs(models: ModelSet, p: dict[str, Any]) -> dict[str, Any]:
    draft = models.require("draft", "hf-assisted")
    if getattr(draft, "model", None) is None:  # an EAGLE head is no causal LM
        raise RelaxSpecError("hf-assisted needs a draft causal LM, not an EAGLE head (--draft)")
    assistant = draft.model
    # Like for like with our sd: K draft tokens per round ("constant" schedule) and, by default, no
    # early stop of the draft on low assistant confidence (HF's own default is 0.4: --set
    # hf-assisted.confidence=0.4 measures that).
    assistant.generation_config.num_assistant_tokens = p["k"]
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = p["confidence"]
    return {"assistant_model": assistant}


PEERS: dict[str, PeerSpec] = {
    p.name: p
    for p in (
        PeerSpec("hf-generate", "Hugging Face generate(), plain decoding", ("target",), {}, lambda m, p: {}),
        PeerSpec(
            "hf-assisted",
            "Hugging Face assisted generation (assistant_model=draft, k tokens per round)",
            ("target", "draft"),
            {"k": DEFAULT_K, "confidence": 0.0},
            _assisted_kwargs,
        ),
        PeerSpec(
            "hf-lookup",
            "Hugging Face prompt lookup decoding (prompt_lookup_num_tokens=k)",
            ("target",),
            {"k": 10},
            lambda m, p: {"prompt_lookup_num_tokens": p["k"]},
        ),
    )
}


def is_peer(name: str) -> bool:
    """Hugging Face peers, the stock-vLLM peers (``vllm-ar``, ``vllm-sd``; --engine vllm) and
    llama.cpp's (``llamacpp-ar``, ``llamacpp-sd``)."""
    return name in PEERS or vllm_runners.is_peer(name) or llamacpp.is_peer(name)


def peer_names() -> list[str]:
    return [*PEERS, *vllm_runners.PEERS, *llamacpp.PEERS]


def runner_needs(name: str) -> tuple[str, ...]:
    if vllm_runners.is_peer(name):
        return vllm_runners.PEER_NEEDS[name]
    if llamacpp.is_peer(name):
        return ("target",)  # its tokenizer checks that the GGUF tokenizes each prompt alike
    return PEERS[name].needs if is_peer(name) else get_method(name).needs


def runner_optional(name: str) -> tuple[str, ...]:
    """Roles a method uses when available (e.g. survival predictors for learned skip signals)."""
    return () if is_peer(name) else get_method(name).optional


def runner_params(name: str) -> dict[str, Any]:
    """Parameter names and defaults of a method preset or a peer (unknown name: clear error)."""
    if vllm_runners.is_peer(name):
        return vllm_runners.row_defaults(name)
    if llamacpp.is_peer(name):
        return llamacpp.PEERS[name]
    return PEERS[name].params if is_peer(name) else get_method(name).defaults


def resolve_runner(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validated parameters of a method preset (:func:`resolve_params`) or a peer."""
    if vllm_runners.is_peer(name):
        return vllm_runners.resolve(name, params)
    if llamacpp.is_peer(name):
        return llamacpp.resolve(name, params)
    if not is_peer(name):
        return resolve_params(name, params)
    spec = PEERS[name]
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        raise RelaxSpecError(f"peer {name!r} has no parameter {', '.join(unknown)} (parameters: {allowed})")
    resolved = {**spec.params, **params}
    check_int(f"k of {name!r}", resolved.get("k", 1), 1)
    c = resolved.get("confidence", 0.0)
    if check_real(f"confidence of {name!r}", c, 0, 1) == 1:
        raise RelaxSpecError(f"confidence of {name!r} must be a number in [0, 1), got {c!r}")
    return resolved


def family(name: str) -> str:
    """Method family for grouping in tables and plots, from the models a method needs."""
    if vllm_runners.is_peer(name):
        return "vllm (stock)"
    if llamacpp.is_peer(name):
        return "llama.cpp"
    if is_peer(name):
        return "hugging face"
    try:
        needs = runner_needs(name)
    except RelaxSpecError:
        return "unregistered"
    for role, fam in (
        ("diffusion", "diffusion drafter"),
        ("block", "block proposer"),
        ("draft", "draft model"),
    ):
        if role in needs:
            return fam
    return "autoregressive"


class StopOnText(StoppingCriteria):
    """Stop when the decoded continuation contains a stop string — the check our engine makes.

    (HF's own ``stop_strings=`` precomputes token-level matches from the vocabulary and fails on
    some tokenizers, e.g. word-level ones; decoding the continuation works with any tokenizer.)
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_length: int, stop: Sequence[str]) -> None:
        self.tokenizer, self.prompt_length, self.stop = tokenizer, prompt_length, tuple(stop)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        done = [
            any(
                s in self.tokenizer.decode(row[self.prompt_length :], skip_special_tokens=True)
                for s in self.stop
            )
            for row in input_ids.tolist()
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def hf_runner(name: str, params: dict[str, Any], models: ModelSet, sampling: SamplingParams) -> Runner:
    """A Hugging Face ``generate()`` peer, with the same prompt encoding, budget and stop strings."""
    target: LoadedModel = models.require("target", name)
    extra = PEERS[name].kwargs(models, params)
    tok = target.tokenizer
    eos = target.model.generation_config.eos_token_id or tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])

    def run(ex: Example, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        ids = tok(ex.prompt, return_tensors="pt")["input_ids"]
        budget = min(max_new_tokens or sampling.max_new_tokens, target.context_length - ids.shape[1])
        if budget < 1:
            raise RelaxSpecError(f"the prompt has {ids.shape[1]} tokens; the context window is full")
        kwargs: dict[str, Any] = dict(
            max_new_tokens=budget,
            pad_token_id=tok.pad_token_id,
            eos_token_id=list(eos_ids),
            do_sample=not sampling.greedy,
            **extra,
        )
        if not sampling.greedy:
            kwargs.update(
                temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p
            )
        if ex.stop:
            kwargs.update(stopping_criteria=StoppingCriteriaList([StopOnText(tok, ids.shape[1], ex.stop)]))
        torch.manual_seed(seed)
        with warnings.catch_warnings(), _quiet_transformers():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            seconds = time.perf_counter() - t0
        new = out[0, ids.shape[1] :].tolist()
        while new and (new[-1] in eos_ids or new[-1] == tok.pad_token_id):
            new.pop()
        text = truncate(tok.decode(new, skip_special_tokens=True), ex.stop)
        return {"tokens": new, "text": text, "seconds": seconds, "stats": None}

    return run


def llamacpp_runner(name: str, params: dict[str, Any], models: ModelSet, sampling: SamplingParams) -> Runner:
    """A llama.cpp peer (:mod:`relaxspec.integrations.llamacpp`) on the same prompts, budget and
    stop strings; each prompt must tokenize as our tokenizer does (else the rows would differ)."""
    target: LoadedModel = models.require("target", name)
    tok = target.tokenizer
    server = llamacpp.server(llamacpp.spec_of(name, params), target.context_length)
    eos = target.model.generation_config.eos_token_id or tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])

    def run(ex: Example, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        ids = tok(ex.prompt)["input_ids"]
        if server.tokenize(ex.prompt) != ids:
            raise RelaxSpecError(
                f"{name}: the GGUF tokenizes prompt {ex.id!r} differently from the target's tokenizer "
                "(rebuild the GGUFs with scripts/llamacpp_peer.sh from the same models)"
            )
        budget = min(max_new_tokens or sampling.max_new_tokens, target.context_length - len(ids))
        if budget < 1:
            raise RelaxSpecError(f"the prompt has {len(ids)} tokens; the context window is full")
        out = server.complete(ex.prompt, budget, sampling, seed, tuple(ex.stop or ()))
        tokens = out["tokens"]
        while tokens and tokens[-1] in eos_ids:  # llama.cpp returns the EOS it stopped at
            tokens.pop()
        return {**out, "tokens": tokens, "text": truncate(out["text"], ex.stop)}

    return run


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
