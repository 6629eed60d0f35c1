"""Flags with no effect where they are given are refused, and sizes are bounded before any work.

Each case goes through the command line: one line on stderr naming the flag and what would
give it an effect, exit status 2, and no run folder left behind (``diloco.tools.cli.flag_checks``,
``diloco.tools.cli.preflight``, ``diloco.tools.runs.faults.shorten``).
"""

from __future__ import annotations

import json
import time
from argparse import Namespace

import pytest
from cli_helpers import run_cli

from diloco.config import DiLoCoConfig
from diloco.data import load_digits_split
from diloco.tools.cli import flag_checks
from diloco.tools.cli.errors import CliError
from diloco.tools.runs.faults import shorten

QUICK = ["--rounds", "2", "-H", "3", "-K", "2", "--hidden-sizes", "8", "-q", "--no-plots"]


def refused(argv, capsys, tmp_path, command="train"):
    status, _, err = run_cli([command, *argv, "--runs-dir", tmp_path / "runs"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "a run folder was left"
    return lines[0]


@pytest.mark.parametrize("flags, names, remedy", [
    (["--error-feedback"], "--error-feedback", "lossy --comm-dtype"),
    (["--error-feedback", "--comm-dtype", "float64"], "--error-feedback", "lossy --comm-dtype"),
    (["--comm-block", "3"], "--comm-block 3", "add --comm-dtype int8 or fp4"),
    (["--comm-block", "16", "--comm-dtype", "float16"], "--comm-block 16", "only int8 and fp4"),
    (["--comm-block", str(10**12), "--comm-dtype", "int8"], "--comm-block 1000000000000", "--comm-block 0"),
    (["--context", "3"], "--context", "--data shakespeare"),
    (["--eval-windows", "5"], "--eval-windows", "--data shakespeare"),
    (["--threads", "1000000"], "--threads 1000000", "or fewer"),
    (["--lr-schedule", "cosine", "--warmup-steps", str(10**9)], "--warmup-steps 1000000000", "at most 6"),
    (["--batch-size", "5000"], "--batch-size 5000", "or less"),
    (["--allow-code-change"], "--allow-code-change", "without --resume"),
    (["--checkpoint-every", str(10**9)], "--checkpoint-every 1000000000", "at most 2"),
])
def test_a_flag_with_no_effect_is_refused_naming_it_and_the_remedy(flags, names, remedy, capsys, tmp_path):
    line = refused([*QUICK, *flags], capsys, tmp_path)
    assert names in line and remedy in line, line


@pytest.mark.parametrize("flags, names", [
    (["--test-fraction", "0.99"], "--test-fraction"),
    (["--split-seed", "3"], "--split-seed"),
    (["--eval-windows", str(10**12)], "--eval-windows 1000000000000"),
])
def test_flags_the_char_lm_ignores_are_refused(flags, names, capsys, tmp_path):
    line = refused(["--data", "shakespeare", "--rounds", "1", "-H", "1", "-q", "--no-plots", *flags], capsys,
                   tmp_path)
    assert names in line and "shakespeare" in line or "held-out windows" in line, line


def test_the_same_flags_are_taken_where_they_have_an_effect():
    data = load_digits_split()
    config = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=2, hidden_sizes=(8,), lr_schedule="cosine",
                          warmup_steps=6)
    shard = len(data.y_train) // 2
    flag_checks.check_flags(Namespace(error_feedback=True, comm_dtype="int8", comm_block=64, warmup_steps=6,
                                      batch_size=shard, threads=1), config, data)
    flag_checks.check_flags(Namespace(error_feedback=True, comm_dtype="float32"), config, data)  # float64 params
    flag_checks.check_flags(Namespace(error_feedback=True, sign_prune=0.5), config, data)
    with pytest.raises(CliError, match="--batch-size"):
        flag_checks.check_flags(Namespace(batch_size=shard + 1), config, data)
    with pytest.raises(CliError, match="--error-feedback"):  # float32 params: float32 on the wire loses nothing
        flag_checks.check_flags(Namespace(error_feedback=True, comm_dtype="float32"),
                                config.replace(dtype="float32"), data)


@pytest.mark.parametrize("content", [b"x,y\n1,2\n", bytes(range(256)) * 4, b""])
@pytest.mark.parametrize("name", ["data.txt", "data.bin", "data.npz"])
def test_data_that_is_not_an_npz_says_what_the_file_must_hold(name, content, capsys, tmp_path):
    path = tmp_path / name
    path.write_bytes(content)
    line = refused(["--data", path, *QUICK], capsys, tmp_path)
    assert "pickled" not in line and ".npz" in line and "x, float features" in line and "integer labels" in line


def test_a_study_of_a_billion_seeds_is_refused_at_once(capsys, tmp_path):
    start = time.perf_counter()
    line = refused(["workers", "--seeds", str(10**9), "-q", "--no-plots"], capsys, tmp_path, command="study")
    assert "--seeds" in line and "available" in line
    assert time.perf_counter() - start < 30  # it never starts the list: a hang would be far longer


def test_rounds_whose_history_cannot_fit_in_memory_are_refused(capsys, tmp_path):
    line = refused([*QUICK[:-6], "--rounds", str(10**12), "-q", "--no-plots"], capsys, tmp_path)
    assert "memory" in line and "available" in line


@pytest.mark.parametrize("flags, numbers", [
    (["--async", "--step-times", "1,1e9"], "1e+09 times"),
    (["--step-times", "1e308,1e308"], "1e+308 s"),
    (["--async", "--step-times", "1e308,1e308"], "1e+308 s"),
    (["--async", "--step-times", "5e-324,1"], "inf times"),
    (["--async", "-K", "8", "--speed-spread", "1000"], "speed_spread 1000"),
])
def test_speeds_the_simulation_cannot_serve_are_refused_at_once(flags, numbers, capsys, tmp_path):
    start = time.perf_counter()
    line = refused([*QUICK, *flags], capsys, tmp_path)
    assert "--step-times" in line and numbers in line, line
    assert time.perf_counter() - start < 30  # refused before any schedule: the old loop ran for minutes


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_a_thousand_workers_of_a_million_steps_are_refused_on_both_engines_with_the_numbers(engine, capsys,
                                                                                           tmp_path, monkeypatch):
    from diloco.tools.cli import preflight

    monkeypatch.setattr(preflight, "available_memory", lambda: 4 * 2**30)  # a 4 GB machine
    line = refused(["-K", "1000", "-H", "1000000", "--engine", engine, "-q", "--no-plots"], capsys, tmp_path)
    assert "1,000,000,000 step losses" in line and "available" in line and "-H" in line, line


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_an_address_space_limit_is_memory_the_run_cannot_have(engine, tmp_path):
    import resource
    import subprocess
    import sys

    def limit():  # 3 GB of address space, as `prlimit --as` or `ulimit -v` would set
        resource.setrlimit(resource.RLIMIT_AS, (3 * 10**9, resource.getrlimit(resource.RLIMIT_AS)[1]))

    done = subprocess.run([sys.executable, "-m", "diloco", "train", "-K", "1000", "-H", "1000000", "--engine", engine,
                           "-q", "--no-plots", "--runs-dir", str(tmp_path / "runs")], preexec_fn=limit,
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "8." in lines[0] and "GB of memory" in lines[0] and "available" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_fast_engine_counts_k_batches_of_activations():
    from diloco.models.mlp import MLPModel
    from diloco.tools.cli.preflight import estimate_memory

    config = DiLoCoConfig(num_workers=100, inner_steps=1, hidden_sizes=(512,), batch_size=256)
    model = MLPModel((64, 512, 10))
    reference, _ = estimate_memory(config, model, 100, checkpointing=False)
    fast, _ = estimate_memory(config.replace(engine="fast"), model, 100, checkpointing=False)
    assert fast - reference == 8 * 4 * 99 * 256 * (64 + 512 + 10)


def test_a_five_megabyte_value_is_not_echoed_back(capsys, tmp_path):
    config = tmp_path / "big.json"
    config.write_text(json.dumps({"dtype": "x" * 5_000_000}))
    line = refused(["--config", config, *QUICK], capsys, tmp_path)
    assert len(line) < 600 and "dtype" in line and "5,000,002 characters" in line


def test_shorten_cuts_long_words_and_long_lines_and_keeps_short_ones():
    assert shorten("a short message") == "a short message"
    cut = shorten("got '" + "y" * 1000 + "' here")
    assert cut.startswith("got '" + "y" * 195) and "[1,002 characters]" in cut and cut.endswith(" here")
    many = shorten(" ".join(["word"] * 10_000))
    assert len(many) < 2100 and many.endswith("characters cut]")
    assert shorten("z" * 201) == "z" * 200 + "...[201 characters]"
