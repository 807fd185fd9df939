"""The README and docs/ stay true to the code (docs/testing.md, "Keeping the docs true").

- The README is a front door: at most 300 lines; every relative link in it and in docs/ resolves.
- Every ``gbdoctor ...`` command in a fenced shell block parses against the real CLI: an unknown
  command or option, a bad choice or a missing argument fails. Only a path that does not exist
  here (``configs/llama4.toml``, the reader's own files) is accepted.
- A fenced block introduced by ``<!-- output-of: COMMAND -->`` is real output: the command runs
  and every line of the block appears in its stdout, in order.
- ``.ci/run`` begins with the README's install and test commands, verbatim, so CI runs what a
  new user runs.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import typer.main
from cli_runs import Child
from repo_paths import REPO

from gbdoctor.cli import app

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
# typer vendors click (``typer._click``) in recent releases and uses the real package in older
# ones: reach click's base exception through a public class, as gbdoctor/cli does.
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
OUTPUT_MARKER = re.compile(r"<!--\s*output-of(?:\[(?P<extra>\w+)\])?:\s*(?P<command>.+?)\s*-->")
ELISION = re.compile(r"^[|\s]*\.\.\.[|\s]*$")
"""An excerpt line that stands for lines left out (``...`` or ``| ... |``)."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    lines: tuple[str, ...]
    output_of: str | None
    """The command whose output this block quotes (the ``output-of`` comment above it)."""
    extra: str | None = None
    """The optional extra that command needs (``<!-- output-of[deepspeed]: ... -->``)."""


def _blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        above = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = OUTPUT_MARKER.search(above)
        blocks.append(
            Block(
                page,
                start + 1,
                fence.group(2),
                tuple(body),
                marker.group("command") if marker else None,
                marker.group("extra") if marker else None,
            )
        )
        i += 1
    return blocks


