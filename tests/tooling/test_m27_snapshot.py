"""The stored milestone-27 reference runs still come out of their generator."""

import numpy as np
from make_m27_snapshot import SNAPSHOT, build_snapshot


def test_m27_snapshot_matches_its_generator():
    fresh = build_snapshot()
    with np.load(SNAPSHOT) as stored:
        assert sorted(stored.files) == sorted(fresh)
        assert str(stored["cases"]) == str(fresh["cases"])
        for key, value in fresh.items():
            if key != "cases":
                np.testing.assert_allclose(stored[key], value, rtol=1e-13, atol=1e-15, err_msg=key)
