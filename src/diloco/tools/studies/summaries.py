"""The studies' exported summaries, as the results pages read them.

``load_summaries(directory)`` reads every ``<study>-<task>.json`` (and ``family-<study>.json``,
``beyond-<study>-<task>.json``, ``make-results.json``) of a results folder, each paper claim's
verdict judged again by today's rule.
``ORDER``, ``TRANSFORMER_ORDER`` and ``FAMILY_ORDER`` name the studies of
``docs/results.md``, ``docs/results-transformer.md`` and ``docs/results-family.md``.
The page renderer (``results_page``) and the claims' plots (``claim_curves``) both read them
from here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from diloco.tools.studies.paper_report import verdict
from diloco.tools.studies.paper_studies import claim_setting

__all__ = ["ORDER", "TRANSFORMER_ORDER", "TASKS", "STUDY_TASKS", "FAMILY_ORDER", "load_summaries", "exports",
           "block_pattern", "fill_blocks", "missing_block"]

ORDER = ["table2", "fig4", "fig6", "table3", "fig8", "fig9", "splits", "scaling"]
# docs/results-transformer.md: the same summaries' names in their own folder (assets/results/transformer)
TRANSFORMER_ORDER = ["table2", "fig9", "splits", "inner-muon", "fragments"]
TASKS = ["shakespeare", "mnist1d"]
STUDY_TASKS = {study: TASKS for study in ORDER} | {"scaling": ["shakespeare"]}  # what make results runs
FAMILY_ORDER = ["compression", "streaming", "bandwidth"]  # docs/results-family.md: family-<study>.json


def load_summaries(directory) -> dict:
    """``{(study, task): summary}`` for every ``<study>-<task>.json`` in ``directory``.

    Each claim's verdict is judged again from its stored paired interval by today's rule
    (``paper_report.verdict``), so a file written under an older vocabulary renders in the
    page's words, and its text names non-IID shards as ``paper_studies.claim_setting`` does.
    A ``beyond-*.json`` (``docs/results-beyond.md``) is kept under its name (``exports``).
    """
    summaries = {}
    record = Path(directory) / "make-results.json"
    if record.is_file():
        summaries["make-results"] = json.loads(record.read_text(encoding="utf-8"))
    for path in sorted(Path(directory).glob("*.json")):
        study, _, task = path.stem.rpartition("-")
        if path.stem.startswith("beyond-"):
            summaries[path.stem] = json.loads(path.read_text(encoding="utf-8"))
            continue
        if study == "family" and task in FAMILY_ORDER:
            summaries[("family", task)] = json.loads(path.read_text(encoding="utf-8"))
            continue
        if (study in ORDER or study in TRANSFORMER_ORDER) and task in TASKS:
            summary = json.loads(path.read_text(encoding="utf-8"))
            for claim in summary.get("claims", []):
                claim["verdict"] = verdict(claim["metric_difference"], claim.get("margin"))
                if study in ("table3", "fig8"):  # one claim across the tasks, whichever split each uses
                    claim["text"] = claim_setting(claim["text"])
            summaries[(study, task)] = summary
    return summaries


def exports(summaries: dict, prefix: str) -> dict:
    """``{rest: summary}`` of the loaded ``<prefix>-<rest>.json`` files (``load_summaries``), in name order."""
    return {key.removeprefix(f"{prefix}-"): summary for key, summary in summaries.items()
            if isinstance(key, str) and key.startswith(f"{prefix}-")}


# --- the pages' generated blocks: <!-- generated: NAME -->, the body, <!-- end: NAME --> ---------

def block_pattern(names: str = r"[\w-]+") -> re.Pattern:
    """The generated blocks whose name matches the regular expression ``names`` (groups ``name``, ``body``)."""
    return re.compile(rf"<!-- generated: (?P<name>{names}) -->\n(?P<body>.*?)<!-- end: (?P=name) -->", re.S)


def fill_blocks(page: str, pattern: re.Pattern, render) -> str:
    """``page`` with the body of every block ``pattern`` finds replaced by ``render(name)``."""
    return pattern.sub(lambda m: f"<!-- generated: {m['name']} -->\n{render(m['name'])}<!-- end: {m['name']} -->",
                       page)


def missing_block(name: str) -> str:
    """The body of a block whose exported summary is missing."""
    return f"*Not run: `docs/assets/results/{name}.json` is missing.*\n"
