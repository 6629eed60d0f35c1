"""What the grader prints, as plain text: lesson maths, tolerances, expected beside got.

* ``plain_math`` turns the lessons' LaTeX (``\\sqrt{1/\\text{fan-in}}``) into plain ASCII
  (``sqrt(1/fan-in)``), for a terminal and for Gradescope's text output alike.
* ``round_tolerances`` shows ``atol=1.0000000000000001e-07`` as ``atol=1e-07``.
* ``shown_lines`` cuts a failure message to a few lines, and when it shows an expected
  array beside the one got, it shows the same rows of both.
* ``safe_text`` makes a string that may come from the submission (an exception's message,
  a crash's output, a path) safe for a terminal, JSON, XML or HTML: every output of the
  grader passes its text through it, and nothing else escapes.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["plain_math", "round_tolerances", "shown_lines", "safe_text", "safe_data", "TEXT_LIMIT", "LINE_LIMIT"]

# Shown as they are: printable ASCII, the newline, and non-ASCII letters, marks, digits,
# punctuation, symbols and spaces. Escaped: C0 and C1 controls (ESC, so every ANSI and OSC
# sequence; BEL, backspace, carriage return, tab, DEL), format characters (bidi overrides
# and isolates, zero-width marks), line and paragraph separators, surrogates, private-use
# and unassigned code points, the invisible Hangul fillers, and every combining mark past
# the fourth stacked on one character.
_NOT_PLAIN = re.compile(r"[^\x20-\x7e\n]")
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
TEXT_LIMIT = 8000  # characters of one field (a results.json output, a JUnit text)
LINE_LIMIT = 500  # characters of one line of the table, or of a one-line field


# Letters that show as nothing (the Hangul fillers), escaped like the format characters.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0")
_MARKS_SHOWN = 4  # combining marks kept on one character; the rest of a stack is escaped


def _escaped(match: re.Match) -> str:
    char = match[0]
    if char == "\n" or (char >= "\xa0" and char not in _INVISIBLE
                        and unicodedata.category(char) not in _ESCAPED_CATEGORIES):
        return char
    return char.encode("unicode_escape").decode("ascii")  # \x1b, \x07, \u202e


def _stack_cut(match: re.Match) -> str:
    """A run of combining marks: the first ``_MARKS_SHOWN`` kept, the rest escaped."""
    marks = match[0]
    return marks[:_MARKS_SHOWN] + marks[_MARKS_SHOWN:].encode("unicode_escape").decode("ascii")


_MARK_RUN = re.compile(  # a run of _MARKS_SHOWN + 1 or more combining marks
    r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]{5,}")


def safe_text(text: object, limit: int = TEXT_LIMIT, *, one_line: bool = False) -> str:
    """``text`` as it may be shown anywhere: what could act on a terminal or a report reader
    escaped (``\x1b[2J``, ``\u202e``), at most ``limit`` characters (then how many were cut).

    ``one_line`` escapes newlines too, so the text cannot start a line of its own (the
    table's rows, an XML attribute, an error message).
    """
    text = str(text)
    cut = max(len(text) - limit, 0)
    text = _MARK_RUN.sub(_stack_cut, _NOT_PLAIN.sub(_escaped, text[:limit]))
    if one_line:
        text = text.replace("\n", "\\n")
    if len(text) > limit:  # escapes make it longer
        cut, text = cut + len(text) - limit, text[:limit]
    return text + (f" ... ({cut} more characters)" if cut else "")


def safe_data(value):
    """``value`` (a results.json dict) with every string in it, keys included, made safe."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(key, LINE_LIMIT, one_line=True): safe_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_data(item) for item in value]
    return value

_WORDS = {
    "alpha": "alpha", "beta": "beta", "gamma": "gamma", "delta": "delta", "Delta": "Delta", "epsilon": "epsilon",
    "varepsilon": "epsilon", "eta": "eta", "theta": "theta", "lambda": "lambda", "mu": "mu", "sigma": "sigma",
    "omega": "omega", "pi": "pi", "rho": "rho", "tau": "tau", "sum": "sum", "log": "log", "exp": "exp",
    "max": "max", "min": "min", "top": "T", "ldots": "...", "cdots": "...", "dots": "...", "le": "<=", "leq": "<=",
    "ge": ">=", "geq": ">=", "ne": "!=", "neq": "!=", "approx": "~", "cdot": "*", "times": "x", "bmod": "mod",
    "lfloor": "floor(", "rfloor": ")", "lceil": "ceil(", "rceil": ")", "infty": "inf", "to": "->",
}
_GROUP = r"\{([^{}]*)\}"


def _script(mark: str, body: str) -> str:
    return f"{mark}{body}" if re.fullmatch(r"\w+", body) else f"{mark}({body})"


def _atom(body: str) -> str:
    return body if re.fullmatch(r"\w+", body) else f"({body})"


def _word(match: re.Match) -> str:
    """A command as its word, spaced from letters it would otherwise run into."""
    name = match.group(1)
    word = _WORDS.get(name, name)
    text, start, end = match.string, match.start(), match.end()
    before = " " if start and (text[start - 1].isalnum() or text[start - 1] == ")") and word[0].isalnum() else ""
    after = " " if end < len(text) and (text[end].isalpha() or text[end] == "\\") and word[-1].isalnum() else ""
    return f"{before}{word}{after}"


def plain_math(text: str) -> str:
    """``text`` with its LaTeX maths as plain ASCII: ``\\hat v`` -> ``v_hat``, ``\\beta_1`` -> ``beta_1``.

    Code in backticks is left as it is.
    """
    parts = text.split("`")
    return "`".join(part if k % 2 else _plain(part) for k, part in enumerate(parts))


def _plain(text: str) -> str:
    text = text.replace("\\(", "").replace("\\)", "").replace("\\,", " ").replace("\\;", " ").replace("\\ ", " ")
    text = re.sub(r"(?<=[A-Za-z0-9])\\(?=[A-Za-z])", r" \\", text)  # \alpha\hat m: two words
    previous = None
    while previous != text:  # the innermost {...} groups first, until none is left
        previous = text
        text = re.sub(r"\\(?:text|operatorname|mathrm|mathbf|mathit|mathcal)" + _GROUP, r"\1", text)
        text = re.sub(r"\\hat" + _GROUP, r"\1_hat", text)
        text = re.sub(r"\\sqrt" + _GROUP, r"sqrt(\1)", text)
        text = re.sub(r"\\frac" + _GROUP + _GROUP, lambda m: f"{_atom(m[1])}/{_atom(m[2])}", text)
        text = re.sub(r"([_^])" + _GROUP, lambda m: _script(m[1], m[2]), text)
    text = re.sub(r"\\hat\s*(\w)", r"\1_hat", text)
    text = re.sub(r"\\sqrt\s*(\w)", r"sqrt(\1)", text)
    text = re.sub(r"\\frac\s*(\w)\s*(\w)", r"\1/\2", text)
    text = re.sub(r"\\([A-Za-z]+)", _word, text)
    text = re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text.replace("{", "").replace("}", "")))
    return re.sub(r"  +", " ", text)


