"""`itlaudit smoke`: a release go/no-go from a fixed suite of small scenarios.

Suite loading and validation (`suite`), pure check evaluation (`checks`), output writers (`output`,
`junit`) and the composition that starts servers and runs scenarios through `compare.run_compare`
(`runner`). Data flows one way: suite → runs (run folders) → figures → check results → files.
"""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "junit": ("write_junit_error",),
        "output": (
            "table_lines",
            "verdict_line",
        ),
        "runner": (
            "REPORT_FILE",
            "run_smoke",
        ),
        "suite": ("load_suite",),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
