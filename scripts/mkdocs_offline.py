"""mkdocs hook: the offline site's search works from file:// with no network at all.

``make docs-offline`` builds with ``DILOCO_DOCS_OFFLINE=true``, which enables Material's
offline plugin (``mkdocs.yml``): every link names a ``.html`` file and the search index is
shipped as a script, ``search/search_index.js``. The plugin loads that script through the
iframe-worker shim, which it links from a CDN (``https://unpkg.com/iframe-worker/shim``);
read from file:// without a network, the shim would not load and search would stay empty.

So ``make docs-offline`` also installs npm's ``iframe-worker`` package into
``build/iframe-worker/`` and passes ``DILOCO_IFRAME_WORKER=<its shim/index.js>``. This hook
refuses an offline build without it (one line saying what to do), copies the shim into the
site as ``assets/javascripts/iframe-worker-shim.js`` and points every page at that copy.
Outside an offline build it does nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

OFFLINE = "DILOCO_DOCS_OFFLINE"
SHIM = "DILOCO_IFRAME_WORKER"
CDN_SHIM = "https://unpkg.com/iframe-worker/shim"
SITE_SHIM = "assets/javascripts/iframe-worker-shim.js"


def offline() -> bool:
    return os.environ.get(OFFLINE, "").strip().lower() in ("1", "true", "yes")


def shim_source(path: str | None) -> Path:
    """The shim file to ship; ``ValueError`` naming the variable when there is none."""
    hint = "run `make docs-offline`, which installs npm's iframe-worker package and sets it"
    if not path:
        raise ValueError(f"{OFFLINE}=true needs {SHIM}, the iframe-worker shim that search loads from file://; {hint}")
    source = Path(path)
    if not source.is_file() or source.stat().st_size == 0:
        raise ValueError(f"{SHIM}={path}: no such (non-empty) file; {hint}")
    return source


def relative_shim(page_url: str) -> str:
    """The shipped shim's URL as seen from a page (``milestones/04-softmax.html`` -> ``../assets/...``)."""
    return "../" * page_url.count("/") + SITE_SHIM


def on_config(config, **kwargs):
    from mkdocs.exceptions import PluginError

    config["extra"]["diloco_shim"] = None
    if offline():
        try:
            config["extra"]["diloco_shim"] = shim_source(os.environ.get(SHIM))
        except ValueError as exc:
            raise PluginError(str(exc)) from None
    return config


def on_post_page(output, page, config, **kwargs):
    if config["extra"].get("diloco_shim") is None:
        return output
    return output.replace(f'src="{CDN_SHIM}"', f'src="{relative_shim(page.url)}"')


def on_post_build(config, **kwargs):
    source = config["extra"].get("diloco_shim")
    if source is not None:
        target = Path(config["site_dir"]) / SITE_SHIM
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
