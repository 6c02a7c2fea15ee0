"""report.md: the run's figures as a table a person reads in one glance, plus the findings."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from itlaudit.analysis.importers import ImportedBenchmark
from itlaudit.analysis.metrics import p50, ratio
from itlaudit.analysis.server_metrics import ENERGY_COUNTER, ENERGY_POWER, SIGNALS
from itlaudit.analysis.stats import SAME_BAND
from itlaudit.analysis.summary import Figures, RunSummary, VariantSummary
from itlaudit.analysis.validity import Validity, comparison_validity, quality_note, variant_validity
from itlaudit.model.codes import CLIENT_SATURATED, LAUNCH_BOUND, TRUNCATION_CODES, Finding

EXPLANATION = (
    "**Why two ITL columns.** Under speculative decoding or MTP the server emits several tokens per "
    "engine step and sends them in one SSE chunk. Tools that time chunks (vllm bench serve's ITL list, "
    "llmperf, AIPerf by default) divide by chunks, not tokens, so their ITL is inflated by about the "
    "tokens per chunk. *Token ITL* here is (t_last − t_first) / (C_last − C_first) with C the server's "
    "own `usage.completion_tokens`; *chunk ITL* is the mean gap between content chunks, the figure a "
    "chunk-counting tool reports. Their ratio is the inflation. A run whose output was cut short "
    "(e.g. at 128 tokens) also distorts per-request averages: see the truncation findings below."
)

SUMMARY_ROWS = (
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
    ("schedule lag (ms)", "schedule_lag_ms", "{:.2f}"),
)


# The "Result" table: vllm bench serve's figures per variant (summary.json's block["benchmark"]), in
# its block's order, with the token ITL beside its per-chunk ITL. (label, key, statistic, format); a
# statistic of None is a plain figure.
RESULT_ROWS = (
    ("successful requests", "completed", None, "{}"),
    ("failed requests", "failed", None, "{}"),
    ("benchmark duration (s)", "duration_s", None, "{:.2f}"),
    ("total input tokens", "total_input_tokens", None, "{}"),
    ("total generated tokens", "total_output_tokens", None, "{}"),
    ("request throughput (req/s)", "request_throughput", None, "{:.2f}"),
    ("output token throughput (tok/s)", "output_throughput", None, "{:.2f}"),
    ("total token throughput (tok/s)", "total_token_throughput", None, "{:.2f}"),
    *(
        (f"{word} {label} (ms)", key, stat, "{:.2f}")
        for label, key in (
            ("TTFT", "ttft_ms"),
            ("TPOT", "tpot_ms"),
            ("ITL per chunk (vllm bench's ITL)", "chunk_itl_ms"),
            ("ITL per token", "token_itl_ms"),
            ("E2EL", "e2el_ms"),
        )
        for word, stat in (("mean", "mean"), ("median", "p50"), ("P99", "p99"))
    ),
    ("tokens per decode chunk", "tokens_per_decode_chunk", None, "{:.2f}"),
)
RESULT_NOTE = (
    "vllm bench serve's figures, computed as it computes them. TTFT, TPOT and E2EL are over requests; "
    "the ITL percentiles are **pooled over every gap of every request**, as vllm bench pools them: "
    "*per chunk* is vllm bench's own ITL (one value per SSE chunk gap), *per token* divides each gap "
    "by the tokens its chunk carried and counts it that many times (a 4-token chunk after 12 ms is "
    "four 3 ms gaps). The figures table further down is the **per-request** distribution instead: its "
    "token ITL p99 is the p99 of the requests' mean token ITLs, not of the gaps."
)


def result_rows(summary: RunSummary) -> list[list[str]]:
    """The Result table's rows (raw strings; label first, one cell per variant), after the validity
    rule's verdict: a capped variant's throughput is no more a speed than its latency."""
    variants = summary.variants
    validity = [variant_validity(summary, n) for n in variants]
    rows = [["comparable", *("yes" if v.comparable else f"no: {v.reason}" for v in validity)]]
    for label, key, stat, fmt in RESULT_ROWS:
        cells = []
        for block in variants.values():
            value = block.benchmark.get(key)
            value = value.get(stat) if isinstance(value, dict) and stat else value
            cells.append("–" if value is None else fmt.format(value))
        rows.append([label, *cells])
    return rows


def context_section(facts: Sequence[tuple[str, str]]) -> list[str]:
    """The run's context (report.context.context_facts) as a quoted list, apart from the headline
    bullets below it; every value is foreign text."""
    return [f"> - **{label}**: {escape(text)}" for label, text in facts]


CATEGORY_HEADER = (
    "category",
    "requests",
    "token ITL (ms)",
    "TPOT (ms)",
    "decode tokens per chunk",
    "acceptance length (server)",
)
CATEGORY_COLUMNS = (
    ("itl_ms", "{:.3f}"),
    ("tpot_ms", "{:.3f}"),
    ("decode_tokens_per_chunk", "{:.2f}"),
    ("server_acceptance_length", "{:.2f}"),  # per-request-spec-decode-metrics; – without them
)
CATEGORY_NOTE = "p50 (p99) over each category's requests."


def summary_rows(summary: RunSummary) -> list[list[str]]:
    """The figures table's rows (raw strings; label first, one cell per variant): requests and
    failed requests (a finding is not a failure: those are counted below the table), whether the
    variant is comparable by the validity rule, then the figures; a figure no variant has (schedule
    lag in a closed-loop run) is left out rather than shown as a row of dashes."""
    blocks = list(summary.variants.values())
    validity = [variant_validity(summary, n) for n in summary.variants]
    rows = [
        ["requests", *(str(b.requests) for b in blocks)],
        ["failed requests", *(str(b.errors) for b in blocks)],
        ["comparable", *("yes" if v.comparable else f"no: {v.reason}" for v in validity)],
    ]
    for label, key, fmt in SUMMARY_ROWS:
        cells = [cell(b.distributions.get(key), fmt) for b in blocks]
        if any(c != "–" for c in cells):
            rows.append([label, *cells])
    return rows


def category_rows(block: VariantSummary) -> list[list[str]]:
    """One row per dataset category of a variant (raw strings: each renderer escapes its own way)."""
    return [
        [
            category,
            str(row["requests"]),
            *(_p50_p99(_figures(row.get(key)), fmt) for key, fmt in CATEGORY_COLUMNS),
        ]
        for category, row in block.categories.items()
    ]


def _figures(value: int | Figures | None) -> Figures | None:
    """A category row's distribution (its `requests` is the one count beside them)."""
    return value if isinstance(value, dict) else None


