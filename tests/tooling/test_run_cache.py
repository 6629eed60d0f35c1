"""The run cache's key: a hash of the config's changes from its defaults and a version, so a
field added with a default keeps every stored run hitting; the runs stored under the first
key (the whole config) are still found and moved to the new key."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from diloco import DiLoCoConfig
from diloco.config import AdamWConfig
from diloco.tools.studies import run_cache
from diloco.tools.studies.run_cache import RunCache, config_changes

pytestmark = pytest.mark.tooling

BASE = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=3, hidden_sizes=(6,), batch_size=8, seed=4)
DATA = {"name": "digits"}


@dataclasses.dataclass(frozen=True)
class WithNewField(DiLoCoConfig):
    """DiLoCoConfig as it would be after a release that adds a field with a default."""

    new_knob: int = 3


def _same_as(config: DiLoCoConfig, cls=WithNewField, **extra):
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(DiLoCoConfig)}
    return cls(**fields, **extra)


def test_the_changes_are_the_fields_away_from_their_defaults_sections_field_by_field():
    config = DiLoCoConfig(rounds=4).replace(inner={"lr": 0.01}, family={"fragments": 2})
    assert config_changes(config) == {"rounds": 4, "inner": {"lr": 0.01}, "family": {"fragments": 2}}
    assert config_changes(DiLoCoConfig()) == {}


def test_a_field_added_with_its_default_keeps_the_key_and_a_stored_run_hits(tmp_path):
    cache = RunCache(tmp_path)
    key = RunCache.key("diloco", BASE, 0, DATA)
    cache.put(key, {"eval_loss": 1.5})
    later = _same_as(BASE)
    assert RunCache.key("diloco", later, 0, DATA) == key
    assert cache.get(RunCache.key("diloco", later, 0, DATA)) == {"eval_loss": 1.5}
    assert RunCache.key("diloco", _same_as(BASE, new_knob=4), 0, DATA) != key, \
        "the new field set away from its default is a different run"


@dataclasses.dataclass(frozen=True)
class AdamWWithNewField(AdamWConfig):
    """The inner optimizer's section as it would be after a release that adds a field with a default."""

    new_knob: float = 0.5


@dataclasses.dataclass(frozen=True)
class WithNewSectionField(DiLoCoConfig):
    inner: AdamWWithNewField = dataclasses.field(default_factory=AdamWWithNewField)


def test_a_field_added_to_a_section_with_its_default_keeps_the_key_and_a_stored_run_hits(tmp_path):
    base = BASE.replace(inner={"lr": 0.01})
    cache = RunCache(tmp_path)
    cache.put(RunCache.key("diloco", base, 0, DATA), {"eval_loss": 1.25})
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(DiLoCoConfig)}
    later = WithNewSectionField(**{**fields, "inner": AdamWWithNewField(**dataclasses.asdict(base.inner))})
    assert cache.get(RunCache.key("diloco", later, 0, DATA)) == {"eval_loss": 1.25}
    moved = WithNewSectionField(**{**fields, "inner": AdamWWithNewField(**dataclasses.asdict(base.inner),
                                                                         new_knob=0.7)})
    assert cache.get(RunCache.key("diloco", moved, 0, DATA)) is None, "the new field away from its default misses"


def test_everything_a_run_depends_on_changes_the_key(monkeypatch):
    keys = {RunCache.key("diloco", BASE, 0, DATA), RunCache.key("diloco", BASE, 1, DATA),
            RunCache.key("sync", BASE, 0, DATA), RunCache.key("diloco", BASE.replace(rounds=4), 0, DATA),
            RunCache.key("diloco", BASE.replace(inner={"lr": 0.5}), 0, DATA),
            RunCache.key("diloco", BASE, 0, {**DATA, "num_samples": 9}),
            RunCache.key("diloco", BASE, 0, DATA, runner="async")}
    assert len(keys) == 7, "seed, algorithm, config, a section's field, data and runner each change the key"
    before = RunCache.key("diloco", BASE, 0, DATA)
    monkeypatch.setattr(run_cache, "CACHE_VERSION", run_cache.CACHE_VERSION + 1)
    assert RunCache.key("diloco", BASE, 0, DATA) != before, "a new version retrains every stored run"


def test_a_run_stored_under_the_first_key_is_found_and_moved_to_the_new_one(tmp_path):
    text = json.dumps({"algo": "diloco", "config": BASE.to_dict(), "seed": 0, "data": DATA}, sort_keys=True,
                      default=str)  # the first key, written out here as it was
    old = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    assert RunCache.legacy_key("diloco", BASE, 0, DATA) == old
    (tmp_path / f"{old}.json").write_text(json.dumps({"eval_loss": 2.0}))
    cache, key = RunCache(tmp_path), RunCache.key("diloco", BASE, 0, DATA)
    assert cache.get(key) is None, "without the legacy key the old file is not this run's"
    assert cache.get(key, old) == {"eval_loss": 2.0}
    assert (tmp_path / f"{key}.json").is_file() and cache.count() == 2


