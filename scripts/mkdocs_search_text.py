"""mkdocs hook: search excerpts show the maths as text, not as raw ``\\(...\\)`` TeX.

The search plugin indexes each page's text before MathJax runs in the browser, so an
excerpt of a lesson read ``the outer step \\(\\theta \\leftarrow \\theta - \\eta\\Delta\\)``.
After the build this hook rewrites the index (``search/search_index.json``, and the offline
site's ``search/search_index.js``, which inlines it): each ``\\(...\\)`` and ``\\[...\\]``
span loses its delimiters, and the common commands become the characters they typeset
(``\\theta`` -> θ, ``\\leftarrow`` -> ←, ``\\frac{a}{b}`` -> (a)/(b), ``x_{k}`` -> x_k).
The pages themselves are untouched: MathJax still typesets them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε", "varepsilon": "ε",
    "eta": "η", "theta": "θ", "Theta": "Θ", "lambda": "λ", "mu": "μ", "nu": "ν", "pi": "π", "rho": "ρ",
    "sigma": "σ", "Sigma": "Σ", "tau": "τ", "phi": "φ", "psi": "ψ", "omega": "ω", "ell": "ℓ", "nabla": "∇",
    "sum": "Σ", "prod": "Π", "sqrt": "√", "cdot": "·", "times": "×", "leftarrow": "←", "rightarrow": "→",
    "to": "→", "gets": "←", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
    "approx": "≈", "in": "∈", "infty": "∞", "odot": "⊙", "lVert": "‖", "rVert": "‖", "Vert": "‖",
    "lvert": "|", "rvert": "|", "dots": "…", "ldots": "…", "cdots": "…", "top": "ᵀ", "partial": "∂",
    "quad": " ", "qquad": "  ", ",": " ", ";": " ", "!": "", " ": " ",
}
# Commands that only style or size what follows: dropped, their argument kept.
STYLE = ("mathrm", "mathbf", "mathit", "mathcal", "operatorname", "text", "textstyle", "displaystyle", "bigl",
         "bigr", "Bigl", "Bigr", "biggl", "biggr", "left", "right", "big", "Big", "hat", "bar", "tilde", "boldsymbol")
MATH = re.compile(r"\\\((?P<inline>.+?)\\\)|\\\[(?P<display>.+?)\\\]", re.S)


def plain(tex: str) -> str:
    """``\\frac{1}{K}\\sum_{k} \\theta_k`` -> ``(1)/(K)Σ_k θ_k``: TeX as readable text."""
    text = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", tex)
    text = re.sub(r"\\(" + "|".join(STYLE) + r")\b\s*", "", text)
    text = re.sub(r"\\([A-Za-z]+|[,;! ])", lambda m: SYMBOLS.get(m[1], m[1]), text)
    text = re.sub(r"([_^])\{([^{}]*)\}", r"\1\2", text)
    text = text.replace("{", "").replace("}", "").replace("&", "")
    return re.sub(r"\s+", " ", text).strip()


def plain_maths(text: str) -> str:
    """Every ``\\(...\\)`` / ``\\[...\\]`` span of ``text`` as ``plain`` text, the rest unchanged."""
    return MATH.sub(lambda m: plain(m["inline"] if m["inline"] is not None else m["display"]), text)


def rewrite_index(site_dir) -> bool:
    """Rewrite the search index of a built site in place; False when the site has none."""
    folder = Path(site_dir) / "search"
    index = folder / "search_index.json"
    if not index.is_file():
        return False
    data = json.loads(index.read_text(encoding="utf-8"))
    for doc in data.get("docs", []):
        for field in ("title", "text"):
            if isinstance(doc.get(field), str):
                doc[field] = plain_maths(doc[field])
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    index.write_text(text, encoding="utf-8")
    inlined = folder / "search_index.js"  # the offline plugin's copy (mkdocs_offline.py)
    if inlined.is_file():
        inlined.write_text(f"var __index = {text}", encoding="utf-8")
    return True


def on_post_build(config, **kwargs):
    rewrite_index(config["site_dir"])