SERVER_HEADING = "Server during the measured window"
SERVER_NOTE = (
    "From the server's /metrics sampled during the measured requests (server_metrics.jsonl), its "
    "per-request acceptance, and the GPU's own figures: NVML on this host or a DCGM exporter "
    "(--gpu, --dcgm-url; gpu_telemetry.jsonl). The server's acceptance length counts only the "
    "steps that drafted (1 + accepted drafts per drafting step); the result table's tokens per decode "
    "chunk counts every decode step, so a drafter that proposes nothing on some steps (ngram without a "
    "match) shows a lower stream figure while both agree on the accepted tokens."
)


_ENERGY_SOURCES = {
    ENERGY_COUNTER: "NVML energy counter",
    ENERGY_POWER: "power samples, integrated",
    "mixed": "counter or power samples, per GPU",
}


def server_rows(summary: RunSummary) -> list[list[str]]:
    """A row per signal any variant has (raw strings): summary.json's `server` blocks, in SIGNALS'
    order, throttle reasons last."""
    server = summary.server
    names = list(summary.variants)
    rows = []
    for key, label, fmt, _ in SIGNALS:
        cells = [server.get(n, {}).get(key) for n in names]
        if any(isinstance(c, int | float) for c in cells):
            rows.append([label, *(fmt.format(c) if isinstance(c, int | float) else "–" for c in cells)])
    notes = [server.get(n, {}).get("note") for n in names]
    if any(notes):
        # A "–" above is a figure not measured, never a zero: say why.
        rows.append(["why a gauge is –", *(str(n) if n else "" for n in notes)])
    sources = [server.get(n, {}).get("gpu_energy_source") for n in names]
    if any(sources):
        # how the joules were found: the counter, or power samples integrated (docs/server-metrics.md)
        rows.append(["GPU energy read from", *(_ENERGY_SOURCES.get(str(s), "–") for s in sources)])
    refused = [server.get(n, {}).get("gpu_not_supported") for n in names]
    if any(refused):
        rows.append(
            ["GPU figures not reported (NOT_SUPPORTED)", *(", ".join(r or []) or "–" for r in refused)]
        )
    throttle = [server.get(n, {}).get("gpu_throttle") for n in names]
    if any(t is not None for t in throttle):
        rows.append(
            ["GPU throttle reasons", *("–" if t is None else ", ".join(t) or "none" for t in throttle)]
        )
    return rows


