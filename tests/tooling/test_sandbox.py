"""The sandbox, its wire and the proxy, on a small stand-in ``diloco`` package.

A call through the proxy must behave as the same call in-process in every way the
milestone tests rely on (in-place changes, memory sharing, Generator state, errstate,
exceptions, warnings, callbacks), and anything else the sandboxed code does (die, hang,
write garbage or a pickle, return what may not cross) must fail the call, never pass it.
The protections are checked for real when the tests run as root (as the grader does on
Gradescope).
"""

from __future__ import annotations

import io
import os
import pwd
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from diloco.adamw import AdamWState
from diloco.tools import proxy, sandbox, wire, wire_values

ROOT = os.geteuid() == 0
REFERENCE_PACKAGE = Path(proxy.__file__).resolve().parents[1]

FAKE = '''
import gc, json, os, pickle, sys, time, warnings
import numpy as np

_cache = None
FD_OUT = json.loads(sys.argv[1])["fd_out"]


def ident(x): return x
def view(x): return x[1:]
def mutate(x): x += 1
def add_key(d): d["new"] = np.ones(2)
def same(d): return d
def shallow(d): return dict(d)
def pair():
    a = np.arange(4.0)
    return a, a[2:]
def cached():
    global _cache
    if _cache is None:
        _cache = np.zeros(3)
    return _cache
def draw(rng): return rng.standard_normal(2)
def spawned(rng): return [float(c.random()) for c in rng.spawn(2)]
def exp(x): return np.exp(x)
def plain(): return (np.float64(1.5), 1.5, 3, True, None, "s", np.float32, np.dtype("int8"), {1: (2,)}, [1j], b"b")
def fail(kind):
    class Shape(ValueError):
        pass
    if kind == "value":
        raise ValueError("x must be 2-d, got shape (3,)")
    if kind == "key":
        raise KeyError("W1")
    if kind == "custom":
        raise Shape("params: bad shape")
    if kind == "stub":
        raise NotImplementedError("milestone 02 relu: not implemented yet")
    raise SystemExit(0)
def warn():
    warnings.warn("careful", RuntimeWarning)
    return 1
def every(n, rng, on_step):
    for i in range(n):
        rng.random()
        on_step(i)
def unsendable(): return lambda: 0
def die(): os._exit(0)
def hang():
    while True:
        pass
def garbage(): os.write(FD_OUT, b"nonsense" * 100)
class Evil:
    def __init__(self, path): self.path = path
    def __reduce__(self): return (open, (self.path, "w"))
def pickled(path): os.write(FD_OUT, pickle.dumps(Evil(path)))
def pickled_array(path):
    from _diloco_sandbox import wire
    worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
    buffer = __import__("io").BytesIO()
    np.save(buffer, np.array([Evil(path)], dtype=object), allow_pickle=True)
    wire.write_frame(FD_OUT, {"kind": "return", "id": worker.call_id, "after": [], "after_kw": {},
                              "value": {"t": "A", "i": 0, "b": 0}}, [buffer.getvalue()])
def whoami(): return os.getuid(), os.getpid(), sorted(p for p in os.listdir("/proc") if p.isdigit())
def write(path):
    try:
        with open(path, "w") as handle:
            handle.write("x")
        return "written"
    except OSError as exc:
        return type(exc).__name__
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return type(exc).__name__
def detach(seconds):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(seconds)
            open("survived", "w").close()
        os._exit(0)
    return os.getcwd()
def bomb():
    children = 0
    while children < 10000:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
    return children
'''


FAKE_TEXT = '''
from typing import NamedTuple


class OneHot:  # a plain class of the project: crosses as its constructor's arguments
    def __init__(self, vocab_size, context):
        self.vocab_size, self.context = vocab_size, context
        self.input_width, self.num_features = context, context * vocab_size


class Window(NamedTuple):
    start: int
    stop: int


def widths(encoder):
    return encoder.num_features, encoder, OneHot(2, 5)


def unknown():
    return Window(1, 4)  # the grader's diloco.text has no Window: it cannot be rebuilt there


def grow(encoder):
    encoder.vocab_size += 1


def retable(encoder):
    encoder.table = encoder.table + 1  # a new array in place of the old one


def apply(f, x):
    return f(x) + f.offset
'''


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake")
    (root / "diloco").mkdir()
    (root / "diloco" / "__init__.py").write_text("")
    (root / "diloco" / "probe.py").write_text(FAKE)
    (root / "diloco" / "text.py").write_text(FAKE_TEXT)  # same module and class names as the grader's
    folder = tmp_path_factory.mktemp("sandbox")
    return sandbox.prepare(root, folder, user="nobody", call_timeout=10.0, hide=[REFERENCE_PACKAGE],
                           cover=[REFERENCE_PACKAGE.parents[1]])