_TOLERANCE = re.compile(r"\b(rtol|atol|tol|tolerance)=(-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)")


def _rounded(match: re.Match) -> str:
    value = match[2]
    digits = len(re.sub(r"\D", "", value.lower().partition("e")[0]).strip("0"))
    return f"{match[1]}={float(value):.3g}" if digits > 8 else match[0]


def round_tolerances(text: str) -> str:
    """``rtol=1e-05, atol=1.0000000000000001e-07`` as ``rtol=1e-05, atol=1e-07``.

    A tolerance written with more than 8 significant digits (a float's full ``repr``) is
    shown to 3; a short one (``1e-05``, ``0.0``) as it is.
    """
    return _TOLERANCE.sub(_rounded, text)


_CONTINUED = re.compile(r"\s+(?:[\[\]\-+.\d]|nan|inf|\.\.\.)")


def _rows(block: list[str]) -> list[list[str]]:
    """The lines of one printed array grouped by row (a row starts with ``[``); lines if one row."""
    rows: list[list[str]] = []
    for k, line in enumerate(block):
        if k == 0 or line.lstrip().startswith("["):
            rows.append([line])
        else:
            rows[-1].append(line)
    return rows if len(rows) > 1 else [[line] for line in block]


def _expected_got_span(lines: list[str]) -> tuple[int, int, int] | None:
    """``(start, got, end)``: the ``expected`` line, the ``got`` line and the line past the got
    block, when ``lines`` hold an expected array then a got array; else None."""
    start = next((i for i, line in enumerate(lines) if "expected" in line), None)
    got = None if start is None else next(
        (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("got")), None)
    if got is None or any(not _CONTINUED.match(line) for line in lines[start + 1:got]):
        return None
    end = got + 1
    while end < len(lines) and _CONTINUED.match(lines[end]):
        end += 1
    return start, got, end


def _rows_that_fit(expected_rows: list[list[str]], got_rows: list[list[str]], room: int) -> int:
    """How many leading rows of each (the same for both, at least one) fit in ``room`` lines."""
    keep = 1
    while (keep < min(len(expected_rows), len(got_rows))
           and sum(map(len, expected_rows[:keep + 1])) + sum(map(len, got_rows[:keep + 1])) <= room):
        keep += 1
    return keep


def _kept_rows(rows: list[list[str]], first: str, keep: int) -> list[str]:
    """The lines of the first ``keep`` rows, then how many rows were left out, under the array."""
    out = [line for row in rows[:keep] for line in row]
    if len(rows) > keep:
        indent = " " * (first.find("[") if "[" in first else len(first) - len(first.lstrip()))
        out.append(f"{indent}... ({len(rows) - keep} more {'row' if len(rows) - keep == 1 else 'rows'})")
    return out


def shown_lines(message: str, limit: int = 8) -> list[str]:
    """At most about ``limit`` lines of ``message``: the same rows of an expected and a got array.

    A message of the form ``what: expected <array>`` then ``got <array>`` (then anything
    else) keeps as many leading rows of each as fit, the same number for both, and says how
    many rows it left out; any other message keeps its first ``limit`` lines.
    """
    lines = message.splitlines() or [""]
    span = _expected_got_span(lines)
    if span is None:
        return lines[:limit]
    start, got, end = span
    expected_rows, got_rows = _rows(lines[start:got]), _rows(lines[got:end])
    head, tail = lines[:start], lines[end:]
    keep = _rows_that_fit(expected_rows, got_rows, max(limit - len(head) - len(tail) - 2, 2))
    out = list(head) + _kept_rows(expected_rows, lines[start], keep) + _kept_rows(got_rows, lines[got], keep)
    return out + tail[:max(limit - len(out), 1)]
