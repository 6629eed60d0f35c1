"""The command line's words for the config's fields: ``num_workers`` is ``-K/--num-workers``.

The library's checks name fields as the code does (``DiLoCoConfig.num_workers must be a
positive int``); a person at the command line typed a flag. ``flag_of(field)`` is the flag
of a config field, read from the parser itself (every ``DiLoCoConfig`` field has one, see
``diloco.tools.cli.config_flags``), so a renamed flag cannot go stale here. ``in_flag_words``
rewrites a library message in those words, and ``config_differences`` lists a config's
departures from the defaults as the flags that would give them (``--comm-dtype fp4``,
``--async``), for plot titles and legends.
"""

from __future__ import annotations

import functools
import re

__all__ = ["flag_of", "in_flag_words", "in_config_words", "config_differences"]

# The config classes whose fields are named in messages, and the prefix of their flags' dests.
_SECTIONS = {"DiLoCoConfig": "", "AdamWConfig": "", "MuonConfig": "muon_", "FamilyConfig": "", "AsyncConfig": "",
             "TransformerShape": "transformer_"}
# The same classes as a config.json names them: its top level and its sections.
_KEYS = {"DiLoCoConfig": "", "AdamWConfig": "inner.", "MuonConfig": "muon.", "FamilyConfig": "family.",
         "AsyncConfig": "asynchrony.", "TransformerShape": "transformer."}
_NEGATABLE = ("nesterov", "muon_nesterov", "transformer_tied")  # False shows as --no-<flag>
_FIELD = re.compile(r"\b(?P<cls>" + "|".join(_SECTIONS) + r")\.(?P<field>[a-z_0-9]+)(?P<index>\[\d+\])?")


@functools.lru_cache(maxsize=1)
def _flags_by_dest() -> dict:
    """dest -> (short flag or None, long flag), from ``diloco train``'s parser."""
    from diloco.tools.cli.config_flags import add_config_flags, add_data_flags
    from diloco.tools.cli.errors import Parser

    parser = Parser(prog="diloco train")
    add_config_flags(parser)
    add_data_flags(parser)
    found = {}
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        longs = [o for o in action.option_strings if o.startswith("--")]
        shorts = [o for o in action.option_strings if not o.startswith("--")]
        if longs and action.dest not in found:
            found[action.dest] = (shorts[0] if shorts else None, longs[0])
    return found


def flag_of(field: str, section: str = "") -> str | None:
    """``-K/--num-workers`` for ``num_workers``; ``--muon-lr`` for ``lr`` of section ``muon_``."""
    names = _flags_by_dest().get(section + field)
    if names is None:
        return None
    short, long = names
    return f"{short}/{long}" if short else long


def in_flag_words(message: str, given=None) -> str:
    """``DiLoCoConfig.num_workers must be ...`` -> ``-K/--num-workers must be ...``. Fields
    without a flag, or (with ``given``, a set of dests) whose flag was not given, keep their name."""

    def named(match):
        dest = _SECTIONS[match["cls"]] + match["field"]
        flag = flag_of(match["field"], _SECTIONS[match["cls"]])
        if flag is None or (given is not None and dest not in given):
            return match.group(0)
        index = match["index"]
        return f"{flag} (value {int(index[1:-1]) + 1})" if index else flag

    return _FIELD.sub(named, message)


def in_config_words(message: str) -> str:
    """``AdamWConfig.lr must be ...`` -> ``inner.lr must be ...``; ``AdamWConfig: unknown field(s)``
    -> ``inner: unknown field(s)``: the keys of a config.json, for a value read from one."""
    message = re.sub(r"\b(" + "|".join(_KEYS) + r")\.", lambda m: _KEYS[m[1]], message)
    return re.sub(r"\b(" + "|".join(_KEYS) + r"): ", lambda m: (_KEYS[m[1]].rstrip(".") or "top level") + ": ",
                  message)


def _flat(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{key}_" if key in ("muon", "transformer") else ""))
        else:
            flat[prefix + key] = value
    return flat


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def config_differences(config, base=None, *, skip=("seed", "rounds", "engine")) -> list[str]:
    """``config``'s departures from ``base`` (default: ``DiLoCoConfig()``) as flags, in the parser's
    order: ``["--comm-dtype fp4", "--async"]``. ``skip`` leaves out fields a title names otherwise."""
    from diloco.config import DiLoCoConfig

    now, then = _flat(config.to_dict()), _flat((base or DiLoCoConfig()).to_dict())
    shown = []
    for dest, (short, long) in _flags_by_dest().items():
        if dest in skip or dest not in now or now[dest] == then.get(dest):
            continue
        value = now[dest]
        flag = short or long
        if value is True:
            shown.append(flag)
        elif value is False:
            shown.append(flag.replace("--", "--no-", 1) if dest in _NEGATABLE else
                         ("--noniid" if dest == "iid" else f"{flag} off"))
        else:
            shown.append(f"{flag} {_shown(value)}")
    return shown
