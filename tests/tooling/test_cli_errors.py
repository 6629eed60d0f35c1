"""The command line's usage errors: no abbreviations, the closest flag suggested, every error
reported against the sub-command it belongs to; and the summary's savings sentence."""

from __future__ import annotations

import argparse
import json

import pytest
from cli_helpers import run_cli

from diloco.tools.cli.commands import savings_sentence
from diloco.tools.cli.errors import Parser, closest_flag
from diloco.tools.cli.invocation import program
from diloco.tools.cli.main import build_parser, main


def usage_error(argv, capsys) -> str:
    """The one line of stderr of ``diloco ARGV``, which must exit with status 2."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("argv, prog, typo, suggestion", [
    (["compare", "--round", "3"], "diloco compare", "--round", "--rounds"),
    (["train", "--seeed", "2"], "diloco train", "--seeed", "--seed"),
    (["study", "workers", "--seed", "1", "--seed", "2", "--value", "1,2"], "diloco study", "--value", "--values"),
    (["compare", "--batch", "4"], "diloco compare", "--batch", "--batch-size"),
    (["compare", "--hiden-sizes=8"], "diloco compare", "--hiden-sizes", "--hidden-sizes"),
    (["grade", "--imp", "ws"], "diloco grade", "--imp", "--impl"),
    (["compare", "-k", "3"], "diloco compare", "-k", "-K"),
])
def test_a_typo_is_reported_against_its_sub_command_with_the_closest_flag(argv, prog, typo, suggestion, capsys):
    line = usage_error(argv, capsys)
    assert line.startswith(f"{prog}: error: unrecognized arguments: {typo}"), line
    assert f"did you mean {suggestion}?" in line, line
    assert f"see '{program()}{prog.removeprefix('diloco')} --help'" in line


def test_a_prefix_is_never_taken_for_the_full_flag(tmp_path, capsys):
    """``--round`` used to be read as ``--rounds`` (argparse's allow_abbrev)."""
    line = usage_error(["compare", "--round", "1", "-H", "1", "-K", "1", "--hidden-sizes", "4", "-q", "--no-plots",
                        "--runs-dir", tmp_path], capsys)
    assert "--round" in line and "did you mean --rounds?" in line


def test_every_parser_and_sub_parser_refuses_abbreviations():
    parser = build_parser()
    seen = []

    def walk(p):
        seen.append(p.prog)
        assert isinstance(p, Parser) and p.allow_abbrev is False, f"{p.prog} allows abbreviations"
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    walk(parser)
    assert {"diloco", "diloco compare", "diloco train", "diloco study", "diloco workspace",
            "diloco workspace create", "diloco grade"} <= set(seen)


def test_several_typos_get_one_suggestion_each_and_nonsense_none(capsys):
    line = usage_error(["compare", "--round", "3", "--seeed", "2"], capsys)
    assert "did you mean --rounds for --round, --seed for --seeed?" in line, line
    line = usage_error(["train", "--bogus"], capsys)
    assert line == f"diloco train: error: unrecognized arguments: --bogus (see '{program()} train --help')"


def test_a_mistyped_sub_command_or_study_name_is_suggested(capsys):
    assert "did you mean 'compare'?" in usage_error(["compre"], capsys)
    line = usage_error(["study", "workerz"], capsys)
    assert line.startswith("diloco study: error:") and "did you mean 'workers'?" in line
    line = usage_error(["workspace", "crate", "x"], capsys)
    assert line.startswith("diloco workspace: error:") and "did you mean 'create'?" in line


def test_a_flag_before_the_sub_command_is_the_top_levels(capsys):
    line = usage_error(["--quiet", "compare"], capsys)
    assert line == f"diloco: error: unrecognized arguments: --quiet (see '{program()} --help')", line


@pytest.mark.parametrize("flag, known, expected", [
    ("--round", ["--rounds", "--seed"], "--rounds"),
    ("--round=3", ["--rounds"], "--rounds"),
    ("-k", ["-K", "-H"], "-K"),
    ("--bogus", ["--rounds", "--seed"], None),
    ("--outer-lr", ["--outer-momentum"], None),
])
def test_closest_flag(flag, known, expected):
    assert closest_flag(flag, known) == expected


@pytest.mark.parametrize("sync, diloco, factor, expected", [
    (50, 1, 50.0, "DiLoCo all-reduces 50x less often than the synchronous baseline: 50x fewer bytes per worker"),
    (1, 1, 1.0, "DiLoCo all-reduces as often as the synchronous baseline (H = 1): the same bytes per worker"),
    (10, 10, 8.0, "DiLoCo all-reduces as often as the synchronous baseline (H = 1): 8x fewer bytes per worker"),
    (30, 10, 7.73, "DiLoCo all-reduces 3x less often than the synchronous baseline: 7.7x fewer bytes per worker"),
    (500, 40, 50.0, "DiLoCo all-reduces 12.5x less often than the synchronous baseline: 50x fewer bytes per worker"),
])
def test_the_savings_sentence_never_says_one_times_less_often(sync, diloco, factor, expected):
    sentence = savings_sentence({"sync_all_reduces": sync, "diloco_all_reduces": diloco, "savings_factor": factor})
    assert sentence == expected
    assert "1x less often" not in sentence


def test_compare_with_h_1_prints_as_often(tmp_path, capsys):
    status = main(["compare", "-H", "1", "--rounds", "1", "-K", "2", "--hidden-sizes", "8", "--batch-size", "8",
                   "-q", "--no-plots", "--runs-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0
    assert "as often as the synchronous baseline (H = 1)" in out and "1x less often" not in out, out


# --- messages in the user's words ---------------------------------------------------------------

@pytest.mark.parametrize("argv, line", [
    (["-K", "0"], "-K/--num-workers must be a positive int, got 0"),
    (["--lr", "-1"], "--lr must be > 0.0, got -1.0"),
    (["--outer-momentum", "1.5"], "--outer-momentum must be < 1.0, got 1.5"),
    (["--inner-optimizer", "muon", "--muon-lr", "-1"], "--muon-lr must be > 0.0, got -1.0"),
    (["--topk", "2"], "--topk must be <= 1.0, got 2.0"),
    (["--async", "--step-times", "1,0"], "--step-times (value 2) must be > 0.0, got 0.0"),
    (["--hidden-sizes", "64,,32"], "--hidden-sizes has an empty width in '64,,32'"),
    (["--hidden-sizes", "64,"], "--hidden-sizes has an empty width in '64,'"),
    (["--fragments", "0"], "--fragments must be a positive int, got 0"),
])
def test_a_bad_value_is_named_by_its_flag_not_the_config_field(argv, line, tmp_path, capsys):
    status, _, err = run_cli(["train", *argv, "--runs-dir", tmp_path], capsys)
    assert status == 2 and err.startswith(f"diloco train: error: {line}"), err
    assert "Config" not in err and not list(tmp_path.iterdir())


def test_an_empty_hidden_sizes_is_no_hidden_layer(tmp_path, capsys):
    status, _, err = run_cli(["train", "--hidden-sizes", "", "--rounds", "1", "-H", "1", "-K", "2", "-q",
                              "--no-plots", "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    assert json.loads(next(tmp_path.iterdir()).joinpath("config.json").read_text())["config"]["hidden_sizes"] == []


@pytest.mark.parametrize("content, line", [
    ({"num_worker": 4}, "top level: unknown field(s) ['num_worker']; did you mean 'num_workers' for 'num_worker'?"),
    ({"inner": {"lrr": 1}}, "inner: unknown field(s) ['lrr']; did you mean 'lr' for 'lrr'?"),
    ({"family": {"top_k": 0.1}}, "family: unknown field(s) ['top_k']; did you mean 'topk' for 'top_k'?"),
    ({"num_workers": 0}, "num_workers must be a positive int, got 0"),
    ({"zzzz": 1}, "top level: unknown field(s) ['zzzz']; known fields are ['alpha', "),
])
def test_a_config_file_mistake_names_the_file_and_its_key_with_a_suggestion(content, line, tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(content))
    status, _, err = run_cli(["train", "--config", path, "--runs-dir", tmp_path], capsys)
    assert status == 2 and err.startswith(f"diloco train: error: --config {path}: {line}"), err


HUGE = "1" + "0" * 400  # an int no float holds


@pytest.mark.parametrize("text, line", [
    ('{"rounds": ' + "9" * 5000 + "}", "cannot read config file {path}: it holds an integer of more than 4,300 digits"),
    ('{"outer_lr": ' + HUGE + "}", "--config {path}: outer_lr must be finite, got an int of 401 digits"),
    ('{"inner": {"weight_decay": ' + HUGE + "}}", "--config {path}: inner.weight_decay must be finite, got an int of "
                                                  "401 digits"),
    ('{"family": {"bandwidth": ' + HUGE + "}}", "--config {path}: family.bandwidth must be finite"),
    ('{"rounds": ' + HUGE + "}", "this run needs about 10^403 bytes of memory"),
])
def test_a_config_file_with_a_huge_integer_is_one_line(text, line, tmp_path, capsys):
    """Python's limit on an integer's digits (a 5,000-digit ``rounds``) and ints beyond every float
    (for a real field, or a memory estimate no float holds) were tracebacks."""
    path = tmp_path / "c.json"
    path.write_text(text)
    status, _, err = run_cli(["train", "--config", path, "--runs-dir", tmp_path / "runs"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"diloco train: error: {line.format(path=path)}"), err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


def test_compare_states_the_all_reduces_its_runs_recorded(capsys, tmp_path):
    """An asynchronous run's arrivals are not rounds: the sentence takes the table's counts (40 and 500 here)."""
    import json

    from cli_helpers import only_run_dir, run_cli

    status, out, err = run_cli(["compare", "--async", "--straggler", "1", "-K", "2", "-H", "5", "--rounds", "4",
                                "--hidden-sizes", "8", "-q", "--no-plots", "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    algorithms = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())["algorithms"]
    exact = algorithms["sync"]["all_reduces"] / algorithms["diloco"]["all_reduces"]
    assert exact != config_ratio(), "no asynchronous arrivals to tell the counts apart"
    shown = f"{exact:.0f}" if exact == round(exact) else f"{exact:.1f}"
    assert f"DiLoCo all-reduces {shown}x less often" in out, out


def config_ratio() -> int:
    return 5  # H: what the plain model (one all-reduce per round) would say
