"""The sandbox root's ``bwrap`` arguments (``bind_arguments``) on a made-up runtime: what is
bound, covered, linked and made passable, and in which order bubblewrap must see it."""

from __future__ import annotations

import os

from diloco.tools.sandbox.sandbox_root import bind_arguments


def _triples(args: list[str], flag: str) -> list[tuple[str, ...]]:
    """Each ``flag`` with its operands, as bwrap reads them (``--ro-bind SRC DEST``...)."""
    width = {"--ro-bind": 2, "--symlink": 2, "--tmpfs": 1, "--remount-ro": 1, "--dir": 1}[flag]
    return [tuple(args[i + 1:i + 1 + width]) for i, arg in enumerate(args) if arg == flag]


def _runtime(tmp_path):
    stdlib = tmp_path / "python"
    site = stdlib / "site-packages"
    (site / "numpy").mkdir(parents=True)
    (stdlib / "secret").mkdir()
    libs = tmp_path / "other"
    libs.mkdir()
    (libs / "libfoo.so.1.2.3").write_bytes(b"\0")
    os.symlink("libfoo.so.1.2.3", libs / "libfoo.so.1")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_bytes(b"\0")
    return {"executable": str(tmp_path / "bin" / "python"), "interpreter": None, "stdlib": [str(stdlib)],
            "sites": [str(site)], "folders": [str(site / "numpy")], "files": [str(libs / "libfoo.so.1.2.3")]}


def test_the_root_binds_covers_and_links_what_the_runtime_needs(tmp_path):
    found = _runtime(tmp_path)
    stdlib, site, numpy = found["stdlib"][0], found["sites"][0], found["folders"][0]
    secret = os.path.join(stdlib, "secret")
    args, shown = bind_arguments(found, hide=[secret, str(tmp_path / "elsewhere")])
    binds = [source for source, _ in _triples(args, "--ro-bind")]
    assert {stdlib, found["files"][0], found["executable"]} <= set(binds)
    assert _triples(args, "--tmpfs") == [(site,), (secret,)]  # unseen: site-packages and what was hidden
    assert _triples(args, "--remount-ro") == [(site,), (secret,)]
    # numpy is inside the covered site-packages: bound again, after the cover and before it is made read-only
    assert args.index("--tmpfs") < len(args) - args[::-1].index(numpy) - 1 < args.index("--remount-ro")
    link = str(tmp_path / "other" / "libfoo.so.1")
    assert ("libfoo.so.1.2.3", link) in _triples(args, "--symlink")  # the name the loader looks for
    # every folder above a bound path exists, made before the first bind
    folders = [path for (path,) in _triples(args, "--dir")]
    assert str(tmp_path) in folders and str(tmp_path / "other") in folders
    assert args.index("--dir") < args.index("--ro-bind")
    links = [where for _, where in _triples(args, "--symlink")]
    assert shown == sorted(set(binds) - {numpy}) + links and secret not in shown  # numpy: inside the python folder


def test_a_system_library_folder_is_bound_whole(tmp_path):
    found = _runtime(tmp_path)
    library = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    library.mkdir(parents=True)
    (library / "libbar.so.2").write_bytes(b"\0")
    found["files"].append(str(library / "libbar.so.2"))
    args, shown = bind_arguments(found)
    assert (str(library), str(library)) in _triples(args, "--ro-bind")
    assert str(library / "libbar.so.2") not in shown
