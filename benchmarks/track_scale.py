"""`itlaudit track check` at scale: 10,000 builds × 20 fingerprints × 8 series (issue 26 item 7).

Generates a history of synthetic points (per-request samples with noise between requests and between
builds, a few real steps), records it in a SQLite file, then times the check (reading the points,
searching every series, testing candidates on raw samples), then adds one new build to one family
and times the incremental check (only that family is searched again; the others come from the
check's cache in the history). The target is ≤ 10 s on the 2-core box.
The generator is also what tests/test_track.py builds its 60-nightly history from.

    .venv/bin/python benchmarks/track_scale.py [--builds 10000] [--families 10] [--db PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from itlaudit.analysis.changes import LENGTH, VALID
from itlaudit.track.db import NewPoint, open_history

__all__ = ["synthetic_point"]


def synthetic_point(
    family: Mapping[str, Any],
    variant: str,
    order: int,
    rng: np.random.Generator,
    *,
    itl_ms: float,
    acceptance: float,
    output_len: int,
    cap: int | None = None,
    requests: int = 16,
    noise: float = 0.08,
    build_noise: float = 0.02,
    trial: int = 0,
    method: Mapping[str, Any] | None = None,
) -> NewPoint:
    """One variant on one build: `requests` requests whose token ITL scatters around `itl_ms` (noise
    between requests, and a shift shared by the whole build); with `cap`, every output stops there and
    the point is invalid, as analysis/validity.py would rule a capped run."""
    shift = float(np.exp(rng.normal(0, build_noise)))
    itl = itl_ms * shift * np.exp(rng.normal(0, noise, requests))
    length = min(output_len, cap) if cap else output_len
    ttft = 50.0 * np.exp(rng.normal(0, noise, requests))
    samples = {
        "itl_ms": itl.tolist(),
        "tpot_ms": (itl * (1 + 0.01 * rng.random(requests))).tolist(),
        "ttft_ms": ttft.tolist(),
        "decode_tokens_per_s": (1000.0 / itl).tolist(),
        "completion_tokens": [float(length)] * requests,
        "decode_tokens_per_chunk": (acceptance * np.exp(rng.normal(0, noise / 2, requests))).tolist(),
    }
    return NewPoint(
        series_fingerprint=family,
        variant=variant,
        run_id=f"build{order}-t{trial}",
        run_dir=None,
        build_order=order,
        build_version="0.32.0.dev",
        build_commit=f"{order:04d}{'c' * 36}",
        build_flavour="cpu",
        method=method or {"variant": variant},
        validity=LENGTH if cap else VALID,
        reason=f"{requests} of {requests} requests capped at {cap} tokens" if cap else None,
        cap=cap,
        errors=0,
        samples=samples,
    )


def _history(builds: int, families: int, seed: int) -> list[NewPoint]:
    """K0 and K3 per family; one family in two gets a 30 % slowdown at two-thirds of the history."""
    rng = np.random.default_rng(seed)
    points = []
    for f in range(families):
        family = {"platform": "H200", "model": f"m{f}", "workload": f"w{f}", "client": "wire"}
        step = 2 * builds // 3 if f % 2 == 0 else None
        for order in range(builds):
            slow = 1.3 if step is not None and order >= step else 1.0
            for variant, itl, acceptance in (("K0", 20.0, 1.0), ("K3", 9.0, 2.6)):
                points.append(
                    synthetic_point(
                        family,
                        variant,
                        order,
                        rng,
                        itl_ms=itl * slow,
                        acceptance=acceptance,
                        output_len=256,
                        requests=8,
                    )
                )
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", type=int, default=10_000)
    parser.add_argument("--families", type=int, default=10, help="2 fingerprints (K0, K3) each")
    parser.add_argument("--db", type=Path, default=None, help="a SQLite file (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "history.sqlite"
        history = open_history(str(db))
        t0 = time.perf_counter()
        history.add_rows(_history(args.builds, args.families, seed=1))
        t1 = time.perf_counter()
        changes = history.check()  # the whole history: nothing cached yet
        t2 = time.perf_counter()
        # Last night: one new build of one family (K0 and K3); only that family is searched again.
        rng = np.random.default_rng(2)
        family = {"platform": "H200", "model": "m0", "workload": "w0", "client": "wire"}
        history.add_rows(
            [
                synthetic_point(
                    family, v, args.builds, rng, itl_ms=itl, acceptance=a, output_len=256, requests=8
                )
                for v, itl, a in (("K0", 26.0, 1.0), ("K3", 11.7, 2.6))
            ]
        )
        t3 = time.perf_counter()
        again = history.check()
        t4 = time.perf_counter()
        points = len(history.points())
        history.close()
    steps = sum(1 for c in changes if c.change_class == "speed")
    print(
        f"{args.builds} builds × {args.families * 2} fingerprints × 8 series: "
        f"record {t1 - t0:.1f} s, full check {t2 - t1:.2f} s ({len(changes)} changes, {steps} speed; "
        f"{args.families // 2 + args.families % 2} planted), incremental check after one new build "
        f"{t4 - t3:.2f} s ({len(again)} changes; {points} points)"
    )


if __name__ == "__main__":
    main()
