"""report.md: the run's figures as a table a person reads in one glance, plus the findings."""

from __future__ import annotations

from typing import Any

EXPLANATION = (
    "**Why two ITL columns.** Under speculative decoding or MTP the server emits several tokens per "
    "engine step and sends them in one SSE chunk. Tools that time chunks (vllm bench serve's ITL list, "
    "llmperf, AIPerf by default) divide by chunks, not tokens, so their ITL is inflated by about the "
    "tokens per chunk. *Token ITL* here is (t_last − t_first) / (C_last − C_first) with C the server's "
    "own `usage.completion_tokens`; *chunk ITL* is the mean gap between content chunks, the figure a "
    "chunk-counting tool reports. Their ratio is the inflation. A run whose output was cut short "
    "(e.g. at 128 tokens) also distorts per-request averages: see the truncation findings below."
)

_ROWS = (
    ("token ITL (ms)", "itl_ms", "{:.3f}"),
    ("chunk ITL (ms)", "chunk_itl_ms", "{:.3f}"),
    ("chunk/token ITL", "itl_inflation", "{:.2f}×"),
    ("tokens per chunk", "tokens_per_chunk", "{:.2f}"),
    ("decode tokens per chunk", "decode_tokens_per_chunk", "{:.2f}"),
    ("TTFT (ms)", "ttft_ms", "{:.1f}"),
    ("TPOT (ms)", "tpot_ms", "{:.3f}"),
    ("E2E (ms)", "e2e_ms", "{:.1f}"),
    ("decode tokens/s", "decode_tokens_per_s", "{:.1f}"),
    ("completion tokens", "completion_tokens", "{:.0f}"),
)


def _cell(stats: dict[str, Any] | None, fmt: str) -> str:
    if not stats or stats.get("p50") is None:
        return "–"
    return f"{fmt.format(stats['p50'])} / {fmt.format(stats['p90'])} / {fmt.format(stats['p99'])}"


def _escape(text: str) -> str:
    """Server strings go into Markdown tables: keep pipes and newlines from breaking the layout."""
    return text.replace("|", "\\|").replace("\n", " ")


def render_report(title: str, summary: dict[str, Any], findings: list[dict[str, Any]]) -> str:
    variants: dict[str, Any] = summary["variants"]
    names = list(variants)
    lines = [f"# itlaudit: {_escape(title)}", ""]
    chunk_fallback = [n for n in names if "chunks" in variants[n].get("token_source", {})]
    if chunk_fallback:
        lines += [
            f"> **WARNING: usage missing for {', '.join(chunk_fallback)}.** The server sent no "
            "`usage.completion_tokens`, so tokens were counted by chunk. Under speculative decoding "
            "these ITL figures are chunk ITL, not token ITL. Start vLLM with continuous usage stats "
            "available (any vLLM ≥ 0.6) and check the request's stream_options.",
            "",
        ]
    lines += ["Figures are p50 / p90 / p99 over requests.", ""]
    lines.append("| metric | " + " | ".join(_escape(n) for n in names) + " |")
    lines.append("|---|" + "---|" * len(names))
    lines.append(
        "| requests (errors) | "
        + " | ".join(f"{variants[n]['requests']} ({variants[n]['errors']})" for n in names)
        + " |"
    )
    for label, key, fmt in _ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(variants[n].get(key), fmt) for n in names) + " |")
    lines += ["", EXPLANATION, "", "## Findings", ""]
    lines += _findings_section(findings) or [
        "No findings: every request ran to its expected length with server token counts."
    ]
    return "\n".join(lines) + "\n"


def _findings_section(findings: list[dict[str, Any]], examples: int = 3) -> list[str]:
    """Grouped by code, a few examples each: 1000 truncated requests should read as one line."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for finding in findings:
        groups.setdefault(finding["code"], []).append(finding)
    lines: list[str] = []
    for code, members in groups.items():
        lines.append(f"- **{code}** ({members[0]['severity']}) × {len(members)}")
        for finding in members[:examples]:
            who = finding.get("request_id") or "run-level"
            lines.append(f"  - {_escape(who)}: {_escape(finding['message'])}")
        if len(members) > examples:
            lines.append(f"  - … and {len(members) - examples} more (see requests.jsonl)")
    return lines
