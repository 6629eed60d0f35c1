"""The one core through the command line: each bug of the old per-capability loops, as a regression test.

Before the core (see the issue "One training core"): family runs had no divergence
guard, a killed family run resumed as plain DiLoCo, ``--engine fast`` silently fell back
with family flags, ``--data shakespeare`` refused the fast engine, the baseline silently
ignored DiLoCo's flags, and a char-LM run with a non-default ``--context`` could not be
resumed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import TINY_DEEP as TINY
from cli_helpers import only_run_dir, run_cli

from diloco.engine import fast as fast_engine
from diloco.tools.runs.folders import read_jsonl


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def _history(run_dir):
    return read_jsonl(run_dir / "history.jsonl")


@pytest.mark.parametrize("flags", [["--comm-dtype", "fp4"], ["--comm-dtype", "int8"], ["--fragments", "2"],
                                   ["--eager"]])
def test_a_family_run_that_diverges_stops_with_the_guard(flags, tmp_path, capsys):
    status, _, err = run_cli(["train", *TINY, *flags, "--lr", "10", "--outer-lr", "50", "--max-loss", "2",
                              "--runs-dir", tmp_path], capsys)
    assert status == 3, err
    assert "diverged in round" in err and len(err.strip().splitlines()) == 1
    assert _summary(only_run_dir(tmp_path))["status"] == "diverged"


BLOW_UP = ["--lr", "1e200", "--weight-decay", "0", "--max-loss", "off"]  # inf within the first round's steps


@pytest.mark.parametrize("command, flags", [
    ("train", ["--comm-dtype", "fp4"]), ("train", ["--comm-dtype", "int8"]), ("train", ["--comm-dtype", "float16"]),
    ("train", ["--eager"]), ("train", ["--comm-dtype", "int8", "--sign-prune", "0.5"]),
    ("train", ["--topk", "0.1"]), ("train", ["--comm-dtype", "int8", "--error-feedback"]),
    ("compare", ["--comm-dtype", "fp4"]), ("train", ["--comm-dtype", "fp4", "--engine", "fast"]),
])
def test_a_non_finite_pseudo_gradient_under_compression_is_a_divergence(command, flags, tmp_path, capsys):
    status, _, err = run_cli([command, *TINY, *flags, *BLOW_UP, "--runs-dir", tmp_path], capsys)
    assert status == 3, err
    assert len(err.strip().splitlines()) == 1 and "diverged in round 1" in err, err
    run_dir = only_run_dir(tmp_path)
    summary = _summary(run_dir)
    assert summary["status"] == "diverged" and summary["divergence"]["round"] == 1
    assert not [r for r in _history(run_dir) if r["algo"] == "diloco"]  # it stopped in the round it names


def test_a_resumed_run_names_the_round_it_diverged_in():
    from diloco._validation import NonFiniteError
    from diloco.core.divergence import Diverged, Guard

    guard = Guard("diloco", None, first_round=5)
    guard.finished({"round": 6, "worker_losses": [1.0], "pseudo_grad_norm": 1.0, "eval_loss": None,
                    "eval_accuracy": None}, None)
    with pytest.raises(Diverged) as caught, guard.watch():
        raise NonFiniteError("x must be finite")
    assert caught.value.round == 7 and "round 7" in str(caught.value)


def test_a_family_study_has_the_guard_too(tmp_path, capsys):
    status, _, err = run_cli(["study", "compression", "--values", "fp4", "--seeds", "1", *TINY, "--lr", "10",
                              "--outer-lr", "50", "--max-loss", "2", "--runs-dir", tmp_path], capsys)
    assert status == 3 and "diverged" in err, err


def test_a_stopped_family_run_resumes_as_the_family_run_bit_for_bit(tmp_path, capsys):
    flags = ["--comm-dtype", "fp4", "--error-feedback", "--fragments", "2", "--overlap", "1", "--mix", "0.5"]
    argv = ["train", *TINY, "--rounds", "4", *flags, "--checkpoint-every", "1"]
    assert run_cli([*argv, "--runs-dir", tmp_path / "whole"], capsys)[0] == 0
    whole = only_run_dir(tmp_path / "whole")
    saved = json.loads((whole / "config.json").read_text())["config"]
    assert saved["family"]["comm_dtype"] == "fp4" and saved["family"]["fragments"] == 2
    # The same run, stopped after round 2 (its checkpoints cut back), then resumed without a flag.
    assert run_cli([*argv, "--runs-dir", tmp_path / "cut"], capsys)[0] == 0
    cut = only_run_dir(tmp_path / "cut")
    for name in ("diloco-round000003", "diloco-round000004"):
        for suffix in (".json", ".npz"):
            (cut / "checkpoints" / f"{name}{suffix}").unlink(missing_ok=True)
    lines = (cut / "history.jsonl").read_text().splitlines(keepends=True)
    (cut / "history.jsonl").write_text("".join(lines[:2]))
    status, _, err = run_cli(["train", "--resume", cut, "-q", "--no-plots"], capsys)
    assert status == 0, err
    drop = ("time",)
    got = [{k: v for k, v in r.items() if k not in drop} for r in _history(cut)]
    want = [{k: v for k, v in r.items() if k not in drop} for r in _history(whole)]
    assert got == want
    with np.load(cut / "params-diloco.npz") as a, np.load(whole / "params-diloco.npz") as b:
        assert all(a[k].tobytes() == b[k].tobytes() for k in b.files)
        num_values = sum(b[k].size for k in b.files)
    # fp4 on the wire after the resume, not plain float64 (8 bytes a value; with K = 2 one
    # sync of everything costs 8 N bytes): well under one byte a value per round.
    assert all(r["bytes_sent"] < num_values for r in got[2:])


def _npz_data(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "blobs.npz"
    np.savez(path, x=rng.normal(size=(60, 6)), y=np.arange(60) % 3)
    return path


# Every data set, each with its own non-default settings (the ones a rerun on the digits would lose).
CONFIG_ROWS = {
    "digits": ["--split-seed", "3", "--test-fraction", "0.3", "--comm-dtype", "int8", "--eager"],
    "mnist1d": ["--data", "mnist1d", "--num-samples", "300"],
    "shakespeare": ["--data", "shakespeare", "--context", "3", "--eval-windows", "64"],
    "npz": ["--data", "NPZ", "--split-seed", "2", "--test-fraction", "0.25"],
    "sync": ["--algo", "sync", "--data", "shakespeare", "--context", "2", "--eval-windows", "32"],
}


def _params(run_dir):
    out = {}
    for path in sorted(run_dir.glob("params-*.npz")):
        with np.load(path) as arrays:
            out[path.name] = {k: arrays[k].tobytes() for k in arrays.files}
    return out


@pytest.mark.parametrize("command, row", [("train", row) for row in sorted(CONFIG_ROWS)]
                         + [("compare", row) for row in sorted(CONFIG_ROWS) if row != "sync"])
def test_config_json_reproduces_a_run_on_every_data_set_bit_for_bit(command, row, tmp_path, capsys):
    if row == "mnist1d":
        pytest.importorskip("mnist1d")
    flags = [str(_npz_data(tmp_path)) if f == "NPZ" else f for f in CONFIG_ROWS[row]]
    cache = ["--cache-dir", tmp_path / "cache"]
    argv = [command, *TINY, *flags, *cache, "--max-loss", "500", "--checkpoint-every", "2"]
    assert run_cli([*argv, "--runs-dir", tmp_path / "a"], capsys)[0] == 0
    first = only_run_dir(tmp_path / "a")
    status, _, err = run_cli([command, "--config", first / "config.json", *cache, "-q", "--no-plots",
                              "--runs-dir", tmp_path / "b"], capsys)
    assert status == 0, err
    second = only_run_dir(tmp_path / "b")
    a, b = (json.loads((d / "config.json").read_text()) for d in (first, second))
    assert {k: v for k, v in b.items() if k != "blas_threads"} == {k: v for k, v in a.items() if k != "blas_threads"}
    strip = [{k: v for k, v in r.items() if k != "time"} for r in _history(first)]
    assert [{k: v for k, v in r.items() if k != "time"} for r in _history(second)] == strip
    assert _params(second) == _params(first) and _params(first)


def test_a_config_json_data_flag_still_overrides_its_data(tmp_path, capsys):
    argv = ["train", *TINY, "--data", "shakespeare", "--context", "3", "--eval-windows", "64"]
    assert run_cli([*argv, "--runs-dir", tmp_path / "a"], capsys)[0] == 0
    first = only_run_dir(tmp_path / "a") / "config.json"
    status, _, err = run_cli(["train", "--config", first, "--context", "2", "-q", "--no-plots",
                              "--runs-dir", tmp_path / "b"], capsys)
    assert status == 0, err
    data = json.loads((only_run_dir(tmp_path / "b") / "config.json").read_text())["data"]
    assert (data["name"], data["context"], data["eval_windows"]) == ("shakespeare", 2, 64)
    status, _, err = run_cli(["train", "--config", first, "--data", "digits", "-q", "--no-plots",
                              "--runs-dir", tmp_path / "c"], capsys)
    assert status == 0, err
    assert json.loads((only_run_dir(tmp_path / "c") / "config.json").read_text())["data"]["name"] == "digits"


@pytest.mark.parametrize("edit, named", [
    (lambda saved: saved.update(family={"comm_dtype": "fp4"}), "'family'"),  # a section misplaced at the top
    (lambda saved: saved.update(seeed=3), "'seeed'"),
    (lambda saved: saved["config"].update(comm_dtype="fp4"), "comm_dtype"),  # a family field one level too high
    (lambda saved: saved["data"].update(contxt=4), "'contxt'"),
    (lambda saved: saved["data"].update(num_train=10), "data.num_train"),
    (lambda saved: saved["data"].update(split_seed="3"), "data.split_seed"),
    (lambda saved: saved.update(max_loss="big"), "max_loss"),
])
def test_a_misplaced_or_unknown_config_json_key_is_refused_by_name(edit, named, tmp_path, capsys):
    assert run_cli(["train", *TINY, "--runs-dir", tmp_path / "a"], capsys)[0] == 0
    path = only_run_dir(tmp_path / "a") / "config.json"
    saved = json.loads(path.read_text())
    edit(saved)
    path.write_text(json.dumps(saved))
    status, _, err = run_cli(["train", "--config", path, "-q", "--no-plots", "--runs-dir", tmp_path / "b"], capsys)
    assert status == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_a_mnist1d_run_with_its_own_sample_count_resumes(tmp_path, capsys):
    pytest.importorskip("mnist1d")
    argv = ["train", *TINY, "--data", "mnist1d", "--num-samples", "300", "--cache-dir", tmp_path / "cache",
            "--checkpoint-every", "1", "--runs-dir", tmp_path / "runs"]
    assert run_cli(argv, capsys)[0] == 0
    run_dir = only_run_dir(tmp_path / "runs")
    (run_dir / "checkpoints" / "diloco-round000002.json").unlink()
    status, _, err = run_cli(["train", "--resume", run_dir, "--cache-dir", tmp_path / "cache", "-q", "--no-plots"],
                             capsys)
    assert status == 0, err


@pytest.mark.parametrize("flags", [["--comm-dtype", "fp4"], ["--fragments", "2"], ["--eager"],
                                   ["--data", "shakespeare", "--context", "3", "--eval-windows", "64"]])
def test_engine_fast_runs_the_fast_executor_for_every_flag(flags, tmp_path, capsys, monkeypatch):
    calls = []
    real = fast_engine.FastExecutor.run

    def counted(self, *args, **kwargs):
        calls.append(None)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(fast_engine.FastExecutor, "run", counted)
    status, _, err = run_cli(["train", *TINY, *flags, "--engine", "fast", "--runs-dir", tmp_path / "f"], capsys)
    assert status == 0, err
    assert calls, "--engine fast did not run the fast executor"
    fast = _history(only_run_dir(tmp_path / "f"))
    status, _, err = run_cli(["train", *TINY, *flags, "--runs-dir", tmp_path / "r"], capsys)
    assert status == 0, err
    reference = _history(only_run_dir(tmp_path / "r"))
    np.testing.assert_allclose([r["eval_loss"] for r in fast], [r["eval_loss"] for r in reference], rtol=1e-10)


@pytest.mark.parametrize("flags, name", [(["--drop-prob", "0.5"], "drop_prob"),
                                         (["--outer-optimizer", "adam"], "outer_optimizer"),
                                         (["--record-similarity"], "record_similarity"),
                                         (["--comm-dtype", "fp4"], "comm_dtype"),
                                         (["--outer-lr", "0.3"], "outer_lr")])
def test_the_baseline_refuses_every_outer_gradient_flag_the_same_way(flags, name, tmp_path, capsys):
    status, _, err = run_cli(["train", "--algo", "sync", *TINY, *flags, "--runs-dir", tmp_path], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "the synchronous baseline has no outer gradient" in err and name in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_compare_trains_the_baseline_without_dilocos_flags(tmp_path, capsys):
    status, _, err = run_cli(["compare", *TINY, "--drop-prob", "0.5", "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    records = _history(only_run_dir(tmp_path))
    assert any("dropped_workers" in r for r in records if r["algo"] == "diloco")
    assert not any("dropped_workers" in r for r in records if r["algo"] == "sync")


def test_a_char_lm_run_with_its_own_context_resumes(tmp_path, capsys):
    argv = ["train", *TINY, "--data", "shakespeare", "--context", "3", "--eval-windows", "64",
            "--checkpoint-every", "1", "--runs-dir", tmp_path]
    assert run_cli(argv, capsys)[0] == 0
    run_dir = only_run_dir(tmp_path)
    (run_dir / "checkpoints" / "diloco-round000002.json").unlink()
    status, _, err = run_cli(["train", "--resume", run_dir, "-q", "--no-plots"], capsys)
    assert status == 0, err
    status, _, err = run_cli(["train", "--resume", run_dir, "--context", "4", "-q", "--no-plots"], capsys)
    assert status == 2 and "--context 3" in err


# --- the transformer: interrupted, then resumed as printed -----------------------------------------

TRANSFORMER = ["--model", "transformer", "--data", "shakespeare", "--d-model", "8", "--n-heads", "2", "--n-layers",
               "1", "--context", "8", "--eval-windows", "16", "-K", "2", "-H", "2", "--rounds", "3", "--batch-size",
               "2", "-q", "--no-plots"]


def _sigint_at(monkeypatch, algo: str, at: int) -> None:
    """A real SIGINT to this process as ``algo``'s round ``at`` is written to the history."""
    import os
    import signal

    from diloco.tools.runs.folders import HistoryWriter

    real = HistoryWriter.append

    def append(self, record):
        written = real(self, record)
        if record.get("algo") == algo and record.get("round") == at:
            os.kill(os.getpid(), signal.SIGINT)
        return written

    monkeypatch.setattr(HistoryWriter, "append", append)


