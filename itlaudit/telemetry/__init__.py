"""Telemetry: what is watched beside a variant's measured window (the server's /metrics, the GPU through
NVML or dcgm-exporter, the server's profiler); the capture starts and stops it, never the reverse."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "defaults": ("DEFAULT_PERIOD_S",),
        "window": (
            "Telemetry",
            "TelemetryRecord",
            "TelemetryWindow",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
