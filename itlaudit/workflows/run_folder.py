"""A run folder as one object: meta.json (one schema for `run`, `compare`, `sweep` trials, `smoke` and
bisect trials), requests.jsonl's writer, each launched server's log, and `finish()`, which derives the
folder's figures once and returns them typed; `RunFolder.open` reads a finished one back, typed.

It lives in workflows/, not store/: meta.json records the host's environment (serve/) and `finish()`
derives the report (report/), both above the store in the stage order.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from itlaudit import __version__
from itlaudit.model.access import Access
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.meta import Meta, MetaVariant, Roofline
from itlaudit.model.redact import redact_json
from itlaudit.model.run_context import workload_meta
from itlaudit.model.run_labels import LabelsMeta, RunLabels
from itlaudit.model.scenario import Scenario
from itlaudit.report.progress import CaptureProgress, Reporter
from itlaudit.serve.environment import host_environment
from itlaudit.store.folder import RunFiles
from itlaudit.store.jsonl import RecordWriter
from itlaudit.store.rundir import META_FILE, REQUESTS_FILE, server_log_name, write_meta
from itlaudit.workflows.signals import run_until_stopped
from itlaudit.workflows.variant_pass import PassResult, VariantPass, WindowHook

if TYPE_CHECKING:
    from rich.console import Console

    from itlaudit.capture.planning import OnPrepare
    from itlaudit.capture.runner import CaptureOptions, OnCapture, OnDone
    from itlaudit.model.scenario import Variant
    from itlaudit.workflows.derive import Derivation
    from itlaudit.workflows.ledger import LedgerPolicy
    from itlaudit.workflows.server import VariantServer

# The labels' keys of a run no command line named (a bisect trial, a sweep's trial).
_UNLABELLED: LabelsMeta = {"command_line": None, "label": None, "metadata": {}, "backend": None}


class RunFolder:
    """One run folder being written. `meta` is meta.json's content (model/meta.Meta, the type its
    readers get back); `save()` writes it (credentials masked) whenever a step adds to it, so a run
    that dies leaves what it knew."""

    def __init__(self, path: Path, meta: Meta) -> None:
        self.path = path
        self.meta = meta

    @classmethod
    def begin(
        cls,
        path: Path,
        scenario: Scenario,
        *,
        labels: RunLabels | None = None,
        context: JSONObject | None = None,
        extend: bool = False,
    ) -> RunFolder:
        """Start the folder's meta.json. With `extend`, a meta.json already there (an --append round, a
        bisect trial's next variant) is kept, the context added over it."""
        path.mkdir(parents=True, exist_ok=True)
        if extend and (path / META_FILE).exists():
            meta = RunFiles(path).meta_file
        else:
            block, labelled = scenario.block, labels.to_meta() if labels is not None else _UNLABELLED
            meta = Meta(
                itlaudit_version=__version__,
                scenario=scenario.name,
                scenario_path=str(scenario.path) if scenario.path else None,
                endpoint=scenario.endpoint,
                quality_gate=scenario.quality_gate,
                goodput=dict(block.goodput),
                metric_percentiles=list(block.percentiles),
                percentile_metrics=list(block.metrics),
                tokenizer=None if scenario.tokenizer is None else str(scenario.tokenizer.absolute()),
                # the bandwidth floor's inputs as given (analysis.roofline reads them when deriving)
                roofline=Roofline(
                    model_config=scenario.model_config,
                    mem_bandwidth_gbps=scenario.mem_bandwidth_gbps,
                    bytes_per_token=scenario.bytes_per_token,
                ),
                workload=workload_meta(scenario),
                started_at_unix=time.time(),
                environment=host_environment(),
                command_line=labelled["command_line"],
                label=labelled["label"],
                metadata=dict(labelled["metadata"]),
                backend=labelled["backend"],
            )
        if context:  # a command's own keys, checked as a reader will read them
            meta = Meta.from_json({**meta.to_json(), **context}, path / META_FILE)
        folder = cls(path, meta)
        folder.save()
        return folder

    @staticmethod
    def open(path: Path) -> RunFiles:
        """The folder at `path` read back for a command that did not just write it (report, diff, a
        resumed sweep's trials, track, bisect's probes, --save-result): its meta.json, summary.json
        and compare.json typed, each decoded and format-checked once (store/folder.RunFiles)."""
        return RunFiles(path)

    @property
    def requests(self) -> Path:
        return self.path / REQUESTS_FILE

    def server_log(self, variant: str) -> Path:
        return self.path / server_log_name(variant)

    def variant(self, name: str, access: Access) -> MetaVariant:
        """The variant's entry in meta.json, new: the header names it sends (never their values)."""
        info = MetaVariant(headers=sorted(header for header, _ in access.headers))
        self.meta.variants[name] = info
        return info

    def save(self) -> None:
        write_meta(self.path, redact_json(self.meta.to_json()))

    def mark(self, key: Literal["interrupted", "failed"], value: JSONObject) -> None:
        """How the run ended when it did not finish (`interrupted`, `failed`), written at once."""
        setattr(self.meta, key, value)
        self.save()

    def measure(
        self,
        scenario: Scenario,
        variant: Variant,
        server: VariantServer,
        *,
        writer: RecordWriter | None = None,
        capture: CaptureOptions | None = None,
        hooks: Sequence[WindowHook] = (),
        ledger: LedgerPolicy | None = None,
        console: Console | None = None,
        id_tag: str | None = None,
        on_done: OnDone | None = None,
        on_prepare: OnPrepare | None = None,
        on_capture: OnCapture | None = None,
    ) -> PassResult:
        """The one measure step of every command (run, compare, smoke, each sweep trial, each bisect and
        nightly trial): the variant's pass (workflows/variant_pass.py) on `server` into this folder, a
        signal stopping it at its boundary (KeyboardInterrupt here, what finished kept), meta.json
        saved after it. Its records land in `writer` when the caller holds one across variants (run's,
        with its progress counts), else in this folder's requests.jsonl, opened for the pass."""
        with nullcontext(writer) if writer is not None else self.records() as lines:
            passed = run_until_stopped(
                VariantPass(
                    scenario,
                    variant,
                    server,
                    self,
                    lines,
                    capture=capture,
                    ledger=ledger,
                    console=console,
                    hooks=hooks,
                    id_tag=id_tag,
                    on_done=on_done,
                    on_prepare=on_prepare,
                    on_capture=on_capture,
                ).run()
            )
        self.save()
        return passed

    def records(self) -> TallyWriter:
        """requests.jsonl's writer (appending: an --append round and a bisect trial's next variant add
        to the lines already there)."""
        return TallyWriter(self.requests)

    def finish(
        self,
        title: str,
        variant_order: list[str],
        *,
        reporter: Reporter | None = None,
        report: bool = True,
    ) -> Derivation:
        """Derive the folder once: summary.json, derived.jsonl and the CSVs from requests.jsonl, then
        (with `report`) the plots and report.md/html. A caller with more to add before the report
        (compare's compare.json) passes report=False and calls `write_report` itself."""
        # Here, not at the top: the derivation's stack (pandas, the report) stays off `run --help`'s path.
        from itlaudit.workflows.derive import derive_figures, write_report

        started = time.perf_counter()
        derivation = derive_figures(self.path, title, variant_order, reporter=reporter)
        # What the run spent after its last stream closed, kept where a reader of the folder (and
        # benchmarks/startup.py, which subtracts it from a run's wall time) can see it.
        timings = self.meta.finish_s = {"derive": round(time.perf_counter() - started, 3)}
        if report:
            drawn = time.perf_counter()
            write_report(derivation, reporter=reporter)
            timings["report"] = round(time.perf_counter() - drawn, 3)
        self.save()
        return derivation


# A landed record's token count, found in the line the lander hands over: the coordinator never decodes
# records mid-capture (that CPU belongs to the workers), and this search costs microseconds a record.
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')


class TallyWriter(RecordWriter):
    """requests.jsonl's writer that also adds each record's completion tokens to the progress
    display's counters (its tokens/s)."""

    counts: CaptureProgress | None = None

    def write(self, line: Any) -> None:
        super().write(line)
        if self.counts is None:
            return
        if isinstance(line, bytes):
            found = _COMPLETION_TOKENS.search(line)
            tokens = int(found.group(1)) if found else 0
        else:
            tokens = (line.get("completion_tokens") if isinstance(line, dict) else None) or 0
        self.counts.add_tokens(tokens)
