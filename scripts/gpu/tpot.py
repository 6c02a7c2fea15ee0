#!/usr/bin/env python3
"""itlaudit's per-request TPOT against vLLM's own `vllm:request_time_per_output_token_seconds`.

vLLM observes one TPOT per finished request into that histogram; the delta of its `_sum` and `_count`
over a run is the server's own mean TPOT for exactly the requests the run sent, which is what
itlaudit's mean `tpot_ms` (summary.json) claims to measure from the client side. The two are compared
per variant, from itlaudit's compare meta.json when its /metrics snapshots carry the histogram, else
from raw /metrics text files the lane saved around the run (`<dir>/<variant>-{before,after}.txt`).

Requests that vLLM counts but the run did not send (itlaudit's one-token identity request before each
variant, recorded with TPOT 0) are reported as `extra`; the "excl." mean divides vLLM's sum by the
run's own request count, which is exact when those extra requests had one output token.

Usage: tpot.py RUN_DIR [--metrics-dir DIR]   (prints a Markdown table; exit 1 if any |diff| > --max-pct)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HIST = "vllm:request_time_per_output_token_seconds"


def _sum_count_from_text(text: str) -> tuple[float, float]:
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, rest = line.partition(" ")
        metric = name.split("{", 1)[0]
        value = float(rest.split()[0])
        if metric == HIST + "_sum":
            total += value
        elif metric == HIST + "_count":
            count += value
    return total, count


def _sum_count_from_snapshot(snapshot: dict[str, Any]) -> tuple[float, float] | None:
    """Whatever key layout the capture engine uses, the histogram's _sum/_count appear as numbers."""
    found: dict[str, float] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, int | float) and HIST in key:
                    suffix = "sum" if key.endswith("_sum") else "count" if key.endswith("_count") else None
                    if suffix:
                        found[suffix] = found.get(suffix, 0.0) + float(value)
                else:
                    walk(value)

    walk(snapshot)
    return (found["sum"], found["count"]) if {"sum", "count"} <= found.keys() else None


def compare(run_dir: Path, metrics_dir: Path | None) -> list[dict[str, Any]]:
    meta = json.loads((run_dir / "meta.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = []
    for name, variant in meta["variants"].items():
        before = _sum_count_from_snapshot(variant.get("before") or {})
        after = _sum_count_from_snapshot(variant.get("after") or {})
        source = "meta.json"
        if before is None or after is None:
            if metrics_dir is None:
                raise SystemExit(f"tpot: {run_dir}/meta.json has no {HIST}; pass --metrics-dir")
            before = _sum_count_from_text((metrics_dir / f"{name}-before.txt").read_text())
            after = _sum_count_from_text((metrics_dir / f"{name}-after.txt").read_text())
            source = "lane /metrics"
        d_sum, d_count = after[0] - before[0], after[1] - before[1]
        block = summary["variants"][name]
        n = block["tpot_ms"]["count"]
        ours = block["tpot_ms"]["mean"]
        theirs_raw = 1000.0 * d_sum / d_count if d_count else None
        theirs = 1000.0 * d_sum / n if n else None
        rows.append(
            {
                "variant": name,
                "requests": n,
                "itlaudit_tpot_ms": ours,
                "vllm_count": d_count,
                "extra": d_count - n,
                "vllm_tpot_ms_raw": theirs_raw,
                "vllm_tpot_ms": theirs,
                "diff_pct": None if not theirs or ours is None else 100.0 * (ours - theirs) / theirs,
                "source": source,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--metrics-dir", type=Path)
    parser.add_argument("--max-pct", type=float, default=1.0)
    args = parser.parse_args()
    rows = compare(args.run_dir, args.metrics_dir)
    print(f"{args.run_dir.name}: itlaudit mean TPOT vs vLLM {HIST} (sum/count delta)")
    print(
        "| variant | requests | itlaudit ms | vLLM count | extra | vLLM ms (raw) | vLLM ms (excl.) | diff "
        "| source |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def f(x: float | None, spec: str = ".3f") -> str:
        return "–" if x is None else format(x, spec)

    for r in rows:
        print(
            f"| {r['variant']} | {r['requests']} | {f(r['itlaudit_tpot_ms'])} | {r['vllm_count']:.0f} | "
            f"{r['extra']:.0f} | {f(r['vllm_tpot_ms_raw'])} | {f(r['vllm_tpot_ms'])} | "
            f"{f(r['diff_pct'], '+.2f')}% | {r['source']} |"
        )
    bad = [r for r in rows if r["diff_pct"] is None or abs(r["diff_pct"]) > args.max_pct]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
