"""GPU telemetry from an NVIDIA dcgm-exporter (`--dcgm-url`): its Prometheus text scraped on the
/metrics sampler's period and clock (the same PeriodicSampler thread kind), each GPU's DCGM fields
mapped onto the figures NVML's rows carry, so gpu_telemetry.jsonl, the report's timeline and its
server figures read them unchanged. Rows say `source: "dcgm"`.

For a GPU that is not local to this host (a server in a cluster, a container itlaudit cannot see
into): the exporter runs beside it. The exporter is not the server, so none of the server's
credentials go to it; a URL's own user:password is masked in every file and line.
"""

from __future__ import annotations

import math
from pathlib import Path

from itlaudit.analysis.server_metrics import GPU_TELEMETRY_FILE
from itlaudit.errors import ItlauditError
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.redact import redact_url
from itlaudit.side.client import BlockingSideClient
from itlaudit.telemetry.defaults import DEFAULT_PERIOD_S
from itlaudit.telemetry.metrics_sampler import PeriodicSampler, SampleFailed, scraped
from itlaudit.telemetry.nvml import throttle_names

# dcgm-exporter's field (default-counters.csv) -> the NVML row's figure of the same meaning and unit.
DCGM_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",  # MHz
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",  # MHz
    "DCGM_FI_DEV_POWER_USAGE": "power_w",  # W
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",  # C
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util_pct",  # %
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_util_pct",  # %
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",  # MiB
}
# Frame buffer total = used + free (+ reserved, where the exporter reports it): NVML's memory total.
_FB_FREE, _FB_RESERVED = "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
# The clock-event (throttle) mask, when the exporter is configured to export it (not a default field).
_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")


class NotAFigure(ValueError):
    """A series whose value no GPU can have (NaN, ±Inf, a mask out of range): the page is not used."""


def _figure(name: str, gpu: str, value: float) -> float:
    if not math.isfinite(value):
        raise NotAFigure(f"GPU {gpu}'s {name} is {value}: not a finite figure")
    return float(value)


def dcgm_figures(text: str) -> dict[str, JSONObject]:
    """Each GPU's figures (keyed by the exporter's `gpu` label, as NVML rows key by index) from one
    page of dcgm-exporter text; ValueError when it is not Prometheus text. Series without a `gpu`
    label (an exporter's own) are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    gpus: dict[str, JSONObject] = {}
    free: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            gpu = sample.labels.get("gpu")
            if gpu is None:
                continue
            figures = gpus.setdefault(gpu, {})
            if sample.name in DCGM_FIELDS:
                figures[DCGM_FIELDS[sample.name]] = _figure(sample.name, gpu, sample.value)
            elif sample.name in (_FB_FREE, _FB_RESERVED):
                free[gpu] = free.get(gpu, 0.0) + _figure(sample.name, gpu, sample.value)
            elif sample.name in _REASONS:
                mask = _figure(sample.name, gpu, sample.value)
                if not 0 <= mask < 2**64 or mask != int(mask):
                    raise NotAFigure(f"GPU {gpu}'s {sample.name} is {mask}: not a 64-bit reason mask")
                figures["throttle"] = list[JSONValue](throttle_names(int(mask)))
    for gpu, figures in gpus.items():
        used = figures.get("memory_used_mib")
        if isinstance(used, float) and gpu in free:
            figures["memory_total_mib"] = used + free[gpu]
    return {gpu: figures for gpu, figures in gpus.items() if figures}


class DcgmSampler(PeriodicSampler):
    """A row a period: {"source": "dcgm", "gpus": {gpu: figures}}, in gpu_telemetry.jsonl."""

    kind = "gpu_telemetry"

    def __init__(self, url: str, run_dir: Path, variant: str, *, period_s: float = DEFAULT_PERIOD_S):
        super().__init__(run_dir / GPU_TELEMETRY_FILE, variant, period_s=period_s)
        self.url = url
        self._client = BlockingSideClient(timeout_s=max(period_s, 1.0))

    def describe(self) -> JSONObject:
        return {"source": "dcgm", "url": redact_url(self.url)}

    def sample(self, t_ns: int) -> JSONObject:
        try:
            gpus = dcgm_figures(scraped(self._client, self.url))
        except ItlauditError as exc:  # no answer or a refusal
            raise SampleFailed(f"DCGM exporter: {exc}") from None
        except NotAFigure as exc:  # an error row, as for a page that is not Prometheus text
            raise SampleFailed(f"DCGM exporter {redact_url(self.url)}: {exc}") from None
        except ValueError as exc:
            raise SampleFailed(f"DCGM exporter {redact_url(self.url)}: not Prometheus text ({exc})") from None
        if not gpus:
            raise SampleFailed(f"DCGM exporter {redact_url(self.url)}: no series with a `gpu` label")
        return {"source": "dcgm", "gpus": dict[str, JSONValue](gpus)}
