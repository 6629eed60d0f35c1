"""Build src/diloco/_datasets/digits.npz from the project's shared digits CSV (run once).

    python scripts/make_digits_npz.py ../shared/data/digits.csv.gz

The CSV has 1,797 rows of 65 integers: 64 pixel counts (0..16) of an 8x8 image, then the
digit label. The npz stores them as uint8 ``x`` (1797, 64) and ``y`` (1797,).
"""

import gzip
import sys
from pathlib import Path

import numpy as np

source = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/digits.csv.gz")
with gzip.open(source, "rt") as handle:
    table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
assert table.shape == (1797, 65), table.shape
assert table[:, :64].min() >= 0 and table[:, :64].max() <= 16
target = Path(__file__).resolve().parents[1] / "src" / "diloco" / "_datasets" / "digits.npz"
np.savez_compressed(target, x=table[:, :64].astype(np.uint8), y=table[:, 64].astype(np.uint8))
print(f"wrote {target} ({target.stat().st_size} bytes)")