@pytest.fixture
def session(config, monkeypatch):
    """A proxy session of its own (the module's worker is started on first use)."""
    state = proxy._Session(config, None)
    monkeypatch.setattr(proxy, "_session", state)
    yield state
    if state.box is not None:
        state.box.close()


def call(name, *args, **kwargs):
    return proxy.call(f"probe.{name}", args, kwargs)


def test_identity_views_and_in_place_changes_come_back_as_in_process(session):
    x = np.arange(4.0)
    assert call("ident", x) is x
    tail = call("view", x)
    assert np.shares_memory(tail, x) and tail.tolist() == [1.0, 2.0, 3.0]
    call("mutate", x)
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0], "an in-place change must reach the caller's array"
    d = {"w": np.zeros(2)}
    assert call("same", d) is d
    copy = call("shallow", d)
    assert copy is not d and copy["w"] is d["w"], "a shallow copy shares its arrays, as in-process"
    call("add_key", d)
    assert list(d) == ["w", "new"] and d["new"].tolist() == [1.0, 1.0]
    whole, part = call("pair")
    assert np.shares_memory(whole, part) and part.tolist() == [2.0, 3.0]
    first, second = call("cached"), call("cached")
    assert np.shares_memory(first, second), "a result cached across calls is one buffer for the caller too"


def test_the_projects_records_and_callable_objects_cross(session):
    from diloco.text import OneHot

    encoder = OneHot(4, 3)
    width, same, other = proxy.call("text.widths", (encoder,), {})
    assert width == 12 and same is encoder
    assert type(other) is OneHot and (other.vocab_size, other.num_features) == (2, 10)
    with pytest.raises(proxy.SandboxError, match="'text.Window' is not a record class of the project"):
        proxy.call("text.unknown", (), {})
    proxy.call("text.grow", (encoder,), {})
    assert encoder.vocab_size == 5, "a change to a plain object's attributes reaches the caller's object"
    encoder.table = np.zeros(2)  # an attribute the record list does not name: it does not cross
    with pytest.raises(AttributeError, match="table"):
        proxy.call("text.retable", (encoder,), {})

    class Shift:  # a test's own callable object: it stays here, its simple attributes travel
        offset = None

        def __init__(self):
            self.offset = 10.0

        def __call__(self, x):
            return x * 2

    assert proxy.call("text.apply", (Shift(), np.arange(3.0)), {}).tolist() == [10.0, 12.0, 14.0]


def test_plain_values_keep_their_types(session):
    got = call("plain")
    assert type(got[0]) is np.float64 and type(got[1]) is float and type(got[2]) is int and got[3] is True
    assert got[4:] == (None, "s", np.float32, np.dtype("int8"), {1: (2,)}, [1j], b"b")


def test_generator_state_and_spawns_advance_as_in_process(session):
    rng, twin = np.random.default_rng(7), np.random.default_rng(7)
    assert call("draw", rng).tolist() == twin.standard_normal(2).tolist()
    assert rng.random() == twin.random(), "the caller's generator must have advanced"
    assert call("spawned", rng) == [float(c.random()) for c in twin.spawn(2)]
    assert rng.bit_generator.seed_seq.n_children_spawned == 2
    seen = []
    call("every", 3, rng, lambda i: seen.append((i, rng.bit_generator.state["state"]["state"])))
    states = []
    for i in range(3):
        twin.random()
        states.append((i, twin.bit_generator.state["state"]["state"]))
    assert seen == states, "a callback sees the generator as it is at that moment of the call"


def test_errstate_exceptions_and_warnings_cross(session):
    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow"):
        call("exp", np.array([1e4]))
    with pytest.raises(ValueError, match=r"x must be 2-d") as info:
        call("fail", "value")
    assert info.value._diloco_sandbox_where.startswith("diloco/probe.py:")
    with pytest.raises(KeyError) as info:
        call("fail", "key")
    assert info.value.args == ("W1",)
    with pytest.raises(ValueError, match="params"):  # a subclass of ValueError is raised as ValueError
        call("fail", "custom")
    with pytest.raises(NotImplementedError) as info:
        call("fail", "stub")
    assert type(info.value) is NotImplementedError and str(info.value).startswith("milestone 02 relu")
    with pytest.raises(proxy.SandboxError, match="SystemExit"):
        call("fail", "exit")
    with pytest.warns(RuntimeWarning, match="careful"):
        assert call("warn") == 1


def test_what_may_not_cross_fails_the_call(session):
    with pytest.raises(proxy.SandboxError, match="may not leave the sandbox"):
        call("unsendable")
    with pytest.raises(proxy.SandboxError, match="could not call probe.ident with these arguments"):
        call("ident", AdamWState(0, {}, {}))  # the stand-in package has no AdamWState to rebuild it with
    anything = object()  # crosses as a stand-in, and comes back as the caller's own object
    assert call("ident", anything) is anything


