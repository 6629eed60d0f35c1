"""The sandbox: a separate, locked-down process that runs the graded package's functions.

``prepare`` makes the sandbox folder for one grading run: a copy of the graded package
(read-only to the sandbox), a copy of the worker (``sandbox_worker``, ``wire``,
``wire_values``) and room for throw-away working folders. ``Sandbox(config).start()``
launches one worker and returns its ``hello``; ``exchange`` sends one request and waits
for its reply, with a wall-clock limit, running the callbacks the worker asks for.

The worker runs

* in its own session (its process group is killed with it), with a scrubbed
  environment, in a fresh working folder, under CPU-time, memory, process-count,
  file-size and open-file limits;
* when ``unshare`` can make them: in new PID, mount, network and IPC namespaces (with
  ``--kill-child``, so nothing it started outlives it), every mount read-only but its
  working folder, the grader's package and tests hidden;
* as ``user`` (``nobody`` by default) when the grader runs as root.

It dies with the process that started it (``PR_SET_PDEATHSIG``). Anything that goes
wrong on the way (the worker dies, exits, hangs, or writes what is not a well-formed
reply) raises ``SandboxError``, a ``BaseException``: no ``pytest.raises(ValueError)`` and
no ``except Exception`` in a test can mistake it for a pass.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diloco.tools import wire

__all__ = ["SandboxError", "Sandbox", "prepare", "namespace_flags", "protections"]

_WORKER_FILES = ("sandbox_worker.py", "wire.py", "wire_names.py", "wire_values.py", "wire_decode.py")
_PR_SET_PDEATHSIG = 1
DEFAULT_LIMITS = {"cpu": 600, "as": 4 << 30, "nproc": 64, "fsize": 256 << 20, "nofile": 256, "core": 0}


class SandboxError(BaseException):
    """The sandboxed call did not give a well-formed answer: the test fails, never passes."""


@functools.cache
def namespace_flags() -> tuple[str, ...]:
    """The ``unshare`` command line that works here (root: PID, mount, network, IPC), or ``()``."""
    unshare = shutil.which("unshare") or ("/usr/bin/unshare" if os.path.exists("/usr/bin/unshare") else None)
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    tail = ["--pid", "--mount", "--net", "--ipc", "--fork", "--kill-child", "--mount-proc"]
    for head in ([unshare], [unshare, "--user", "--map-current-user"]):
        try:
            ok = subprocess.run([*head, *tail, "true"], capture_output=True, timeout=20).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return (*head, *tail, "--")
    return ()


def prepare(package_root: Path, folder: Path, *, user: str | None, hide=(), cover=(), limits=None,
            call_timeout: float = 120.0, python: str | None = None) -> dict:
    """Fill ``folder`` (empty, made by the caller) for a sandbox; the config a ``Sandbox`` takes.

    ``package_root`` holds the graded ``diloco`` package; it is copied, so the original
    is never touched. ``user`` is the account the worker drops to (only as root). With
    namespaces, the folders ``hide`` are invisible to the sandbox and the folders ``cover``
    show only what the interpreter needs (say the virtual environment in a checkout).
    """
    import pwd

    shutil.copytree(package_root / "diloco", folder / "pkg" / "diloco", ignore=_plain_files_only, symlinks=True)
    (folder / "bin").mkdir()
    here = Path(__file__).resolve().parent
    for name in _WORKER_FILES:
        shutil.copyfile(here / name, folder / "bin" / name)
    for path in [folder, *folder.rglob("*")]:  # readable, never writable, by the sandbox user
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    uid = gid = None
    if user and os.geteuid() == 0:
        entry = pwd.getpwnam(user)  # KeyError: no such user
        uid, gid = entry.pw_uid, entry.pw_gid
    else:
        user = None
    flags = namespace_flags()
    return {
        "python": python or sys.executable, "folder": str(folder), "package_root": str(folder / "pkg"),
        "user": user, "uid": uid, "gid": gid, "namespaces": list(flags),
        "hide": [str(p) for p in hide], "cover": [str(p) for p in cover],
        "limits": {**DEFAULT_LIMITS, **(limits or {})}, "call_timeout": float(call_timeout),
    }


def _plain_files_only(directory: str, names: list[str]) -> set[str]:
    """Copy folders and regular files only, each with a single name: a symlink or a hard link
    could point the root grader at a secret it would then copy where the sandbox can read it."""
    skipped = set()
    for name in names:
        path = os.path.join(directory, name)
        info = os.lstat(path)
        plain = stat.S_ISDIR(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_nlink == 1)
        if name == "__pycache__" or name.endswith(".pyc") or not plain:
            skipped.add(name)
    return skipped


def protections(config: dict, hello: dict | None = None) -> str:
    """The protections in force, in words, for the report (``hello`` says what the worker found)."""
    hello = hello or {}
    parts = ["separate process", "own session"]
    if config["namespaces"]:
        parts.append("PID/mount/network/IPC namespaces")
    if hello.get("readonly"):
        parts.append("read-only filesystem but its folder")
    if config["user"] and hello.get("uid") == config["uid"]:
        parts.append(f"user {config['user']}")
    else:
        parts.append("grader's own user")
    limits, refused = config["limits"], set(hello.get("limits_refused") or ())
    shown = [text for name, text in (("cpu", f"{limits['cpu']} s CPU"), ("as", f"{limits['as'] >> 20} MiB memory"),
                                     ("nproc", f"{limits['nproc']} processes")) if name not in refused]
    shown.append(f"{config['call_timeout']:g} s per call")
    parts.append("limits: " + ", ".join(shown))
    return ", ".join(parts)


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

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> dict:
        """Launch the worker; its ``hello`` (``"error"`` when the package does not import)."""
        config = self.config
        work = tempfile.mkdtemp(prefix="work-", dir=config["folder"])
        if config["uid"] is not None:
            os.chown(work, config["uid"], config["gid"])
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        self._log = tempfile.TemporaryFile()  # the grader's own file: the worker cannot redirect it
        worker = {"fd_in": request_r, "fd_out": reply_w, "package_root": config["package_root"], "work": work,
                  "prefix": f"s{self.generation}-", "user": config["user"], "limits": config["limits"],
                  "hide": config["hide"], "cover": config["cover"],
                  "lock_filesystem": bool(config["namespaces"]) and os.geteuid() == 0}
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work,
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        command = [*config["namespaces"], config["python"], "-I", "-B",
                   str(Path(config["folder"]) / "bin" / "sandbox_worker.py"), json.dumps(worker)]
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                            pass_fds=(request_r, reply_w), cwd=work, env=env,
                                            start_new_session=True, preexec_fn=_die_with_parent)
        finally:
            os.close(request_r)
            os.close(reply_w)
        self._fd_out, self._fd_in = request_w, reply_r
        self._reader = wire.Reader(reply_r)
        self.hello, _ = self.exchange({"kind": "hello"}, [], what="importing the graded package")
        return self.hello

    def exchange(self, header: dict, blobs: list, *, what: str, on_callback=None) -> tuple[dict, list]:
        """Send ``header`` and ``blobs``; the reply. Callbacks are answered by ``on_callback``."""
        limit = self.config["call_timeout"]
        try:
            wire.write_frame(self._fd_out, header, blobs, time.monotonic() + limit)
            while True:
                reply, reply_blobs = wire.read_frame(self._reader, time.monotonic() + limit)
                if reply.get("kind") != "callback" or on_callback is None:
                    break
                answer, answer_blobs = on_callback(reply, reply_blobs)
                wire.write_frame(self._fd_out, answer, answer_blobs, time.monotonic() + limit)
        except TimeoutError:
            self.kill()
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