def server_section(summary: RunSummary) -> list[str]:
    rows = server_rows(summary)
    if not rows:
        return floor_lines(summary)
    names = list(summary.variants)
    out = [f"## {SERVER_HEADING}", "", SERVER_NOTE, ""]
    out.append("| signal | " + " | ".join(escape(n) for n in names) + " |")
    out.append("|---|" + "---|" * len(names))
    out += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return [*out, "", *floor_lines(summary)]


def floor_lines(summary: RunSummary) -> list[str]:
    """Each variant's token ITL said against its memory-bandwidth floor (analysis.roofline), or why
    there is none."""
    out = []
    for name in summary.variants:
        server = summary.server.get(name) or {}
        if note := server.get("floor_note"):
            out.append(f"- {escape(name)}: {escape(str(note))}")
            continue
        floor, share = server.get("floor_ms"), server.get("floor_share")
        if not isinstance(floor, int | float) or not isinstance(share, int | float):
            continue
        itl = floor / share
        device = server.get("floor_device") or "the device"
        where = (
            f"{share:.0%} of {escape(str(device))}'s bandwidth floor {floor:.3g} ms"
            if share <= 1
            else f"below {escape(str(device))}'s K0 bandwidth floor {floor:.3g} ms ({share:.2f}x): more "
            "than one token a step, which only speculation gives"
        )
        out.append(
            f"- {escape(name)}: {itl:.3g} ms/token = {where} "
            f"({server['floor_bytes_per_step'] / 1e9:.3g} GB a step at "
            f"{server['floor_bandwidth_gbps']:.0f} GB/s, batch {server['floor_batch']}, "
            f"{server['floor_context_tokens']:.0f} tokens of context)"
        )
    return [*out, ""] if out else []


def category_section(variants: Mapping[str, VariantSummary]) -> list[str]:
    """Per-category figures, one table per variant with categories (the dataset's `category` field)."""
    out: list[str] = []
    for name, block in variants.items():
        rows = category_rows(block)
        if not rows:
            continue
        out += [f"### By category: {escape(name)}", "", CATEGORY_NOTE, ""]
        out += ["| " + " | ".join(CATEGORY_HEADER) + " |", "|" + "---|" * len(CATEGORY_HEADER)]
        out += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
        out.append("")
    return out


def _p50_p99(stats: Figures | None, fmt: str) -> str:
    if not stats or stats.get("p50") is None:
        return "–"
    return f"{fmt.format(stats['p50'])} ({fmt.format(stats['p99'])})"


def cell(stats: Figures | None, fmt: str) -> str:
    if not stats or stats.get("p50") is None:
        return "–"
    return f"{fmt.format(stats['p50'])} / {fmt.format(stats['p90'])} / {fmt.format(stats['p99'])}"


