"""The import graph of ``gbdoctor/`` keeps the layering of docs/architecture.md.

Read with ``ast`` (nothing is imported), every ``import``/``from ... import`` in every module,
at any depth (function-level lazy imports count: they are still dependencies), is an edge:

- ``records/`` imports nothing from gbdoctor except ``gbdoctor.errors``, and ``errors.py``
  imports nothing from gbdoctor: together they are the ground floor (a malformed JSON file is
  a ``BaselineError`` raised by ``records.io``, exit code 2).
- Formatters (``report/``) import no command module: ``scan``, ``plan``, ``run``, ``gate``,
  ``cli`` (they lay out records; they never call a command back).
- ``cli/`` is the top floor: only ``__main__`` imports it, and only ``cli/`` imports typer, so
  every command is a thin layer over a library function that tests call without typer.
- Stage packages form no cycle: the graph between stages (``records``, ``errors``, ``causes``,
  ``capture``, ``setup``, ``models``, ``scan``, ``plan``, ``run``, ``gate``, ``summary``,
  ``spec``, ``report``, ``cli``) is acyclic.
- Only ``capture/`` uses Dynamo. What counts: importing ``torch._dynamo``, ``torch._logging``
  or any module under them, at any depth (a function-level ``import torch._dynamo`` too), and
  any attribute ``torch._dynamo.X``. The other stages reach Dynamo's settings through
  ``torch_compat.dynamo_config()`` (torch has no public name for ``torch._dynamo.config``) and
  its reset and backend list through ``torch.compiler``.
- Other private torch API (importing ``torch._X``, using a ``torch._X`` attribute) lives in
  ``capture/`` or ``torch_compat.py`` behind a named function; :data:`PRIVATE_TORCH_ALLOWED`
  lists what must stay where it is, each with its reason.
- No module imports a module that imports it back (module-level cycles, lazy imports included;
  a submodule reading its own package's ``__init__`` is not a cycle).
- Training frameworks live behind one seam (``gbdoctor/frameworks/``): ``frameworks`` sits above
  ``setup``, ``capture``, ``causes``, ``models`` and ``records`` (it imports nothing else of
  gbdoctor, and they never import it); outside ``frameworks/`` no module imports a framework's
  own package (``deepspeed``, ``torchtitan``, ``gbdoctor.frameworks.<framework>``; the seam's
  ``interface``, ``registry`` and ``common`` are for everyone) and no code names a framework:
  a framework's name (each package under ``frameworks/``, a version suffix ``_v02`` aside)
  anywhere inside a string (``"deepspeed/runtime/zero/"``, ``"--torchtitan"``) or an identifier
  (``TorchtitanOpt``, ``DEEPSPEED``), in any case; docstrings and comments are prose.
  :data:`FRAMEWORK_ALLOWED` lists the places that must, each with its reason, and
  :data:`FRAMEWORK_NOT_MOVED` those whose framework knowledge has not moved behind the seam
  yet (``tools.layout_report`` counts them).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from repo_paths import REPO

PACKAGE = REPO / "gbdoctor"

COMMANDS = ("scan", "plan", "run", "price", "timeline", "gate", "cli")
DYNAMO_MODULES = ("torch._dynamo", "torch._logging")

PRIVATE_TORCH_HOMES = ("capture", "torch_compat")
"""Where torch's private API (``torch._X``) is used: ``capture/`` (Dynamo's internals) and
``torch_compat.py`` (features asked of the running torch)."""
PRIVATE_TORCH_ALLOWED = {
    # Simulation runs the setup under a FakeTensorMode: the mode, its tensor type and its escape
    # hatch are the mechanism itself, and torch has no public name for them.
    ("gbdoctor.scan.simulate", "torch._subclasses.fake_tensor"),
    # The op torchtitan's MoE calls (no public name); a wrapper function would add a frame to
    # every break location inside the experts.
    ("gbdoctor.models.moe", "torch._grouped_mm"),
}
"""(module, private torch name) pairs allowed outside :data:`PRIVATE_TORCH_HOMES` (see each
reason)."""


def framework_names(root: Path = PACKAGE) -> tuple[str, ...]:
    """Framework names (and their import packages) that only ``gbdoctor/frameworks/`` may use:
    its packages but ``common``, less a version suffix (``torchtitan_v02`` -> ``torchtitan``)."""
    packages = (p.parent.name for p in (root / "frameworks").glob("*/__init__.py"))
    return tuple(sorted({re.sub(r"_v\d+$", "", p) for p in packages if p != "common"}))


FRAMEWORK_SEAM = ("gbdoctor.frameworks.interface", "gbdoctor.frameworks.registry")
"""The seam every stage above ``frameworks`` may import, with ``gbdoctor.frameworks.common``."""
BELOW_FRAMEWORKS = (
    "records",
    "errors",
    "setup",
    "capture",
    "causes",
    "models",
    "usercode",
    "torch_compat",
)
"""Stages ``frameworks/`` may import (and which never import it)."""
FRAMEWORK_ALLOWED = {
    # `--version` prints the installed torchtitan's version and the releases tested with it.
    ("gbdoctor.cli.root", "gbdoctor.frameworks.torchtitan.config"),
    ("gbdoctor.cli.root", "torchtitan"),
    # The locator attributes a frame to the library whose files it is in (a hook component,
    # like fsdp or tp), which is not choosing a framework.
    ("gbdoctor.capture.locate", "deepspeed"),
    # JSON vocabulary: the default framework of a spec, plan and scan record (schema fields),
    # the DeepSpeed sections of a spec and a plan, and the DeepSpeed hook components; and the
    # stages that read those fields or components by name.
    ("gbdoctor.records", "deepspeed"),
    ("gbdoctor.records.spec", "torchtitan"),
    ("gbdoctor.records.spec", "deepspeed"),
    ("gbdoctor.records.plan", "torchtitan"),
    ("gbdoctor.records.plan", "deepspeed"),
    ("gbdoctor.records.scan", "torchtitan"),
    ("gbdoctor.records.enums", "deepspeed"),
    ("gbdoctor.scan.oracle", "deepspeed"),
    # The `deepspeed` launcher started this process (like torchrun or srun): how ranks join,
    # whichever framework trains.
    ("gbdoctor.launcher", "deepspeed"),
    # File format: a spec file is torchtitan v0.2.2's JobConfig TOML (plus [gbdoctor]), for every
    # framework; the loader's message about an unknown section names that schema.
    ("gbdoctor.spec", "torchtitan"),
}
"""(module, framework name or module) pairs allowed outside ``frameworks/`` (see each reason)."""
FRAMEWORK_NOT_MOVED: set[tuple[str, str]] = set()
"""(module, framework name) pairs whose framework knowledge has not moved behind the seam yet:
``tools.layout_report`` counts their modules, and none may join (issue 41: all have moved)."""


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=4096)
def _parsed_text(text: str) -> ast.Module:
    """The planted-violation tests check copies of the whole package that differ in one file:
    each file's tree is parsed once per text, not once per copy and pass (read-only use)."""
    return ast.parse(text)


