"""Loading the models a method needs, by role (bundled ``models/<role>`` or a given directory),
with the kernels their decoding forwards run on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from relaxspec.engine.packed import KERNELS
from relaxspec.engine.packed import attach as attach_kernels
from relaxspec.engine.proposers.diffusion import load_diffusion
from relaxspec.engine.proposers.eagle import LoadedEagle, is_eagle_dir, load_eagle
from relaxspec.engine.survival import SurvivalPredictor
from relaxspec.errors import RelaxSpecError
from relaxspec.methods.registry import ModelSet, get_method
from relaxspec.models import LoadedModel, load_model, model_dir


def load_draft(path: Path) -> LoadedModel | LoadedEagle:
    """A ``--draft`` directory: an EAGLE head (recognised by its config) or a causal LM."""
    return load_eagle(path) if is_eagle_dir(path) else load_model(path)


# How a model of each role is loaded from a directory.
ROLE_LOADERS: dict[str, Callable[[Path], Any]] = {
    "target": load_model,
    "draft": load_draft,
    "eagle": load_eagle,
    "block": load_model,
    "diffusion": load_diffusion,
    "survival": SurvivalPredictor.load,
}


# Roles whose decoding forwards may run on packed kernels (engine/packed.py): every transformers
# model the engines decode with (the diffusion drafter's block forward passes its own mask).
PACKED_ROLES = ("target", "draft", "block", "diffusion")


def load_role(role: str, path: Path, kernels: str = "auto") -> Any:
    """A model of ``role`` loaded from ``path`` with that role's loader.

    ``kernels`` (:data:`relaxspec.engine.packed.KERNELS`) says what the decoding forwards of a
    :data:`PACKED_ROLES` model run on; ``auto`` picks the fastest measured one it allows.
    """
    if role not in ROLE_LOADERS:
        raise RelaxSpecError(f"no loader for {role} models (roles: {', '.join(ROLE_LOADERS)})")
    if kernels not in KERNELS:
        raise RelaxSpecError(f"unknown kernels {kernels!r} (choose from {', '.join(KERNELS)})")
    loaded = ROLE_LOADERS[role](path)
    if role in PACKED_ROLES and not isinstance(loaded, LoadedEagle):  # a head runs on the target's
        attach_kernels(loaded.model, kernels)
    return loaded


def load_models(
    method: str, paths: dict[str, str | Path | None] | None = None, kernels: str = "auto"
) -> ModelSet:
    """Load the models ``method`` needs: from ``paths[role]`` or the bundled ``models/<role>``."""
    spec = get_method(method)
    paths = paths or {}
    models = ModelSet()
    for role in spec.needs:
        path = model_dir(role, paths.get(role), f"method {method!r}")
        setattr(models, role, load_role(role, path, kernels))
    for role in spec.optional:
        path = model_dir(role, paths.get(role), required=False)
        if path is not None:
            setattr(models, role, load_role(role, path, kernels))
    return models