# Markdown's inline punctuation, backslash-escaped; `<` and `&` become entities, so no server string
# (an error message, a model name) is rendered as HTML or as emphasis, a link or an image. `>` stays
# as typed: without `<` it opens no tag, and mid-line it quotes nothing ("digit_ratio 0.5 > 0.35").
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|])")
_HTML_ENTITIES = {"&": "&amp;", "<": "&lt;"}


def escape(text: str) -> str:
    """Every string that did not come from itlaudit (server messages, names, imported tools' labels)
    passes through here: shown as typed, one line, never as markup."""
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))
    return "".join(_HTML_ENTITIES.get(char, char) for char in text)


def table_cell(text: str) -> str:
    """itlaudit's own text (check names, figures, verdict reasons) in one table cell: one line, pipes
    escaped, its Markdown kept (`itl_ms.p50` stays readable in the source). Foreign text takes escape."""
    return " ".join(str(text).splitlines()).replace("|", "\\|")


def _factor(ratio: float, smaller: str, larger: str) -> str:
    return f"{1 / ratio:.2f}× {smaller}" if ratio < 1 else f"{ratio:.2f}× {larger}"


def comparison_sentence(name: str, base_name: str, base: VariantSummary, block: VariantSummary) -> str | None:
    """Token ITL first (what a user feels), then chunk ITL with "though" when it points the other way:
    that contrast is exactly the trap chunk-counting benchmarks fall into. Only for a comparable pair
    (headline checks the validity rule first)."""
    token = ratio(p50(block.distributions, "itl_ms"), p50(base.distributions, "itl_ms"))
    if token is None or token <= 0:  # a p50 of 0 ms is no timing to compare (and no factor to print)
        return None
    if abs(token - 1) < SAME_BAND:
        sentence = f"**{escape(name)} is about as fast per token as {escape(base_name)}**"
    else:
        sentence = (
            f"**{escape(name)} is {_factor(token, 'faster', 'slower')} per token than {escape(base_name)}**"
        )
    chunk = ratio(p50(block.distributions, "chunk_itl_ms"), p50(base.distributions, "chunk_itl_ms"))
    if chunk is not None and chunk > 0 and abs(chunk - 1) >= 0.05:
        contrast = (chunk > 1) != (token > 1)
        joiner = "though" if contrast else "and"
        sentence += f", {joiner} its chunk ITL is {_factor(chunk, 'smaller', 'larger')}"
        per_chunk = p50(block.distributions, "decode_tokens_per_chunk")
        if contrast and per_chunk is not None:
            sentence += f" (each chunk carries {per_chunk:.1f} tokens)"
    return sentence + "." + _launch_bound_words(name, base_name, base, block)


def _launch_bound_words(name: str, base_name: str, base: VariantSummary, block: VariantSummary) -> str:
    """A ratio between launch-bound variants (analysis.roofline: the GPU mostly idle, far from its
    floor) moves with the host, not the engine: on the GPU lane the same eager server ran 29-40 ms a
    token on identical work minutes apart. The sentence says so and how to get the spread."""
    bound = [n for n, b in ((base_name, base), (name, block)) if b.findings.get(LAUNCH_BOUND)]
    if not bound:
        return ""
    who = " and ".join(escape(n) for n in bound)
    return (
        f" {who} {'are' if len(bound) > 1 else 'is'} launch-bound (`launch_bound`): the ratio moves "
        "with the host's CPU, so read it over repeated trials (`--trials N` gives its spread)."
    )


