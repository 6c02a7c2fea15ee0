"""The generated histories tests/test_track.py and tests/test_track_dashboard.py both read: the 60
nightlies of issue 26 (a 128-token cap on builds 25–32, a 30 % token-ITL slowdown from 40, K3's
speedup lost from 50 with K0 unchanged, noise, missing nightlies, two trials on some builds)."""

from __future__ import annotations

import numpy as np
from track_scale import synthetic_point

from itlaudit.track.db import NewPoint

__all__ = ["FAMILY", "MISSING", "sixty_nightlies"]

MISSING = {7, 18, 37, 45, 56}
FAMILY = {"platform": "cpu", "model": "tiny", "workload": "w", "client": "wire"}


def sixty_nightlies(seed: int, *, planted: bool = True) -> list[NewPoint]:
    rng = np.random.default_rng(seed)
    points = []
    for build in range(1, 61):
        if build in MISSING:
            continue
        cap = 128 if planted and 25 <= build <= 32 else None
        slow = 1.3 if planted and build >= 40 else 1.0
        lost = planted and build >= 50
        # A capped build looks faster (shorter outputs, emptier batches): it must not read as a speedup.
        looks = 0.6 if cap else 1.0
        for trial in range(2 if build % 10 == 3 else 1):
            points.append(
                synthetic_point(
                    FAMILY,
                    "K0",
                    build,
                    rng,
                    itl_ms=20 * slow * looks,
                    acceptance=1.0,
                    output_len=256,
                    cap=cap,
                    trial=trial,
                )
            )
            points.append(
                synthetic_point(
                    FAMILY,
                    "K3",
                    build,
                    rng,
                    itl_ms=(20 if lost else 9) * slow * looks,
                    acceptance=1.0 if lost else 2.6,
                    output_len=256,
                    cap=cap,
                    trial=trial,
                )
            )
    return points
