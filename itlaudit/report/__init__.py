"""Readable outputs: report.md, report.html and the PNG figures, from analysis results."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "context": (
            "host_facts",
            "server_fact",
        ),
        "diff": (
            "render_diff",
            "why_it_moved",
        ),
        "markdown": (
            "PARTIAL_HEADING",
            "table_cell",
        ),
        "progress": (
            "CaptureProgress",
            "Reporter",
            "duration",
        ),
        "sweep_report": ("write_sweep_report",),
        "terminal": ("result_block",),
        "writer": (
            "REPORT_HTML",
            "REPORT_MD",
            "draws_plots",
            "plots_skipped",
            "write_reports",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