def _parsed(path: Path) -> ast.Module:
    return _parsed_text(path.read_text(encoding="utf-8"))


def _imports(path: Path, root: Path) -> set[str]:
    """Absolute module names imported by ``path`` (relative imports resolved)."""
    tree = _parsed(path)
    me = _module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            # ``from gbdoctor import causes`` imports the submodule gbdoctor.causes
            out.update(f"{mod}.{alias.name}" for alias in node.names if mod == "gbdoctor")
    return out


def _dynamo_attributes(path: Path) -> set[str]:
    """``X`` of every ``torch._dynamo.X`` attribute access in ``path``."""
    tree = _parsed(path)
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "_dynamo"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "torch"
        ):
            out.add(node.attr)
    return out


def _private_torch(path: Path, root: Path) -> set[str]:
    """Private torch modules imported (``torch._X...``; a bare ``import torch._dynamo``, which
    reaches its configuration, is the Dynamo rule's) and ``torch._X`` attributes used."""
    tree = _parsed(path)
    out = {
        dep for dep in _imports(path, root) if dep.startswith("torch._") and dep != "torch._dynamo"
    }
    out.update(
        f"torch.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and node.attr != "_dynamo"
    )
    return out


def _graph(root: Path) -> dict[str, set[str]]:
    """Module -> gbdoctor modules it imports."""
    return {
        _module_name(p, root): {
            m for m in _imports(p, root) if m == "gbdoctor" or m.startswith("gbdoctor.")
        }
        for p in sorted(root.rglob("*.py"))
    }


