"""GPU telemetry through a fake NVML module (this machine has no GPU) and the real one's one line, and
the telemetry window around a simulator: /metrics, NVML and --profile's answer from a server without a
profiler."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reportkit import block
from simkit import sim_server

from itlaudit.analysis.server_metrics import GPU_TELEMETRY_FILE, gpu_energy, gpu_figures
from itlaudit.analysis.summary import RunSummary
from itlaudit.errors import ScenarioError
from itlaudit.report.markdown import server_rows
from itlaudit.serve.sim import SimConfig
from itlaudit.store.server_metrics import read_server_metrics
from itlaudit.telemetry.metrics_sampler import SampleFailed
from itlaudit.telemetry.nvml import NvmlSampler, open_gpus, throttle_names
from itlaudit.telemetry.window import Telemetry


class _NVMLError(Exception):
    pass


def _fake_nvml(gpus: int = 2, broken: bool = False) -> types.ModuleType:
    """pynvml's calls as NVML answers them on an H200 that is power-capped; `broken`: no driver."""
    state: dict[str, Any] = {"clock": 1980, "inits": 0}
    nvml = types.ModuleType("pynvml")

    def init() -> None:
        if broken:
            raise _NVMLError("Driver Not Loaded")
        state["inits"] += 1

    def clock(handle: int, kind: int) -> int:
        state["clock"] -= 15  # the SM clock falls as it heats: the series must move
        return state["clock"] if kind == 1 else 3201

    namespace = {
        "NVMLError": _NVMLError,
        "NVML_CLOCK_SM": 1,
        "NVML_CLOCK_MEM": 2,
        "NVML_TEMPERATURE_GPU": 0,
        "nvmlInit": init,
        "nvmlShutdown": lambda: state.__setitem__("inits", state["inits"] - 1),
        "nvmlDeviceGetCount": lambda: gpus,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetClockInfo": clock,
        "nvmlDeviceGetPowerUsage": lambda h: 612_500,
        "nvmlDeviceGetTemperature": lambda h, kind: 71,
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=80 * 2**30, total=141 * 2**30),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=97, memory=60),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4,  # sw_power_cap
        "state": state,
    }
    for name, value in namespace.items():
        setattr(nvml, name, value)
    return nvml


@pytest.fixture()
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    nvml = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    yield nvml


def test_throttle_reasons_are_named() -> None:
    assert throttle_names(0) == []
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert throttle_names(0x8000) == ["0x8000"]


def test_nvml_rows_on_the_capture_clock(fake_nvml: types.ModuleType, tmp_path: Path) -> None:
    indices, problem = open_gpus([1])
    assert (indices, problem) == ([1], None)
    sampler = NvmlSampler(tmp_path / GPU_TELEMETRY_FILE, "k3", indices, period_s=0.01)
    sampler.start()
    info = sampler.stop()
    assert info["rows"] >= 2 and fake_nvml.state["inits"] == 0  # shut down again
    rows = read_server_metrics(tmp_path, GPU_TELEMETRY_FILE)["k3"]
    gpu = rows[0]["gpus"]["1"]
    assert gpu["power_w"] == 612.5 and gpu["temperature_c"] == 71 and gpu["throttle"] == ["sw_power_cap"]
    assert gpu["memory_used_mib"] == 80 * 1024 and gpu["gpu_util_pct"] == 97
    assert rows[-1]["gpus"]["1"]["sm_clock_mhz"] < gpu["sm_clock_mhz"]
    assert [r["t_ns"] for r in rows] == sorted(r["t_ns"] for r in rows)


