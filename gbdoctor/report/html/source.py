"""The user's source lines around a break, read when the report is made, only from trusted roots.

Locations in a scan are relative to the spec's repository (library files from
``site-packages/`` on). The reader resolves them under the roots its caller names (the command
line's choices: ``--source-root``, the working directory, the results' folders, and the scans'
spec roots that lie inside those; see ``cli/report.py``) and the interpreter's installed
packages, never anywhere a scan JSON points: a JSON can come from a pull request, and a page it
builds is uploaded as a CI artifact (issue 45: ``/proc/self/environ`` named as a location put the
job's environment on the page). So a location is read only when it is a relative path without
``..`` or hidden parts, names a ``.py`` file, and resolves (symlinks followed) to a regular file
inside the root it was found under. Anything else, like a file that is not found or changed so
that the line is past its end, is shown as text without source.
"""

from __future__ import annotations

import os
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gbdoctor.records import Location

__all__ = ["SourceReader", "Snippet", "installed_roots"]

CONTEXT_LINES = 3
"""Lines shown before and after the break's line."""
_SITE_PACKAGES = "<site-packages>/"
_MAX_FILE_BYTES = 4_000_000
"""Larger files are not read (a generated file or a wrong match)."""
SOURCE_SUFFIXES = (".py",)
"""What a break location can be: Dynamo traces Python files only."""


@dataclass(frozen=True)
class Snippet:
    """Lines ``first``.. of ``path``, the break's line among them."""

    path: Path
    first: int
    lines: tuple[str, ...]
    line: int


def installed_roots() -> tuple[Path, ...]:
    """The interpreter's installed packages (library locations are relative to them)."""
    return tuple(Path(p) for key in ("purelib", "platlib") if (p := sysconfig.get_path(key)))


def readable_name(file: str) -> PurePosixPath | None:
    """``file`` as a path a reader may look up under a root: relative, no ``..``, no hidden
    part (``.git``, ``.env``), a Python file; else None."""
    name = PurePosixPath(file.replace("\\", "/").removeprefix(_SITE_PACKAGES))
    if name.is_absolute() or not name.parts or name.suffix not in SOURCE_SUFFIXES:
        return None
    if any(part == ".." or part.startswith(".") or "\0" in part for part in name.parts):
        return None
    return name


class SourceReader:
    """Finds and reads located files once each, under ``roots`` and the installed packages."""

    def __init__(self, roots: tuple[Path, ...] = ()) -> None:
        ordered = [*roots, *installed_roots()]
        self.roots = tuple(dict.fromkeys(p.resolve() for p in ordered if p.is_dir()))
        self._lines: dict[Path, tuple[str, ...] | None] = {}

    def find(self, file: str) -> Path | None:
        """The file a location names, inside one of the roots, or None."""
        name = readable_name(file)
        if name is None:
            return None
        for root in self.roots:
            try:
                path = (root / name).resolve(strict=True)
            except (OSError, RuntimeError):  # missing, or a symlink loop
                continue
            # A symlink inside a root may point anywhere: the target must be in the root too.
            if path.is_relative_to(root) and path.suffix in SOURCE_SUFFIXES:
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
            self._lines[path] = _read_regular(path)
        return self._lines[path]


def _read_regular(path: Path) -> tuple[str, ...] | None:
    """The lines of ``path`` when it is a regular file of at most ``_MAX_FILE_BYTES``; a FIFO,
    device or procfs entry is not opened for reading at all (O_NONBLOCK: no wait on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FILE_BYTES:
            return None
        data = f.read(_MAX_FILE_BYTES + 1)
    if len(data) > _MAX_FILE_BYTES:
        return None
    return tuple(data.decode("utf-8", errors="replace").splitlines())
