"""The packed decoder-layer loop compiled to C++ (engine/csrc/layers.cpp), built on first use.

A decode step of the packed forward is a few hundred small ATen ops; called from Python each costs
more than the arithmetic of most (docs/performance.md §9). :func:`layers_module` compiles the same
loop, op for op, with torch's C++ extension builder (a C++ compiler and ninja; ~30 s once per
machine, cached under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``), so the numbers do
not change, only the cost per op. Where it cannot be built the Python loop runs, with one warning
saying why; :func:`python_layers` forces the Python loop (tests, and benchmarks that compare both).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("csrc") / "layers.cpp"
NAME = "relaxspec_layers"

_lock = threading.Lock()
_built: dict[str, ModuleType | str | None] = {"module": None, "error": None}
_PYTHON_ONLY: ContextVar[bool] = ContextVar("relaxspec_python_layers", default=False)


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    return load(name=NAME, sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False)


def layers_module() -> ModuleType | None:
    """The compiled layer loop; None inside :func:`python_layers` or where it cannot be built
    (warned once, with the reason)."""
    if _PYTHON_ONLY.get():
        return None
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
                        "packed forwards run the Python loop (same numbers, slower)",
                        stacklevel=2,
                    )
    return _built["module"]  # type: ignore[return-value]


def build_error() -> str | None:
    """Why the C++ loop could not be built (None if it was, or has not been tried)."""
    return _built["error"]  # type: ignore[return-value]


@contextmanager
def python_layers() -> Iterator[None]:
    """Packed forwards run the Python layer loop within this context (this thread; same numbers)."""
    token = _PYTHON_ONLY.set(True)
    try:
        yield
    finally:
        _PYTHON_ONLY.reset(token)
