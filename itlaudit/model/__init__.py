"""What things are: the scenario, raw records, workloads, finding codes and the redaction policy.

The lowest stage above `errors`: every other stage may import it; it imports nothing of itlaudit else.
"""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "access": (
            "NO_ACCESS",
            "TLS_ADVICE",
            "Access",
            "api_key_header",
            "header_problem",
            "tls_problem",
            "url_credentials_problem",
        ),
        "codes": (
            "ACCEPTANCE_LENGTH_MISMATCH",
            "CHOICES_INTERLEAVED",
            "CHUNKS_COALESCED",
            "CLIENT_SATURATED",
            "COMMON_CAP",
            "CONNECTION_ERROR",
            "CUT_BY_DURATION",
            "GIBBERISH_SUSPECTED",
            "HTTP_ERROR",
            "IGNORE_EOS_VIOLATED",
            "INVALID_UTF8",
            "MIN_TOKENS_VIOLATED",
            "NO_DONE_SENTINEL",
            "RATE_LIMITED",
            "SPEC_DECODE_DISTRIBUTION_SHIFT",
            "SPEC_DECODE_OUTPUT_MISMATCH",
            "STOP_REASON_UNEXPECTED",
            "STOP_TOKEN_IDS_IGNORED",
            "STREAM_ERROR",
            "STREAM_STALLED",
            "TRUNCATED_BELOW_MAX_TOKENS",
            "TRUNCATION_CODES",
            "USAGE_MISSING",
            "USAGE_NON_MONOTONIC",
            "Finding",
            "Scope",
            "Severity",
            "codes_in",
        ),
        "datasets": (
            "DATASET_KINDS",
            "MAX_ROUND_TRIPS",
            "chat_prompt_note",
            "refit_ids",
            "refit_rng",
            "usable_text",
        ),
        "formats": (
            "FORMAT",
            "FORMAT_KEY",
            "RECORDS_FORMAT",
            "RECORDS_FORMAT_KEY",
            "check_format",
            "stamped",
        ),
        "launch": (
            "READY_TIMEOUT_S",
            "LaunchKind",
            "LaunchSpec",
            "launch_kind_problem",
        ),
        "records": (
            "DURATION_CUT",
            "ChunkSeries",
            "RequestParams",
            "RequestRecord",
            "Status",
            "Timeouts",
        ),
        "redact": (
            "known_secrets",
            "launch_secret_values",
            "redact_args",
            "redact_bytes",
            "redact_env",
            "redact_file",
            "redact_json",
            "redact_terminal",
            "redact_text",
            "redact_url",
            "remember_secrets",
        ),
        "registry": ("Registry",),
        "run_context": (
            "SIMULATOR",
            "is_simulator",
            "server_build",
            "simulator_version",
            "variant_view",
            "workload_meta",
        ),
        "run_labels": (
            "RunLabels",
            "parse_metadata",
        ),
        "scenario": (
            "COMPILED",
            "EAGER",
            "GOODPUT_KEYS",
            "Scenario",
            "ScenarioFlags",
            "Variant",
            "build_scenario",
            "load_scenario",
            "parse_scenario",
            "scenario_toml",
        ),
        "scenario_toml": ("Located",),
        "schedule": (
            "DURATION_GRACE_S",
            "Arrivals",
            "send_offsets_s",
        ),
        "sendlog": (
            "ResponseSends",
            "SendLog",
        ),
        "vocabulary": (
            "Endpoint",
            "LoadAxis",
            "Shift",
            "StampMode",
            "Verdict",
        ),
        "workload": ("BOUNDS",),
    },
    modules=("vocabulary",),
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