def _finished(run_dir):
    params = {p.name: dict(np.load(p)) for p in sorted(run_dir.glob("params-*.npz"))}
    return params, [{k: v for k, v in r.items() if k != "time"} for r in _history(run_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("command", ["train", "compare"])
def test_an_interrupted_transformer_run_resumes_as_printed_to_the_uninterrupted_result(command, engine, tmp_path,
                                                                                       capsys, monkeypatch):
    """A ``--model transformer`` run (``--data shakespeare``) stopped by SIGINT after DiLoCo's round 2;
    the command its message prints, run as printed, takes the data and the model from the run
    folder (it once checked them against the default ``--data digits`` and refused) and ends at
    the uninterrupted run's params and history."""
    import shlex

    argv = [command, *TRANSFORMER, "--engine", engine]
    assert run_cli([*argv, "--runs-dir", tmp_path / "clean"], capsys)[0] == 0
    with monkeypatch.context() as patch:
        _sigint_at(patch, "diloco", 2)
        status, _, err = run_cli([*argv, "--runs-dir", tmp_path / "stopped"], capsys)
    assert status == 130 and "round 2 of 3" in err, err
    printed = shlex.split(err.strip().rsplit(" with: ", 1)[1])
    status, out, err = run_cli(printed[printed.index(command):], capsys)  # the program's name dropped
    assert status == 0, err
    got, want = _finished(only_run_dir(tmp_path / "stopped")), _finished(only_run_dir(tmp_path / "clean"))
    assert got[1] == want[1]
    assert got[0].keys() == want[0].keys() and all(
        got[0][f][k].tobytes() == want[0][f][k].tobytes() for f in want[0] for k in want[0][f])
