"""How far the tree is from the layout issue 41 asks for: ``python -m tools.layout_report``.

Prints one count per line (what issue 41's "Done when" names), each followed by what it counted,
read from the source with ``ast`` (nothing of gbdoctor is imported):

- format registries: module-level tables of output formats (a name ending in ``FORMATS``, or
  a literal holding two or more format names: ``OutputFormat`` members or their strings),
  format enums (a ``StrEnum`` named ``...Format``, or one whose values are format names) other
  than the vocabulary itself (``records/enums.OutputFormat``), and if-chains (a function that
  compares a value with two or more format names);
- modules outside ``frameworks/`` naming a framework in code or strings: the layering test's
  rule (``tests/test_layering.py``), with how many it allows with a reason and how many have not
  moved behind the seam yet;
- duck-typed framework members: ``getattr``/``hasattr`` with the name of an optional framework
  member (of a capability protocol, or of a framework class, and not of the core), and
  ``type: ignore`` in the registry;
- ``Any`` in ``frameworks/interface.py``;
- mypy ``ignore_errors`` modules (``pyproject.toml``);
- modules missing from ``docs/architecture.md``: a module with no row in its module index whose
  file name does not appear in its top-level package's layout entry;
- flat test files: a ``test_*.py`` under ``tests/`` whose folder does not mirror the package
  (``tests/X/`` for ``gbdoctor/X/`` or ``gbdoctor/X.py``), other than the whole-repository tests
  named in ``WHOLE_REPO_TESTS``.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Count:
    what: str
    items: tuple[str, ...]
    detail: str = ""

    @property
    def value(self) -> int:
        return len(self.items)


def _modules(package: Path) -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        yield ".".join(parts), path, ast.parse(path.read_text(encoding="utf-8"))


VOCABULARY = ("gbdoctor.records.enums", "OutputFormat")
"""The format names themselves (the one source of names), not a registry of them."""


def _format_names(package: Path) -> set[str]:
    """The values of ``OutputFormat`` (``records/enums.py``), read with ``ast``."""
    tree = ast.parse((package / "records" / "enums.py").read_text(encoding="utf-8"))
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == VOCABULARY[1])
    return {
        node.value.value
        for node in enum.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def _named_formats(node: ast.AST, names: set[str]) -> set[str]:
    """The format names ``node`` spells, as strings or as ``OutputFormat.X``."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value in names:
            found.add(sub.value)
        elif (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == VOCABULARY[1]
        ):
            found.add(sub.attr.lower())
    return found


def _format_tables(mod: str, tree: ast.Module, names: set[str]) -> Iterator[str]:
    for node in tree.body:
        targets: list[str] = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        value = getattr(node, "value", None)
        spelled = value is not None and len(_named_formats(value, names)) >= 2
        yield from (f"{mod}.{t}" for t in targets if t.endswith("FORMATS") or spelled)
        if isinstance(node, ast.ClassDef) and (mod, node.name) != VOCABULARY:
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            values = _named_formats(ast.Module(body=node.body, type_ignores=[]), names)
            if "StrEnum" in bases and (node.name.endswith("Format") or len(values) >= 2):
                yield f"{mod}.{node.name}"


def _format_if_chains(mod: str, tree: ast.Module, names: set[str]) -> Iterator[str]:
    """Functions that choose by format name: comparisons with two or more format names."""
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        compared: set[str] = set()
        for node in ast.walk(func):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if not isinstance(side, ast.Name):
                        compared |= _named_formats(side, names)
        if len(compared) >= 2:
            yield f"{mod}.{func.name} (if-chain over {', '.join(sorted(compared))})"


def format_registries(package: Path) -> Count:
    names = _format_names(package)
    found = []
    for mod, _path, tree in _modules(package):
        found += _format_tables(mod, tree, names)
        found += _format_if_chains(mod, tree, names)
    return Count("format registries", tuple(found))


def _layering():  # the layering test's own rules, so the count and the check cannot disagree
    sys.path.insert(0, str(REPO / "tests"))
    import test_layering

    return test_layering


def framework_naming_modules(package: Path) -> Count:
    layering = _layering()
    names = layering.framework_names(package)
    naming: dict[str, set[str]] = {}
    for mod, path, _tree in _modules(package):
        if mod.split(".")[1:2] == ["frameworks"]:
            continue
        for name in layering.framework_mentions(path, names):
            naming.setdefault(mod, set()).add(name)
    allowed = {m for m, _ in layering.FRAMEWORK_ALLOWED}
    not_moved = {m for m, _ in layering.FRAMEWORK_NOT_MOVED}
    waiting = sorted(m for m in naming if m in not_moved)
    detail = (
        f"{len(naming)} in all: {len(set(naming) & allowed - not_moved)} allowed with a reason "
        f"(JSON vocabulary, file format, launcher, --version, locator), {len(waiting)} not moved "
        "behind the seam yet (listed)"
    )
    return Count(
        "modules outside frameworks/ naming a framework (not moved yet)", tuple(waiting), detail
    )


