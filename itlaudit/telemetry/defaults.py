"""The capture's defaults that commands show among their options, in a module that imports nothing: a
command's `--help` draws them without loading the capture stage (numpy, msgspec and the samplers
behind it: 0.4-0.6 s of `run --help` on the GPU host)."""

from __future__ import annotations

DEFAULT_PERIOD_S = 1.0  # seconds between scrapes of /metrics (and NVML, dcgm-exporter) while measuring
