"""The pre-flight memory estimate against the peak a run really reaches.

``diloco.tools.cli.preflight.estimate_memory`` is the figure a run is refused by; here it
is compared with the peak that ``tracemalloc`` (which sees NumPy's buffers) measures over a
real ``train_resumable`` run, on both engines: without checkpoints, with a checkpoint every
round, and interrupted mid-run (the kept round written beside the live one), with and
without the workers' own params in the kept round. The models are wide enough that
parameter-sized arrays dominate, so a missing term (the kept round, round 0's state, a
checkpoint's serialised copy) shows as a peak above the estimate.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from diloco.config import DiLoCoConfig
from diloco.data import load_digits_split
from diloco.models.mlp import MLPModel
from diloco.tools.cli.preflight import estimate_memory
from diloco.tools.runs.training import train_resumable

# The estimate must not fall below the measured peak (a run it admits could still run out of memory)
# by more than rounding, nor exceed it by more than half (a run that fits refused).
LOWEST, HIGHEST = 0.97, 1.5


def measured_peak(config, data, tmp_path, checkpoints: str) -> int:
    """Peak bytes (tracemalloc) of a ``train_resumable`` run beyond what was allocated before it."""
    def interrupt(record):  # a signal after round 2's training: the kept round 1 is written beside it
        if checkpoints == "interrupt" and record["round"] == 2:
            raise KeyboardInterrupt

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        try:
            train_resumable("diloco", data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test,
                            checkpoint_dir=None if checkpoints == "none" else tmp_path,
                            checkpoint_every=1 if checkpoints == "every" else None, on_round=interrupt)
        except KeyboardInterrupt:
            assert checkpoints == "interrupt"
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("checkpoints, drop_prob", [("none", 0.0), ("every", 0.0), ("interrupt", 0.0),
                                                    ("interrupt", 0.5)])
def test_the_estimate_is_at_or_just_above_the_measured_peak(engine, checkpoints, drop_prob, tmp_path):
    data = load_digits_split(0)
    config = DiLoCoConfig(num_workers=3, inner_steps=2, rounds=3, hidden_sizes=(700, 700), batch_size=16,
                          engine=engine, drop_prob=drop_prob)
    peak = measured_peak(config, data, tmp_path, checkpoints)
    model = MLPModel((data.x_train.shape[1], *config.hidden_sizes, data.num_classes))
    estimate, _ = estimate_memory(config, model, len(data.y_test), checkpointing=checkpoints != "none")
    assert LOWEST * peak <= estimate <= HIGHEST * peak, f"estimate {estimate:,} bytes, measured peak {peak:,}"


def test_the_fast_engines_stacked_layout_holds_k_models_at_once(tmp_path):
    data = load_digits_split(0)  # 300-300: 0.9 MB a model, 7 MB for 8: stacked (diloco.engine.layout)
    config = DiLoCoConfig(num_workers=8, inner_steps=2, rounds=3, hidden_sizes=(300, 300), batch_size=16,
                          engine="fast")
    peak = measured_peak(config, data, tmp_path, "none")
    estimate, _ = estimate_memory(config, MLPModel((64, *config.hidden_sizes, 10)), len(data.y_test),
                                  checkpointing=False)
    assert LOWEST * peak <= estimate <= HIGHEST * peak, f"estimate {estimate:,} bytes, measured peak {peak:,}"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_the_transformers_estimate_counts_its_parameters_and_activations(engine):
    from diloco.core.driver import train
    from diloco.core.model_seam import data_model
    from diloco.text import load_shakespeare

    text = load_shakespeare(64, eval_windows=256)
    x, y = text.dataset.x_train[:4000].copy(), text.dataset.y_train[:4000].copy()  # the data: not the run's
    config = DiLoCoConfig(num_workers=4, inner_steps=3, rounds=2, batch_size=16, model="transformer",
                          dtype="float32", engine=engine)
    # The fast engine's kernels are compiled (or loaded from their cache) at their first call in a process:
    # numba's memory, not the run's arrays. A tiny run first, so the peak does not depend on the test order
    # (run alone, in a fresh process, the fast engine's peak was 1.7 times the estimate).
    train("diloco", x[:64], y[:64], config.replace(rounds=1, inner_steps=1), encode=text.encode, executor=engine)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        train("diloco", x, y, config, x_eval=text.dataset.x_test, y_eval=text.dataset.y_test, encode=text.encode,
              executor=engine)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    estimate, _ = estimate_memory(config, data_model(config, x, text.encode), 256, checkpointing=False)
    assert LOWEST * peak <= estimate <= HIGHEST * peak, f"estimate {estimate:,} bytes, measured peak {peak:,}"


@pytest.mark.parametrize("layers", [1, 2, 3, 7])
@pytest.mark.parametrize("tied", [True, False])
def test_the_transformers_count_without_listing_its_blocks_is_its_tables(layers, tied):
    """``TransformerModel.parameter_count`` (one block's table, then each further block's share) against
    the sum over the whole table (``parameter_shapes``): a billion blocks are never listed."""
    import numpy as np

    from diloco.config import TransformerShape
    from diloco.core.model_seam import _transformer, parameter_count

    config = DiLoCoConfig(model="transformer", transformer=TransformerShape(d_model=12, n_heads=3, n_layers=layers,
                                                                            mlp_ratio=3, tied=tied))
    model = _transformer(config, 11, 5)
    assert parameter_count(model) == sum(int(np.prod(shape)) for shape in model.parameter_shapes().values())


@pytest.mark.parametrize("flags, named", [(["--model", "transformer", "--n-layers", "1000000000"], "--n-layers"),
                                          (["--model", "transformer", "--context", "1000000"], "--context"),
                                          (["--context", "1000000"], "--context")])
def test_huge_text_runs_are_refused_before_their_windows_are_made(flags, named, tmp_path, capsys, monkeypatch):
    """``--n-layers 1000000000`` and ``--context 1000000`` once ran for minutes (15 GB of windows)
    before a refusal; now the check needs the text's length and vocabulary only: the windows are
    never made (their maker fails the test if called)."""
    from cli_helpers import run_cli

    import diloco.text

    def never(*args, **kwargs):
        raise AssertionError("the windows were made before the refusal")

    monkeypatch.setattr(diloco.text, "char_windows", never)
    status, _, err = run_cli(["train", "--data", "shakespeare", *flags, "-q", "--no-plots", "--runs-dir", tmp_path],
                             capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "of memory" in err and named in err, err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
