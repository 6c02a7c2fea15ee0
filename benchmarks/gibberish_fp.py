"""gibberish_suspected's false-positive rate on real text: Gemma 3 270M's outputs, sampled and greedy.

The rule was calibrated on one seed's numbers (seed 003); a real model writing lists, code and number
sequences must not trip it. This replays the saved outputs (tests/fixtures/gemma_outputs.jsonl: every
line one completion of the real model on the CPU testbed, with its prompt kind and sampling) through
the rule at its default thresholds and prints the rate, overall and per prompt kind, plus each output
it flags. tests/test_quality.py holds the rate to at most 1% on the same file.

    .venv/bin/python benchmarks/gibberish_fp.py                  # replay the fixture
    .venv/bin/python benchmarks/gibberish_fp.py --collect URL    # re-sample it from a Gemma server

--collect sends every prompt once greedy and SAMPLED_SEEDS times at temperature 0.8, top_p 0.95 (seeded,
so a re-collection is the same text on the same build) to /v1/completions at URL, 8 at a time, and
rewrites the fixture; the server is `itlaudit testbed build-model`'s gemma3-270m, served as in
itlaudit/data/gemma-greedy.toml's K0 variant.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from itlaudit.analysis.quality import DEFAULT_THRESHOLDS, GibberishThresholds, gibberish_reasons, text_quality

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "gemma_outputs.jsonl"
MAX_TOKENS = 128
SAMPLED_SEEDS = 6
# Several kinds of text a benchmark sends, numbers and lists included: the kinds the rule could mistake.
PROMPTS: dict[str, list[str]] = {
    "prose": [
        "The history of the printing press begins in the fifteenth century, when",
        "On a cold morning in the mountains, the old shepherd woke before dawn and",
        "Photosynthesis is the process by which plants",
        "The main causes of the French Revolution were",
        "Dear hiring manager, I am writing to apply for the position of",
        "The city council met on Tuesday to discuss the new budget. According to the mayor,",
    ],
    "code": [
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "#include <stdio.h>\n\nint main(void) {\n",
        "SELECT customer_id, SUM(amount) AS total\nFROM orders\n",
        "function debounce(fn, wait) {\n",
        "class Stack:\n    def __init__(self):\n",
        "# Bash script that backs up a folder\n#!/bin/bash\n",
    ],
    "list": [
        "A shopping list for a week of simple dinners:\n1.",
        "Ten tips for better sleep:\n1.",
        "Things to pack for a camping trip:\n-",
        "The planets of the solar system, in order from the sun:\n1.",
        "Steps to change a flat tire:\nStep 1:",
        "Top reasons to learn a second language:\n*",
    ],
    "numbers": [
        "The first ten prime numbers are 2, 3, 5, 7,",
        "Multiplication table for 7:\n7 x 1 = 7\n7 x 2 = 14\n",
        "Population of major world cities (2020 estimates):\nTokyo: 37.4 million\n",
        "Quarterly revenue report. Q1 2023: $12.5 million. Q2 2023:",
        "Timeline of the Apollo program:\n1961:",
        "Convert the following temperatures from Celsius to Fahrenheit: 0 C = 32 F, 100 C = 212 F,",
    ],
    "dialogue": [
        "Q: What is the capital of Australia?\nA:",
        '"Where have you been?" asked Maria. "I was',
        "Interviewer: Tell me about your first job.\nCandidate:",
        "Customer: My order has not arrived yet.\nSupport agent:",
        "Teacher: Can anyone explain why the sky is blue?\nStudent:",
        "User: How do I boil an egg?\nAssistant:",
    ],
}


def _requests() -> list[dict[str, Any]]:
    out = []
    for kind, prompts in PROMPTS.items():
        for prompt in prompts:
            out.append({"kind": kind, "prompt": prompt, "temperature": 0.0, "top_p": 1.0, "seed": None})
            for seed in range(SAMPLED_SEEDS):
                out.append({"kind": kind, "prompt": prompt, "temperature": 0.8, "top_p": 0.95, "seed": seed})
    return out


def _complete(url: str, model: str, req: dict[str, Any]) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": req["prompt"],
        "max_tokens": MAX_TOKENS,
        "temperature": req["temperature"],
        "top_p": req["top_p"],
    }
    if req["seed"] is not None:
        body["seed"] = req["seed"]
    http = urllib.request.Request(
        f"{url.rstrip('/')}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(http, timeout=600) as resp:
        reply = json.load(resp)
    choice = reply["choices"][0]
    return {
        **req,
        "text": choice["text"],
        "finish_reason": choice["finish_reason"],
        "completion_tokens": reply["usage"]["completion_tokens"],
    }


def collect(url: str, model: str, out: Path) -> None:
    """Sample every request from a live server and write them, in request order, as the fixture."""
    requests = _requests()
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = list(pool.map(lambda req: _complete(url, model, req), requests))
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"wrote {len(rows)} outputs to {out}", file=sys.stderr)


def load(path: Path = FIXTURE) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def false_positives(
    rows: list[dict[str, Any]], thresholds: GibberishThresholds = DEFAULT_THRESHOLDS
) -> list[tuple[dict[str, Any], list[str]]]:
    """Each output the rule flags, with its reasons: on these, every one is a false positive (a healthy
    server's text)."""
    flagged = []
    for row in rows:
        reasons = gibberish_reasons(text_quality(row["text"]), thresholds)
        if reasons:
            flagged.append((row, reasons))
    return flagged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", metavar="URL", help="re-sample the fixture from a Gemma server first")
    parser.add_argument("--model", default="gemma3-270m", help="served model name (with --collect)")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    args = parser.parse_args(argv)
    if args.collect:
        collect(args.collect, args.model, args.fixture)
    rows = load(args.fixture)
    flagged = false_positives(rows)
    judged = [row for row in rows if text_quality(row["text"]).chars >= DEFAULT_THRESHOLDS.min_chars]
    kinds = Counter(row["kind"] for row in rows)
    flagged_kinds = Counter(row["kind"] for row, _ in flagged)
    for row, reasons in flagged:
        print(f"flagged [{row['kind']}, T={row['temperature']}] {'; '.join(reasons)}: {row['text'][:120]!r}")
    per_kind = ", ".join(f"{kind} {flagged_kinds[kind]}/{n}" for kind, n in sorted(kinds.items()))
    sampled = sum(1 for row in rows if row["temperature"] > 0)
    print(
        f"gibberish_suspected false positives: {len(flagged)}/{len(rows)} = {len(flagged) / len(rows):.1%} "
        f"({len(judged)} long enough to judge; {sampled} sampled, {len(rows) - sampled} greedy; {per_kind})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
