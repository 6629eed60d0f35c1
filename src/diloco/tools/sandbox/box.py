"""The sandbox: a separate, locked-in process that runs the graded package's functions.

``prepare`` makes the sandbox folder for one grading run (a copy of the graded package and
of the worker, ``sandbox_worker`` and the ``wire`` modules) and the ``bwrap`` (bubblewrap)
command line of its root; ``Sandbox(config).start()`` launches one worker and returns its
``hello``; ``exchange`` sends one request and waits for its reply, running the callbacks
the worker asks for, all within one wall-clock limit per call.

The worker runs under bubblewrap:

* in an allow-list root (``diloco.tools.sandbox.sandbox_root``): the interpreter, its standard
  library, NumPy, the graded package read-only and a tmpfs limited in bytes and in files
  (``nr_inodes``, mounted by the worker itself over bubblewrap's) as its working folder,
  nothing else of the host;
* in new PID, network, IPC and UTS namespaces, in its own session, dying with its parent;
* as a separate user: as root, bubblewrap keeps only ``CAP_SETUID``/``CAP_SETGID`` and
  ``CAP_SYS_ADMIN`` (for that one mount) and the worker drops to ``user`` (``nobody``), with
  no capability left, before it imports anything of the submission; as any other user, in
  a user namespace of its own that cannot make another, where it drops every capability;
* under CPU-time, memory, process-count, file-size and open-file limits.

``protections`` says which of these are in force, from what the worker itself found, and
``missing`` which required ones are not: the grader refuses to call a run ``sandboxed``
without all of them. When bubblewrap is missing or cannot build its namespaces, ``prepare``
raises ``Unavailable`` with one line saying how to enable it. Anything that goes wrong in
a call (the worker dies, exits, hangs, or writes what is not a well-formed reply) raises
``SandboxError``, a ``BaseException``: no ``pytest.raises(ValueError)`` and no ``except
Exception`` in a test can mistake it for a pass.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from diloco.tools.sandbox import wire
from diloco.tools.sandbox.sandbox_root import (
    BIN,
    HOW_TO_ENABLE,
    NAMESPACES,
    PKG,
    SANDBOX_ENV,
    WORK,
    Unavailable,
    bind_arguments,
    find_bwrap,
    launch_mode,
    runtime,
)

__all__ = ["SandboxError", "Unavailable", "Refused", "Sandbox", "prepare", "check_package", "protections", "missing",
           "find_bwrap", "HOW_TO_ENABLE", "PACKAGE_LIMIT", "PACKAGE_ENTRIES", "PACKAGE_DEPTH", "DEFAULT_FILES",
           "full_note"]

_PR_SET_PDEATHSIG = 1
DEFAULT_DISK = 64 << 20
# Files and folders the worker's tmpfs may hold (its ``nr_inodes``): each costs the host's
# kernel memory that ``--size`` does not count, so a loop of empty files stops here (ENOSPC).
DEFAULT_FILES = 10_000
# fsize is the disk quota (prepare sets it to ``disk``): no file on the tmpfs can be larger,
# and the worker's stdout and stderr, one file of the grader's, stop there too.
DEFAULT_LIMITS = {"cpu": 600, "as": 4 << 30, "nproc": 64, "fsize": DEFAULT_DISK, "nofile": 256, "core": 0}


PACKAGE_LIMIT = 32 << 20  # bytes of the graded package copied for the sandbox, at most
PACKAGE_ENTRIES = 5000  # files and folders in it, at most
PACKAGE_DEPTH = 32  # folders nested in it, at most


class Refused(ValueError):
    """The graded package cannot be copied for the sandbox: too large, or a sparse or special file."""


class SandboxError(BaseException):
    """The sandboxed call did not give a well-formed answer: the test fails, never passes."""


def prepare(package_root: Path, folder: Path, *, user: str | None, hide=(), limits=None,
            call_timeout: float = 120.0, python: str | None = None, disk: int = DEFAULT_DISK,
            files: int = DEFAULT_FILES, packages: tuple[str, ...] = ("numpy",), as_user: bool = False,
            package_limit: int = PACKAGE_LIMIT) -> dict:
    """Fill ``folder`` (empty, made by the caller) for a sandbox; the config a ``Sandbox`` takes.

    ``package_root`` holds the graded ``diloco`` package; it is copied, so the original is
    never touched. ``user`` is the account the worker runs as when the grader is root.
    ``hide`` are folders that must stay invisible even if they lie inside a folder the root
    shows; ``disk`` is the size of the worker's tmpfs in bytes and ``files`` how many files and
    folders it may hold; ``packages`` what the graded
    code may import besides the standard library. ``as_user``: as root, start bubblewrap itself
    as ``user``, in a user namespace (what happens anyway where root cannot make namespaces).
    ``Unavailable`` when the sandbox cannot be isolated here; ``Refused``, before anything is
    copied, when the package is over ``package_limit`` bytes or holds a sparse or special file.
    """
    import sys

    bwrap = find_bwrap()
    if bwrap is None or not sys.platform.startswith("linux"):
        raise Unavailable(f"bubblewrap (bwrap) is not installed; {HOW_TO_ENABLE}")
    launch = launch_mode(bwrap, user, as_user)
    try:
        found = runtime(python or sys.executable, tuple(packages))
    except RuntimeError as exc:
        raise Unavailable(f"{exc}; the sandbox needs an interpreter with {', '.join(packages)}") from None
    skipped = _fill(folder, package_root, package_limit)
    binds, shown = bind_arguments(found, hide)
    root = [*binds, *_mounts(folder, disk)]
    return {
        "bwrap": [bwrap, *NAMESPACES, *launch["flags"], *root], "python": found["executable"],
        "paths": found["paths"], "shown": shown, "folder": str(folder), "package_root": PKG,
        "mode": launch["mode"], "launch_as": launch["launch_as"], "uid": launch["uid"], "gid": launch["gid"],
        "user": user if os.geteuid() == 0 else None, "packages": list(packages), "disk": int(disk),
        "files": int(files),
        "limits": {**DEFAULT_LIMITS, "fsize": int(disk), **(limits or {})}, "call_timeout": float(call_timeout),
        "skipped": skipped,
    }


def _fill(folder: Path, package_root: Path, package_limit: int) -> list[str]:
    """Copy the checked package to ``folder/pkg`` and the worker to ``folder/bin``, all readable and
    never writable by the sandbox user; the files the check skipped. ``Refused`` when the package
    fails the check or cannot be read while it is copied."""
    skipped = check_package(package_root / "diloco", package_limit)
    try:
        shutil.copytree(package_root / "diloco", folder / "pkg" / "diloco", ignore=_plain_files_only, symlinks=True)
    except shutil.Error as exc:  # a file that changed or became unreadable since the check
        raise Refused(f"cannot read the package to copy it: {exc.args[0][0][2]}") from None
    except OSError as exc:
        raise Refused(f"cannot read the package to copy it: {exc.strerror or exc}") from None
    (folder / "bin").mkdir()
    here = Path(__file__).resolve().parent
    for source in [here / "sandbox_worker.py", *sorted(here.glob("wire*.py"))]:
        shutil.copyfile(source, folder / "bin" / source.name)
    for path in [folder, *folder.rglob("*")]:  # readable, never writable, by the sandbox user
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return skipped


def _mounts(folder: Path, disk: int) -> list[str]:
    """bubblewrap's arguments after the allow-list binds: the package and worker read-only, a
    ``disk``-byte tmpfs to work in, /proc, /dev, and everything else remounted read-only."""
    return ["--perms", "0755", "--dir", os.path.dirname(PKG),
            "--ro-bind", str(folder / "pkg"), PKG, "--ro-bind", str(folder / "bin"), BIN,
            "--perms", "1777", "--size", str(int(disk)), "--tmpfs", WORK, "--proc", "/proc", "--dev", "/dev",
            "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK]


def _plain_files_only(directory: str, names: list[str]) -> set[str]:
    """Copy folders and regular files only, each with a single name: a symlink or a hard link
    could point the root grader at a secret it would then copy where the sandbox can read it."""
    return {name for name in names if _not_copied(os.lstat(os.path.join(directory, name)), name)}


def _not_copied(info: os.stat_result, name: str) -> str:
    """Why the entry ``name`` (its ``lstat``) is not copied, in words; empty when it is."""
    if name == "__pycache__" or name.endswith(".pyc"):
        return "cache"
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return "a hard link"
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return "special"
    return ""


def _listing(folder: str, shown: str) -> list[tuple[str, os.stat_result]]:
    """``(name, lstat)`` of each entry of ``folder``, sorted; ``Refused`` saying what could not be read."""
    try:
        return [(name, os.lstat(os.path.join(folder, name))) for name in sorted(os.listdir(folder))]
    except OSError as exc:
        raise Refused(f"cannot read {shown}: {exc.strerror or exc}") from None


def check_package(package: Path, limit: int = PACKAGE_LIMIT) -> list[str]:
    """``Refused`` unless what ``prepare`` would copy of ``package`` is at most ``limit`` bytes
    (sizes as the files claim them) in at most ``PACKAGE_ENTRIES`` entries nested at most
    ``PACKAGE_DEPTH`` folders deep, every one readable, with no sparse file (a hole is read
    as zeros: copied dense) and no FIFO, socket or device, and ``package`` itself no symbolic
    link (the copy would follow it). The walk keeps its own stack (no recursion, whatever
    the depth). Returns a line for each link not copied (``diloco/adamw.py is a hard link
    and was not copied``)."""
    if package.is_symlink():
        raise Refused(f"{package.name} is a symbolic link: a submission must hold its own files")
    total, entries, notes = 0, 0, []
    stack = [(str(package), 0)]
    while stack:
        folder, depth = stack.pop()
        for name, info in _listing(folder, os.path.relpath(folder, package.parent)):
            path = os.path.join(folder, name)
            shown = os.path.relpath(path, package.parent)
            why = _not_copied(info, name)
            if why == "special":
                raise Refused(f"{shown} is a special file (a FIFO, socket or device)")
            if why:
                notes += [f"{shown} is {why} and was not copied"] if why != "cache" else []
                continue
            entries += 1
            if entries > PACKAGE_ENTRIES:
                raise Refused(f"the package holds more than {PACKAGE_ENTRIES} files and folders")
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 > PACKAGE_DEPTH:
                    raise Refused(f"the package nests folders more than {PACKAGE_DEPTH} deep (at {shown})")
                stack.append((path, depth + 1))
                continue
            total += _file_size(path, shown, info)
            if total > limit:
                raise Refused(f"the package is larger than {limit >> 20} MiB (at {shown})")
    return sorted(notes)


def _file_size(path: str, shown: str, info: os.stat_result) -> int:
    """The size of a regular file; ``Refused`` when it is sparse or cannot be read."""
    try:
        sparse = _sparse(path)
    except OSError as exc:
        raise Refused(f"cannot read {shown}: {exc.strerror or exc}") from None
    if sparse:
        raise Refused(f"{shown} is a sparse file")
    return info.st_size


def _sparse(path: str) -> bool:
    """A regular file with a hole before its end (``SEEK_HOLE``; exact whatever the compression)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        return size > 0 and os.lseek(fd, 0, os.SEEK_HOLE) < size
    except OSError:  # no SEEK_HOLE here: every file reads as dense
        return False
    finally:
        os.close(fd)


