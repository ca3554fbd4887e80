"""The packed decoder-layer loop compiled to C++ (engine/csrc/layers.cpp), built on first use.

A decode step of the packed forward is a few hundred small ATen ops; called from Python each costs
more than the arithmetic of most (docs/performance.md §9). :func:`layers_module` compiles the same
loop, op for op, with torch's C++ extension builder (a C++ compiler and ninja; ~30 s once per
machine, cached under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``), so the numbers do
not change, only the cost per op. Where it cannot be built the Python loop runs, with one warning
saying why; :func:`python_layers` forces the Python loop (tests, and benchmarks that compare both).

The same module holds kernels of its own for CPUs with AVX-512 BF16 (:func:`own_kernels`, used
by both loops, csrc/kernels.h): the product of at most 16 input rows on bf16 or weight-only int8
weights (decode steps, verifies), streaming each weight once in the layout ``vdpbf16ps`` reads,
its rows independent of how many are computed together; and a decode step's attention.
:func:`torch_kernels` runs oneDNN's and torch's int8 products and torch's attention instead (the
path before them, for comparisons). With its own kernels, a forward
of one sequence over a few new tokens (a decode step, a verify, a short prefill: one token without
a mask or up to 256 under the plain causal mask; bias-free layers) runs fused: the operators
between the products in plain loops instead of ATen calls, and for a whole model the embedding,
final norm and LM head in the same call — the same formulas, float32 rounding apart;
:func:`unfused` keeps the ATen operators (whose numbers are the Python loop's bit for bit).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "layers.cpp"  # includes kernels.h
NAME = "relaxspec_layers"

_lock = threading.Lock()
_built: dict[str, ModuleType | str | None] = {"module": None, "error": None}
_PYTHON_ONLY: ContextVar[bool] = ContextVar("relaxspec_python_layers", default=False)
_TORCH_ONLY: ContextVar[bool] = ContextVar("relaxspec_torch_kernels", default=False)
_UNFUSED: ContextVar[bool] = ContextVar("relaxspec_unfused", default=False)


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    if shutil.which("ninja") is None:  # a venv's tools when its bin/ is not on PATH (not activated)
        os.environ["PATH"] = sysconfig.get_path("scripts") + os.pathsep + os.environ.get("PATH", "")
    # torch rebuilds when a source or a flag changes, not a header: the flags carry their digest
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(CSRC.iterdir()) if f.is_file()))
    flags = ["-O2", f"-DRELAXSPEC_SOURCES={digest.hexdigest()[:16]}"]
    return load(name=NAME, sources=[str(SOURCE)], extra_cflags=flags, verbose=False)


def _module() -> ModuleType | None:
    """The compiled module, built on the first call; None where it cannot be (warned once)."""
    if _built["module"] is None and _built["error"] is None:
        with _lock:
            if _built["module"] is None and _built["error"] is None:
                try:
                    _built["module"] = _build()
                except Exception as error:  # no compiler, no ninja, a failed build
                    lines = str(error).strip().splitlines() or [""]
                    _built["error"] = f"{type(error).__name__}: {lines[-1]}"
                    warnings.warn(
                        f"relaxspec's C++ layer loop could not be built ({_built['error']}); "
                        "packed forwards run the Python loop and oneDNN's products (same results "
                        "up to bf16 rounding, slower)",
                        stacklevel=3,
                    )
    return _built["module"]  # type: ignore[return-value]


def layers_module() -> ModuleType | None:
    """The module whose ``run_layers`` is the layer loop; None inside :func:`python_layers` or
    where it cannot be built."""
    return None if _PYTHON_ONLY.get() else _module()


def own_kernels_available() -> bool:
    """Whether the module's own kernels can run here (built, and the CPU has AVX-512 BF16),
    whatever :func:`torch_kernels` says: what packing decides to keep a VNNI copy of weights on."""
    module = _module()
    return module is not None and bool(module.small_product_cpu())


def own_kernels() -> ModuleType | None:
    """The module whose ``small_product(x, vnni, bias, scale)`` runs products of at most
    ``small_rows()`` input rows on bf16 or int8 weights in VNNI layout and whose ``attend`` runs a
    decode step's attention; None where they are not available or inside :func:`torch_kernels`."""
    if _TORCH_ONLY.get() or not own_kernels_available():
        return None
    return _built["module"]  # type: ignore[return-value]


def fusion_allowed() -> bool:
    """Whether the C++ loop may run a forward of one sequence fused (not inside :func:`unfused`)."""
    return not _UNFUSED.get()


def build_error() -> str | None:
    """Why the module could not be built (None if it was, or has not been tried)."""
    return _built["error"]  # type: ignore[return-value]


@contextmanager
def _setting(var: ContextVar[bool]) -> Iterator[None]:
    token = var.set(True)
    try:
        yield
    finally:
        var.reset(token)


def python_layers():
    """Packed forwards run the Python layer loop within this context (this thread)."""
    return _setting(_PYTHON_ONLY)


def torch_kernels():
    """oneDNN's products and torch's attention within this context, in either loop (this thread)."""
    return _setting(_TORCH_ONLY)


def unfused():
    """Forwards keep the C++ loop's ATen operators within this context (this thread)."""
    return _setting(_UNFUSED)
