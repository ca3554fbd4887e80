"""The models ``relaxspec serve`` loads, and the tokenizer and context window its requests are
checked against."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ROLE_LOADERS, ModelSet, get_method, load_role
from relaxspec.models import LoadedModel, model_dir

log = logging.getLogger("relaxspec.serve.server")


def load_serving_models(
    method: str, paths: dict[str, str | Path | None], extra_roles: bool = True, kernels: str = "auto"
) -> ModelSet:
    """The models ``relaxspec serve`` holds.

    The default method's models are required (a given directory or the bundled one); models of
    other roles are loaded from a given directory, or, with ``extra_roles``, from the bundled one
    when it exists, so that requests can switch to the methods that use them. A bundled extra
    model that fails to load is skipped with a warning. ``kernels``: see :func:`load_role`.
    """
    spec = get_method(method)
    models = ModelSet()
    for role in ROLE_LOADERS:
        required = role in spec.needs
        given = paths.get(role)
        if given is not None:
            setattr(models, role, load_role(role, Path(given), kernels))
            continue
        if not (required or extra_roles or role in spec.optional):
            continue
        path = model_dir(role, None, f"method {method!r}", required=required)
        if path is None:
            continue
        try:
            setattr(models, role, load_role(role, path, kernels))
        except RelaxSpecError as err:
            if required:
                raise
            log.warning("skipping the bundled %s model: %s", role, err)
    return models


def serving_tokenizer_and_context(models: ModelSet, method: str) -> tuple[Any, int]:
    """The tokenizer prompts are counted with (the default method's first model's) and the
    context window requests are checked against (the smallest of the loaded models')."""
    loaded = [m for m in (getattr(models, role) for role in ROLE_LOADERS) if isinstance(m, LoadedModel)]
    primary = [getattr(models, role) for role in get_method(method).needs]
    primary = [m for m in primary if isinstance(m, LoadedModel)]
    if not primary:
        raise RelaxSpecError(f"method {method!r} has no loaded Hugging Face model to take a tokenizer from")
    return primary[0].tokenizer, min(m.context_length for m in loaded)