@pytest.mark.parametrize("name, message", [
    ("die", "exited early"), ("garbage", "malformed reply"), ("pickled", "malformed reply"),
    ("pickled_array", "malformed reply"), ("hang", "did not answer within"),
])
def test_a_misbehaving_sandbox_fails_the_call_and_is_restarted(session, tmp_path, monkeypatch, name, message):
    monkeypatch.setitem(session.config, "call_timeout", 2.0)
    marker = tmp_path / "unpickled"  # the grader's folder: the sandbox itself cannot write here
    with pytest.raises(proxy.SandboxError, match=message):
        call(name, str(marker)) if name.startswith("pickled") else call(name)
    assert not marker.exists(), "the grader unpickled what the sandbox sent"
    assert call("ident", 5) == 5, "the next call gets a fresh sandbox"
    assert session.starts == 2


def test_a_sandbox_that_keeps_failing_is_not_restarted_forever(session):
    for _ in range(proxy.MAX_STARTS):
        with pytest.raises(proxy.SandboxError):
            call("die")
    with pytest.raises(proxy.SandboxError, match="not restarted"):
        call("ident", 1)


def test_frames_refuse_pickles_and_garbage():
    read, write = os.pipe()
    try:
        buffer = io.BytesIO()
        np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
        with pytest.raises(wire.WireError):
            wire._load(buffer.getvalue())
        os.write(write, b"\x80\x04K\x01.")  # pickle.dumps(1)
        with pytest.raises(wire.WireError, match="not a frame"):
            wire.read_frame(read, time.monotonic() + 5)
    finally:
        os.close(read)
        os.close(write)
    registry, names = wire.Registry("t"), wire_values.Names(lambda module: None)
    for item in ({"t": "O", "i": 0, "type": "os.system", "repr": "x"}, {"t": "F", "i": 0}, {"t": "Q"},
                 {"t": "@", "i": 3}, {"t": "Y", "v": "builtins.eval"}, {"t": "D", "i": 0, "k": [[1]], "v": [1]}):
        with pytest.raises(wire.WireError):
            wire_values.Decoder(registry, names, []).decode(item)


@pytest.mark.skipif(not ROOT, reason="the sandbox drops privileges and locks the filesystem only as root")
def test_as_root_the_sandbox_runs_locked_in(session, config, tmp_path):
    uid, pid, pids = call("whoami")
    assert uid == pwd.getpwnam("nobody").pw_uid
    if config["namespaces"]:
        assert pid == 1 and len(pids) <= 3, "a PID namespace of its own: it sees only itself"
        assert session.hello["readonly"] is True
        assert call("write", str(tmp_path.parent / "diloco-sandbox-escape")) in ("OSError", "PermissionError")
        assert call("write", "/tmp/diloco-sandbox-escape") == "OSError"  # read-only, though /tmp is 1777
        assert call("listing", str(REFERENCE_PACKAGE)) in ([], "PermissionError"), "the reference is hidden"
        shown = call("listing", str(REFERENCE_PACKAGE.parents[1]))  # the checkout: only what Python needs
        assert "pyproject.toml" not in shown and ".git" not in shown and "tests" not in shown, shown
    assert call("write", "inside") == "written"  # its own folder is writable
    assert call("write", str(REFERENCE_PACKAGE / "model.py")) in ("OSError", "PermissionError")
    assert not Path("/tmp/diloco-sandbox-escape").exists()


@pytest.mark.skipif(not sandbox.namespace_flags(), reason="needs unshare (a PID namespace)")
def test_detached_children_and_fork_bombs_die_with_the_sandbox(session):
    work = Path(call("detach", 2))
    children = call("bomb")
    assert 0 < children < 200, f"the process limit must stop a fork bomb, it made {children}"
    session.box.close()
    time.sleep(3)
    if work.exists():  # the folder is the caller's to remove; the child must not have outlived the sandbox
        assert not (work / "survived").exists()
        shutil.rmtree(work, ignore_errors=True)


def test_protections_are_reported(session, config):
    call("ident", 1)
    text = sandbox.protections(config, session.hello)
    assert "separate process" in text and "s per call" in text
    if ROOT and config["namespaces"]:
        assert "user nobody" in text and "namespaces" in text and "read-only" in text


def test_the_copy_of_the_graded_package_holds_no_links(tmp_path):
    """A link in a submission could make the root grader copy a secret where the sandbox reads it."""
    package = tmp_path / "submission" / "diloco"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    secret = tmp_path / "secret"
    secret.write_text("s")
    secret.chmod(0o600)
    (package / "soft.py").symlink_to(secret)
    os.link(secret, package / "hard.py")
    folder = tmp_path / "sandbox"
    folder.mkdir()
    sandbox.prepare(package.parent, folder, user=None)
    assert sorted(p.name for p in (folder / "pkg" / "diloco").iterdir()) == ["__init__.py", "sub"]
    assert secret.stat().st_mode & 0o777 == 0o600