def test_a_gb10_like_nvml_loses_the_memory_figures_not_the_sample(tmp_path: Path) -> None:
    """DGX Spark's GB10 through NVML: its framebuffer queries answer NOT_SUPPORTED (unified memory;
    pynvml's own NVMLError_NotSupported here), while clocks, power, utilisation and the energy counter
    answer. Each row keeps those, names what the GPU does not report, and the refused query is asked
    once; a transient error drops one figure from one row; the window's energy is the counter's
    difference. ~0.1 s."""
    import pynvml

    nvml = _fake_nvml(gpus=1)
    calls = {"memory": 0, "power": 0, "energy_mj": 100_000}

    def memory(handle: int) -> None:
        calls["memory"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # pynvml makes it NVMLError_NotSupported

    def power(handle: int) -> int:
        calls["power"] += 1
        if calls["power"] == 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return 41_000

    def energy(handle: int) -> int:
        calls["energy_mj"] += 250
        return calls["energy_mj"]

    for name, value in {
        "NVMLError": pynvml.NVMLError,
        "NVMLError_NotSupported": pynvml.NVMLError_NotSupported,
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTotalEnergyConsumption": energy,
    }.items():
        setattr(nvml, name, value)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "pynvml", nvml)
        sampler = NvmlSampler(tmp_path / GPU_TELEMETRY_FILE, "k0", [0], period_s=0.01)
        rows = [sampler.sample(t) for t in range(4)]
    first, lost = rows[0]["gpus"]["0"], rows[1]["gpus"]["0"]
    assert first["not_supported"] == ["memory"] and "memory_used_mib" not in first
    assert first["power_w"] == 41.0 and first["gpu_util_pct"] == 97 and first["sm_clock_mhz"] > 0
    assert "power_w" not in lost and lost["energy_j"] > first["energy_j"]  # one figure, one row
    assert calls["memory"] == 1  # NOT_SUPPORTED is not asked again
    figures = gpu_figures([{"t_ns": t, **row} for t, row in enumerate(rows)], output_tokens=3)
    assert figures["gpu_not_supported"] == ["memory"] and figures["gpu_energy_j"] == pytest.approx(0.75)
    assert figures["gpu_energy_source"] == "nvml_energy_counter" and figures["gpu_energy_coverage"] == 1.0
    assert figures["gpu_memory_used_max_mib"] is None and figures["gpu_power_max_w"] == 41.0
    # The report's server table: the figures the GPU does not report, and energy per output token.
    summary = RunSummary(variants={"k0": block()}, run_findings=[], server={"k0": figures})
    table = {row[0]: row[1] for row in server_rows(summary)}
    assert table["GPU figures not reported (NOT_SUPPORTED)"] == "memory"
    assert (
        table["GPU energy per output token"] == "0.2500 J"
        and table["output tokens per joule"] == "4.00 tok/J"
    )
    assert table["GPU energy over the window"] == "0.8 J" and "GPU SM clock p50" in table
    assert table["GPU energy read from"] == "NVML energy counter"


def test_energy_over_the_measured_window_from_the_counter_or_the_power_samples() -> None:
    """The window's joules read off the counter at its edges (interpolated between readings); a GPU
    without a counter integrates its power samples (trapezoids), said so; readings that start inside
    the window stand in for the rest at their mean power (coverage). Two GPUs sum. ~0 s."""
    seconds = [0, 1, 2, 3, 4]
    rows = [
        {"t_ns": int(t * 1e9), "gpus": {"0": {"energy_j": 1000.0 + 100 * t}, "1": {"power_w": 50.0}}}
        for t in seconds
    ]
    figures = gpu_energy(rows, window=(int(1.5e9), int(3.5e9)), output_tokens=40)
    assert figures["gpu_energy_per_gpu_j"] == pytest.approx({"0": 200.0, "1": 100.0})
    assert figures["gpu_energy_j"] == pytest.approx(300.0) and figures["gpu_energy_source"] == "mixed"
    assert figures["gpu_joules_per_output_token"] == pytest.approx(7.5)
    assert figures["output_tokens_per_joule"] == pytest.approx(40 / 300)
    # readings from 2 s on, window from 0 s: half read, the other half at the read half's mean power
    late = gpu_energy(rows[2:], window=(0, int(4e9)))
    assert late["gpu_energy_coverage"] == pytest.approx(0.5)
    assert late["gpu_energy_per_gpu_j"]["0"] == pytest.approx(400.0)
    assert late["gpu_energy_source"] == "mixed"
    # one reading per GPU knows no energy: nothing is claimed
    assert gpu_energy(rows[:1]) == {}


def test_an_nvml_that_answers_nothing_fails_the_sample_in_one_line(tmp_path: Path) -> None:
    """Every query refused or failing: the row is an error naming them, never an empty row."""
    import pynvml

    nvml = _fake_nvml(gpus=1)

    def lost(*args: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    for name in (
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetCurrentClocksEventReasons",
    ):
        setattr(nvml, name, lost)
    nvml.NVMLError = pynvml.NVMLError
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "pynvml", nvml)
        sampler = NvmlSampler(tmp_path / GPU_TELEMETRY_FILE, "k0", [0], period_s=0.01)
        with pytest.raises(SampleFailed, match=r"^NVML: GPU 0 sm_clock_mhz: GPU is lost"):
            sampler.sample(0)


