"""`itlaudit track`: a history of builds (points keyed by a full fingerprint, raw samples kept), the
series over it and their change points, validity first. Storage in db.py, run folders in record.py;
the pure series and change-point rules are analysis/changes.py."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "db": ("open_history",),
        "nightly": (
            "EXIT_CANNOT_TELL",
            "EXIT_REGRESSION",
            "bisect_change",
            "bisect_unexplained",
            "nightly",
            "nightly_builds",
        ),
        "publish": ("publish",),
        "record": (
            "BuildInfo",
            "record",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
