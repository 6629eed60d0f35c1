"""The sandbox worker: the one process that imports the graded package and runs its functions.

Started only by ``diloco.tools.sandbox.box.Sandbox``, inside bubblewrap's allow-list root
(``diloco.tools.sandbox.sandbox_root``), from its copy at ``/sandbox/bin``, as ``python -I -B
sandbox_worker.py CONFIG`` (``-I``: no ``PYTHON*`` variables, no user site, no script
folder on ``sys.path``, so nothing of the submission runs before it is meant to). While
still trusted it locks itself in, in this order:

1. the folders of the packages the graded code may import (NumPy) on ``sys.path``;
2. resource limits: CPU seconds, address space, processes, file size, open files, no core;
3. its working folder: a tmpfs of its own, of ``disk`` bytes and ``files`` files and folders
   (``nr_inodes``, which bubblewrap cannot set), mounted over ``/sandbox/work`` in a mount
   namespace of its own (``CAP_SYS_ADMIN``, which bubblewrap kept for this); cwd and ``HOME``;
4. when bubblewrap ran as root (keeping only ``CAP_SETUID``/``CAP_SETGID``/``CAP_SYS_ADMIN``):
   drop to the sandbox user's uid and gid, and make sure it cannot become root again; then
   drop every capability left (those of a user namespace); no new privileges.

Only then does it import the graded package and answer requests: ``hello`` (did it
import, and what it found in force: its uid, whether it is in a user namespace, the top of
its root, its network interfaces, the limits) and ``call`` (one function, its arguments,
``numpy.errstate`` and the warnings it raised; see ``diloco.tools.sandbox.proxy``).
"""

import ctypes
import importlib
import json
import os
import resource
import sys
import types
import warnings

_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV = 2, 4
_CAPABILITY_VERSION_3 = 0x20080522
_ERR_MODES = {"ignore", "warn", "raise", "print"}


def _load_wire():
    """``wire`` and ``wire_values`` from this folder, as a private package (never ``diloco``)."""
    package = types.ModuleType("_diloco_sandbox")
    package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules["_diloco_sandbox"] = package
    return importlib.import_module("_diloco_sandbox.wire"), importlib.import_module("_diloco_sandbox.wire_values")


def _set_limits(limits: dict) -> list:
    """Apply ``limits``; the names of those this system refused (reported in the hello)."""
    refused = []
    for name, value in limits.items():
        try:
            which = getattr(resource, f"RLIMIT_{name.upper()}")
            hard = resource.getrlimit(which)[1]
            top = value + 5 if name == "cpu" else value  # soft CPU limit: SIGXCPU; hard: SIGKILL
            if hard != resource.RLIM_INFINITY:
                value, top = min(value, hard), min(top, hard)
            resource.setrlimit(which, (value, top))
        except (AttributeError, ValueError, OSError):
            refused.append(name)
    return refused


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    try:
        os.setuid(0)
    except PermissionError:
        return
    os._exit(70)  # still able to become root: never run the submission like that


def _own_tmpfs(work: str, disk: int, files: int) -> None:
    """Mount a tmpfs of ``disk`` bytes and ``files`` inodes over ``work``, in a mount namespace
    of this process's own (so it needs only the capabilities of the namespace it is in). On
    failure ``work`` stays bubblewrap's tmpfs, and the hello's ``files`` shows it."""
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={int(disk)},nr_inodes={int(files)},mode=1777".encode()
    if libc.unshare(_CLONE_NEWNS) == 0:
        libc.mount(b"tmpfs", work.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options)


def _drop_capabilities() -> None:
    """No capability left, ambient, effective, permitted or inheritable (``capset``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    libc.capset(header, (ctypes.c_uint32 * 6)())


def _capabilities() -> int | None:
    """The effective and permitted capabilities of this process, as one mask (``None``: unknown)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        return int(fields["CapEff"], 16) | int(fields["CapPrm"], 16) | int(fields["CapAmb"], 16)
    except (OSError, KeyError, ValueError):
        return None


def full(work: str) -> bool:
    """The working folder can take no more files or folders (its ``nr_inodes`` is used up)."""
    try:
        return os.statvfs(work).f_ffree == 0
    except OSError:
        return False