_REQUIRED_LIMITS = ("cpu", "as", "nproc", "fsize")


def _root_gap(config: dict, hello: dict) -> str | None:
    expected = {p.strip("/").split("/")[0] for p in [*config["shown"], PKG]} | {"dev", "proc"}
    if not hello.get("root") or not set(hello["root"]) <= expected:
        return f"an allow-list root (the worker sees /{', /'.join(map(str, hello.get('root') or []))})"
    return None


def _network_gap(config: dict, hello: dict) -> str | None:
    if not isinstance(hello.get("network"), list) or [name for name in hello["network"] if name != "lo"]:
        return f"no network (the worker sees interfaces {hello.get('network')})"
    return None


def _user_gap(config: dict, hello: dict) -> str | None:
    if hello.get("uid") != config["uid"] or (config["mode"] == "userns" and not hello.get("userns")):
        return f"a separate user or user namespace (the worker runs as uid {hello.get('uid')})"
    return None


def _files_gap(config: dict, hello: dict) -> str | None:
    if hello.get("files") != config["files"]:
        return f"a file count on its working folder (it may hold {hello.get('files')} files)"
    return None


def _capabilities_gap(config: dict, hello: dict) -> str | None:
    if hello.get("capabilities") != 0:
        return f"no capabilities (the worker holds {hello.get('capabilities')!r})"
    return None


