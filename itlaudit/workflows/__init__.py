"""What the commands compose: run, compare, sweep, selfcheck."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "audit": (
            "DEFAULT_PROMPTS",
            "INVARIANCE_FILE",
            "InvarianceSettings",
            "invariance_audit",
            "invariance_targets",
        ),
        "compare": ("run_compare",),
        "derive": ("write_derived",),
        "run": (
            "DEFAULT_REPORTS",
            "LedgerPolicy",
            "RunOutcome",
            "handle_signals",
            "interruption",
            "run_scenario",
            "server_log_name",
            "variant_target",
        ),
        "selfcheck": (
            "capture_options",
            "run_trial",
            "search_streams",
            "truth_server",
            "verdict",
        ),
        "sweep": (
            "SweepConfig",
            "run_sweep",
            "selected_variants",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
