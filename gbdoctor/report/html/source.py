"""The user's source lines around a break, read when the report is made.

Locations in a scan are relative to the spec's repository (library files from
``site-packages/`` on), so the reader looks for them under a list of roots: the ones the caller
names (``--source-root``, the directories of the JSON files), the working directory and its
parents, and the interpreter's site-packages. A file that is not found, or changed so that the
line is past its end, is said so instead of showing something else.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

from gbdoctor.records import Location

__all__ = ["SourceReader", "Snippet"]

CONTEXT_LINES = 3
"""Lines shown before and after the break's line."""
_SITE_PACKAGES = "<site-packages>/"
_MAX_FILE_BYTES = 4_000_000
"""Larger files are not read (a generated file or a wrong match)."""


@dataclass(frozen=True)
class Snippet:
    """Lines ``first``.. of ``path``, the break's line among them."""

    path: Path
    first: int
    lines: tuple[str, ...]
    line: int


class SourceReader:
    """Finds and reads located files once each."""

    def __init__(self, roots: tuple[Path, ...] = ()) -> None:
        cwd = Path.cwd()
        site = [Path(p) for key in ("purelib", "platlib") if (p := sysconfig.get_path(key))]
        ordered = [*roots, cwd, *cwd.parents, *site]
        self.roots = tuple(dict.fromkeys(p.resolve() for p in ordered))
        self._lines: dict[Path, tuple[str, ...] | None] = {}

    def find(self, file: str) -> Path | None:
        """The file a location names, or None."""
        name = file.replace("\\", "/").removeprefix(_SITE_PACKAGES)
        candidate = Path(name)
        if candidate.is_absolute():
            return candidate if candidate.is_file() else None
        for root in self.roots:
            path = root / candidate
            if path.is_file():
                return path
        return None

    def snippet(self, location: Location, context: int = CONTEXT_LINES) -> Snippet | None:
        """The lines around ``location``; None when the file is not found or is shorter."""
        path = self.find(location.file)
        if path is None:
            return None
        lines = self._read(path)
        if lines is None or not 1 <= location.line <= len(lines):
            return None
        first = max(1, location.line - context)
        last = min(len(lines), location.line + context)
        return Snippet(path, first, lines[first - 1 : last], location.line)

    def _read(self, path: Path) -> tuple[str, ...] | None:
        if path not in self._lines:
            try:
                if path.stat().st_size > _MAX_FILE_BYTES:
                    raise OSError("too large")
                text = path.read_text(encoding="utf-8", errors="replace")
                self._lines[path] = tuple(text.splitlines())
            except OSError:
                self._lines[path] = None
        return self._lines[path]