def not_comparable_sentence(
    name: str, base_name: str | None, validity: Validity, base: VariantSummary, block: VariantSummary
) -> str:
    """Where a speed comparison would stand, the rule's verdict instead: "K3-capped vs K0: not
    comparable: 6 of 6 requests capped at 128 tokens", with the completion tokens that show it."""
    who = escape(name) if base_name is None else f"{escape(name)} vs {escape(base_name)}"
    sentence = f"**{who}: {escape(validity.label)}**"
    tokens = p50(block.distributions, "completion_tokens")
    base_tokens = p50(base.distributions, "completion_tokens")
    if tokens is not None and any(block.findings.get(code) for code in TRUNCATION_CODES):
        sentence += f" (completion tokens p50 {tokens:.0f}"
        sentence += f" vs {base_tokens:.0f} for {escape(base_name)})" if base_name and base_tokens else ")"
    return sentence + ": its speed is not ranked (see Findings)."


def headline(summary: RunSummary) -> list[str]:
    """One sentence per variant against the first, by the validity rule (analysis.validity): a
    comparable pair gets its speed in words, any other pair "not comparable" and why, in the same
    bullet, so no reader sees a capped variant called faster."""
    variants = summary.variants
    names = list(variants)
    if not names:
        return ["No requests recorded."]
    base_name, base = names[0], variants[names[0]]
    base_validity = variant_validity(summary, base_name)
    lines = []
    if not base_validity.comparable:
        lines.append(not_comparable_sentence(base_name, None, base_validity, base, base))
    for name in names[1:]:
        block = variants[name]
        validity = comparison_validity(variant_validity(summary, name), base_validity, base_name)
        if validity.comparable:
            sentence = comparison_sentence(name, base_name, base, block)
        else:
            sentence = not_comparable_sentence(name, base_name, validity, base, block)
        if sentence:
            lines.append(sentence)
    return lines


def usage_warning(summary: RunSummary) -> str | None:
    chunk_fallback = [n for n, b in summary.variants.items() if "chunks" in b.token_source]
    retokenized = [n for n, b in summary.variants.items() if "tokenizer" in b.token_source]
    if retokenized and not chunk_fallback:
        return (
            f"**Tokens re-counted for {escape(', '.join(retokenized))}.** The server sent no per-chunk "
            "`usage.completion_tokens` or token ids; the local tokenizer (`--tokenizer`) counted the "
            "tokens each chunk's text completed. Near the server's own count where the text re-encodes "
            "to the tokens generated; the per-request `usage_missing` findings give both totals."
        )
    if not chunk_fallback:
        return None
    return (
        f"**WARNING: usage missing for {escape(', '.join(chunk_fallback))}.** The server sent no "
        "`usage.completion_tokens`, so tokens were counted by chunk. Under speculative decoding "
        "these ITL figures are chunk ITL, not token ITL. Start vLLM with continuous usage stats "
        "available (any vLLM ≥ 0.6) and check the request's stream_options."
    )


def quality_warning(summary: RunSummary) -> str | None:
    """analysis.validity's phrase when gibberish was measured and did not gate: the speeds stand,
    the text was not judged (dummy weights, a stand-in server, a single variant)."""
    note = quality_note(summary)
    return None if note is None else f"**Output quality not judged:** {escape(note)}."


def report_warnings(summary: RunSummary) -> list[str]:
    """The notes above the figures, in both report forms: what limits how they may be read."""
    found = (
        partial_warning(summary),
        quality_warning(summary),
        usage_warning(summary),
        saturation_warning(summary),
    )
    return [warning for warning in found if warning]


PARTIAL_HEADING = "partial: run still in progress"


def partial_warning(summary: RunSummary) -> str | None:
    """A report derived while its run was still writing (`report --live`): how much it covers, and
    that the run's own summary, written when it ends, is the one to read."""
    partial = summary.partial
    if partial is None:
        return None
    who = f"pid {partial.pid}" if partial.pid else "another process"
    count = f" {summary.records.lines}" if summary.records is not None else ""
    return (
        f"**{escape(PARTIAL_HEADING)}.** The run ({who}) was still writing its folder: these figures "
        f"cover the{count} requests that had finished by then. When the run ends it writes its own "
        "summary.json and report.md from all of its records, and removes this partial/ folder."
    )


