"""The presets' package: each family in its own module, registered in one order (that of
``--help`` and of tables), the old import path ``relaxspec.methods`` unchanged."""

from __future__ import annotations

import relaxspec.methods as methods
from relaxspec.methods import draft_model, prove, sdd

ORDER = [
    "ar", "sd", "nsd", "topk", "typical", "lenience", "topk-delta", "threshold", "fly",  # draft_model
    "mars", "prove", "prove-lossless",  # prove
    "sdd", "sdd-skip", "sdd-periodic",  # sdd
]  # fmt: skip


def test_presets_register_in_family_order():
    assert methods.method_names() == ORDER


def test_each_family_builds_its_own_presets():
    family = {draft_model: ORDER[:9], prove: ORDER[9:12], sdd: ORDER[12:]}
    for module, names in family.items():
        for name in names:
            build = methods.get_method(name).build
            assert build.__module__ == module.__name__, (name, build.__module__)


def test_the_package_exports_what_it_lists():
    assert all(hasattr(methods, name) for name in methods.__all__)
