"""``build_config``'s layers: the defaults (or a study's base), ``--config FILE`` over them
section by section, and the flags over both; what a run file sets beside its config."""

from __future__ import annotations

import json
import re

import pytest

from diloco import DiLoCoConfig
from diloco.tools.cli.config_file import run_file_settings
from diloco.tools.cli.config_flags import add_config_flags, add_data_flags
from diloco.tools.cli.errors import CliError, Parser
from diloco.tools.cli.flags import build_config


def _args(*argv):
    parser = Parser(prog="diloco train")
    add_config_flags(parser)
    add_data_flags(parser)
    return parser.parse_args(list(argv))


def test_a_config_file_section_changes_only_its_own_fields_of_the_base(tmp_path):
    base = DiLoCoConfig.from_dict({"inner": {"beta1": 0.8}, "family": {"fragments": 2},
                                   "asynchrony": {"speed_spread": 0.5}, "inner_optimizer": "muon",
                                   "muon": {"momentum": 0.9}, "hidden_sizes": [4, 4]})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"inner": {"lr": 0.5}, "family": {"mix": 0.5}, "asynchrony": {"straggler": 1},
                                "muon": {"lr": 0.01}, "num_workers": 4}))
    config = build_config(_args("--config", str(path)), base=base)
    mine = (config.inner.lr, config.family.mix, config.asynchrony.straggler, config.muon.lr, config.num_workers)
    gold = (0.5, 0.5, 1, 0.01, 4)
    assert mine == gold, f"file's fields: mine {mine}, expected {gold}"
    mine = (config.inner.beta1, config.family.fragments, config.asynchrony.speed_spread, config.muon.momentum,
            config.hidden_sizes)
    gold = (0.8, 2, 0.5, 0.9, (4, 4))
    assert mine == gold, f"the base's fields: mine {mine}, expected {gold}"


def test_flags_override_the_file_and_the_base(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"inner": {"lr": 0.5}, "num_workers": 4}))
    config = build_config(_args("--config", str(path), "--lr", "0.25", "-K", "2", "--fragments", "2"),
                          base=DiLoCoConfig.from_dict({"inner": {"beta1": 0.8}, "hidden_sizes": [4, 4]}))
    mine = (config.inner.lr, config.inner.beta1, config.num_workers, config.family.fragments)
    assert mine == (0.25, 0.8, 2, 2), f"mine {mine}, expected (0.25, 0.8, 2, 2)"


def _run_file(tmp_path, **top) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"command": "train", "config": {}, **top}))
    return str(path)


def test_a_run_files_settings_beside_the_config(tmp_path):
    args = _args("--config", _run_file(tmp_path, algorithms=["sync"], max_loss=5, checkpoint_every=2))
    assert run_file_settings(args, "train") == {"max_loss": 5, "checkpoint_every": 2, "algo": "sync"}
    assert run_file_settings(args, "compare") == {"max_loss": 5, "checkpoint_every": 2}  # only train takes its algo
    bad = [({"max_loss": 0}, "max_loss must be a positive number or null, got 0"),
           ({"max_loss": True}, "max_loss must be a positive number or null, got True"),
           ({"checkpoint_every": 1.5}, "checkpoint_every must be a positive int or null, got 1.5"),
           ({"algorithms": ["diloco", "sync"]},
            "algorithms must be [\"diloco\"] or [\"sync\"], got ['diloco', 'sync']")]
    for top, message in bad:
        with pytest.raises(CliError, match=re.escape(message)):
            run_file_settings(_args("--config", _run_file(tmp_path, **top)), "train")