def saturation_warning(summary: RunSummary) -> str | None:
    """The client's own loop lagged by a visible share of the ITL: the figures partly measure itlaudit."""
    variants = summary.variants
    hit = {n: b.findings.get(CLIENT_SATURATED, 0) for n, b in variants.items()}
    hit = {n: k for n, k in hit.items() if k}
    if not hit:
        return None
    counts = ", ".join(f"{n} ({k} of {variants[n].requests} requests)" for n, k in hit.items())
    return (
        f"**WARNING: itlaudit's capture loop was saturated for {counts}.** Its event-loop lag exceeded "
        "5% of the token ITL (loop stamps) or the whole ITL (kernel stamps), so part of these figures is "
        "the client's. Rerun with more capture processes (`--workers N`) or fewer concurrent streams."
    )


def render_report(
    title: str,
    summary: RunSummary,
    findings: Sequence[Finding],
    *,
    images: Sequence[tuple[str, str]] = (),
    imported: Sequence[tuple[ImportedBenchmark, str]] = (),
    context: Sequence[tuple[str, str]] = (),
) -> str:
    """`images` are (caption, file name relative to report.md); `imported` pairs another tool's result
    with the variant it measured; `context` is the run's facts (report.context), shown first."""
    variants = summary.variants
    names = list(variants)
    lines = [f"# itlaudit: {escape(title)}", ""]
    if context:
        lines += [*context_section(context), ""]
    lines += [f"- {line}" for line in headline(summary)] + [""]
    for warning in report_warnings(summary):
        lines += [f"> {warning}", ""]
    lines += ["## Result", "", RESULT_NOTE, ""]
    lines.append("| figure | " + " | ".join(escape(n) for n in names) + " |")
    lines.append("|---|" + "---|" * len(names))
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in result_rows(summary)]
    lines += ["", "## Per-request figures", ""]
    lines += ["p50 / p90 / p99 over requests, each request's own figure (its mean token ITL, its TTFT).", ""]
    lines.append("| metric | " + " | ".join(escape(n) for n in names) + " |")
    lines.append("|---|" + "---|" * len(names))
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in summary_rows(summary)]
    lines += ["", EXPLANATION, ""]
    # The findings before the figures: they say which figures can be read at all.
    lines += ["## Findings", ""]
    lines += _findings_section(findings) or [NO_FINDINGS]
    lines.append("")
    lines += category_section(variants)
    lines += server_section(summary)
    for imp, variant in imported:
        lines += imported_section(imp, variant, variants.get(variant))
    lines += [f"![{escape(caption)}]({name})" for caption, name in images]
    return "\n".join(lines) + "\n"


# Order and labels of the rows an imported result can fill.
IMPORT_ROWS = (
    ("token ITL (ms)", "itl_ms", "{:.2f}"),
    ("chunk ITL (ms)", "chunk_itl_ms", "{:.2f}"),
    ("TPOT (ms)", "tpot_ms", "{:.2f}"),
    ("TTFT (ms)", "ttft_ms", "{:.1f}"),
    ("E2E (ms)", "e2e_ms", "{:.1f}"),
    ("completion tokens", "completion_tokens", "{:.0f}"),
    ("tokens per chunk", "tokens_per_chunk", "{:.2f}"),
    ("decode tokens/s", "decode_tokens_per_s", "{:.1f}"),
)


def stat_pair(stats: Mapping[str, float | int | None] | None, fmt: str) -> str:
    """ "p50 (mean)": tools disagree on which one they headline, so show both."""
    stats = stats or {}
    parts = [fmt.format(v) if v is not None else "–" for v in (stats.get("p50"), stats.get("mean"))]
    return "–" if parts == ["–", "–"] else f"{parts[0]} ({parts[1]})"


