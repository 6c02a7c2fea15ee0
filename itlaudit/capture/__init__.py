"""Capture: the I/O side of a run — connect, stream, stamp every read at the socket, keep the raw bytes."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "cluster": (
            "connect",
            "import_ray",
            "lost_worker_warnings",
        ),
        "described": ("CaptureDescription",),
        "environment": ("capture_environment",),
        "planning": (
            "OnPrepare",
            "reset_prefix_cache",
            "resolve_model",
            "sent_prompt",
        ),
        "request_plan": ("Prompt",),
        "runner": (
            "CaptureOptions",
            "CapturePlan",
            "CaptureResult",
            "OnCapture",
            "OnDone",
            "capture",
            "plan_capture",
            "variant_access",
        ),
        "scoring": (
            "DEFAULT_REPEATS",
            "DEFAULT_TOP_K",
            "Scorer",
            "explain_mismatch",
            "observe",
            "score_outputs",
            "scorer_for",
        ),
        "server_info": (
            "VERSION_TIMEOUT_S",
            "ServerIdentity",
            "environment_record",
            "scrape_counters",
            "server_identity",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