def _gbdoctor_invocations(line: str) -> list[list[str]]:
    """The arguments of every ``gbdoctor`` (or ``python -m gbdoctor``) call in one shell line:
    split at ``&&``, ``||``, ``|`` and ``;``; redirections and leading ``VAR=value`` dropped."""
    lexer = shlex.shlex(line.strip().removeprefix("$ "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    calls: list[list[str]] = [[]]
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        if tokens[i] in ("&&", "||", "|", ";"):
            calls.append([])
        elif tokens[i] in (">", ">>", "<", "2>"):
            i += 1  # skip the redirection's target too
        else:
            calls[-1].append(tokens[i])
        i += 1
    found = []
    for words in calls:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        if words[:3] == ["python", "-m", "gbdoctor"]:
            words = ["gbdoctor", *words[3:]]
        if words and words[0] == "gbdoctor":
            found.append(words[1:])
    return found


def _shell_commands(block: Block) -> list[list[str]]:
    """``gbdoctor`` invocations in a shell block (continuation lines joined)."""
    text = "\n".join(block.lines).replace("\\\n", " ")
    return [call for line in text.splitlines() for call in _gbdoctor_invocations(line)]


def parse_command(args: list[str]) -> None:
    """Parse ``gbdoctor ARGS`` with the real CLI without running it; raise click's error."""
    root = typer.main.get_command(app)
    try:
        ctx = root.make_context("gbdoctor", list(args))
        # click >= 8.2 keeps the subcommand's name in ``_protected_args``; older click public
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
        if not [*protected, *ctx.args]:
            return  # app options only (gbdoctor --version)
        _name, command, rest = root.resolve_command(ctx, [*protected, *ctx.args])
        assert command is not None
        sub = command.make_context(command.name or "", rest, parent=ctx)
    except typer.Exit:  # --version / --help: parsed, then exits by design
        return
    except typer.BadParameter as exc:
        if "does not exist" in exc.format_message():
            return  # a file on the reader's machine (configs/llama4.toml, plan.json, ...)
        raise
    # ``scan`` passes unknown options through as a framework's own arguments (torchtitan's
    # overrides, accelerate's --model); without its run option the command refuses them when it
    # runs, so they are unknown options here too.
    # (Each framework run option is a ``registry_run_N`` parameter: cli.options.with_registry_runs.)
    passthrough = any(
        name.startswith("registry_run") and value is not None for name, value in sub.params.items()
    )
    for value in sub.params.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item.startswith("-") and not passthrough:
                raise ClickException(f"no such option: {item}")


def _inline_commands(page: Path) -> list[tuple[int, list[str]]]:
    """``gbdoctor ...`` code spans in prose, outside fenced blocks. A span that names its
    command by a placeholder (``gbdoctor COMMAND --help``) is a template, not a command."""
    found, fenced, generated = [], False, False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        # architecture.md's module index quotes docstrings (with placeholders such as PCT):
        # tests/test_architecture_doc.py generates and checks it.
        if line.startswith("<!-- module-index:"):
            generated = line.startswith("<!-- module-index:begin")
            continue
        if fenced or generated:
            continue
        for span in re.findall(r"`((?:python -m )?gbdoctor(?: [^`]*)?)`", line):
            for args in _gbdoctor_invocations(span):
                args = [word for word in args if word != "..."]
                words = [word for word in args if not word.startswith("-")]
                if not args or (words and words[0].isupper()):
                    continue
                if len(words) == 1 and args == words:  # `gbdoctor plan`: the command's name
                    args = [*args, "--help"]
                found.append((number, args))
    return found


def _documented_commands() -> list[tuple[str, list[str]]]:
    out = []
    for page in PAGES:
        where = page.relative_to(REPO)
        for block in _blocks(page):
            if block.language in SHELL_LANGUAGES and block.output_of is None:
                out += [(f"{where}:{block.line}", args) for args in _shell_commands(block)]
        out += [(f"{where}:{number}", args) for number, args in _inline_commands(page)]
    return out


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference text to docs/"
    headings = [line for line in lines if line.startswith("## ")]
    for needed in ("## Install", "## Run it on a bundled spec", "## Run the tests", "## Commands"):
        assert needed in headings, f"README.md lost its {needed!r} section"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links to missing files {broken}"


CODE_PATH = re.compile(
    r"`([A-Za-z0-9_./-]+/[A-Za-z0-9_.-]+\.(?:py|toml|json|md))(?::\d+(?:-\d+)?)?`"
)
"""A file path in backticks (``gbdoctor/models/moe.py``, ``fixtures/llama4_debug.toml:12``)."""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_code_paths_named_in_docs_exist(page: Path) -> None:
    """A path that names one of this repository's files exists (relative to the repository,
    ``gbdoctor/`` or ``tests/``): files move, and prose that points at the old place lies. A
    path whose first part is none of this repository's folders is another library's
    (``torch/_dynamo/...``, ``deepspeed/runtime/engine.py``) and is not checked."""
    bases = (REPO, REPO / "gbdoctor", REPO / "tests")
    ours = {entry.name for base in bases for entry in base.iterdir() if entry.is_dir()}
    missing = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for path in CODE_PATH.findall(line):
            if path.split("/", 1)[0] not in ours:
                continue
            if not any((base / path).exists() for base in bases):
                missing.append(f"{page.relative_to(REPO)}:{number}: {path}")
    assert not missing, "docs name files that do not exist:\n" + "\n".join(missing)


def test_every_documented_command_parses() -> None:
    commands = _documented_commands()
    assert len(commands) >= 10, "the command extraction found almost nothing: is it broken?"
    os.chdir(REPO)  # documented paths are relative to the repository
    failures = []
    for where, args in commands:
        try:
            parse_command(args)
        except ClickException as exc:
            failures.append(f"{where}: gbdoctor {shlex.join(args)}: {exc.format_message()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "args",
    [
        ["scan", "fixtures/llama3_debug.toml", "--no-such-option"],
        ["scna", "fixtures/llama3_debug.toml"],
        ["scan", "fixtures/llama3_debug.toml", "--world-size", "zero"],
        ["diff", "fixtures/scans/llama4_before.json"],
    ],
    ids=["unknown-option", "unknown-command", "bad-value", "missing-argument"],
)
def test_the_command_check_can_fail(args, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ClickException):
        parse_command(args)


def _fenced(heading: str) -> list[str]:
    """The command lines of the first fenced block under the README's ``heading``."""
    text = README.read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1]
    block = re.search(r"```\w*\n(.*?)\n```", section, re.S)
    assert block, f"no fenced block under {heading!r}"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_ci_starts_with_the_readme_install_and_test_commands() -> None:
    front_door = _fenced("## Install") + _fenced("## Run the tests")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [line for line in ci if line.strip() and not line.lstrip().startswith("#")]
    preamble = ["set -euo pipefail", 'cd "$(dirname "$0")/.."']
    assert commands[: len(preamble)] == preamble, commands[:3]
    assert commands[len(preamble) : len(preamble) + len(front_door)] == front_door, (
        ".ci/run must begin with the README's install and test commands, verbatim:\n"
        + "\n".join(front_door)
    )


def _output_blocks() -> list[Block]:
    return [block for page in PAGES for block in _blocks(page) if block.output_of]


def _output_params() -> list:
    return [
        pytest.param(
            block,
            marks=[pytest.mark.extra(block.extra)] if block.extra else [],
            id=f"{block.page.relative_to(REPO)}:{block.line}",
        )
        for block in _output_blocks()
    ]


def test_output_excerpts_are_marked() -> None:
    assert _output_blocks(), "the README's real-output excerpt lost its output-of marker"


@pytest.fixture(scope="session")
def excerpt_scans(tmp_path_factory) -> Path:
    """Where the excerpts' commands share their scans: the README and docs/report.md show the
    same scan as markdown and as a table; it runs once (``cli_runs.Child``'s ``shared_scans``:
    the same spec, options and environment), and each command renders and prints its own."""
    return tmp_path_factory.mktemp("excerpt-scans")


@pytest.mark.slow
@pytest.mark.parametrize("block", _output_params())
def test_output_excerpt_is_real_output(block: Block, excerpt_scans: Path) -> None:
    args = shlex.split(block.output_of)
    assert args[0] == "gbdoctor", block.output_of
    # A process of its own, forked from a server that imported the CLI once (tests/cli_runs.py).
    done = Child(*args[1:], cwd=REPO, shared_scans=excerpt_scans).wait(timeout=900)
    assert done.returncode == 0, done.stderr
    missing = first_missing_line(block.lines, done.stdout)
    assert missing is None, (
        f"{block.page.relative_to(REPO)}:{block.line}: not in the output of "
        f"`{block.output_of}` (in order): {missing!r}\n--- output ---\n{done.stdout}"
    )


def first_missing_line(excerpt: tuple[str, ...] | list[str], output: str) -> str | None:
    """The first excerpt line not found in ``output`` after the previous one, else None."""
    produced = iter(output.splitlines())
    for line in excerpt:
        if not ELISION.match(line) and not any(line == out for out in produced):
            return line
    return None


def test_the_excerpt_check_can_fail() -> None:
    output = "a\nb\nc\n"
    assert first_missing_line(["a", "...", "c"], output) is None
    assert first_missing_line(["c", "a"], output) == "a"  # order matters
    assert first_missing_line(["a", "b2"], output) == "b2"
