"""Derivation of one long reply (fault row N20: a 50 MB event took over 6 minutes and 641 MB to derive).

Each size runs in a fresh interpreter: build a prose-like reply (words, punctuation, some numbers and
dates, a little CJK), wrap it in a finished record, then time `derive_request` on it (metrics, findings,
text quality: what derived.jsonl holds) and take the peak RSS it adds over the process with the record
already built (the kernel's high-water mark, reset through /proc/self/clear_refs just before). The bound
of issue 23: 50 MB derives in at most 10 s and at most 2x its size.

The old per-character implementation (quality.py at OLD_COMMIT, read with `git show`, not copied) is
timed against the new one on the same smaller text, both cold, as a ratio; at 50 MB it took minutes.

    .venv/bin/python benchmarks/derive_long_output.py                 # 5 MB and 50 MB, old vs new at 1 MB
    .venv/bin/python benchmarks/derive_long_output.py --sizes-mb 5 --old-mb 0
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "1e2a6f012fb7547e45bec48cf0ef69a6f4d9abd7"  # the last quality.py with per-character loops
_SENTENCE = (
    "the model kept writing about the regression test and its baseline while the server answered "
    "every request at full speed with tokens that looked fine until the drift began"
)
_WORDS = _SENTENCE.split()
_EXTRAS = ("version 2", "in 1024 ways", "3.14", "—", "“quoted”", "推理", "质量", "(see §4)", "e.g.,")


def prose(chars: int, seed: int = 3) -> str:
    """Deterministic prose-like text of about `chars` characters."""
    rng = random.Random(seed)
    pieces: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 18)))
        if rng.random() < 0.05:
            sentence += " " + rng.choice(_EXTRAS)
        sentence = sentence.capitalize() + rng.choice((". ", ", ", "; ", ".\n\n"))
        pieces.append(sentence)
        size += len(sentence)
    return "".join(pieces)[:chars]


def old_quality() -> types.ModuleType:
    """quality.py as it was at OLD_COMMIT, as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:itlaudit/analysis/quality.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("old_quality")
    module.__dict__["__name__"] = "old_quality"
    sys.modules["old_quality"] = module  # dataclasses look their module up while the class is built
    exec(compile(source, f"{OLD_COMMIT[:8]}:quality.py", "exec"), module.__dict__)
    return module


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(size_mb: float) -> dict[str, Any]:
    """In this process: derive one reply of size_mb MB; seconds and the peak RSS added."""
    from itlaudit.analysis.derive import derive_request
    from itlaudit.model.records import RequestParams, RequestRecord

    text = prose(int(size_mb * 1e6))
    record = RequestRecord(
        request_id="A-00000",
        variant="A",
        endpoint="completions",
        url="http://x/v1/completions",
        model="m",
        params=RequestParams(max_tokens=10**8),
        text=text,
        finish_reason="stop",
        done_sentinel=True,
        e2e_ms=1000.0,
    )
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    base_kb = _rss_kb("VmRSS")
    started = time.perf_counter()
    line = derive_request(record)
    seconds = time.perf_counter() - started
    added_mb = (_rss_kb("VmHWM") - base_kb) / 1e3
    utf8_mb = len(text.encode("utf-8")) / 1e6
    return {
        "size_mb": utf8_mb,
        "derive_s": seconds,
        "peak_added_mb": added_mb,
        "peak_added_x_size": added_mb / utf8_mb,
        "findings": line["findings"],
    }


def compare_old(size_mb: float) -> dict[str, Any]:
    """text_quality old vs new on the same text, each called once; the figures must agree."""
    from itlaudit.analysis import quality

    text = prose(int(size_mb * 1e6))
    old = old_quality()
    started = time.perf_counter()
    before = old.text_quality(text).to_json()
    old_s = time.perf_counter() - started
    started = time.perf_counter()
    after = quality.text_quality.__wrapped__(text).to_json()
    new_s = time.perf_counter() - started
    differ = sorted(key for key in before if before[key] != after[key])
    return {"size_mb": size_mb, "old_s": old_s, "new_s": new_s, "speedup": old_s / new_s, "differ": differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="5,50", help="reply sizes to derive, each in its own process")
    parser.add_argument("--old-mb", type=float, default=1.0, help="size for the old-vs-new ratio (0: skip)")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # the child: measure one size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    for size in (float(s) for s in args.sizes_mb.split(",")):
        child = subprocess.run(
            [sys.executable, __file__, "--one", str(size)], capture_output=True, text=True, check=True
        )
        figures = json.loads(child.stdout)
        print(
            f"{figures['size_mb']:6.1f} MB reply: derive {figures['derive_s']:6.2f} s, peak RSS "
            f"+{figures['peak_added_mb']:6.1f} MB ({figures['peak_added_x_size']:.2f}x its size); "
            f"findings {figures['findings']}"
        )
    if args.old_mb:
        ratio = compare_old(args.old_mb)
        print(
            f"text_quality at {ratio['size_mb']:g} MB: old {ratio['old_s']:.2f} s, new "
            f"{ratio['new_s']:.3f} s ({ratio['speedup']:.0f}x); "
            f"figures that differ: {ratio['differ'] or 'none'}"
        )


if __name__ == "__main__":
    main()