def _found(work: str) -> dict:
    """What this process can see of its own confinement, for the grader to check."""
    import socket

    try:
        with open("/proc/self/uid_map", encoding="ascii") as table:
            identity = table.read().split() == ["0", "0", "4294967295"]
    except OSError:
        identity = True
    try:
        network = sorted(name for _, name in socket.if_nameindex())
    except OSError:
        network = []
    try:
        files = os.statvfs(work).f_files
    except OSError:
        files = None
    return {"uid": os.getuid(), "gid": os.getgid(), "userns": not identity, "root": sorted(os.listdir("/")),
            "network": network, "files": files, "capabilities": _capabilities()}


class Worker:
    """Answers the grader's requests on two inherited pipes."""

    def __init__(self, config: dict, wire, values):
        self.wire, self.values = wire, values
        self.fd_in, self.fd_out = wire.Reader(config["fd_in"]), config["fd_out"]
        self.package_dir = os.path.join(os.path.realpath(config["package_root"]), "diloco")
        self.work = os.path.realpath(config["work"])
        self.registry = wire.Registry(config["prefix"])
        self.pid = os.getpid()
        self.names = None
        self.table, self.snapshots, self.call_id = [], {}, None
        self.call_args, self.call_kwargs = [], {}

    def send(self, header: dict, blobs=()) -> None:
        if os.getpid() != self.pid:  # a child the submission forked never speaks for the sandbox
            os._exit(0)
        if header.get("kind") != "callback" and full(self.work):  # the grader's report says so
            header = {**header, "full": True}
        self.wire.write_frame(self.fd_out, header, list(blobs))

    def hello(self, facts: dict) -> bool:
        self.wire.read_frame(self.fd_in)
        sys.path.insert(0, os.path.realpath(os.path.dirname(self.package_dir)))
        try:
            import diloco

            self.names = self.values.Names(lambda module: importlib.import_module(f"diloco.{module}"))
            self.send({"kind": "hello", "file": os.path.realpath(diloco.__file__), **facts})
            return True
        except BaseException as exc:  # noqa: BLE001 - SystemExit at import is a failed import too
            error = self.wire.describe_exception(exc, self.package_dir, skip=0)
            where = error["where"]
            if isinstance(exc, SyntaxError) and exc.filename:
                name = os.path.relpath(os.path.realpath(exc.filename), os.path.dirname(self.package_dir))
                where = f"{name}, line {exc.lineno}"
            self.send({"kind": "hello", "error": f"{error['type']}: {error['message']}"[:2000],
                       "where": where, **facts})
            return False

    def serve(self) -> None:
        while True:
            header, blobs = self.wire.read_frame(self.fd_in)
            if header.get("kind") != "call":
                return
            self.call(header, blobs)

    def call(self, header: dict, blobs: list) -> None:
        wire, values = self.wire, self.values
        self.call_id = header.get("id")
        try:
            decoder = values.Decoder(self.registry, self.names, blobs, make_callable=self._callback, opaque=True)
            args = [decoder.decode(item) for item in header["args"]]
            kwargs = {str(key): decoder.decode(item) for key, item in header["kwargs"].items()}
            module, _, name = str(header["fn"]).rpartition(".")  # "model.relu", "core.quantize.encode"
            function = getattr(importlib.import_module(f"diloco.{module}"), name)
        except Exception as exc:  # noqa: BLE001 - the submission's own classes may refuse the values
            self.send({"kind": "refused", "id": self.call_id,
                       "message": f"the sandbox could not call {header.get('fn')} with these arguments: "
                                  f"{type(exc).__name__}: {exc}"[:4000]})
            return
        self.table, self.call_args, self.call_kwargs = decoder.objects, args, kwargs
        self._snapshot()
        errstate = {key: (mode if mode in _ERR_MODES else "warn")
                    for key, mode in dict(header.get("errstate") or {}).items()
                    if key in ("divide", "over", "under", "invalid")}
        import numpy as np

        with np.errstate(**errstate), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                outcome = {"kind": "return", "value": function(*args, **kwargs)}
            except BaseException as exc:  # noqa: BLE001 - reported, whatever it is
                outcome = {"kind": "raise", "error": wire.describe_exception(exc, self.package_dir)}
        encoder = values.Encoder(self.registry, self.names, args=self.table, snapshots=self.snapshots)
        reply = {"kind": outcome["kind"], "id": self.call_id, "warnings": [_warning(w) for w in caught[:50]]}
        try:
            reply["after"] = [encoder.encode(value) for value in args]
            reply["after_kw"] = {key: encoder.encode(value) for key, value in kwargs.items()}
            if outcome["kind"] == "return":
                reply["value"] = encoder.encode(outcome["value"])
            else:
                reply["error"] = outcome["error"]
        except Exception as exc:  # noqa: BLE001 - a value that may not cross
            self.send({"kind": "refused", "id": self.call_id,
                       "message": f"{header['fn']} gave back a value that may not leave the sandbox: {exc}"[:4000]})
            return
        self.send(reply, encoder.blobs)

    def _snapshot(self) -> None:
        self.snapshots = {k: self.values.snapshot(obj) for k, obj in enumerate(self.table) if _is_array(obj)}

    def _callback(self, index: int, attrs: dict):
        """Stands in for the caller's callable ``index`` (say ``on_round``): asks the caller to run it.
        It carries the callable's simple attributes (an encoder's ``num_features``, say).

        Both sides bring the call's arguments up to date first (the caller sees this side's
        Generator state and arrays, this side sees what the callable changed), as they
        would be, shared, in one process.
        """

        def callback(*args, **kwargs):
            encoder = self.values.Encoder(self.registry, self.names, args=self.table, snapshots=self.snapshots)
            header = {"kind": "callback", "id": self.call_id, "fn": index,
                      "after": [encoder.encode(a) for a in self.call_args],
                      "after_kw": {k: encoder.encode(v) for k, v in self.call_kwargs.items()},
                      "args": [encoder.encode(a) for a in args],
                      "kwargs": {str(k): encoder.encode(v) for k, v in kwargs.items()}}
            self.send(header, encoder.blobs)
            header, blobs = self.wire.read_frame(self.fd_in)
            decoder = self.values.Decoder(self.registry, self.names, blobs, args=self.table, opaque=True)
            for item in [*header.get("after", []), *header.get("after_kw", {}).values()]:
                decoder.decode(item)
            self._snapshot()
            if header.get("kind") == "callback_return":
                return decoder.decode(header["value"])
            if header.get("kind") == "callback_raise":
                raise self.wire.rebuild_exception(header["error"]) or RuntimeError(header["error"].get("message"))
            os._exit(3)  # the caller broke the protocol

        stand_in = type("Callback", (), {"__call__": lambda _, *args, **kwargs: callback(*args, **kwargs)})()
        vars(stand_in).update(attrs)
        return stand_in


def _is_array(value) -> bool:
    import numpy as np

    return isinstance(value, np.ndarray)


def _warning(caught) -> dict:
    cls = caught.category
    return {"category": cls.__name__, "bases": [c.__name__ for c in cls.__mro__ if c.__module__ == "builtins"],
            "message": str(caught.message)[:2000], "filename": os.path.basename(str(caught.filename)),
            "lineno": int(caught.lineno or 0)}


def main(argv) -> None:
    config = json.loads(argv[1])
    sys.path[:0] = [str(path) for path in config.get("paths", [])]
    wire, values = _load_wire()  # and NumPy, before any limit
    work = os.path.realpath(config["work"])
    facts = {"pid": os.getpid(), "limits": config["limits"]}
    facts["limits_refused"] = _set_limits(config["limits"])
    _own_tmpfs(work, config["disk"], config["files"])
    os.chdir(work)
    os.environ["HOME"] = os.environ["TMPDIR"] = work
    os.umask(0o077)
    if config.get("drop_to"):
        _drop_privileges(*config["drop_to"])
    _drop_capabilities()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    facts.update(_found(work))
    worker = Worker(config, wire, values)
    if worker.hello(facts):
        worker.serve()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
