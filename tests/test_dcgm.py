"""--dcgm-url: a real HTTP server serving dcgm-exporter text (tests/fixtures/gpu/dcgm-exporter-h200.prom,
the exporter's default counters for two H200s) read into gpu_telemetry.jsonl on the /metrics
sampler's period and clock, as NVML's rows, so the report's GPU figures read them unchanged; an
exporter that does not answer is one line and the window goes on; its URL's password stays out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from aiohttp import web
from simkit import app_on_thread, itlaudit, sim_server

from itlaudit.analysis.server_metrics import GPU_TELEMETRY_FILE, SERVER_METRICS_FILE, gpu_figures
from itlaudit.errors import ScenarioError
from itlaudit.serve.sim import SimConfig
from itlaudit.store.server_metrics import read_telemetry
from itlaudit.telemetry.dcgm import NotAFigure, dcgm_figures
from itlaudit.telemetry.window import Telemetry

EXPORTER_PAGE = (Path(__file__).parent / "fixtures" / "gpu" / "dcgm-exporter-h200.prom").read_text()


def _exporter() -> web.Application:
    """dcgm-exporter's /metrics: the fixture page, GPU 1's SM clock falling 15 MHz a scrape (a
    power-capped GPU heating up), so the series moves as a real one does."""
    scrapes = [0]

    async def metrics(request: web.Request) -> web.Response:
        scrapes[0] += 1
        clock = 1755 - 15 * scrapes[0]
        line = next(x for x in EXPORTER_PAGE.splitlines() if x.startswith('DCGM_FI_DEV_SM_CLOCK{gpu="1"'))
        page = EXPORTER_PAGE.replace(line, line.rsplit(" ", 1)[0] + f" {clock}")
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def test_exporter_page_maps_onto_nvml_figures() -> None:
    figures = dcgm_figures(EXPORTER_PAGE)
    assert set(figures) == {"0", "1"}
    assert figures["1"] == {
        "sm_clock_mhz": 1755.0,
        "mem_clock_mhz": 3201.0,
        "power_w": 612.517,
        "temperature_c": 71.0,
        "gpu_util_pct": 97.0,
        "mem_util_pct": 60.0,
        "memory_used_mib": 82110.0,
        "memory_total_mib": 82110.0 + 60859.0 + 582.0,  # used + free + reserved
    }


def test_throttle_mask_when_the_exporter_exports_it() -> None:
    page = EXPORTER_PAGE + (
        "# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge\n"
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="1",modelName="NVIDIA H200"} 4\n'
    )
    figures = dcgm_figures(page)
    assert figures["1"]["throttle"] == ["sw_power_cap"] and "throttle" not in figures["0"]


@pytest.mark.fault_row("R8")
@pytest.mark.parametrize(
    ("series", "value"),
    [("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "+Inf"), ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "-4"),
     ("DCGM_FI_DEV_POWER_USAGE", "NaN")],
)  # fmt: skip
def test_a_figure_no_gpu_can_have_makes_the_page_an_error_row(series: str, value: str) -> None:
    """issue 39 item 5: a +Inf throttle mask was an OverflowError traceback that aborted the run before
    any request; a NaN power was written as a figure. Now the page is refused (NotAFigure, which the
    sampler turns into an error row naming the series), and the clean page above reads. ~0 s."""
    page = EXPORTER_PAGE + f'# TYPE {series} gauge\n{series}{{gpu="1",modelName="NVIDIA H200"}} {value}\n'
    with pytest.raises(NotAFigure, match=f"GPU 1's {series} is"):
        dcgm_figures(page)


def test_window_reads_the_exporter_into_gpu_telemetry(tmp_path: Path) -> None:
    said: list[str] = []
    with app_on_thread(_exporter()) as exporter, sim_server(SimConfig()) as url:
        # A password in the exporter's URL must reach no file.
        dcgm_url = exporter.replace("http://", "http://scraper:s3cret-pw@") + "/metrics"
        telemetry = Telemetry.from_flags(0.05, dcgm_url=dcgm_url)
        window = telemetry.window("base", url, tmp_path, say=said.append)
        window.start()
        recorded = window.stop()
    assert said == []
    assert recorded["gpu_telemetry"]["rows"] >= 2 and recorded["gpu_telemetry"]["gave_up"] is None
    text = (tmp_path / GPU_TELEMETRY_FILE).read_text()
    assert "s3cret-pw" not in text and "s3cret-pw" not in json.dumps(recorded)
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["file"] == "gpu_telemetry"
    assert lines[1]["start"] is True and lines[1]["source"] == "dcgm"
    rows = read_telemetry(tmp_path)["gpu"]["base"]
    samples = [r for r in rows if "t_ns" in r]
    assert len(samples) >= 2 and all(r["source"] == "dcgm" and set(r["gpus"]) == {"0", "1"} for r in samples)
    clocks = [r["gpus"]["1"]["sm_clock_mhz"] for r in samples]
    assert clocks == sorted(clocks, reverse=True) and clocks[0] > clocks[-1]  # the series moved
    # On the /metrics sampler's clock: its rows and the exporter's interleave in one window.
    server = [r["t_ns"] for r in read_telemetry(tmp_path)["server"]["base"] if "t_ns" in r]
    assert (tmp_path / SERVER_METRICS_FILE).exists() and min(server) < samples[-1]["t_ns"]
    # The report's GPU figures read them as NVML's.
    figures = gpu_figures(rows)
    assert figures["gpu_power_max_w"] == 612.517 and figures["gpu_memory_used_max_mib"] == 82110.0
    assert figures["gpu_sm_clock_min_mhz"] == min(clocks) and figures["gpu_throttle"] == []


def test_unreachable_exporter_is_one_line_and_the_window_goes_on(tmp_path: Path) -> None:
    said: list[str] = []
    telemetry = Telemetry.from_flags(0.05, dcgm_url="http://scraper:s3cret-pw@127.0.0.1:9/metrics")
    with sim_server(SimConfig()) as url:
        window = telemetry.window("base", url, tmp_path, say=said.append)
        window.start()
        time.sleep(0.3)  # a measured window: the sampler tries again a few periods, then gives up
        recorded = window.stop()
    assert len(said) == 1 and said[0].startswith("base: no DCGM telemetry yet: DCGM exporter")
    assert "\n" not in said[0] and "s3cret-pw" not in said[0]
    assert recorded["gpu_telemetry"]["rows"] == 0 and recorded["gpu_telemetry"]["gave_up"]
    assert recorded["server_metrics"]["rows"] >= 2  # the rest of the window went on
    assert "s3cret-pw" not in (tmp_path / GPU_TELEMETRY_FILE).read_text()


def test_dcgm_url_is_checked() -> None:
    assert Telemetry.from_flags().dcgm_url is None
    with pytest.raises(ScenarioError, match=r"--dcgm-url ftp://x: give the exporter's http\(s\) URL"):
        Telemetry.from_flags(dcgm_url="ftp://x")


def test_itlaudit_run_with_dcgm_url_records_and_reports_the_gpus(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with app_on_thread(_exporter()) as exporter, sim_server(SimConfig(step_ms=3)) as url:
        dcgm_url = exporter.replace("http://", "http://scraper:s3cret-pw@") + "/metrics"
        flags = ["--num-prompts", "4", "--max-concurrency", "2", "--max-tokens", "40", "--out", str(out)]
        result = itlaudit("run", "--url", url, "--metrics-period", "0.05", "--dcgm-url", dcgm_url, *flags)
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    (entry,) = meta["variants"].values()
    assert entry["gpu_telemetry"]["rows"] >= 2 and "notes" not in entry
    rows = [r for r in read_telemetry(out)["gpu"][next(iter(meta["variants"]))] if "t_ns" in r]
    assert rows and all(r["source"] == "dcgm" for r in rows)
    report = (out / "report.md").read_text()  # the report's server figures read the exporter's rows
    assert "| GPU power max | 613 W |" in report and "| GPU temperature max | 71 °C |" in report
    for path in out.rglob("*"):
        if path.is_file():
            assert b"s3cret-pw" not in path.read_bytes(), path
