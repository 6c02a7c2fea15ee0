"""Pure figures and rules: metrics, derived records, findings, comparisons, statistics."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "comparison": (
            "CompareResult",
            "VariantComparison",
            "build_comparison",
        ),
        "convergence": (
            "DEFAULT_CI_WIDTH_PCT",
            "DEFAULT_MAX_TRIALS",
            "DEFAULT_MIN_TRIALS",
            "ConvergenceRule",
            "Interval",
            "Progress",
            "mean_interval",
            "trials_settings",
        ),
        "derive": (
            "derive_request",
            "derive_requests",
            "request_line",
            "run_summary",
            "summarize_run",
        ),
        "distribution": (
            "ScoredOutput",
            "distribution_shift",
            "sampled",
            "speculates",
        ),
        "fidelity": (
            "LAG_BUDGET_MS",
            "ChunkJoin",
            "Fidelity",
            "SendLag",
            "grade",
            "join_chunks",
            "send_lag",
        ),
        "findings": (
            "CODES",
            "Finding",
            "truncated_requests",
        ),
        "importers": (
            "ImportedBenchmark",
            "parse_import",
        ),
        "invariance": (
            "DEFAULT_SWEEP_SIZES",
            "PromptObservations",
            "TopLogprobs",
            "figures_json",
            "parse_top_logprobs",
            "prompt_figures",
            "summarize",
        ),
        "lossless": (
            "output_token_ids",
            "prompt_index",
            "with_divergence_logprobs",
            "with_execution_modes",
        ),
        "metrics": (
            "SUMMARY_METRICS",
            "content_chunk_mask",
            "p50",
            "per_chunk_itl_ms",
            "ratio",
            "request_metrics",
            "speedup",
            "token_counts",
        ),
        "quality": (
            "DEFAULT_THRESHOLDS",
            "GibberishThresholds",
            "gibberish_reasons",
            "text_quality",
        ),
        "request_acceptance": (
            "pooled_server_acceptance",
            "server_acceptance",
        ),
        "run_diff": (
            "MetricDiff",
            "RunDiff",
            "diff_runs",
            "workload_differences",
            "workload_of",
        ),
        "server_metrics": (
            "GPU_TELEMETRY_FILE",
            "KV_USAGE",
            "RUNNING",
            "SERVER_METRICS_FILE",
            "SIGNALS",
            "SIGNAL_CHANGE",
            "WAITING",
            "Scrape",
            "SignalChange",
            "delta_row",
            "parse_scrape",
            "per_position_series",
            "signal_changes",
            "variant_server_figures",
        ),
        "specdecode": (
            "CounterSnapshot",
            "SpecDecodeStats",
            "parse_counters",
            "spec_decode_delta",
        ),
        "stats": (
            "SAME_BAND",
            "Comparison",
            "compare_samples",
        ),
        "summary": (
            "Figures",
            "PartialBy",
            "RecordsSeen",
            "RunSummary",
            "VariantSummary",
        ),
        "sweep": (
            "SweepResult",
            "parse_goodput",
            "parse_points",
            "parse_sla",
            "pool_trials",
            "request_figures",
            "sla_search",
            "sweep_result",
            "trial_figures",
        ),
        "validity": (
            "COMPARABLE",
            "NOT_COMPARABLE",
            "Validity",
            "block_validity",
            "comparison_validity",
            "variant_validity",
        ),
        "workloads": ("prefix_cache_delta",),
    },
    modules=(
        "findings",
        "stats",
    ),
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
