"""mkdocs hook: ship MathJax with the site when ``DILOCO_MATHJAX_URL`` points at a local copy.

``mkdocs.yml`` loads MathJax 3 from ``$DILOCO_MATHJAX_URL`` (default: the jsDelivr CDN). For
a site that reads offline, ``make docs-offline`` installs npm's ``mathjax@3`` package into
``build/mathjax/`` and builds with

    DILOCO_MATHJAX_URL=mathjax/es5/tex-mml-chtml.js
    DILOCO_MATHJAX_DIR=build/mathjax/node_modules/mathjax/es5

This hook checks, before anything is built, that a relative URL names a file the build can
ship (in ``$DILOCO_MATHJAX_DIR``, or else under ``docs/``), and fails the build with one
line saying what is wrong otherwise; after the build it copies ``$DILOCO_MATHJAX_DIR`` into
the site at the URL's folder. An ``http(s)://`` URL is used as given (nothing to ship).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import NamedTuple

MATHJAX_URL = "DILOCO_MATHJAX_URL"
MATHJAX_DIR = "DILOCO_MATHJAX_DIR"


class Shipment(NamedTuple):
    """A local MathJax: ``source`` (a folder, or None when it already sits in ``docs/``)
    is copied to ``target`` (a folder relative to the site root)."""

    source: Path | None
    target: PurePosixPath


def plan(url: str | None, docs_dir: Path | str, source_dir: str | None) -> Shipment | None:
    """What to copy into the site for MathJax at ``url``; None for a remote URL or no URL.

    Raises
    ------
    ValueError
        ``url`` is a local file the build cannot ship: an absolute path, a ``file:`` URL, a
        path leaving the site, a file missing from ``source_dir`` (or from ``docs_dir``), or
        an empty file.
    """
    if not url or url.startswith(("https://", "http://")):
        return None
    hint = "run `make docs-offline`, or unset it to load MathJax from the CDN"
    if url.startswith(("file:", "/", "\\")) or ":" in url.split("/")[0]:
        raise ValueError(f"{MATHJAX_URL}={url} is not a path inside the site, so the site cannot ship it; {hint}")
    relative = PurePosixPath(url)
    if ".." in relative.parts or relative.suffix != ".js":
        raise ValueError(f"{MATHJAX_URL}={url} must be a .js file inside the site (no '..'); {hint}")
    if source_dir:
        source = Path(source_dir)
        found = source / relative.name
        where = f"{MATHJAX_DIR}={source_dir}"
    else:
        source = None
        found = Path(docs_dir) / relative
        where = f"the docs folder {docs_dir}"
    if not found.is_file():
        raise ValueError(f"{MATHJAX_URL}={url}: no {relative.name} in {where}, so the site would ship "
                         f"no MathJax; {hint}")
    if found.stat().st_size == 0:
        raise ValueError(f"{MATHJAX_URL}={url}: {found} is empty; {hint}")
    return Shipment(source, relative.parent)


def on_config(config, **kwargs):
    from mkdocs.exceptions import PluginError

    try:
        config["extra"]["diloco_mathjax"] = plan(os.environ.get(MATHJAX_URL), config["docs_dir"],
                                                 os.environ.get(MATHJAX_DIR))
    except ValueError as exc:
        raise PluginError(str(exc)) from None
    return config


def on_post_build(config, **kwargs):
    shipment = config["extra"].get("diloco_mathjax")
    if shipment is not None and shipment.source is not None:
        shutil.copytree(shipment.source, Path(config["site_dir"]) / shipment.target, dirs_exist_ok=True)
