"""``docs/results.md`` and ``docs/results-family.md`` quote the studies' output files, and nothing else.

The page's tables are generated blocks (``diloco.tools.studies.results_page``) rendered from
``docs/assets/results/<study>-<task>.json``, the summaries that ``diloco study <study>
--data <task> --export docs/assets/results`` writes. These tests render every block again
and require the page to hold exactly that; require the command that produced each block
beside it, with the seeds and budget the summary records; require each headline claim's
plot against tokens (``claim_curves.MLP_HEADLINE``) beside its study; and require every measured
number the prose quotes (three decimals or more, as the tables print them; settings such as
lr 0.7 have fewer) to be one that a generated block on the page shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diloco.tools.studies.claim_curves import MLP_HEADLINE, headline_claims
from diloco.tools.studies.make_results import JOBS, command_of
from diloco.tools.studies.paper_studies import TASKS as TASK_DEFAULTS
from diloco.tools.studies.results_page import (
    BLOCK,
    FAMILY_ORDER,
    ORDER,
    STUDY_TASKS,
    TASKS,
    block_names,
    load_summaries,
    rebuild,
    render_block,
)

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results.md"
FAMILY_PAGE = ROOT / "docs" / "results-family.md"
RESULTS = ROOT / "docs" / "assets" / "results"
COMMANDS = {job.name: command_of(job) for job in JOBS}


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def family_page() -> str:
    return FAMILY_PAGE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def summaries() -> dict:
    return load_summaries(RESULTS)


def test_every_generated_block_equals_its_rendering_from_the_files(page, summaries):
    names = block_names(page)
    assert "paper" in names and "compute" in names and "similarity" in names
    for match in BLOCK.finditer(page):
        assert match.group("body") == render_block(match.group("name"), summaries), (
            f"block {match.group('name')} differs from the files: run python -m diloco.tools.studies.results_page")
    assert rebuild(page, summaries) == page


def test_the_family_page_holds_exactly_the_renderings_of_its_files(family_page, summaries):
    names = block_names(family_page)
    assert {f"family-{study}" for study in FAMILY_ORDER} | {"family-compute"} <= set(names)
    for match in BLOCK.finditer(family_page):
        assert match.group("body") == render_block(match.group("name"), summaries), (
            f"block {match.group('name')} differs from the files: run python -m diloco.tools.studies.results_page "
            "docs/results-family.md")
    for study in FAMILY_ORDER:
        assert ("family", study) in summaries, f"docs/assets/results/family-{study}.json is missing"
        section = _section_before(family_page, f"family-{study}")
        assert COMMANDS[f"family-{study}"] in section, f"family-{study}: the make results command is not beside it"
        assert f"assets/results/family-{study}.png" in family_page


def test_every_page_command_is_a_make_results_command_and_every_one_is_on_its_page(page, family_page):
    shown = set(re.findall(r"^\.venv/bin/diloco study .*$", page + "\n" + family_page, re.M))
    assert shown == set(COMMANDS.values()), (
        f"not in make results: {sorted(shown - set(COMMANDS.values()))}; "
        f"not on a page: {sorted(set(COMMANDS.values()) - shown)}")


def test_every_study_and_task_has_its_block_its_file_and_its_plot(page, summaries):
    names = set(block_names(page))
    for study in ORDER:
        for task in STUDY_TASKS[study]:
            assert f"{study}-{task}" in names, f"the page has no block {study}-{task}"
            assert (study, task) in summaries, f"docs/assets/results/{study}-{task}.json is missing"
            assert f"assets/results/{study}-{task}.png" in page and (RESULTS / f"{study}-{task}.png").exists()


def test_every_headline_claim_has_its_plot_beside_its_study_and_its_costs_block(page, summaries):
    names = set(block_names(page))
    for task in TASKS:
        assert f"costs-{task}" in names, f"the page has no block costs-{task}"
        places = headline_claims(summaries, MLP_HEADLINE, task)
        assert [study for study, _, _ in places] == [study for study, _ in MLP_HEADLINE], (
            f"{task}: a headline claim of claim_curves.MLP_HEADLINE is not in its study's summary")
        for study, summary, index in places:
            assert all(row.get("per_seed_curve") for row in summary["rows"]), f"{study}-{task}: no per_seed_curve"
            name = f"{study}-{task}-claim{index}.png"
            assert (RESULTS / name).exists(), f"{name} is missing: python -m diloco.tools.studies.claim_curves"
            end = page.index(f"<!-- end: {study}-{task} -->")
            beside = page[end:page.find("\n## ", end)]
            assert f"](assets/results/{name})" in beside, f"{name} is not shown beside block {study}-{task}"


def _section_before(page: str, name: str) -> str:
    start = page.index(f"<!-- generated: {name} -->")
    heading = page.rindex("\n## ", 0, start)
    return page[heading:start]


def test_each_block_has_the_command_that_made_it_beside_it(page, summaries):
    for key, summary in summaries.items():
        if not isinstance(key, tuple) or key[0] == "family":
            continue
        study, task = key
        section = _section_before(page, f"{study}-{task}")
        commands = re.findall(rf"^(?:\.venv/bin/)?diloco study {study} --data {task}\b.*$", section, re.M)
        assert len(commands) == 1, f"{study}-{task}: one command 'diloco study {study} --data {task} ...' expected"
        command = commands[0]
        assert "--export docs/assets/results" in command
        seeds = re.search(r"--seeds (\d+)", command)
        assert seeds and int(seeds.group(1)) == len(summary["seeds"]), f"{study}-{task}: --seeds"
        steps = re.search(r"--total-steps (\d+)", command)
        given = int(steps.group(1)) if steps else TASK_DEFAULTS[task]["steps"]
        assert given == summary["steps_per_worker"], f"{study}-{task}: the command's budget is not the file's"
        assert command == COMMANDS[f"{study}-{task}"], f"{study}-{task}: not the command make results runs"


NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d{3,}(?![\w.])")


def _prose(page: str) -> str:
    text = BLOCK.sub("", page)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"\\\(.*?\\\)", "", text, flags=re.S)  # inline maths: notation, not results
    text = re.sub(r"arXiv:? ?\d{4}\.\d{4,5}", "", text)  # paper identifiers, not results
    return re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)


@pytest.mark.parametrize("which", ["results", "family"])
def test_every_number_in_the_prose_is_one_the_tables_show(which, page, family_page):
    text = page if which == "results" else family_page
    generated = "".join(match.group("body") for match in BLOCK.finditer(text))
    shown = set(NUMBER.findall(generated))
    loose = sorted(set(NUMBER.findall(_prose(text))) - shown)
    assert not loose, f"numbers in the prose that no generated table on the page shows: {loose}"


BEYOND_PAGE = ROOT / "docs" / "results-beyond.md"
# The beyond page's block names may hold a dot (beyond-async-shakespeare-spread0.5).
BEYOND_BLOCK = re.compile(r"<!-- generated: (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- end: (?P=name) -->", re.S)


def _beyond_rebuilt(text: str) -> str:
    """The beyond page with every block of its three studies rendered again from the files (the one renderer)."""
    return rebuild(text, load_summaries(RESULTS))


def test_the_beyond_page_holds_exactly_the_renderings_of_its_files_and_their_commands():
    text = BEYOND_PAGE.read_text(encoding="utf-8")
    names = [match.group("name") for match in BEYOND_BLOCK.finditer(text)]
    unknown = [n for n in names if not n.startswith(("beyond-async", "beyond-sparse-", "beyond-muon-"))]
    assert not unknown, f"generated blocks no renderer owns: {unknown}"
    assert {"beyond-async", "beyond-sparse-shakespeare", "beyond-muon-claims"} <= set(names)
    assert _beyond_rebuilt(text) == text, "a block differs from the files: rebuild docs/results-beyond.md"
    for path in sorted(RESULTS.glob("beyond-*.json")):
        command = __import__("json").loads(path.read_text(encoding="utf-8"))["command"]
        shown = command if command.startswith(".venv/bin/") else f".venv/bin/{command}"
        assert shown in text, f"{path.name}: the command that wrote it, {shown!r}, is not on the page"


def test_every_number_in_the_beyond_prose_is_one_its_tables_show():
    text = BEYOND_PAGE.read_text(encoding="utf-8")
    generated = "".join(match.group("body") for match in BEYOND_BLOCK.finditer(text))
    prose = _prose(BEYOND_BLOCK.sub("", text))
    loose = sorted(set(NUMBER.findall(prose)) - set(NUMBER.findall(generated)))
    assert not loose, f"numbers in the beyond page's prose that no generated table on it shows: {loose}"
