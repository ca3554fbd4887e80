"""Files written whole or not at all, for every record a kill must not tear.

A plain ``path.write_text`` truncates the file first and writes it after: a process killed in
between (or a full disk, or an exception while serialising) leaves an empty or half-written file
where a good one was. Here the new content goes to a temporary file in the same directory, is
flushed and ``fsync``'ed, and then ``os.replace`` puts it in place in one step (atomic on POSIX
within one file system); the directory is ``fsync``'ed too, so the rename survives a power cut.
Whatever stops a write, the reader finds the old file (or none) and no temporary is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_MODE = 0o644  # a new file's permissions (an existing file keeps its own)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` atomically (see the module docstring)."""
    write_chunks(path, [text], encoding)


def write_json(path: str | Path, obj: Any, indent: int | None = 1, ensure_ascii: bool = True) -> None:
    """Replace ``path`` with ``obj`` as JSON; an object that cannot be serialised leaves it as it was."""
    write_text(path, json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii))


def write_jsonl(path: str | Path, rows: Iterable[Any], ensure_ascii: bool = True) -> None:
    """Replace ``path`` with one JSON object per line, streamed (the rows need not fit in one string)."""
    write_chunks(path, (json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows))


def write_chunks(path: str | Path, chunks: Iterable[str], encoding: str = "utf-8") -> None:
    """Write ``chunks`` to a temporary file next to ``path``, fsync it, then ``os.replace`` it over
    ``path`` and fsync the directory. An exception while writing (or serialising a chunk) removes
    the temporary and re-raises: ``path`` is untouched."""
    target = Path(path)
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else DEFAULT_MODE
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


def fsync_dir(directory: str | Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
