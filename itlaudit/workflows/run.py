"""Composes a run: for each variant, find or start its server, stream the workload, land records,
then derive the run's files. Shared by `run` and `compare`; it holds no figures of its own."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from itlaudit.capture.described import CaptureDescription
from itlaudit.capture.runner import CaptureOptions, variant_access
from itlaudit.errors import ItlauditError, RunDirError, RunInterrupted, ScenarioError
from itlaudit.model.access import url_credentials_problem
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_labels import RunLabels
from itlaudit.model.scenario import Scenario
from itlaudit.model.stop import check, interruption, requested
from itlaudit.report.progress import Reporter, duration
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.store.lock import hold_run_lock, refuse_if_live
from itlaudit.store.rundir import DEFAULT_REPORTS, REPORT_FILE, REQUESTS_FILE, new_run_dir, remove_partial
from itlaudit.workflows.ledger import LedgerPolicy
from itlaudit.workflows.server import VariantServer
from itlaudit.workflows.signals import held_signals

if TYPE_CHECKING:
    from itlaudit.model.meta import Meta
    from itlaudit.workflows.derive import Derivation
    from itlaudit.workflows.run_folder import RunFolder
    from itlaudit.workflows.variant_pass import PassResult, WindowHook


@dataclass
class RunOutcome:
    """A finished run: its folder, the one derivation of its figures and each variant's pass (this
    round's), typed: its callers (compare, smoke, trials) read these, never the files just written."""

    run_dir: Path
    derivation: Derivation
    meta: Meta  # meta.json as the run wrote it
    passes: dict[str, PassResult] = field(default_factory=dict)

    @property
    def records(self) -> list[RequestRecord]:
        """What the figures counted: no warmup, every --append round."""
        return self.derivation.records

    @property
    def finding_count(self) -> int:
        return sum(sum(block.findings.values()) for block in self.derivation.summary.variants.values())


