"""What the commands compose: a variant's pass into a run folder; run, compare, sweep, selfcheck."""

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
            "VariantInvariance",
            "invariance_audit",
            "invariance_targets",
        ),
        "compare": ("run_compare",),
        "ledger": ("LedgerPolicy",),
        "report": (
            "Run",
            "combine_runs",
            "load_run",
            "report_runs",
            "still_written",
        ),
        "run": (
            "RunOutcome",
            "run_scenario",
        ),
        "run_folder": ("RunFolder",),
        "selfcheck": (
            "run_trial",
            "search_streams",
            "truth_server",
            "verdict",
        ),
        "server": ("VariantServer",),
        "signals": ("mark_interrupted",),
        "sweep": (
            "SweepConfig",
            "run_sweep",
            "selected_variants",
            "serve_grid",
            "workload_digest",
        ),
        "trials": (
            "TRIALS_FILE",
            "run_trials",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