def _limits_gap(config: dict, hello: dict) -> str | None:
    refused = set(hello.get("limits_refused") or ()) & set(_REQUIRED_LIMITS)
    if refused or hello.get("limits") != config["limits"]:
        return f"resource limits ({', '.join(sorted(refused)) or 'not applied'} refused)"
    return None


# One check per required protection, in the order a report names them: each returns the gap
# (what is missing, and what the worker found instead) or None when the protection is in force.
_PROTECTIONS = (_root_gap, _network_gap, _user_gap, _files_gap, _capabilities_gap, _limits_gap)


def missing(config: dict, hello: dict) -> list[str]:
    """The required protections the worker did not find in force (empty: it is sandboxed)."""
    return [gap for check in _PROTECTIONS if (gap := check(config, hello)) is not None]


def protections(config: dict, hello: dict | None = None) -> str:
    """The protections in force, in words, for the report (``hello`` says what the worker found)."""
    hello = hello or {}
    limits = config["limits"]
    parts = ["separate process", "own session",
             f"allow-list root (the interpreter, its standard library, {', '.join(config['packages'])}, "
             f"the submission read-only, a tmpfs of {config['disk'] >> 20} MiB and {config['files']} files "
             "as its only writable folder)",
             "no network", "own PID/IPC/UTS namespaces"]
    if config["mode"] == "root":
        parts.append(f"user {config['user']} (uid {config['uid']})")
    else:
        outside = "the grader's own" if config["launch_as"] is None else f"user {config['user']}"
        parts.append(f"a user namespace (uid {config['uid']} outside: {outside})")
    shown = [f"{limits['cpu']} s CPU", f"{limits['as'] >> 20} MiB memory", f"{limits['nproc']} processes",
             f"{limits['fsize'] >> 20} MiB per file", f"{config['call_timeout']:g} s per call (callbacks included)"]
    parts.append("limits: " + ", ".join(shown))
    gaps = missing(config, hello) if hello else []
    return ", ".join(parts) + (f"; NOT in force: {'; '.join(gaps)}" if gaps else "")


