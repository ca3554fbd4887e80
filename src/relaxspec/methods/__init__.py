"""Named method presets (docs/design.md §4): a method is a (proposer, verifier, rule, scheduler) combination.

``build_engine("nsd", target, draft, theta=0.9, k=4)`` returns a ready :class:`Engine`. Each
preset (:class:`MethodSpec`) declares the models it needs, its typed parameters
(:class:`~relaxspec.params.Param`), the rule it verifies with (:data:`RULES`) and its row inside
vLLM (:class:`VllmRow`). Parameters are resolved once into a frozen
:class:`~relaxspec.params.Params`; the CLI's flags, the server's ``relaxspec.params``, vLLM's
``extra_args`` and the bench grid all read these declarations. Users who want another
combination build an :class:`Engine` from the parts directly.
"""

# Each family's presets register themselves when its module is imported: draft_model (ar, sd, nsd,
# ...), then prove, then sdd -- the order of --help and of tables (tests/test_methods.py checks it).
from relaxspec.methods.draft_model import (
    LOOKUP_PROPOSERS,
    PROMPT_LOOKUP_MAX,
    PROMPT_LOOKUP_MIN,
    check_drafter,
    draft_model_method,
    draft_proposer,
)
from relaxspec.methods.loading import PACKED_ROLES, ROLE_LOADERS, load_draft, load_models, load_role
from relaxspec.methods.prove import SEAMS, block_size_of
from relaxspec.methods.registry import (
    METHODS,
    MODEL_ROLES,
    MethodSpec,
    ModelSet,
    VllmRow,
    build_engine,
    get_method,
    method_names,
    params_named,
    register,
    resolve_params,
)
from relaxspec.methods.sdd import SDD_ACCEPT, build_sdd, check_draft_work, make_signal, sdd_rules

__all__ = [
    "LOOKUP_PROPOSERS",
    "METHODS",
    "MODEL_ROLES",
    "PACKED_ROLES",
    "PROMPT_LOOKUP_MAX",
    "PROMPT_LOOKUP_MIN",
    "ROLE_LOADERS",
    "SDD_ACCEPT",
    "SEAMS",
    "MethodSpec",
    "ModelSet",
    "VllmRow",
    "block_size_of",
    "build_engine",
    "build_sdd",
    "check_draft_work",
    "check_drafter",
    "draft_model_method",
    "draft_proposer",
    "get_method",
    "load_draft",
    "load_models",
    "load_role",
    "make_signal",
    "method_names",
    "params_named",
    "register",
    "resolve_params",
    "sdd_rules",
]
