"""Offline generation through vLLM with relaxspec's rules: :class:`VLLMEngine` (docs/design.md §8).

``VLLMEngine("nsd", theta=0.9, k=4).generate(prompts, temperature=1.0, seed=0)`` returns one
:class:`VLLMResult` per prompt (``text``, ``tokens`` = generated ids, ``stats`` with ``tau``).
The engine is a ``vllm.LLM`` with vLLM's draft-model proposer (``k`` drafts per step) and the
plugin; the rule goes to vLLM per request in ``SamplingParams.extra_args``, so one engine serves
every rule at its ``k`` (``generate(..., rule={"rule": "topk", "accept_k": 3})``). ``stock=True``
is vLLM without the plugin (the ``vllm-ar`` / ``vllm-sd`` peers). The keywords are the rule's
parameters and the fields of :class:`VLLMEngineSettings` (checked on creation; ``VLLMEngine(settings)``).

How ``tau`` is counted, why sampling uses probabilistic drafting, and the process options
(``multiprocessing``, ``tensor_parallel_size``): docs/vllm.md, "The plugin, file by file".
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from relaxspec.core.sampling import check_temperature, check_top_p
from relaxspec.engine.proposers.eagle import is_eagle_dir
from relaxspec.engine.threads import torch_threads_kept
from relaxspec.errors import RelaxSpecError, check_int, check_real
from relaxspec.integrations import vllm as plugin
from relaxspec.integrations.vllm.drafts import draft_speculative_config
from relaxspec.integrations.vllm.hooks import make_llvmlite_scannable
from relaxspec.integrations.vllm.lookup import check_prompt_lookup, lookup_speculative_config
from relaxspec.integrations.vllm.rules import PARAM_KEYS, RULE_NAMES, RuleChoice, canonical, default_env
from relaxspec.models import model_dir
from relaxspec.params import DEFAULT_K

DEFAULT_KV_CACHE_GIB = 1
_ids = itertools.count()


@dataclass
class VLLMResult:
    """One generation: ``text``, generated token ids, and ``stats`` (``tau`` and the counts)."""

    text: str
    tokens: list[int]
    stats: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": self.tokens, "stats": self.stats}


def other_plugins() -> list[str]:
    """vLLM general plugins installed besides relaxspec's (what ``VLLM_PLUGINS`` keeps for stock)."""
    from importlib.metadata import entry_points

    return [ep.name for ep in entry_points(group="vllm.general_plugins") if ep.name != plugin.PLUGIN_NAME]


@contextlib.contextmanager
def _env(**values: str | None) -> Iterator[None]:
    """Set (None: unset) environment variables for the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    try:
        _set_env(values)
        yield
    finally:
        _set_env(old)


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def engine_env(stock: bool, multiprocessing: bool, rule: RuleChoice | None = None) -> dict[str, str | None]:
    """Environment for vLLM's processes: plugin in or out, in-process or not, default rule."""
    env: dict[str, str | None] = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocessing else "0",
        "VLLM_CPU_KVCACHE_SPACE": None,  # it would override kv_cache_memory_bytes (kv_cache_bytes)
    }
    if stock:
        env["VLLM_PLUGINS"] = ",".join(other_plugins()) or "none"
        env[plugin.ENV_DISABLE] = "1"
    else:
        env[plugin.ENV_DISABLE] = None
        allowed = os.environ.get("VLLM_PLUGINS")
        if allowed is not None and plugin.PLUGIN_NAME not in allowed.split(","):
            env["VLLM_PLUGINS"] = ",".join([*allowed.split(","), plugin.PLUGIN_NAME])
        if rule is not None:
            env.update(default_env(rule))
    return env