def test_no_gpu_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(broken=True))
    assert open_gpus(None) == ([], "no GPU telemetry: NVML cannot start here (Driver Not Loaded)")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(gpus=1))
    indices, problem = open_gpus([3])
    assert indices == [] and problem == "no GPU telemetry: GPU 3 not on this host (1 GPUs)"


def test_real_nvml_without_a_gpu_is_one_line() -> None:
    """The real nvidia-ml-py on this CPU machine: no driver, so one line and no sampler."""
    indices, problem = open_gpus(None)
    if indices:
        pytest.skip("this host has a GPU")
    assert problem is not None and problem.startswith("no GPU telemetry: ") and "\n" not in problem


def test_window_samples_metrics_and_gpu_and_says_the_profiler_is_missing(
    fake_nvml: types.ModuleType, tmp_path: Path
) -> None:
    said: list[str] = []
    telemetry = Telemetry.from_flags(0.05, gpu="0", profile=True)
    with sim_server(SimConfig()) as url:
        window = telemetry.window("base", url, tmp_path, say=said.append)
        window.start()
        recorded = window.stop()
    assert recorded["server_metrics"]["rows"] >= 2 and recorded["gpu_telemetry"]["rows"] >= 2
    assert recorded["profile"]["profiled"] is False
    assert said == [f"base: {recorded['profile']['problem']}"] and "/start_profile" in said[0]
    header = json.loads((tmp_path / GPU_TELEMETRY_FILE).read_text().splitlines()[0])
    assert header["file"] == "gpu_telemetry" and header["format"] >= 2


def test_telemetry_flags_are_checked() -> None:
    assert Telemetry.from_flags(no_server_metrics=True).metrics_period_s is None
    with pytest.raises(ScenarioError, match="--metrics-period 0: give seconds"):
        Telemetry.from_flags(0)
    with pytest.raises(ScenarioError, match="--gpu 'a': give GPU indices"):
        Telemetry.from_flags(gpu="a")


NVML_H200 = Path(__file__).parent / "fixtures" / "gpu" / "nvml-h200"


def test_real_nvml_on_the_h200_reads_idle_then_a_power_capped_load(tmp_path: Path) -> None:
    """tests/fixtures/gpu/nvml-h200: a run's window read through the real NVML while a matmul loop loaded
    the GPU part-way through. The rows sit on the capture's clock beside the /metrics rows, the figures
    span idle and load, every throttle reason NVML gave is named, and the timeline draws the GPU clock."""
    from itlaudit.analysis.server_metrics import gpu_figures
    from itlaudit.report.plots import VariantView, _server_panels, plot_server_timeline
    from itlaudit.store.server_metrics import read_telemetry

    telemetry = read_telemetry(NVML_H200)
    gpu, server = telemetry["gpu"]["truth"], telemetry["server"]["truth"]
    samples = [r for r in gpu if "t_ns" in r]
    assert len(samples) >= 40 and all(set(r["gpus"]) == {"0"} for r in samples)
    stamps = [r["t_ns"] for r in samples]
    assert stamps == sorted(stamps)
    server_stamps = [r["t_ns"] for r in server if "t_ns" in r]
    assert min(server_stamps) - 2e9 < stamps[0] < max(server_stamps)  # one clock, one window
    figures = gpu_figures(gpu)
    assert figures["gpu_sm_clock_min_mhz"] == 345 and figures["gpu_sm_clock_p50_mhz"] >= 1740
    assert 590 <= figures["gpu_power_max_w"] <= 700 and figures["gpu_util_p50_pct"] < 99
    assert figures["gpu_throttle"] == ["gpu_idle", "sw_power_cap"]
    loaded = [r["gpus"]["0"] for r in samples if r["gpus"]["0"]["gpu_util_pct"] >= 95]
    assert loaded and all("sw_power_cap" in g["throttle"] for g in loaded)
    view = VariantView("truth", [], block(), telemetry={"server": server, "gpu": gpu})
    assert _server_panels(view)[-1] == "gpu"
    png = plot_server_timeline([view], tmp_path / "server_timeline.png")
    assert png is not None and png.stat().st_size > 10_000