def _stage(module: str) -> str:
    """``gbdoctor.scan.rank`` -> ``scan``; ``gbdoctor`` -> ``gbdoctor``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layering_violations(root: Path = PACKAGE) -> list[str]:
    """Every broken rule, one line each (empty when the layering holds)."""
    graph = _graph(root)
    problems = []
    for mod, deps in graph.items():
        stage = _stage(mod)
        for dep in sorted(deps):
            target = _stage(dep)
            if stage in ("records", "errors") and target not in ("records", "errors"):
                problems.append(f"{mod} imports {dep}: records/errors are the ground floor")
            if stage == "errors" and target != "errors":
                problems.append(f"{mod} imports {dep}: errors.py imports nothing from gbdoctor")
            if stage == "report" and target in COMMANDS:
                problems.append(f"{mod} imports {dep}: formatters import no command module")
            if target == "cli" and stage not in ("cli", "__main__"):
                problems.append(f"{mod} imports {dep}: nothing below the CLI imports cli/")
    for path in sorted(root.rglob("*.py")):
        mod = _module_name(path, root)
        if _stage(mod) != "cli":
            for dep in sorted(_imports(path, root)):
                if dep == "typer" or dep.startswith("typer."):
                    problems.append(f"{mod} imports {dep}: only cli/ uses typer")
    # Stage cycles (edges between different stages; the top-level package itself is skipped).
    edges: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        for dep in deps:
            a, b = _stage(mod), _stage(dep)
            if a != b and "gbdoctor" not in (a, b) and a != "__main__":
                edges.setdefault(a, set()).add(b)
    problems += [f"import cycle between stages: {' -> '.join(c)}" for c in _cycles(edges)]
    # Module cycles (a submodule importing from its own package's __init__ is not one).
    module_edges = {
        mod: {d for d in deps if d in graph and d != mod and not mod.startswith(d + ".")}
        for mod, deps in graph.items()
    }
    problems += [f"import cycle between modules: {' -> '.join(c)}" for c in _cycles(module_edges)]
    problems += _framework_violations(root, graph)
    # Dynamo: capture/, and torch_compat.py's settings accessor.
    for path in sorted(root.rglob("*.py")):
        mod = _module_name(path, root)
        if _stage(mod) in PRIVATE_TORCH_HOMES:
            continue
        for dep in sorted(_imports(path, root)):
            if any(dep == d or dep.startswith(d + ".") for d in DYNAMO_MODULES):
                problems.append(f"{mod} imports {dep}: only capture/ uses Dynamo internals")
        for attr in sorted(_dynamo_attributes(path)):
            problems.append(f"{mod} uses torch._dynamo.{attr}: only capture/ uses Dynamo internals")
    # Other private torch API.
    for path in sorted(root.rglob("*.py")):
        mod = _module_name(path, root)
        if _stage(mod) in PRIVATE_TORCH_HOMES:
            continue
        for name in sorted(_private_torch(path, root)):
            if (mod, name) not in PRIVATE_TORCH_ALLOWED:
                problems.append(
                    f"{mod} uses {name}: private torch API belongs in capture/ or torch_compat.py"
                )
    return problems


def _framework_violations(root: Path, graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for mod, deps in graph.items():
        stage = _stage(mod)
        for dep in sorted(deps):
            target = _stage(dep)
            if stage == "frameworks" and target not in (*BELOW_FRAMEWORKS, "frameworks"):
                problems.append(f"{mod} imports {dep}: frameworks/ sits below {target}")
            if target == "frameworks" and stage in BELOW_FRAMEWORKS:
                problems.append(f"{mod} imports {dep}: {stage}/ sits below frameworks/")
    names = framework_names(root)
    for path in sorted(root.rglob("*.py")):
        mod = _module_name(path, root)
        if _stage(mod) == "frameworks":
            continue
        for dep in sorted(_imports(path, root)):
            specific = dep.split(".")[0] in names or (
                dep.startswith("gbdoctor.frameworks.")
                and not dep.startswith(FRAMEWORK_SEAM + ("gbdoctor.frameworks.common",))
            )
            if specific and (mod, dep) not in FRAMEWORK_ALLOWED:
                problems.append(f"{mod} imports {dep}: only frameworks/ names a framework")
        for name in sorted(framework_mentions(path, names)):
            if (mod, name) not in FRAMEWORK_ALLOWED | FRAMEWORK_NOT_MOVED:
                problems.append(f"{mod} names framework {name!r}: only frameworks/ does")
    return problems


def _code_words(tree: ast.AST) -> list[str]:
    """Every string of code in ``tree``: string constants (not docstrings: prose), names,
    attributes, definitions, arguments, keywords and import aliases."""
    docstrings = _docstrings(tree)
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append(node.name)
        elif isinstance(node, ast.arg):
            words.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            words.append(node.arg)
        elif isinstance(node, ast.alias):
            words += [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.append(node.module)
    return words


def framework_mentions(path: Path, names: tuple[str, ...]) -> set[str]:
    """The framework ``names`` that code in ``path`` spells, inside a string or an identifier,
    in any case (``"deepspeed/runtime/zero/"``, ``TorchtitanOpt``)."""
    tree = _parsed(path)
    text = "\n".join(_code_words(tree)).lower()
    return {name for name in names if name in text}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants in ``tree`` (docstrings are prose, not code)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # Attribute docstrings (a string statement after an assignment) are prose too.
    docstrings |= {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return docstrings


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One representative cycle per strongly connected component with more than one node."""
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def test_layering_holds():
    assert layering_violations() == []