def _optional_members(package: Path) -> set[str]:
    """Members a framework may or may not have: those of the interface's capability protocols
    and of the framework classes under ``frameworks/``, less the core every framework has."""
    protocols: dict[str, set[str]] = {}
    framework_classes: set[str] = set()
    for mod, _path, tree in _modules(package / "frameworks"):
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if mod.endswith(".interface") and "Protocol" in bases:
                protocols[cls.name] = _class_members(cls)
            elif any(b.endswith(("Framework", "FrameworkBase")) for b in bases):
                framework_classes |= _class_members(cls)
    core = protocols.get("Framework", set())
    data = ("Framework", "CompileStrategy", "SpecContext", "RunModes")
    capabilities = set().union(*(m for name, m in protocols.items() if name not in data))
    return {m for m in (capabilities | framework_classes) - core if not m.startswith("_")}


def _class_members(cls: ast.ClassDef) -> set[str]:
    members: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members.add(node.target.id)
        elif isinstance(node, ast.Assign):
            members.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return members


def duck_typed_members(package: Path) -> Count:
    members = _optional_members(package)
    found = []
    for mod, path, tree in _modules(package):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in members
            ):
                found.append(f"{mod}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
        if mod == "gbdoctor.frameworks.registry":
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "type: ignore" in line:
                    found.append(f"{mod}:{n} type: ignore")
    return Count("duck-typed framework members", tuple(found))


def any_in_interface(package: Path) -> Count:
    path = package / "frameworks" / "interface.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        f"interface.py:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
        and node.id == "Any"
        or isinstance(node, ast.Attribute)
        and node.attr == "Any"
    ]
    return Count("Any in frameworks/interface.py", tuple(found))


def mypy_ignore_errors(pyproject: Path) -> Count:
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    found: list[str] = []
    for override in config.get("tool", {}).get("mypy", {}).get("overrides", []):
        if override.get("ignore_errors"):
            modules = override["module"]
            found += [modules] if isinstance(modules, str) else modules
    return Count("mypy ignore_errors modules", tuple(found))


def _layout_entries(doc: str) -> dict[str, str]:
    """``docs/architecture.md``'s layout block: top-level entry (``scan/``, ``spec.py``) ->
    its text."""
    block = re.search(r"## Layout\s*```(.*?)```", doc, re.S)
    entries: dict[str, str] = {}
    current = None
    for line in (block.group(1) if block else "").splitlines():
        head = re.match(r"^(?:gbdoctor/)?\s{0,11}([\w.]+/?)\s", line + " ")
        if head and not line.startswith(" " * 12):
            current = head.group(1)
            entries[current] = ""
        if current:
            entries[current] += line + "\n"
    return entries


def modules_missing_from_architecture(package: Path, doc_path: Path) -> Count:
    doc = doc_path.read_text(encoding="utf-8")
    entries = _layout_entries(doc)
    layout = "".join(entries.values())
    missing = []
    for mod, path, _tree in _modules(package):
        rel = path.relative_to(package)
        # A row of the page's module index (tests/test_architecture_doc.py keeps it whole).
        if f"| `{package.name}/{rel.as_posix()}` |" in doc:
            continue
        if len(rel.parts) == 1:
            if path.name not in layout:
                missing.append(mod)
            continue
        top = rel.parts[0] + ("/" if len(rel.parts) > 1 else "")
        text = entries.get(top, "")
        name = rel.parts[-2] + "/" if path.name == "__init__.py" else path.name
        if name not in text:
            missing.append(mod)
    return Count("modules missing from docs/architecture.md", tuple(missing))


WHOLE_REPO_TESTS = frozenset(
    {
        "test_architecture_doc.py",
        "test_docs.py",
        "test_golden.py",
        "test_gpu_kit.py",
        "test_layering.py",
        "test_layout_report.py",
        "test_recompile_goldens.py",
        "test_security.py",
        "test_slow_tiers.py",
    }
)
"""The tests at ``tests/`` itself: each checks the repository as a whole (its docs, its import
graph, the CLI's output on every bundled spec, docs/security.md's promises across the package,
the GPU kit under ``benchmarks/``, the test tiers), so no one package folder is theirs (docs/architecture.md)."""


def flat_test_files(tests: Path, package: Path) -> Count:
    flat = []
    for path in sorted(tests.rglob("test_*.py")):
        folder = path.parent.relative_to(tests)
        if folder == Path("."):
            if path.name not in WHOLE_REPO_TESTS:
                flat.append(path.relative_to(tests.parent).as_posix())
        elif not ((package / folder).is_dir() or (package / folder).with_suffix(".py").is_file()):
            flat.append(path.relative_to(tests.parent).as_posix())
    return Count("flat test files", tuple(flat))


def report(repo: Path = REPO) -> list[Count]:
    package = repo / "gbdoctor"
    return [
        format_registries(package),
        framework_naming_modules(package),
        duck_typed_members(package),
        any_in_interface(package),
        mypy_ignore_errors(repo / "pyproject.toml"),
        modules_missing_from_architecture(package, repo / "docs" / "architecture.md"),
        flat_test_files(repo / "tests", package),
    ]


def main() -> None:
    for count in report():
        print(f"{count.what}: {count.value}" + (f" ({count.detail})" if count.detail else ""))
        for item in count.items:
            print(f"    {item}")


if __name__ == "__main__":
    main()