def import_rows(imp: ImportedBenchmark, block: VariantSummary | None) -> list[tuple[str, str, str, str]]:
    """(figure, the tool's name for it, its value, itlaudit's value) for each figure the tool has;
    itlaudit's are blank for a variant this run does not hold."""
    ours = block.distributions if block is not None else {}
    return [
        (label, imp.names.get(key, ""), stat_pair(imp.figures[key], fmt), stat_pair(ours.get(key), fmt))
        for label, key, fmt in IMPORT_ROWS
        if key in imp.figures
    ]


def imported_section(imp: ImportedBenchmark, variant: str, block: VariantSummary | None) -> list[str]:
    lines = [
        f"## {escape(imp.tool)} ({escape(imp.source)}) beside itlaudit {escape(variant)}",
        "",
        "Figures are p50 (mean). Rows are filed under what the figure measures, not what the tool calls it.",
        "",
        f"| figure | what {escape(imp.tool)} calls it | {escape(imp.tool)} | itlaudit {escape(variant)} |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {escape(b)} | {c} | {d} |" for a, b, c, d in import_rows(imp, block)]
    return [*lines, "", *(f"- {escape(note)}" for note in imp.notes), ""]


FINDING_EXAMPLES = 3
NO_FINDINGS = "No findings: every request ran to its expected length with server token counts."
# Where a finding's example lines send the reader for the rest: derived.jsonl holds every request's
# findings with their messages (requests.jsonl is the raw capture and has none).
FINDINGS_FILE = "derived.jsonl"


def group_findings(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    """By code, in first-seen order: 1000 truncated requests should read as one entry."""
    groups: dict[str, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.code, []).append(finding)
    return groups


@dataclass(frozen=True)
class FindingGroup:
    """One cause as the report lists it: `codes` fired on exactly the same requests (a request capped
    at 128 of 512 tokens is both truncated_below_max_tokens and min_tokens_violated: one problem per
    request, not two), `members` are the first code's findings, `also` the first finding of each other
    code, for its wording."""

    codes: tuple[str, ...]
    members: list[Finding]
    also: list[Finding]

    @property
    def heading(self) -> str:
        """The bullet's head: code, severity and count; shared codes joined with + and counted once."""
        severity = self.members[0].severity
        if len(self.codes) == 1:
            return f"**{self.codes[0]}** ({severity}) × {len(self.members)}"
        joined = " + ".join(f"**{code}**" for code in self.codes)
        rules = len(self.codes)
        return f"{joined} ({severity}) × {len(self.members)} requests: one cause, seen by {rules} rules"


def _requests(members: Sequence[Finding]) -> frozenset[str] | None:
    ids = frozenset(f.request_id for f in members if f.request_id)
    return ids if len(ids) == len(members) else None


def finding_groups(findings: Sequence[Finding]) -> list[FindingGroup]:
    """group_findings with the truncation codes that fired on the same requests merged into one
    group: they are one cause (the output was cut short) seen by several rules."""
    groups = group_findings(findings)
    merged: dict[frozenset[str], list[str]] = {}
    for code, members in groups.items():
        ids = _requests(members) if code in TRUNCATION_CODES else None
        merged.setdefault(ids or frozenset({f"code:{code}"}), []).append(code)
    return [
        FindingGroup(tuple(codes), groups[codes[0]], [groups[c][0] for c in codes[1:]])
        for codes in merged.values()
    ]


def _findings_section(findings: Sequence[Finding], examples: int = FINDING_EXAMPLES) -> list[str]:
    """Grouped by cause, a few examples each."""
    lines: list[str] = []
    for group in finding_groups(findings):
        lines.append(f"- {group.heading}")
        for finding in group.members[:examples]:
            who = finding.request_id or "run-level"
            lines.append(f"  - {escape(who)}: {escape(finding.message)}")
        if len(group.members) > examples:
            lines.append(f"  - … and {len(group.members) - examples} more (see {FINDINGS_FILE})")
        for other in group.also:
            lines.append(f"  - {other.code}, on the same requests: {escape(other.message)}")
    return lines
