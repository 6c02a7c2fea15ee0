"""Run folders on disk: paths, the append-only JSONL writer and reader, the ledger, exports."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "export": (
            "CHUNK_FORMATS",
            "write_chunks",
            "write_table",
        ),
        "folder": ("RunFiles",),
        "jsonl": (
            "RecordWriter",
            "iter_jsonl",
            "load_records",
            "read_records",
        ),
        "ledger": ("run_fingerprints",),
        "lock": (
            "Holder",
            "hold_run_lock",
            "live_holder",
            "refuse_if_live",
        ),
        "result": (
            "VLLM_NAME",
            "save_result",
        ),
        "rundir": (
            "COMPARE_FILE",
            "CSV_FILE",
            "DEFAULT_REPORTS",
            "DERIVED_FILE",
            "META_FILE",
            "PARTIAL_DIR",
            "REPORT_FILE",
            "REQUESTS_FILE",
            "SUMMARY_FILE",
            "TOO_DEEP",
            "new_run_dir",
            "read_versioned",
            "remove_partial",
            "server_log_name",
            "write_jsonl",
            "write_meta",
            "write_versioned",
        ),
        "server_metrics": (
            "read_telemetry",
            "server_blocks",
        ),
    },
    modules=("ledger",),
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