# Proposer kind -> the model role it loads by default (docs/design.md §8; .proposers); None: vLLM's
# model-free proposers (.lookup), which draft from the request's own tokens
PROPOSER_ROLES: dict[str, str | None] = {
    "draft": "draft",
    "block": "block",
    "block-cache": "block",
    "block-fused": "block",
    "diffusion": "diffusion",
    "ngram": None,
    "suffix": None,
}
CUSTOM_PROPOSERS = ("block-cache", "block-fused", "diffusion")  # our proposer classes: they need the plugin


@dataclass(frozen=True)
class VLLMEngineSettings:
    """Everything a :class:`VLLMEngine` is built from, checked on creation (``RelaxSpecError``).

    ``method``: ``ar`` or the default rule of the engine's requests (aliases allowed; stored
    canonical), ``rule_params`` its parameters (:data:`~relaxspec.integrations.vllm.rules.PARAM_KEYS`);
    ``target`` / ``draft``: model directories (None: the bundled model of the role); ``proposer``,
    ``k`` and the proposer options (``gamma``, ``steps``, ``reveal``, ``min_confidence``,
    ``prompt_lookup_min`` / ``_max``): see :class:`VLLMEngine`. The rest goes to ``vllm.LLM``
    (``llm_kwargs`` last, over the others); ``multiprocessing`` None reads
    ``$VLLM_ENABLE_V1_MULTIPROCESSING`` when the engine is built. ``kv_cache_gib``: the KV cache's
    space (vLLM's ``kv_cache_memory_bytes``; None: ``$VLLM_CPU_KVCACHE_SPACE`` GiB, else 1 GiB),
    allocated and touched when the engine starts, whatever the load.
    """

    method: str = "sd"
    rule_params: Mapping[str, Any] = field(default_factory=dict)
    target: str | Path | None = None
    draft: str | Path | None = None
    k: int = DEFAULT_K
    proposer: str = "draft"
    gamma: int | None = None
    steps: int | None = None
    reveal: str = "auto"
    min_confidence: float | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    stock: bool = False
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    seed: int = 0
    draft_sample_method: str | None = None
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None
    multiprocessing: bool | None = None
    enforce_eager: bool = True
    kv_cache_gib: float | None = None
    llm_kwargs: Mapping[str, Any] | None = None
    # derived on creation: the default rule (None for ar) and the ngram window
    rule: RuleChoice | None = field(init=False, default=None, repr=False, compare=False)
    lookup_window: tuple[int | None, int | None] = field(init=False, default=(None, None), repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", "ar" if self.method == "ar" else canonical(self.method))
        object.__setattr__(self, "rule", self._check_rule())
        self._check_engine()
        window = check_prompt_lookup(self.proposer, self.prompt_lookup_min, self.prompt_lookup_max)
        object.__setattr__(self, "lookup_window", window)
        if self.role is None and self.draft is not None:
            raise RelaxSpecError(f"the {self.proposer!r} proposer drafts without a model: pass no draft")

    @classmethod
    def of(cls, method: str = "sd", **keywords: Any) -> VLLMEngineSettings:
        """Settings from keywords: this class's fields, and every other keyword a rule parameter
        (``VLLMEngineSettings.of("nsd", theta=0.9, k=4)``)."""
        names = {f.name for f in fields(cls) if f.init} - {"method", "rule_params"}
        own = {n: v for n, v in keywords.items() if n in names}
        return cls(method, {n: v for n, v in keywords.items() if n not in names}, **own)

    @property
    def role(self) -> str | None:
        """The model role the proposer loads (None: a model-free proposer)."""
        return PROPOSER_ROLES[self.proposer]

    def _check_rule(self) -> RuleChoice | None:
        """The default rule (None for ``ar``); unknown or misplaced parameters raise."""
        params = dict(self.rule_params)
        if self.method == "ar" and params:
            raise RelaxSpecError(f"method 'ar' takes no rule parameters, got {', '.join(params)}")
        unknown = set(params) - set(PARAM_KEYS)
        if unknown:
            raise RelaxSpecError(
                f"unknown parameter(s) {', '.join(sorted(unknown))}; "
                f"rule parameters are {', '.join(PARAM_KEYS)}"
            )
        return None if self.method == "ar" else RuleChoice(self.method, params)

    def _check_engine(self) -> None:
        """Stock vLLM's limits, the draft length, the parallelism and the proposer's name."""
        if self.stock and self.method not in ("ar", "sd"):
            raise RelaxSpecError(f"stock vLLM has no {self.method!r} rule (only ar and sd)")
        if self.method != "ar":
            check_int("k", self.k, 1, what="draft length")
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.kv_cache_gib is not None:
            check_real("kv_cache_gib", self.kv_cache_gib, lo=2**-10, what="KV cache space in GiB")
        proposer = self.proposer
        if proposer not in PROPOSER_ROLES:
            raise RelaxSpecError(f"proposer must be one of {', '.join(PROPOSER_ROLES)}, got {proposer!r}")
        if self.stock and proposer in CUSTOM_PROPOSERS:
            raise RelaxSpecError(f"the {proposer!r} proposer needs the relaxspec plugin (not stock vLLM)")


def model_dirs(s: VLLMEngineSettings) -> tuple[Path, Path | None]:
    """The target's directory and the proposer's model directory (None: ``ar`` or model-free)."""
    target = model_dir("target", s.target, "vLLM")
    draft = model_dir(s.role, s.draft, "vLLM") if s.method != "ar" and s.role else None
    return target, draft  # type: ignore[return-value]


def kv_cache_bytes(gib: float | None) -> int:
    """The KV cache's size in bytes: ``gib``, else ``$VLLM_CPU_KVCACHE_SPACE`` (vLLM's own setting,
    whole GiB), else :data:`DEFAULT_KV_CACHE_GIB`."""
    if gib is None:
        raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or str(DEFAULT_KV_CACHE_GIB)
        try:
            gib = int(raw)
        except ValueError:
            raise RelaxSpecError(f"VLLM_CPU_KVCACHE_SPACE must be whole GiB, got {raw!r}") from None
        check_int("VLLM_CPU_KVCACHE_SPACE", gib, 1)
    return int(gib * 2**30)


def llm_arguments(s: VLLMEngineSettings, target: Path, draft: Path | None) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``s`` with its models at ``target`` / ``draft``."""
    kwargs: dict[str, Any] = {
        "model": str(target),
        "tokenizer": str(target),
        "enforce_eager": s.enforce_eager,
        "seed": s.seed,
        "tensor_parallel_size": s.tensor_parallel_size,
        "disable_log_stats": True,
        "kv_cache_memory_bytes": kv_cache_bytes(s.kv_cache_gib),
    }
    if s.max_model_len is not None:
        kwargs["max_model_len"] = s.max_model_len
    if s.method != "ar":
        kwargs.update(_speculative_arguments(s, target, draft))
    kwargs.update(s.llm_kwargs or {})
    return kwargs


def _speculative_arguments(s: VLLMEngineSettings, target: Path, draft: Path | None) -> dict[str, Any]:
    """``speculative_config`` (with the batch-size schedule of k) and what our proposers add."""
    from relaxspec.integrations.vllm import proposers

    sample_method = s.draft_sample_method
    if sample_method is None:
        sample_method = "greedy" if s.stock else "probabilistic"
    out: dict[str, Any] = {}
    if s.role is None:  # vLLM's ngram / suffix: drafts without probabilities
        spec = lookup_speculative_config(s.proposer, s.k, *s.lookup_window)
    elif s.proposer == "draft":
        assert draft is not None
        spec = draft_speculative_config(draft, target, s.k, sample_method)
    else:
        assert draft is not None
        if s.proposer in ("block", "block-cache", "block-fused"):
            _check_block_model(draft, s.k)
        if s.proposer == "block-fused" and draft.resolve() != target.resolve():
            raise RelaxSpecError(
                "the fused seam drafts with the target itself: target and draft must be the "
                f"same block model (got {target} and {draft})"
            )
        if s.proposer == "block":
            out["hf_overrides"] = proposers.mars_hf_overrides
        gamma = s.k if s.gamma is None else s.gamma
        options = (s.k, sample_method, gamma, s.steps, s.reveal, s.min_confidence)
        spec, extra_config = proposers.speculative_settings(s.proposer, str(draft), *options)
        if extra_config is not None:
            out["additional_config"] = extra_config
    proposers.add_k_schedule(spec, s.num_speculative_tokens_per_batch_size)
    out["speculative_config"] = spec
    return out


class VLLMEngine:
    """A vLLM engine for one (method family, proposer, k): ``ar``, or speculative decoding with any rule.

    Built from :class:`VLLMEngineSettings` (``VLLMEngine(settings)``), or from a method and the
    same keywords (``VLLMEngine("nsd", theta=0.9, k=4)``: :meth:`VLLMEngineSettings.of`).

    method: ``ar`` or a rule name (``sd``, ``nsd``, ``topk``, ``typical``, ``lenience``,
    ``topk-delta``, ``threshold``, ``fly``, ``greedy``, ``gate``; aliases ``exact``, ``nucleus``,
    ``prove``) — the default rule of this engine's requests; rule parameters as keywords
    (:data:`~relaxspec.integrations.vllm.rules.PARAM_KEYS`).

    proposer: ``draft`` (vLLM's draft-model proposer, ``draft`` = a causal LM), ``block`` (a MARS
    block proposer through vLLM's parallel drafting, ``draft`` = the block model, ``k`` ≤ its
    trained block size), ``block-cache`` (the same block proposer as a vLLM custom proposer with
    its own context cache: fewer drafter positions per step, rows drafted together),
    ``block-fused`` (``prove-lossless`` only: target = the block model, which drafts the next block
    inside its own verification forward; ``min_confidence`` cuts a block before its first unlikely
    draft) or
    ``diffusion`` (relaxspec's masked-diffusion drafter as a vLLM custom proposer, ``draft`` = the
    drafter; ``gamma`` block length (default ``k``), ``steps`` S,
    ``reveal``). See :mod:`relaxspec.integrations.vllm.proposers`. ``ngram`` (vLLM's prompt lookup,
    n-gram window ``prompt_lookup_min`` .. ``prompt_lookup_max``) and ``suffix`` (vLLM's suffix
    decoding; needs arctic-inference) draft without a model (``draft`` must be None; stock vLLM
    too): ``q`` is one-hot at each draft (:mod:`relaxspec.integrations.vllm.lookup`).
    """

    def __init__(self, settings: VLLMEngineSettings | str = "sd", /, **keywords: Any) -> None:
        plugin.require_vllm()
        plugin.check_version()
        if isinstance(settings, VLLMEngineSettings):
            if keywords:
                raise TypeError("VLLMEngine takes VLLMEngineSettings or a method and keywords, not both")
        else:
            settings = VLLMEngineSettings.of(**{"method": settings, **keywords})
        s = self.settings = settings
        self.method, self.rule, self.stock = s.method, s.rule, s.stock
        self.proposer = s.proposer if s.method != "ar" else None
        self.k = s.k if s.method != "ar" else 0
        self.target, self.draft = model_dirs(s)
        if self.proposer == "draft" and self.draft is not None and is_eagle_dir(self.draft):
            self.proposer = "eagle"  # vLLM's eagle proposer (.drafts)
        multiprocessing = s.multiprocessing
        if multiprocessing is None:
            multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1"
        self.multiprocessing = multiprocessing
        self.llm = self._start(llm_arguments(s, self.target, self.draft))
        self.tokenizer = self.llm.get_tokenizer()

    def _start(self, kwargs: dict[str, Any]) -> Any:
        """``vllm.LLM(**kwargs)`` with the plugin in (or out, stock) and vLLM's environment set."""
        import torch
        from vllm import LLM

        make_llvmlite_scannable()  # stock too: an ngram engine earlier in this process imported numba
        env = engine_env(self.stock, self.multiprocessing, self.rule)
        with self._plugin_state(), _env(**env), torch_threads_kept():
            llm = LLM(**kwargs)
            self.threads = torch.get_num_threads()  # what vLLM bound its threads for, in-process
            return llm

    # -- plugin on/off where vLLM runs in this process --------------------------------------------

    @contextlib.contextmanager
    def _plugin_state(self) -> Iterator[None]:
        if self.stock:
            was = plugin.is_registered()
            plugin.unregister()
            try:
                yield
            finally:
                if was:
                    plugin.register()
        else:
            with _env(**{plugin.ENV_DISABLE: None}):
                plugin.register()
            yield

    # -- generation -------------------------------------------------------------------------------

    def sampling_params(
        self,
        temperature: float = 0.0,
        max_new_tokens: int = 128,
        seed: int | None = None,
        top_k: int = 0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        rule: RuleChoice | Mapping[str, Any] | str | None = None,
        ignore_eos: bool = False,
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        temperature, top_p = check_temperature(temperature), check_top_p(top_p)
        check_int("max_new_tokens", max_new_tokens, 1)
        extra = None
        if not self.stock and self.method != "ar":
            extra = self._choice(rule).to_extra_args()
        elif rule is not None:
            raise RelaxSpecError("a rule needs the plugin and a draft model (not 'ar' or stock vLLM)")
        return SamplingParams(
            temperature=float(temperature),
            max_tokens=max_new_tokens,
            seed=seed,
            top_k=top_k if top_k and top_k > 0 else 0,
            top_p=top_p,
            stop=list(stop) if stop else None,
            ignore_eos=ignore_eos,
            extra_args=extra,
            output_kind=RequestOutputKind.CUMULATIVE,
        )

    def _choice(self, rule: RuleChoice | Mapping[str, Any] | str | None) -> RuleChoice:
        assert self.rule is not None
        if rule is None:
            return self.rule
        if isinstance(rule, RuleChoice):
            return rule
        if isinstance(rule, str):
            return RuleChoice(rule)
        return RuleChoice.from_extra_args(rule, self.rule)

    def proposer_state(self) -> dict[str, Any] | None:
        """The (first) worker's custom-proposer state (live request states), or None."""
        if self.proposer not in CUSTOM_PROPOSERS:
            return None
        return self.llm.collective_rpc("relaxspec_proposer_state")[0]

    def plugin_stats(self) -> dict[str, Any] | None:
        """The plugin's counters in the (first) worker, or None for stock vLLM / ``ar``."""
        if self.stock or self.method == "ar":
            return None
        return self.llm.collective_rpc("relaxspec_stats")[0]

    def generate(
        self,
        prompts: str | Sequence[str],
        temperature: float = 0.0,
        max_new_tokens: int = 128,
        seed: int | None = None,
        top_k: int = 0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        rule: RuleChoice | Mapping[str, Any] | str | Sequence[Any] | None = None,
        ignore_eos: bool = False,
    ) -> list[VLLMResult]:
        """Generate for each prompt (one batch); ``rule`` may be one rule or one per prompt."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise RelaxSpecError("prompts must be non-empty strings")
        rules = list(rule) if isinstance(rule, list | tuple) else [rule] * len(prompts)
        if len(rules) != len(prompts):
            raise RelaxSpecError(f"got {len(rules)} rules for {len(prompts)} prompts")
        params = [
            self.sampling_params(temperature, max_new_tokens, seed, top_k, top_p, stop, r, ignore_eos)
            for r in rules
        ]
        with self._plugin_state(), torch_threads_kept(during=self.threads):  # ours back after
            return self._run(prompts, params, rules)

    def _run(self, prompts: list[str], params: list[Any], rules: list[Any]) -> list[VLLMResult]:
        engine = self.llm.llm_engine
        before = self.plugin_stats()
        ids = [f"relaxspec-{next(_ids)}" for _ in prompts]
        for rid, prompt, sp in zip(ids, prompts, params, strict=True):
            engine.add_request(rid, prompt, sp)
        lengths = dict.fromkeys(ids, 0)
        forwards = dict.fromkeys(ids, 0)
        finals: dict[str, Any] = {}
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id not in lengths:
                    continue
                n = len(out.outputs[0].token_ids)
                if n > lengths[out.request_id]:
                    forwards[out.request_id] += 1
                    lengths[out.request_id] = n
                if out.finished:
                    finals[out.request_id] = out
        seconds = time.perf_counter() - start
        after = self.plugin_stats()
        relaxed = _delta(before, after, self.k)
        results = []
        for rid, sp in zip(ids, params, strict=True):
            out = finals[rid]
            tokens = list(out.outputs[0].token_ids)
            stats: dict[str, Any] = {
                "engine": "vllm",
                "method": self.method,
                "proposer": self.proposer,
                "stock": self.stock,
                "k": self.k,
                "rule": (sp.extra_args or {}).get("rule"),
                "rule_params": {k: v for k, v in (sp.extra_args or {}).items() if k != "rule"},
                "new_tokens": len(tokens),
                "target_forwards": forwards[rid],
                "tau": len(tokens) / forwards[rid] if forwards[rid] else 0.0,
                "total_seconds": seconds,
                "batch_size": len(prompts),
                "finish_reason": out.outputs[0].finish_reason,
            }
            if relaxed is not None:
                stats["plugin"] = relaxed  # the whole batch's counts
            results.append(VLLMResult(out.outputs[0].text, tokens, stats, len(out.prompt_token_ids or [])))
        return results

    def close(self) -> None:
        """Release the engine (vLLM shuts its processes down)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            self.llm = None


def _check_block_model(path: Path, k: int) -> None:
    """``path`` is a MARS block proposer trained for blocks of at least ``k`` (clear error if not)."""
    import json

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise RelaxSpecError(f"cannot read the block proposer's config at {path}: {err}") from None
    trained = config.get("mars_block_size")
    if not isinstance(trained, int) or config.get("mars_mask_token_id") is None:
        raise RelaxSpecError(
            f"{path} is not a block proposer (its config has no mars_block_size / mars_mask_token_id); "
            "train one with `relaxspec train block`"
        )
    if k > trained:
        raise RelaxSpecError(f"block size {k} is larger than the block proposer's trained size ({trained})")


def _delta(before: dict[str, Any] | None, after: dict[str, Any] | None, k: int) -> dict[str, Any] | None:
    """The plugin's counters of one ``generate`` call: ``after − before``, per-position lists over
    the engine's ``k`` positions (longer if this call drafted deeper). The counters live in the
    worker process, which may have served an engine with a longer K before this one: its zeros
    beyond are not this engine's positions."""
    if before is None or after is None:
        return None

    def sub(a: list[int], b: list[int]) -> list[int]:
        return [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]

    drafted = sub(after["drafted_per_pos"], before["drafted_per_pos"])
    positions = max([k, *(i + 1 for i, n in enumerate(drafted) if n)])
    out = {
        "verify_rows": after["rows"] - before["rows"],
        "emitted": after["emitted"] - before["emitted"],
        "drafted_per_pos": drafted[:positions],
        "accepted_per_pos": sub(after["accepted_per_pos"], before["accepted_per_pos"])[:positions],
        "relaxed_per_pos": sub(after["relaxed_per_pos"], before["relaxed_per_pos"])[:positions],
    }
    out["relaxed_accepted"] = sum(out["relaxed_per_pos"])
    return out


__all__ = ["RULE_NAMES", "VLLMEngine", "VLLMEngineSettings", "VLLMResult", "other_plugins"]
