"""Each kind of value the sandbox wire carries, both ways, and how an exception is rebuilt.

One case per branch of ``Encoder`` / ``Decoder`` and ``wire.rebuild_exception``, in this
process, without a sandbox: the exploits suites (test_wire_exploits, test_exploits) cover
the hostile messages.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from diloco.config import AdamWConfig
from diloco.tools.sandbox import wire
from diloco.tools.sandbox.wire_values import Decoder, Encoder, Names

pytestmark = pytest.mark.tooling

NAMES = Names(lambda module: sys.modules.get(f"diloco.{module}"))


def round_trip(value, *, lenient=False, args=None, make_callable=None, opaque=False):
    encoder = Encoder(wire.Registry("a"), NAMES, lenient=lenient)
    item = encoder.encode(value)
    decoder = Decoder(wire.Registry("b"), NAMES, encoder.blobs, args=args, make_callable=make_callable,
                      opaque=opaque)
    return item, decoder.decode(item)


@pytest.mark.parametrize("value", [
    3 + 4j, b"\x00bytes", {1, 2}, frozenset({"a"}), np.float32, float, np.dtype("<f4"), np.int16(7),
    (1, [2, {"k": (3,)}]), AdamWConfig(lr=0.5),
])
def test_plain_values_cross_whole_and_of_their_own_type(value):
    _, back = round_trip(value)
    assert back == value and type(back) is type(value)


def test_tags_of_the_plain_values():
    tags = {"complex": (1j, "X"), "bytes": (b"", "B"), "set": (set(), "E"), "np type": (np.int8, "Y"),
            "builtin type": (int, "Y"), "dtype": (np.dtype("f8"), "Z"), "tuple": ((), "T"), "list": ([], "L"),
            "dict": ({}, "D"), "scalar": (np.float64(1), "S"), "record": (AdamWConfig(), "C")}
    for what, (value, tag) in tags.items():
        assert round_trip(value)[0]["t"] == tag, what
    assert round_trip(np.int8)[0]["v"] == "numpy.int8" and round_trip(int)[0]["v"] == "builtins.int"
    assert round_trip(frozenset())[0]["f"] is True and round_trip(set())[0]["f"] is False


def test_generators_cross_with_their_state_and_seed_sequence():
    rng = np.random.default_rng(5)
    rng.spawn(2)
    item, back = round_trip(rng)
    assert item["t"] == "G" and "q" in item and item["q"]["n_children_spawned"] == 2
    assert back.random() == rng.random()
    legacy = np.random.RandomState(3)
    item, back = round_trip(legacy)
    assert item["t"] == "R" and "q" not in item and back.rand() == legacy.rand()


def test_the_strict_side_refuses_what_the_lenient_side_sends_as_a_callable_or_a_stand_in():
    class Thing:
        def __repr__(self):
            raise RuntimeError("no repr")

    def f():
        pass

    f.width = 3
    f.table = [1]
    with pytest.raises(wire.WireError, match="cannot cross the sandbox boundary"):
        round_trip(f)
    made = []
    item, back = round_trip(f, lenient=True, make_callable=lambda i, attrs: made.append((i, attrs)) or "stand-in")
    assert item["t"] == "F" and back == "stand-in" and made == [(0, {"width": 3})]
    with pytest.raises(wire.WireError, match="unknown or forbidden item tag 'F'"):
        round_trip(f, lenient=True)
    item, back = round_trip(Thing(), lenient=True, opaque=True)
    assert item["t"] == "O" and item["repr"] == "?" and repr(back) == "?" and type(back).__name__ == "Thing"
    with pytest.raises(wire.WireError, match="unknown or forbidden item tag 'O'"):
        round_trip(Thing(), lenient=True)
    long = type("Long", (), {"__repr__": lambda self: "x" * 500})()
    assert len(round_trip(long, lenient=True, opaque=True)[0]["repr"]) == 200
    with pytest.raises(wire.WireError, match="are not plain"):
        Decoder(wire.Registry("b"), NAMES, [], make_callable=lambda i, a: None).decode(
            {"t": "F", "i": 0, "attrs": {"x": [1]}})


def test_a_request_object_sent_back_is_the_caller_s_own_object():
    mine = object()
    encoder = Encoder(wire.Registry("a"), NAMES, lenient=True, args=(mine,))
    assert encoder.encode(mine) == {"t": "=", "i": 0, "a": 0}
    listed, plain = {"a": 1}, [1, 2]
    encoder = Encoder(wire.Registry("a"), NAMES, args=(listed, plain))
    items = [encoder.encode(listed), encoder.encode(plain)]
    decoded = Decoder(wire.Registry("b"), NAMES, encoder.blobs, args=[listed, plain])
    assert [decoded.decode(i) for i in items] == [listed, plain]
    assert decoded.objects[0] is listed and decoded.objects[1] is plain


def test_a_changed_request_container_is_refilled_in_place_and_an_unchanged_one_kept():
    target_d, target_l = {"a": 1}, [1, 2]
    decoder = Decoder(wire.Registry("b"), NAMES, [], args=[target_d, target_l])
    d = decoder.decode({"t": "D", "i": 0, "a": 0, "k": ["b"], "v": [2]})
    lst = decoder.decode({"t": "L", "i": 1, "a": 1, "v": [3]})
    assert d is target_d and d == {"b": 2} and lst is target_l and lst == [3]
    same_values = {"a": 1, "b": 2}
    decoder = Decoder(wire.Registry("b"), NAMES, [], args=[same_values])
    assert decoder.decode({"t": "D", "i": 0, "a": 0, "k": ["b", "a"], "v": [2, 1]}) == {"b": 2, "a": 1}
    assert list(same_values) == ["b", "a"], "new key order: refilled"
    with pytest.raises(wire.WireError, match="more keys than values"):
        Decoder(wire.Registry("b"), NAMES, []).decode({"t": "D", "i": 0, "k": ["a", "b"], "v": [1]})


def test_a_scalar_blob_must_be_0_d():
    blob = wire.blob_of(np.arange(3.0))
    with pytest.raises(wire.WireError, match="not 0-d"):
        Decoder(wire.Registry("b"), NAMES, [blob]).decode({"t": "S", "b": 0})


@pytest.mark.parametrize("error, expected", [
    ({"bases": ["MyError", "ValueError", "Exception"], "message": "bad", "args": ["bad"]}, ValueError("bad")),
    ({"bases": ["KeyError"], "message": "'k'", "args": ["k"]}, KeyError("k")),
    ({"bases": ["KeyError"], "message": "'k'", "args": None}, KeyError("'k'")),
    ({"bases": ["OSError"], "message": "[Errno 2] gone: 'f'", "args": [2, "gone"]}, OSError("[Errno 2] gone: 'f'")),
    ({"bases": ["ValueError"], "message": str((1,) * 21), "args": [1] * 21}, ValueError(str((1,) * 21))),  # > 20 args
    ({"bases": ["ValueError"], "message": str((1,) * 20), "args": [1] * 20}, ValueError(*(1,) * 20)),
    ({"bases": ["ValueError"], "message": "m", "args": ["x" * 20001]}, ValueError("m")),
    ({"bases": ["ValueError"], "message": "m", "args": [[1]]}, ValueError("m")),
    ({"bases": ["UnicodeDecodeError"], "message": "u", "args": None}, Exception("u")),
    ({"bases": [3, "eval", "TypeError"], "message": "t"}, TypeError("t")),
    ({"bases": ["SystemExit", "BaseException"], "message": "1"}, None),
    ({"bases": ["ValueError"], "message": "x" * 30000}, ValueError("x" * 20000)),
])
def test_an_exception_is_rebuilt_as_its_nearest_builtin_with_its_message(error, expected):
    got = wire.rebuild_exception(error)
    if expected is None:
        assert got is None
    else:
        assert type(got) is type(expected) and str(got) == str(expected) and got.args == expected.args


def test_a_malformed_exception_is_refused():
    for error in (None, {"bases": "ValueError", "message": "m"}, {"bases": [], "message": 3}):
        with pytest.raises(wire.WireError, match="malformed exception"):
            wire.rebuild_exception(error)


@pytest.mark.parametrize("name", ["numpy.ndarray", "numpy.random", "os.int", "builtins.open", "numpy.int8.x"])
def test_only_builtin_types_and_numpy_scalar_types_cross_by_name(name):
    with pytest.raises(wire.WireError, match="may not cross"):
        Decoder(wire.Registry("b"), NAMES, []).decode({"t": "Y", "v": name})
    assert Decoder(wire.Registry("b"), NAMES, []).decode({"t": "Y", "v": "builtins.int"}) is int


class _Counting(dict):
    clears = 0

    def clear(self):
        type(self).clears += 1
        super().clear()


@pytest.mark.parametrize("target, keys, values, expected", [
    ({"a": 1}, ["b"], [1], {"b": 1}),  # same values, other keys
    ({"a": 1}, ["a"], [2], {"a": 2}),  # same keys, another value
    ({"a": 1, "b": 2}, ["b", "a"], [2, 1], {"b": 2, "a": 1}),  # another order
])
def test_a_request_dict_takes_any_change(target, keys, values, expected):
    decoder = Decoder(wire.Registry("b"), NAMES, [], args=[target])
    assert decoder.decode({"t": "D", "i": 0, "a": 0, "k": keys, "v": values}) is target
    assert target == expected and list(target) == list(expected)


@pytest.mark.parametrize("target, values", [([1, 2], [1]), ([1, 2], [3, 4]), ([1], [1, 2])])
def test_a_request_list_takes_any_change(target, values):
    decoder = Decoder(wire.Registry("b"), NAMES, [], args=[target])
    assert decoder.decode({"t": "L", "i": 0, "a": 0, "v": values}) is target and target == values


def test_an_unchanged_request_container_is_not_rewritten():
    target = _Counting(a=1)
    Decoder(wire.Registry("b"), NAMES, [], args=[target]).decode({"t": "D", "i": 0, "a": 0, "k": ["a"], "v": [1]})
    assert _Counting.clears == 0
    Decoder(wire.Registry("b"), NAMES, [], args=[target]).decode({"t": "D", "i": 0, "a": 0, "k": ["a"], "v": [2]})
    assert _Counting.clears == 1 and target == {"a": 2}

    class Watched(list):
        writes = 0

        def __setitem__(self, index, value):
            type(self).writes += 1
            super().__setitem__(index, value)

    items = Watched([1, 2])
    Decoder(wire.Registry("b"), NAMES, [], args=[items]).decode({"t": "L", "i": 0, "a": 0, "v": [1, 2]})
    assert Watched.writes == 0


def test_a_class_of_the_project_that_is_not_listed_is_named_on_the_strict_side():
    from diloco.tools.grading.grade_report import MilestoneResult  # a project NamedTuple that is no record

    value = MilestoneResult(None, "passed")
    with pytest.raises(wire.WireError, match="'tools.grading.grade_report.MilestoneResult' is not a record class"):
        round_trip(value)
    assert round_trip(value, lenient=True, opaque=True)[0]["t"] == "O", "the caller's side sends a stand-in"
