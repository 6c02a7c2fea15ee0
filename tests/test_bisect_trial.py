"""A bisect trial's figures come from its run folder's own derivation: requests.jsonl is read once
(by that derivation), not again by the bisection, and the figures are those a reader of the folder
derives (read_trial, used on resume)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from pacedkit import Paced, prompts, scenario

from itlaudit.bisect.figures import read_trial
from itlaudit.bisect.probe import ProbeConfig, run_trial
from itlaudit.bisect.verdict import parse_regress
from itlaudit.model.scenario import load_scenario
from itlaudit.store.rundir import REQUESTS_FILE
from itlaudit.workflows.server import VariantServer

_opened: list[str] = []
_watching: list[Path] = []


def _count_reads(event: str, args: tuple[object, ...]) -> None:
    """An audit hook (it cannot be removed, so it only counts while a test watches a path)."""
    if event == "open" and _watching and isinstance(args[0], (str, Path)):
        path, mode, flags = args[0], args[1], args[2]
        # open() names its mode; os.open (the record writer's) gives None and its flags.
        reading = "r" in mode if isinstance(mode, str) else (int(str(flags)) & os.O_ACCMODE) == os.O_RDONLY
        if Path(path) == _watching[0] and reading:
            _opened.append(str(mode))


sys.addaudithook(_count_reads)


def test_a_trial_reads_its_requests_once_and_figures_them_as_the_folder_does(
    tmp_path: Path, paced: Callable[..., Paced]
) -> None:
    server = paced(interval_ms=1.0)
    path = scenario(tmp_path, f"{prompts(3)}\nnum_requests = 3\nmax_tokens = 12")
    config = ProbeConfig(
        scenario=load_scenario(path),
        specs={},
        regress=parse_regress("itl"),
        threshold=1.5,
        alpha=0.05,
        trials=1,
        max_trials=1,
    )
    trial_dir = tmp_path / "trial-1"
    _watching.append((trial_dir / REQUESTS_FILE).resolve())
    try:
        figures = run_trial(config, VariantServer("A", server.url), trial_dir)
    finally:
        _watching.clear()
    assert len(_opened) == 1, f"requests.jsonl opened for reading {len(_opened)} times"
    (trial,) = figures.values()
    assert trial.requests == 3 and len(trial.itl_ms) == 3 and all(v < 50 for v in trial.itl_ms)
    assert read_trial(trial_dir) == figures  # what resume reads back is what the bisection judged
