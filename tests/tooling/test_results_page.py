"""``docs/results.md`` quotes the studies' output files, and nothing else.

The page's tables are generated blocks (``diloco.tools.studies.results_page``) rendered from
``docs/assets/results/<study>-<task>.json``, the summaries that ``diloco study <study>
--data <task> --export docs/assets/results`` writes. These tests render every block again
and require the page to hold exactly that; require the command that produced each block
beside it, with the seeds and budget the summary records; and require every measured
number the prose quotes (three decimals or more, as the tables print them; settings such as
lr 0.7 have fewer) to be one that a generated block on the page shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diloco.tools.studies.paper_studies import TASKS as TASK_DEFAULTS
from diloco.tools.studies.results_page import BLOCK, ORDER, TASKS, block_names, load_summaries, rebuild, render_block

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results.md"
RESULTS = ROOT / "docs" / "assets" / "results"


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


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


def test_every_study_and_task_has_its_block_its_file_and_its_plot(page, summaries):
    names = set(block_names(page))
    for study in ORDER:
        for task in TASKS:
            assert f"{study}-{task}" in names, f"the page has no block {study}-{task}"
            assert (study, task) in summaries, f"docs/assets/results/{study}-{task}.json is missing"
            assert f"assets/results/{study}-{task}.png" in page and (RESULTS / f"{study}-{task}.png").exists()


def _section_before(page: str, name: str) -> str:
    start = page.index(f"<!-- generated: {name} -->")
    heading = page.rindex("\n## ", 0, start)
    return page[heading:start]


def test_each_block_has_the_command_that_made_it_beside_it(page, summaries):
    for (study, task), summary in summaries.items():
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


NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d{3,}(?![\w.])")


def _prose(page: str) -> str:
    text = BLOCK.sub("", page)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"\\\(.*?\\\)", "", text, flags=re.S)  # inline maths: notation, not results
    return re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)


def test_every_number_in_the_prose_is_one_the_tables_show(page):
    generated = "".join(match.group("body") for match in BLOCK.finditer(page))
    shown = set(NUMBER.findall(generated))
    loose = sorted(set(NUMBER.findall(_prose(page))) - shown)
    assert not loose, f"numbers in the prose that no generated table on the page shows: {loose}"
