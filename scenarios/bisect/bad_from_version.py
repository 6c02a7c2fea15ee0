#!/usr/bin/env python3
"""`--script` verdict for a release bisect: bad when the probed server reports vLLM >= VERSION.

Usage: itlaudit bisect ... --script "python3 scenarios/bisect/bad_from_version.py 0.31.0"
(itlaudit appends the probe folder). It reads the `system_fingerprint` ("vllm-0.32.0-<hash>") that
the server itself put on every streamed response, so the verdict is about the build that really ran.
Exit codes follow `git bisect run`: 0 good, 1 bad, 125 skip (no response to judge).
"""

import json
import sys
from pathlib import Path


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def main() -> int:
    threshold, probe_dir = sys.argv[1], Path(sys.argv[2])
    for path in sorted(probe_dir.rglob("requests.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            fingerprint = json.loads(line).get("system_fingerprint") or ""
            if fingerprint.startswith("vllm-"):
                served = fingerprint.split("-")[1]
                print(f"server reports vLLM {served}")
                return 1 if version_key(served) >= version_key(threshold) else 0
    print("no system_fingerprint in any response")
    return 125


if __name__ == "__main__":
    sys.exit(main())
