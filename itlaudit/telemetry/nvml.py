"""GPU telemetry beside a variant's measured window, through NVML (nvidia-ml-py's `pynvml`): SM and
memory clocks, power, temperature, memory used, utilisation and the clock-event (throttle) reasons of
each watched GPU, a row a period in gpu_telemetry.jsonl on the capture's clock.

Only where the GPU can be read: the server itlaudit launched on this host (its CUDA_VISIBLE_DEVICES,
else every GPU here), or GPUs the user names (--gpu). Without NVML, a driver or a GPU, `open_gpus`
says why in one line and nothing else happens.

Each query is read on its own: a GPU that does not report one (NVML's NOT_SUPPORTED: DGX Spark's GB10
has no framebuffer queries, its memory being unified) loses that figure, not the sample, and the
figure is named in the row's `not_supported` and never asked again; another NVML error drops the
figure from that one row. A row fails only when no figure of any GPU could be read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.telemetry.defaults import DEFAULT_PERIOD_S
from itlaudit.telemetry.metrics_sampler import PeriodicSampler, SampleFailed, SamplerRecord

# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*), named as a reader wants them.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int) -> list[str]:
    """The reasons set in an NVML clock-event mask; an unknown bit is named by its value."""
    named = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return named + ([f"0x{unknown:x}"] if unknown else [])


def _import_nvml() -> ModuleType:
    import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py, untyped: only when GPUs are watched

    module: ModuleType = pynvml
    return module


def open_gpus(indices: Sequence[int] | None) -> tuple[list[int], str | None]:
    """The GPU indices NVML can read (`indices`, or all of them when None), or ([], the one line
    saying why there are none)."""
    try:
        nvml = _import_nvml()
    except ImportError:
        return [], "no GPU telemetry: nvidia-ml-py (pynvml) is not installed"
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        return [], f"no GPU telemetry: NVML cannot start here ({exc})"
    wanted = list(range(count)) if indices is None else list(indices)
    missing = [i for i in wanted if not 0 <= i < count]
    if missing:
        nvml.nvmlShutdown()
        return [], f"no GPU telemetry: GPU {', '.join(map(str, missing))} not on this host ({count} GPUs)"
    if not wanted:
        nvml.nvmlShutdown()
        return [], "no GPU telemetry: NVML sees no GPU on this host"
    return wanted, None


class NvmlSampler(PeriodicSampler):
    """A row a period: {"gpus": {index: figures}}; NVML was initialised by open_gpus and is shut down
    at stop."""

    kind = "gpu_telemetry"

    def __init__(
        self, path: Path, variant: str, indices: Sequence[int], *, period_s: float = DEFAULT_PERIOD_S
    ):
        super().__init__(path, variant, period_s=period_s)
        self.nvml = _import_nvml()
        self.indices = list(indices)
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        # nvidia-ml-py 12.535 renamed throttle reasons to clock-event reasons; older ones have the first.
        renamed = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self.reasons = renamed or self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self.queries = self._queries()
        # Per GPU, the queries NVML answered NOT_SUPPORTED: skipped from then on (the GPU will not
        # start reporting them mid-run).
        self.not_supported: dict[str, list[str]] = {}

    def describe(self) -> JSONObject:
        names = [self.nvml.nvmlDeviceGetName(h) for h in self.handles]
        return {
            "gpus": {
                str(i): n if isinstance(n, str) else n.decode()
                for i, n in zip(self.indices, names, strict=True)
            }
        }

    def _queries(self) -> dict[str, Callable[[Any], JSONObject]]:
        """Each NVML query by the figures it gives, one call each."""
        nvml = self.nvml

        def memory(handle: Any) -> JSONObject:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return {"memory_used_mib": info.used / 2**20, "memory_total_mib": info.total / 2**20}

        def utilisation(handle: Any) -> JSONObject:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            return {"gpu_util_pct": rates.gpu, "mem_util_pct": rates.memory}

        queries: dict[str, Callable[[Any], JSONObject]] = {
            "sm_clock_mhz": lambda h: {"sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)},
            "mem_clock_mhz": lambda h: {"mem_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)},
            "power_w": lambda h: {"power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0},
            # mJ since the driver loaded (Volta and later): a window's energy is the difference
            "temperature_c": lambda h: {
                "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
            },
            "memory": memory,
            "utilisation": utilisation,
            "throttle": lambda h: {"throttle": list[JSONValue](throttle_names(int(self.reasons(h))))},
        }
        energy = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # nvidia-ml-py 11+
        if energy is not None:
            # mJ since the driver loaded (Volta and later): a window's energy is the difference
            queries["energy_j"] = lambda h: {"energy_j": energy(h) / 1000.0}
        return queries

    def sample(self, t_ns: int) -> JSONObject:
        nvml = self.nvml
        not_supported = getattr(nvml, "NVMLError_NotSupported", ())
        gpus: JSONObject = {}
        errors: list[str] = []
        for index, handle in zip(self.indices, self.handles, strict=True):
            figures: JSONObject = {}
            refused = self.not_supported.setdefault(str(index), [])
            for name, query in self.queries.items():
                if name in refused:
                    continue
                try:
                    figures.update(query(handle))
                except not_supported:
                    refused.append(name)
                except nvml.NVMLError as exc:
                    errors.append(f"GPU {index} {name}: {exc}")
            if refused:
                figures["not_supported"] = list[JSONValue](refused)
            if len(figures) > bool(refused):
                gpus[str(index)] = figures
        if not gpus:
            raise SampleFailed(f"NVML: {'; '.join(errors) or 'no figure is supported on the watched GPUs'}")
        return {"gpus": gpus}

    def stop(self) -> SamplerRecord:
        try:
            return super().stop()
        finally:
            self.nvml.nvmlShutdown()