def _open_run_dir(run_dir: Path | None, scenario_name: str, append: bool) -> Path:
    """The run folder, created now. An existing run is refused unless appending: two runs in one
    requests.jsonl would mix their figures silently. Unwritable locations end in one line."""
    try:
        if run_dir is None:
            return new_run_dir(DEFAULT_REPORTS, scenario_name)
        # A folder another run is writing is refused first, whether or not it has records yet.
        refuse_if_live(run_dir, f"--out {run_dir}")
        # Records make a run; a folder left by a refused or failed start (meta.json only) is reusable.
        requests = run_dir / REQUESTS_FILE
        if requests.is_file() and requests.stat().st_size > 0 and not append:
            raise RunDirError(
                f"--out {run_dir} already holds a run; pass --append to add to it, or choose a new folder"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".itlaudit-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = run_dir if run_dir is not None else DEFAULT_REPORTS
        raise RunDirError(
            f"cannot write the run folder {where}: {exc.strerror or exc}; choose another --out"
        ) from None
    return run_dir


def _append_tag(requests: Path) -> str | None:
    """For --append: cut a half-written last line (a crash mid-write; its request never finished) so
    the next line starts clean, and pick a tag (`r2`, `r3`, ...) that keeps request ids unique."""
    if not requests.exists():
        return None
    data = requests.read_bytes()
    if data and not data.endswith(b"\n"):
        with requests.open("r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)
    ids = {str(line.get("request_id")) for line in iter_jsonl(requests)}
    round_number = 2
    while any(f".r{round_number}-" in request_id for request_id in ids):
        round_number += 1
    return f"r{round_number}"


def run_scenario(
    scenario: Scenario,
    *,
    url: str | None = None,
    variant_urls: dict[str, str] | None = None,
    run_dir: Path | None = None,
    console: Console | None = None,
    hooks: Sequence[WindowHook] = (),
    ledger: LedgerPolicy | None = None,
    append: bool = False,
    capture: CaptureOptions | None = None,
    labels: RunLabels | None = None,
    report: bool = True,
) -> RunOutcome:
    """Run every variant in turn, each through its VariantPass (workflows/variant_pass.py), into one
    RunFolder. With a ledger, each variant is fingerprinted before it is measured (a repeat is named,
    or refused with no_repeat) and the finished run is recorded.

    A variant's measured window (the `hooks`) holds its measured requests and nothing else: warmup
    requests finish before it opens, the identity ping comes before it and the /version read of the
    environment record after it. With report=False the folder's figures are derived but the report
    is left to the caller (compare adds compare.json first).

    The run holds its folder's lock (store.lock) from the start until its summary is written, so
    `report` and a second run can tell it is still going. However it ends (finished, SIGINT/SIGTERM,
    a capture worker lost, any error after requests were sent), summary.json and the report are
    rewritten from every record in requests.jsonl, and `report --live`'s partial/ folder is removed;
    an interrupt then raises RunInterrupted, an error is re-raised."""
    variant_urls = variant_urls or {}
    unknown = set(variant_urls) - {v.name for v in scenario.variants}
    if unknown:
        names = ", ".join(v.name for v in scenario.variants)
        raise ScenarioError(f"--variant names {', '.join(sorted(unknown))}, not in the scenario ({names})")
    for variant in scenario.variants:
        target = url or variant_urls.get(variant.name) or variant.url
        problem = target and url_credentials_problem(target, variant_access(scenario, variant.name, capture))
        if problem:
            raise ScenarioError(f"variant {variant.name}: {problem}")
    from itlaudit.capture.environment import capture_environment

    # Local capture workers: their forkserver boots meanwhile (a Ray cluster starts nothing here).
    capture_environment(None if capture is None else capture.cluster).prepare()
    check()  # a signal while the dataset was drawn (seconds for the largest): no folder is made
    folder = _open_run_dir(run_dir, scenario.folder_name, append)
    try:
        with hold_run_lock(folder, f"--out {folder}"):
            return _run_in_folder(
                scenario,
                folder,
                url=url,
                variant_urls=variant_urls,
                console=console,
                hooks=hooks,
                ledger=ledger,
                append=append,
                capture=capture,
                labels=labels,
                report=report,
            )
    finally:
        remove_partial(folder)  # after the lock is let go: a `report --live` then sees the run over


def _run_in_folder(
    scenario: Scenario,
    run_dir: Path,
    *,
    url: str | None,
    variant_urls: dict[str, str],
    console: Console | None,
    hooks: Sequence[WindowHook],
    ledger: LedgerPolicy | None,
    append: bool,
    capture: CaptureOptions | None,
    labels: RunLabels | None,
    report: bool,
) -> RunOutcome:
    """run_scenario's work, in a folder it holds."""
    # The capture and report stacks load here, not at the top: the CLI imports this module to start.
    from itlaudit.capture.cluster import lost_worker_warnings
    from itlaudit.workflows.run_folder import RunFolder

    tag = _append_tag(run_dir / REQUESTS_FILE) if append else None
    context: JSONObject | None = (
        {"appended_at_unix": time.time(), "append_tag": tag} if tag is not None else None
    )
    folder = RunFolder.begin(run_dir, scenario, labels=labels, context=context, extend=tag is not None)
    workload = scenario.workload
    per_variant = workload.num_requests + workload.arrivals.warmup_requests  # every record counts
    total = per_variant * len(scenario.variants)
    reporter = Reporter(console)
    writer = folder.records()
    passes: dict[str, PassResult] = {}
    try:
        with reporter.capture("requests", total) as counts, writer:
            writer.counts = counts
            for variant in scenario.variants:
                override = url or variant_urls.get(variant.name)
                access = variant_access(scenario, variant.name, capture)
                check()  # a signal between two variants: the next one never starts
                with VariantServer.open(
                    variant, run_dir, url=override, access=access, reporter=reporter
                ) as server:
                    base_url = server.url
                    counts.begin(f"{variant.name} @ {base_url}", per_variant)
                    variant_started = time.monotonic()

                    def on_capture(
                        workers: CaptureDescription, name: str = variant.name, url: str = base_url
                    ) -> None:
                        """The phase line comes here, once the server has answered the model lookup."""
                        if "workers" in workers:
                            counts.sending()
                            count = len(workers["workers"])
                            reporter.phase(
                                f"{name}: {workload.num_requests} requests to {url} over "
                                f"{count} capture process{'es' if count > 1 else ''}"
                            )
                        dataset = scenario.workload.dataset
                        if workers.get("reply_lengths") == "estimated" and dataset and console:
                            console.print(f"warning: {dataset.warning}", markup=False, soft_wrap=True)
                        if "random_chat" in workers and console:
                            note = workers["random_chat"]["note"]
                            console.print(f"{name}: {note}", markup=False, soft_wrap=True)
                        for warning in lost_worker_warnings(workers):
                            (console or Console(stderr=True)).print(warning, markup=False, soft_wrap=True)

                    passed = passes[variant.name] = folder.measure(
                        scenario,
                        variant,
                        server,
                        writer=writer,
                        capture=capture,
                        ledger=ledger,
                        console=console,
                        hooks=hooks,
                        id_tag=tag,
                        on_done=counts.landed,
                        on_prepare=counts.prepare,
                        on_capture=on_capture,
                    )
                    reporter.phase(
                        f"{variant.name}: {len(passed.capture.records)} requests done in "
                        f"{duration(time.monotonic() - variant_started)}"
                    )
                    if server.launched is not None:
                        reporter.phase(f"{variant.name}: stopping its server")
    except KeyboardInterrupt:
        raise _wrap_up_interrupted(folder, scenario, reporter) from None
    except Exception as exc:
        _wrap_up_failed(folder, scenario, reporter, exc)
        raise
    order = [v.name for v in scenario.variants]
    hint = f"`itlaudit report {run_dir}` derives its figures"
    with held_signals(folder, hint):
        derivation = folder.finish(scenario.name, order, reporter=reporter, report=report)
    if requested():
        # A signal held until the figures were written: the folder is finished, nothing more runs.
        signal_name, exit_code = interruption()
        raise RunInterrupted(
            signal_name,
            exit_code,
            f"interrupted by {signal_name} after the last request: its figures were finished "
            f"first (summary.json in {run_dir}); not recorded in the ledger",
        )
    if ledger is not None:
        ledger.record(run_dir, derivation.summary, derivation.records)
    return RunOutcome(run_dir=run_dir, derivation=derivation, meta=folder.meta, passes=passes)


def _finished_requests(run_dir: Path) -> int:
    requests = run_dir / REQUESTS_FILE
    return sum(1 for _ in iter_jsonl(requests)) if requests.exists() else 0


def _wrap_up_failed(folder: RunFolder, scenario: Scenario, reporter: Reporter, error: Exception) -> None:
    """An error ended the run after it began (a capture worker died, the server refused, the disk
    filled): as after an interrupt, meta says so and summary and report are rewritten from what
    finished, so they never disagree with requests.jsonl; nothing goes to the ledger. If that fails
    too (the disk is still full), the original error is the one reported."""
    with contextlib.suppress(OSError, ItlauditError):
        # save() masks it: a server's message in it may quote a key the run sent (a 401).
        folder.mark("failed", {"error": str(error), "at_unix": time.time()})
        finished = _finished_requests(folder.path)
        if finished:
            reporter.phase(f"run failed: keeping the {finished} finished requests")
            folder.finish(scenario.name, [v.name for v in scenario.variants], reporter=reporter)


def _wrap_up_interrupted(folder: RunFolder, scenario: Scenario, reporter: Reporter) -> RunInterrupted:
    """Keep what finished: meta (marked interrupted), summary and report; nothing goes to the ledger,
    since a partial run is not the experiment its fingerprint names."""
    signal_name, exit_code = interruption()
    folder.mark("interrupted", {"signal": signal_name, "at_unix": time.time()})
    finished = _finished_requests(folder.path)
    if finished:
        reporter.phase(f"interrupted by {signal_name}: keeping the {finished} finished requests")
        with held_signals(folder, f"`itlaudit report {folder.path}` derives its figures"):
            folder.finish(scenario.name, [v.name for v in scenario.variants], reporter=reporter)
        where = f"summary and report for them in {folder.path / REPORT_FILE}"
    else:
        where = f"nothing to report ({folder.path})"
    return RunInterrupted(
        signal_name, exit_code, f"interrupted by {signal_name}: {finished} finished requests kept; {where}"
    )
