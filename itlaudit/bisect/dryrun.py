"""`itlaudit bisect --dry-run`: what a bisection would do, from metadata alone.

The range, the scenario and its variants, which builds the provider can find (a metadata lookup per
build, done in parallel: nothing is downloaded or installed), the expected probe count and what those
probes would download. Answers "will this work here?" before hours of GPU time.
"""

from __future__ import annotations

import statistics
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from itlaudit.bisect.bisector import probe_scenario
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers import Found
from itlaudit.bisect.search import Search
from itlaudit.bisect.settings import Settings, commit_source, list_builds, make_provider
from itlaudit.errors import BisectError

LOOKUP_THREADS = 8


def _size(size: int | None) -> str:
    if size is None:
        return "size unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def expected_probes(count: int) -> int:
    """Both ends, then a clean binary search of what lies between (skips can add a few)."""
    return 2 + Search(count).remaining_estimate()


def dry_run_report(settings: Settings, console: Console) -> None:
    scenario, specs = probe_scenario(settings)
    builds = list_builds(settings)
    _, source = commit_source(settings.setup)
    console.print(
        f"range: {settings.good} … {settings.bad}: {len(builds)} builds from {source}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    workload = scenario.workload
    models = sorted({spec.model for spec in specs.values() if spec.model})
    console.print(
        f"scenario: {scenario.name} ({settings.setup.scenario}); variants {', '.join(specs)}; model "
        f"{', '.join(models) or '(set by the server command)'}; {workload.num_requests} requests × "
        f"{workload.params.max_tokens} tokens; verdict --regress {settings.regress.text}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    with tempfile.TemporaryDirectory(prefix="itlaudit-dry-run-") as scratch:
        provider, _cache = make_provider(settings.setup, Path(scratch))
        with ThreadPoolExecutor(max_workers=LOOKUP_THREADS) as pool:
            found: list[Found] = list(pool.map(provider.find, builds))
    console.print(f"provider {settings.setup.provider.kind}:", highlight=False, markup=False, soft_wrap=True)
    # A reason shared by several builds (no network) is said once, not once per build.
    reasons = Counter((f.available, f.detail) for f in found if not f.available)
    shared = {key: count for key, count in reasons.items() if count > 1}
    state = {True: "found", False: "missing", None: "unknown"}
    for number, (build, answer) in enumerate(zip(builds, found, strict=True), 1):
        if (answer.available, answer.detail) in shared:
            continue
        size = f" ({_size(answer.size_bytes)})" if answer.available else ""
        console.print(
            f"  {number:4d} {_label(build)} {state[answer.available]}: {answer.detail}{size}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    for (answered, detail), count in shared.items():
        console.print(
            f"  {count} builds {state[answered]}: {detail}", highlight=False, markup=False, soft_wrap=True
        )
    available = sum(1 for f in found if f.available)
    probes = expected_probes(len(builds))
    sizes = [f.size_bytes for f in found if f.available and f.size_bytes]
    unknown = sum(1 for f in found if f.available is None)
    console.print(
        f"{available} of {len(builds)} builds found, {unknown} unknown",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if not available and not unknown:
        details = {f.detail for f in found}
        why = details.pop() if len(details) == 1 else "see the reasons above"
        raise BisectError(
            f"none of the {len(builds)} builds was found by provider {settings.setup.provider.kind}: "
            f"nothing to bisect ({why})"
        )
    download = "unknown (the provider reports no sizes)"
    if sizes:
        median = int(statistics.median(sizes))
        download = f"~{_size(probes * median)} ({probes} probes × median {_size(median)})"
    console.print(
        f"expected probes: ~{probes} (both ends, then a binary search)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    console.print(f"expected download: {download}", highlight=False, markup=False, soft_wrap=True)
    console.print(
        "dry run: nothing was downloaded, installed or started", highlight=False, markup=False, soft_wrap=True
    )


def _label(build: Build) -> str:
    return build.ref if build.kind == "version" else build.ref[:12]
