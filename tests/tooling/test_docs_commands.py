"""Every page and notebook prints commands that run as printed, and the CLI commands parse.

``test_doc_drift.py`` checks the learner's files; this extends the same rule to every docs
page (the instructor guide's code blocks; its prose names the commands) and to the
notebooks' Markdown, and parses every ``.venv/bin/diloco ...`` command shown anywhere with
the real parser, so a flag that was renamed, or an abbreviation the parser no longer
accepts (``allow_abbrev=False``), fails here. Each sub-command shown is run with ``--help``
through the program as printed, and no command names a time-stamped run folder that
existed only on the machine that wrote the page. No notebook tells anyone to execute a
tracked notebook in place.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_doc_drift import FENCE, SHELL, commands, needs_activation  # noqa: E402  (the shared Markdown scanner)

from diloco.tools.cli.main import build_parser  # noqa: E402

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md",
                *(p for p in DOCS.rglob("*.md") if p.name not in ("instructor-guide.md", "TEMPLATE.md"))])
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAKE_NOTEBOOKS = ROOT / "scripts" / "make_notebooks.py"


INSTRUCTOR_GUIDE = DOCS / "instructor-guide.md"  # its prose names commands; its code blocks are run


def code_blocks(text: str, languages=None) -> str:
    """``text`` with everything outside its fenced blocks (of ``languages``, default all) blanked."""
    kept, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = (match.group(1), languages is None or match.group(2) in languages)
            kept.append(line)
        elif fence is not None and line.strip().startswith(fence[0]):
            fence = None
            kept.append(line)
        else:
            kept.append(line if fence is not None and fence[1] else "")
    return "\n".join(kept)


def notebook_markdown(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def shown_commands():
    """``(where, command)`` for every command the pages and notebooks show."""
    for path in PAGES:
        for line, command in commands(path.read_text(encoding="utf-8")):
            yield f"{path.relative_to(ROOT)}:{line}", command
    for path in NOTEBOOKS:
        for line, command in commands(notebook_markdown(path)):
            yield f"{path.relative_to(ROOT)} (markdown):{line}", command
    for line, command in commands(code_blocks(INSTRUCTOR_GUIDE.read_text(encoding="utf-8"))):
        yield f"{INSTRUCTOR_GUIDE.relative_to(ROOT)}:{line}", command


def shown_errors() -> set:
    """``where`` of every ``$ command`` a page shows failing on purpose (its next line is an error)."""
    found = set()
    for path in PAGES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, (line, after) in enumerate(zip(lines, lines[1:] + [""], strict=True), start=1):
            if line.startswith("$ ") and re.match(r"diloco [\w ]*: error: ", after):
                found.add(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_every_page_and_notebook_prints_runnable_commands():
    bad = [f"{where}: {command}" for where, command in shown_commands() if needs_activation(command)]
    assert not bad, "write `.venv/bin/PROGRAM ...` or a make target instead of:\n  " + "\n  ".join(bad)


PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\.\.\.|<|\[")  # NAME, COMMAND, DIR, ..., <x>, [--flag]


def cli_arguments(command: str) -> list[str] | None:
    """The argument list of a shown ``.venv/bin/diloco ...`` command, or None for another
    command, a placeholder (``NAME``, ``...``) or ``--help``."""
    command = command.strip().removeprefix("$ ")
    if not command.startswith(".venv/bin/diloco "):
        return None
    rest = command.removeprefix(".venv/bin/diloco ")
    if PLACEHOLDER.search(rest) or "--help" in rest:
        return None
    try:
        argv = shlex.split(rest.replace("\\|", "|"))
    except ValueError:
        return None
    if argv in (["study"], ["workspace"]):  # the command named in prose, its NAME or ACTION left out
        return None
    return argv


def alternatives(argv: list[str]) -> list[list[str]]:
    """``train --algo diloco|sync`` stands for two commands: one per alternative."""
    for i, word in enumerate(argv):
        if "|" in word:
            return [alt for choice in word.split("|") for alt in alternatives([*argv[:i], choice, *argv[i + 1:]])]
    return [argv]


def test_every_shown_diloco_command_parses():
    parser, errors = build_parser(), shown_errors()
    checked, bad = 0, []
    for where, command in shown_commands():
        argv = cli_arguments(command)
        if argv is None or where in errors:
            continue
        for variant in alternatives(argv):
            checked += 1
            try:
                parser.parse_args(variant)
            except SystemExit:
                bad.append(f"{where}: {command} ({' '.join(variant)})")
    assert checked >= 20, f"only {checked} diloco commands found: is the scanner still reading the pages?"
    assert not bad, "these commands do not parse (a renamed or abbreviated flag?):\n  " + "\n  ".join(bad)


# A run folder named by its time stamp in a command to type: it exists only on the machine that made it.
STAMPED_RUN = re.compile(r"runs/\d{8}-\d{6}-|runs/\d{8}-\.\.\.")


def test_no_command_to_type_names_a_run_folder_that_only_existed_once():
    bad = []
    for path in [*PAGES, INSTRUCTOR_GUIDE]:
        shell = code_blocks(path.read_text(encoding="utf-8"), SHELL)
        bad += [f"{path.relative_to(ROOT)}:{n}: {c}" for n, c in commands(shell) if STAMPED_RUN.search(c)]
    assert not bad, "name the run folder so the command runs anywhere (the newest: \"$(ls -d runs/*-train-diloco " \
                    "| tail -n 1)\"):\n  " + "\n  ".join(bad)


def test_every_shown_diloco_program_and_sub_command_runs_with_help():
    """The program as the pages print it (``.venv/bin/diloco``), from the project root, with each
    sub-command they show: it exists and starts (``--help``, exit 0)."""
    script = Path(sys.executable).parent / "diloco"
    if script.resolve() != (ROOT / ".venv" / "bin" / "diloco").resolve():
        pytest.skip("the tests do not run from the project's own .venv")
    shown = set()
    for _, command in shown_commands():
        argv = cli_arguments(command)
        if argv:
            words = [w for w in argv[:2] if not w.startswith("-")][:2]
            shown.add(tuple(words[:2] if words[:1] == ["workspace"] else words[:1]))
    assert {("train",), ("compare",), ("study",), ("grade",), ("workspace", "create")} <= shown, shown
    for words in sorted(shown):
        proc = subprocess.run([".venv/bin/diloco", *words, "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: diloco"), (words, proc.stderr)


def test_the_parse_check_catches_an_abbreviation(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(cli_arguments(".venv/bin/diloco compare --round 3"))
    assert "did you mean --rounds?" in capsys.readouterr().err


def test_nothing_suggests_executing_a_tracked_notebook_in_place():
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in PAGES}
    texts.update({str(p.relative_to(ROOT)): notebook_markdown(p) for p in NOTEBOOKS})
    texts["scripts/make_notebooks.py"] = MAKE_NOTEBOOKS.read_text(encoding="utf-8")
    template = ROOT / "src" / "diloco" / "tools" / "workspace" / "workspace_template" / "README.md"
    texts[str(template.relative_to(ROOT))] = template.read_text(encoding="utf-8")
    bad = [name for name, text in texts.items() if re.search(r"jupyter\s+(execute|nbconvert)\b[^\n`]*--inplace", text)]
    assert not bad, f"--inplace rewrites a tracked notebook (git shows it modified): {bad}"


def test_make_notebooks_writes_executed_copies_under_build():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile[makefile.index("\nnotebooks:"):]
    recipe = recipe[:recipe.index("\n\n")]
    assert "jupyter execute" in recipe and '--output="../build/notebooks/' in recipe and "--inplace" not in recipe
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make notebooks" in readme and "--inplace" not in readme