def full_note(config: dict) -> str:
    """The line a report carries when the graded code filled its working folder's file count."""
    return (f"the sandbox's working folder ran out of files: it may hold {config['files']} files and folders "
            "(box.DEFAULT_FILES), and creating more failed with ENOSPC")


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Sandbox:
    """One worker process; ``generation`` keeps its array handles apart from earlier workers'."""

    def __init__(self, config: dict, generation: int = 0):
        self.config, self.generation = config, generation
        self.process: subprocess.Popen | None = None
        self.hello: dict = {}
        self._log = None
        self._fd_out = self._fd_in = -1
        self.timed_out = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> dict:
        """Launch the worker; its ``hello`` (``"error"`` when the package does not import)."""
        config = self.config
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        self._log = tempfile.TemporaryFile()  # the grader's own file: the worker cannot redirect it
        worker = {"fd_in": request_r, "fd_out": reply_w, "package_root": config["package_root"], "work": WORK,
                  "disk": config["disk"], "files": config["files"],
                  "prefix": f"s{self.generation}-", "limits": config["limits"], "paths": config["paths"],
                  "drop_to": [config["uid"], config["gid"]] if config["mode"] == "root" else None}
        command = [*config["bwrap"], config["python"], "-I", "-B", f"{BIN}/sandbox_worker.py", json.dumps(worker)]
        launch = {}
        if config["launch_as"]:
            launch = {"user": config["launch_as"][0], "group": config["launch_as"][1], "extra_groups": []}
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                            pass_fds=(request_r, reply_w), cwd="/", env=dict(SANDBOX_ENV),
                                            start_new_session=True, preexec_fn=_die_with_parent, **launch)
        finally:
            os.close(request_r)
            os.close(reply_w)
        self._fd_out, self._fd_in = request_w, reply_r
        self._reader = wire.Reader(reply_r)
        self.hello, _ = self.exchange({"kind": "hello"}, [], what="importing the graded package")
        return self.hello

    def exchange(self, header: dict, blobs: list, *, what: str, on_callback=None) -> tuple[dict, list]:
        """Send ``header`` and ``blobs``; the reply. Callbacks are answered by ``on_callback``.

        One wall-clock limit covers the whole call, every callback and its answer included:
        a worker that keeps asking for callbacks is stopped like one that hangs.
        """
        limit = self.config["call_timeout"]
        deadline = time.monotonic() + limit
        try:
            wire.write_frame(self._fd_out, header, blobs, deadline)
            while True:
                reply, reply_blobs = wire.read_frame(self._reader, deadline)
                if reply.get("kind") != "callback" or on_callback is None:
                    break
                answer, answer_blobs = on_callback(reply, reply_blobs)
                wire.write_frame(self._fd_out, answer, answer_blobs, deadline)
        except TimeoutError:
            self.kill()
            self.timed_out = True
            raise SandboxError(f"the sandbox did not answer within {limit:g} s while {what}; it was killed") from None
        except (EOFError, BrokenPipeError, ConnectionError):
            raise SandboxError(f"the sandbox {self._exit_text()} while {what}{self._log_tail()}") from None
        except wire.WireError as exc:
            self.kill()
            raise SandboxError(f"the sandbox sent a malformed reply while {what}: {exc}") from None
        if "id" in header and reply.get("id") != header["id"]:
            self.kill()
            raise SandboxError(f"the sandbox answered request {reply.get('id')!r}, not {header['id']}, "
                               f"while {what}")
        return reply, reply_blobs

    def _exit_text(self) -> str:
        try:
            status = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "closed its channel"
        finally:
            self.kill()
        if status < 0:
            return f"was killed by signal {-status} ({signal.Signals(-status).name})"
        return f"exited early (status {status})"

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        try:
            size = os.fstat(self._log.fileno()).st_size
            text = os.pread(self._log.fileno(), 2000, max(0, size - 2000)).decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line for line in text.strip().splitlines() if line.strip()][-3:]
        return ("; its last output: " + " | ".join(lines)) if lines else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        """Kill the worker and drop its output."""
        self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """Kill the worker and its process group (its namespace goes with it)."""
        if self.process is None:
            return
        for target in (lambda: os.killpg(self.process.pid, signal.SIGKILL), self.process.kill):
            try:
                target()
            except (ProcessLookupError, PermissionError, OSError):
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._fd_in, self._fd_out):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd_in = self._fd_out = -1
