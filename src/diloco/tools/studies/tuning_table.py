"""The tuning grid as the results pages print it: every value tried, its loss, the choice.

``render_tuning(summary)`` is shared by every page that shows a study's tuning
(``results_page``, ``family_report``, ``beyond_sparse``, ``beyond_async``, ``beyond_muon``).
"""

from __future__ import annotations

from diloco.tools.studies.paper_runs import FEEDBACK_DECAY

__all__ = ["SHORT_FIELDS", "render_tuning"]

# A joint grid's fields, as its pairs are printed (``lr/mu``).
SHORT_FIELDS = {"outer_lr": "lr", "outer_momentum": "mu", FEEDBACK_DECAY: "beta"}


def render_tuning(summary: dict) -> str:
    """The tuning grid: per tuning step, field and probe arm, the mean final held-out loss at
    each value on the tuning seeds, the chosen value in bold, and the arms that took it.
    A joint field (the outer lr x momentum grid) prints each pair as ``lr/mu``."""
    if not summary.get("tuning"):
        return ""
    groups: dict = {}
    for entry in summary["tuning"]:
        field = tuple(entry["field"]) if isinstance(entry["field"], list) else entry["field"]
        groups.setdefault((entry.get("step", 0), field, entry["arm"]), []).append(entry)
    lines = ["", f"Tuning grid (final held-out loss, tuning seed(s) {summary['tune_seeds']}, which are not "
                 "reported seeds; chosen in bold: the grid's lowest):", ""]
    inner_passes: dict = {}
    for (_step, field, probe), entries in groups.items():
        entries = sorted(entries, key=lambda e: e["value"])
        cells = ", ".join(f"**{_value_text(e['value'])}: {e['eval_loss']:.3f}**" if e.get("chosen") else
                          f"{_value_text(e['value'])}: {e['eval_loss']:.3f}" for e in entries)
        targets = entries[0].get("targets", [probe])
        used = "" if targets == [probe] else f" (used by {', '.join(targets)})"
        inner_passes[(field, probe)] = inner_passes.get((field, probe), 0) + 1
        again = ", again at the chosen outer step" if inner_passes[(field, probe)] > 1 else ""
        lines.append(f"- {_field_text(field)} of {probe}{used}{again}: {cells}{_edge_note(field, entries)}")
    return "\n".join(lines) + "\n"


def _edge_note(field, entries: list) -> str:
    """For a joint grid: which of the chosen pair's values is the largest or smallest tried,
    since a value past it was not (a study that tries its grid as it is, or whose extension
    reached its limit or the end of its ladder)."""
    chosen = [e["value"] for e in entries if e.get("chosen")]
    if not isinstance(field, tuple) or not chosen:
        return ""
    edges = []
    for i, name in enumerate(field):
        values = sorted({e["value"][i] for e in entries})
        short = SHORT_FIELDS.get(name, name)
        if len(values) > 1 and chosen[0][i] in (values[0], values[-1]):
            edges.append(f"{short} {chosen[0][i]:g} is its {'largest' if chosen[0][i] == values[-1] else 'smallest'}")
    return f" (chosen at the grid's edge: {', '.join(edges)})" if edges else ""


def _field_text(field) -> str:
    if isinstance(field, tuple):
        return " x ".join(f.replace("_", " ") for f in field) + " (" + "/".join(
            SHORT_FIELDS.get(f, f) for f in field) + ")"
    return field.replace("_", " ")


def _value_text(value) -> str:
    return "/".join(f"{v:g}" for v in value) if isinstance(value, list | tuple) else f"{value:g}"
