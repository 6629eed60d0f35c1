"""Exercise x02 (optional, outside the 30): the Streaming DiLoCo fragment schedule.

``fragment_layers``, ``fragment_keys``, ``sync_offsets`` and ``sync_steps`` in
``diloco.core.schedule`` are the library's own: the training core schedules every streaming
run with them. Expected values are hand-worked (``tests/fixtures/x02.json``) or come from
the paper's definition written here as a brute force ("fragment p syncs after every step t
with (t - t_p) mod H == 0, t_p = floor(p H / P)"), never from the package.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.core.schedule import fragment_keys, fragment_layers, sync_offsets, sync_steps
from helpers import load_fixture

pytestmark = pytest.mark.x02


def mlp_params(num_layers: int) -> dict:
    """W1, b1, ..., WL, bL of a small MLP, built by hand."""
    params = {}
    for layer in range(1, num_layers + 1):
        params[f"W{layer}"] = np.zeros((2, 2))
        params[f"b{layer}"] = np.zeros(2)
    return params


def as_lists(groups) -> list:
    return [[int(layer) for layer in group] for group in groups]


# --------------------------------------------------------------------------- fragment_layers / fragment_keys


def test_fragment_layers_match_hand_worked_fixture():
    fixture = load_fixture("x02")
    n, p = fixture["inputs"]["num_layers"], fixture["inputs"]["fragments"]
    for pattern in ("strided", "sequential"):
        got = fragment_layers(n, p, pattern)
        assert isinstance(got, list), f"fragment_layers must return a list, got {type(got).__name__}"
        assert as_lists(got) == fixture["expected"][pattern], (
            f"{pattern} fragments of {n} layers in {p}:\n  expected {fixture['expected'][pattern]}\n"
            f"       got {as_lists(got)}")


def test_fragment_layers_strided_is_the_default_and_the_edges():
    assert as_lists(fragment_layers(4, 2)) == [[1, 3], [2, 4]], "the default pattern is strided"
    assert as_lists(fragment_layers(4, 2, "sequential")) == [[1, 2], [3, 4]]
    assert as_lists(fragment_layers(3, 1)) == [[1, 2, 3]] == as_lists(fragment_layers(3, 1, "sequential"))
    assert as_lists(fragment_layers(3, 3)) == [[1], [2], [3]] == as_lists(fragment_layers(3, 3, "sequential"))


@given(num_layers=st.integers(1, 40), data=st.data())
def test_fragments_partition_the_layers(num_layers, data):
    fragments = data.draw(st.integers(1, num_layers))
    for pattern in ("strided", "sequential"):
        groups = as_lists(fragment_layers(num_layers, fragments, pattern))
        assert len(groups) == fragments, f"{pattern}: expected {fragments} fragments, got {len(groups)}"
        assert all(groups) and all(g == sorted(g) for g in groups), f"{pattern}: empty or unsorted {groups}"
        assert sorted(layer for g in groups for layer in g) == list(range(1, num_layers + 1)), (
            f"{pattern}: every layer 1..{num_layers} exactly once, got {groups}")
        sizes = [len(g) for g in groups]
        assert max(sizes) - min(sizes) <= 1, f"{pattern}: sizes differ by more than one: {sizes}"
    strided = as_lists(fragment_layers(num_layers, fragments, "strided"))
    assert all((layer - 1) % fragments == p for p, g in enumerate(strided) for layer in g), strided
    sequential = as_lists(fragment_layers(num_layers, fragments, "sequential"))
    assert [layer for g in sequential for layer in g] == list(range(1, num_layers + 1)), sequential
    assert [len(g) for g in sequential] == sorted((len(g) for g in sequential), reverse=True), (
        f"sequential: the longer runs come first (np.array_split), got {sequential}")


def test_fragment_keys_match_hand_worked_fixture():
    fixture = load_fixture("x02")
    case = fixture["inputs"]["keys_of"]
    got = fragment_keys(mlp_params(case["num_layers"]), case["fragments"])
    assert [tuple(k) for k in got] == [tuple(k) for k in fixture["expected"]["keys_strided"]], (
        f"expected {fixture['expected']['keys_strided']}, got {got}")
    assert all(isinstance(k, tuple) for k in got), "each fragment's keys are a tuple"
    assert fragment_keys(mlp_params(3), 2, "sequential") == [("W1", "b1", "W2", "b2"), ("W3", "b3")]


@given(num_layers=st.integers(1, 12), data=st.data())
def test_fragment_keys_cover_every_parameter_once(num_layers, data):
    fragments = data.draw(st.integers(1, num_layers))
    pattern = data.draw(st.sampled_from(["strided", "sequential"]))
    params = mlp_params(num_layers)
    keys = fragment_keys(params, fragments, pattern)
    assert sorted(k for group in keys for k in group) == sorted(params), keys
    for group in keys:
        assert all(f"b{key[1:]}" in group for key in group if key.startswith("W")), f"W_l and b_l apart: {group}"


def test_fragment_layers_and_keys_refuse_bad_arguments():
    with pytest.raises(ValueError, match="fragments"):
        fragment_layers(3, 4)
    with pytest.raises(ValueError, match="pattern"):
        fragment_layers(4, 2, "zigzag")
    with pytest.raises(ValueError, match="fragments"):
        fragment_keys(mlp_params(2), 3)
    with pytest.raises(ValueError, match="params"):
        fragment_keys({"W1": np.zeros((2, 2))}, 1)


# --------------------------------------------------------------------------- sync_offsets / sync_steps


def test_sync_offsets_match_hand_worked_fixture():
    expected = load_fixture("x02")["expected"]
    for (p, h), key in (((3, 4), "offsets"), ((3, 5), "offsets_P3_H5"), ((4, 6), "offsets_P4_H6")):
        got = sync_offsets(p, h)
        assert [int(t) for t in got] == expected[key], f"sync_offsets({p}, {h}): expected {expected[key]}, got {got}"
    assert sync_offsets(4, 100) == [0, 25, 50, 75] and sync_offsets(1, 7) == [0] and sync_offsets(4, 4) == [0, 1, 2, 3]


def test_sync_steps_match_hand_worked_fixture():
    fixture = load_fixture("x02")
    p, h, total = (fixture["inputs"][k] for k in ("fragments", "inner_steps", "total_steps"))
    for fragment, expected in enumerate(fixture["expected"]["steps"]):
        got = sync_steps(fragment, p, h, total)
        assert [int(t) for t in got] == expected, (
            f"sync_steps({fragment}, {p}, {h}, {total}): expected {expected}, got {list(got)}")
    assert sync_steps(1, 2, 5, 12) == [2, 7, 12] and sync_steps(0, 2, 5, 12) == [5, 10]
    assert sync_steps(1, 3, 4, 0) == [] and sync_steps(0, 1, 4, 3) == []


@given(inner_steps=st.integers(1, 60), data=st.data())
def test_sync_offsets_follow_the_definition(inner_steps, data):
    fragments = data.draw(st.integers(1, inner_steps))
    got = [int(t) for t in sync_offsets(fragments, inner_steps)]
    expected = [p * inner_steps // fragments for p in range(fragments)]  # floor(p H / P), in integers
    assert got == expected, f"sync_offsets({fragments}, {inner_steps}): expected {expected}, got {got}"
    assert got[0] == 0 and all(a < b for a, b in zip(got, got[1:], strict=False)) and got[-1] < inner_steps


@given(inner_steps=st.integers(1, 20), data=st.data())
def test_sync_steps_follow_the_definition(inner_steps, data):
    """Brute force over every step: fragment p syncs after t iff (t - t_p) mod H == 0, 1 <= t <= T."""
    fragments = data.draw(st.integers(1, inner_steps))
    total = data.draw(st.integers(0, 5 * inner_steps))
    every = []
    for p in range(fragments):
        t_p = p * inner_steps // fragments
        expected = [t for t in range(1, total + 1) if (t - t_p) % inner_steps == 0]
        got = [int(t) for t in sync_steps(p, fragments, inner_steps, total)]
        assert got == expected, f"sync_steps({p}, {fragments}, {inner_steps}, {total}): expected {expected}, got {got}"
        every += got
    for start in range(1, total - inner_steps + 2):  # every window of H steps holds one sync of each fragment
        window = [t for t in every if start <= t < start + inner_steps]
        assert len(window) == fragments, f"steps {start}..{start + inner_steps - 1} hold {len(window)} syncs"


def test_sync_offsets_and_steps_refuse_bad_arguments():
    with pytest.raises(ValueError, match="fragments"):
        sync_offsets(5, 4)  # more fragments than inner steps: two would share an offset
    with pytest.raises(ValueError, match="inner_steps"):
        sync_offsets(1, 0)
    with pytest.raises(ValueError, match="fragment"):
        sync_steps(3, 3, 4, 12)
    with pytest.raises(ValueError, match="total_steps"):
        sync_steps(0, 3, 4, -1)
