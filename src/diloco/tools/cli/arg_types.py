"""Flag values for argparse's ``type=``, shared by the commands (``train``'s ``--max-loss``,
``grade``'s timeouts). Imports only the standard library, so any command may use it."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_finite"]


def positive_finite(text: str, *, not_a_number: str, not_positive: str, off: float | None = None) -> float:
    """``text`` as a positive, finite float; with ``off``, the words ``off`` and ``none`` give ``off``.

    Anything else is an ``argparse.ArgumentTypeError``, argparse's one-line usage error:
    ``"<not_a_number>, got 'text'"`` when ``text`` is no number, ``"<not_positive>, got 'text'"``
    when it is zero, negative, infinite or NaN.
    """
    if off is not None and text.strip().lower() in ("off", "none"):
        return off
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{not_a_number}, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{not_positive}, got {text!r}")
    return value
