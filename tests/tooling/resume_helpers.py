"""What the resume tests of the core's mechanisms share: a run that keeps a copy of every
round's checkpoint, and the check that resuming from each copy gives the same run, bit for bit."""

from __future__ import annotations

import shutil

from diloco.tools.runs.training import train_resumable


def run_keeping_checkpoints(algo, data, config, tmp_path, encode=None):
    """``(result, copies)``: the run with a checkpoint every round, and ``{round: folder}``
    holding a copy of the checkpoint written after that round."""
    x, y, x_eval, y_eval = data
    copies = {}

    def keep(manifest, round_index):
        copies[round_index] = tmp_path / f"after{round_index}"
        copies[round_index].mkdir()
        for path in (manifest, manifest.with_suffix(".npz")):
            shutil.copy(path, copies[round_index] / path.name)

    want = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, checkpoint_dir=tmp_path / "run",
                           checkpoint_every=1, on_checkpoint=keep, encode=encode)
    return want, copies


def assert_resumes_bit_identical(algo, data, config, want, copies, stops=(1, 2), encode=None) -> None:
    """Resuming from the copy after each round of ``stops`` ends at ``want``'s params (bit for
    bit) and history."""
    x, y, x_eval, y_eval = data
    for stop in stops:
        got = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, resume_from=copies[stop],
                              encode=encode)
        assert all(got.params[k].tobytes() == want.params[k].tobytes() for k in want.params), stop
        assert got.history == want.history