def test_expected_stage_packages_exist():
    for stage in (
        "records",
        "capture",
        "causes",
        "scan",
        "plan",
        "run",
        "price",
        "timeline",
        "report",
        "setup",
        "models",
        "gate",
        "cli",
        "frameworks",
    ):
        assert (PACKAGE / stage / "__init__.py").is_file(), stage
    assert (PACKAGE / "__init__.py").is_file()  # a regular package, not a namespace package


@pytest.mark.parametrize(
    ("where", "code", "expected"),
    [
        ("records/bad.py", "from gbdoctor.summary import summarize\n", "ground floor"),
        (
            "report/bad.py",
            "def f():\n    from gbdoctor.gate import check_gate\n",
            "no command module",
        ),
        ("causes/bad.py", "from gbdoctor.scan import scan\n", "import cycle"),
        ("scan/bad.py", "from gbdoctor.cli.output import emit\n", "below the CLI"),
        ("plan/bad.py", "import typer\n", "only cli/ uses typer"),
        ("scan/bad.py", "from torch._dynamo.utils import counters\n", "Dynamo internals"),
        (
            "plan/bad.py",
            "import torch._dynamo\nx = torch._dynamo.utils.counters\n",
            "Dynamo internals",
        ),
        ("plan/bad.py", "from torch._subclasses import FakeTensor\n", "private torch API"),
        ("setup/bad.py", "import torch\nx = torch._C._get_tracing_state\n", "private torch API"),
        (
            "frameworks/common/plan.py",
            "from gbdoctor.frameworks.torchtitan_v02.plan import block_plan_strategy\n",
            "between modules",
        ),
        (
            "scan/bad.py",
            'def f(spec):\n    return spec.framework == "deepspeed"\n',
            "names framework",
        ),
        ("run/bad.py", "def f():\n    import deepspeed\n", "only frameworks/ names"),
        ("scan/bad.py", 'ZERO_FILE = r"deepspeed/runtime/zero/"\n', "names framework 'deepspeed'"),
        ("cli/bad.py", "class TorchtitanOpt:\n    pass\n", "names framework 'torchtitan'"),
        ("run/bad.py", "def f(x):\n    return x.DEEPSPEED\n", "names framework 'deepspeed'"),
        (
            "plan/bad.py",
            "def f():\n    import torch._dynamo\n\n    return torch._dynamo.config\n",
            "imports torch._dynamo: only capture/",
        ),
        ("setup/bad.py", "import torch\n\n\ndef f():\n    torch._dynamo.reset()\n", "Dynamo"),
        (
            "plan/bad.py",
            "from gbdoctor.frameworks.deepspeed.plan import propose_deepspeed_plan\n",
            "only frameworks/ names",
        ),
        ("frameworks/bad.py", "from gbdoctor.scan import scan\n", "frameworks/ sits below"),
        (
            "setup/bad.py",
            "from gbdoctor.frameworks import framework_for\n",
            "sits below frameworks",
        ),
    ],
)
def test_a_planted_violation_is_caught(tmp_path, where, code, expected):
    """The check can fail: copy the package, plant one violation, expect it reported."""
    import shutil

    root = tmp_path / "gbdoctor"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / where).write_text(code)
    problems = layering_violations(root)
    assert any(expected in p for p in problems), problems


def _planted_copy(tmp_path, files: dict[str, str]) -> list[str]:
    import shutil

    root = tmp_path / "gbdoctor"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    for where, code in files.items():
        (root / where).parent.mkdir(parents=True, exist_ok=True)
        (root / where).write_text(code)
    return layering_violations(root)


def test_a_new_framework_package_is_a_name_only_it_may_use(tmp_path):
    """Framework names come from ``frameworks/``'s packages: a new one is covered at once."""
    problems = _planted_copy(
        tmp_path,
        {
            "frameworks/acme_v1/__init__.py": "NAME = 'acme'\n",
            "run/bad.py": "def f(spec):\n    return spec.framework == 'Acme-Train'\n",
        },
    )
    assert "gbdoctor.run.bad names framework 'acme': only frameworks/ does" in problems


def test_prose_naming_a_framework_is_not_code(tmp_path):
    code = '"""Set up as DeepSpeed does."""\n\n\ndef f():\n    """torchtitan\'s order."""\n'
    code += "    # deepspeed/runtime/zero/\n    return 1\n"
    assert _planted_copy(tmp_path, {"scan/prose.py": code}) == []
