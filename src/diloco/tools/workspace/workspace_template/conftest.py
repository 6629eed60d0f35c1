"""Make ``pytest`` test *this* workspace's code, with no reinstall after an edit.

``src/`` goes first on ``sys.path``, so ``import diloco`` finds ``src/diloco`` here even
when another copy of diloco (say, the reference) is installed in the same environment.
"""

import sys
from pathlib import Path

_SRC = str(Path(__file__).resolve().parent / "src")
if sys.path[:1] != [_SRC]:
    sys.path.insert(0, _SRC)
for _name in [n for n in sys.modules if n == "diloco" or n.startswith("diloco.")]:
    if not str(getattr(sys.modules[_name], "__file__", "") or "").startswith(_SRC):
        del sys.modules[_name]  # imported from elsewhere before this file ran