def test_a_diverged_runs_nan_loss_comes_back_a_nan_not_a_null(tmp_path):
    import math

    cache = RunCache(tmp_path)
    cache.put("k", {"eval_loss": float("nan"), "best_eval_loss": float("inf"), "arm": None})
    stored = cache.get("k")
    assert math.isnan(stored["eval_loss"]) and math.isnan(stored["best_eval_loss"]), "a tuning mean must not see None"
    assert stored["arm"] is None, "only the metrics are revived"


def test_a_reference_engine_run_is_keyed_on_the_learners_sources_and_a_fast_one_is_not(monkeypatch):
    reference, fast = BASE.replace(engine="reference"), BASE.replace(engine="fast")
    before = RunCache.key("diloco", reference, 0, DATA), RunCache.key("diloco", fast, 0, DATA)
    monkeypatch.setattr(run_cache, "learner_sources", lambda: "a milestone body changed")
    after = RunCache.key("diloco", reference, 0, DATA), RunCache.key("diloco", fast, 0, DATA)
    assert after[0] != before[0], "a fixed milestone retrains the runs that ran it"
    assert after[1] == before[1], "the fast engine does not run the milestone bodies"


def test_the_learners_sources_are_the_milestone_and_exercise_modules(tmp_path, monkeypatch):
    import importlib.util

    run_cache.learner_sources.cache_clear()
    digest = run_cache.learner_sources()
    real = importlib.util.find_spec
    for module in ("loop", "core.quantize"):  # a milestone module, an exercise module
        edited = tmp_path / f"{module}.py"
        edited.write_bytes(real(f"diloco.{module}").loader.get_data(real(f"diloco.{module}").origin) + b"# fixed\n")
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, m=module, e=edited: (
            type("Spec", (), {"origin": str(e)}) if name == f"diloco.{m}" else real(name)))
        run_cache.learner_sources.cache_clear()
        assert run_cache.learner_sources() != digest, module
        monkeypatch.undo()
    run_cache.learner_sources.cache_clear()
    assert run_cache.learner_sources() == digest


def test_a_claimed_run_is_waited_for_not_trained_again(tmp_path, monkeypatch):
    """Two processes sharing the cache: while one holds a key's claim, the other's claim waits and comes
    back with the outcome the first stored (threads stand in for the processes; no sleeps to order them)."""
    import threading
    import time

    from diloco.tools.studies.run_cache import RunCache

    monkeypatch.setattr(RunCache, "POLL_SECONDS", 0.01)
    cache = RunCache(tmp_path)
    holding, waiting, got = threading.Event(), threading.Event(), {}

    real_sleep = time.sleep

    def polling(seconds):  # the second claim found ours and waits
        waiting.set()
        real_sleep(seconds)

    monkeypatch.setattr(run_cache.time, "sleep", polling)

    def second():
        with cache.claim("k") as stored:
            got["stored"] = stored

    with cache.claim("k") as stored:
        assert stored is None and (tmp_path / "k.lock").is_file()
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(10)
        assert "stored" not in got  # still waiting: the claim is ours
        cache.put("k", {"eval_loss": 1.5})
        holding.set()
    thread.join(10)
    assert got["stored"]["eval_loss"] == 1.5
    assert not (tmp_path / "k.lock").exists()


def test_a_claim_whose_owner_is_gone_is_taken_over(tmp_path, monkeypatch):
    import subprocess
    import sys

    from diloco.tools.studies.run_cache import RunCache

    monkeypatch.setattr(RunCache, "POLL_SECONDS", 0.01)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "k.lock").write_text(gone.stdout.strip())  # that process has exited
    cache = RunCache(tmp_path)
    with cache.claim("k") as stored:
        assert stored is None
        assert (tmp_path / "k.lock").read_text() == str(__import__("os").getpid())
    assert not (tmp_path / "k.lock").exists()
    cache.put("k", {"eval_loss": 2.0})
    with cache.claim("k") as stored:  # stored already: nothing to train, no lock made
        assert stored["eval_loss"] == 2.0 and not (tmp_path / "k.lock").exists()


def test_every_study_run_goes_through_the_cache_once_and_a_stopped_one_leaves_nothing(tmp_path):
    cache, trained = RunCache(tmp_path), []

    def train():
        trained.append(1)
        return {"eval_loss": 1.0}

    assert cache.through("k", train) == ({"eval_loss": 1.0}, False)
    assert cache.through("k", train) == ({"eval_loss": 1.0}, True) and len(trained) == 1

    def stopped():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.through("j", stopped)
    assert cache.get("j") is None and not list(tmp_path.glob("*.lock")), "no outcome, no claim left behind"
