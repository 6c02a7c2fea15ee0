"""report.md and report.html of a sweep: the headline in words first (crossover, SLA limits), then
the per-point table and the figures. Reads sweep.json's content only."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from itlaudit.analysis.convergence import Interval
from itlaudit.analysis.sweep import LatencyFigure, SweepPoint, SweepResult, load_of
from itlaudit.model.stop import requested
from itlaudit.model.vocabulary import LoadAxis
from itlaudit.report.html import figure_html, inline_markdown, page_html, table_html
from itlaudit.report.sweep_plots import write_sweep_plots

HEADER = (
    "variant",
    "load",
    "requests",
    "out tok/s",
    "req/s",
    "token ITL p50/p99",
    "chunk ITL p50",
    "TTFT p50/p99",
    "TPOT p50/p99",
    "tokens/chunk",
    "findings",
    "goodput (token / chunk TPOT)",
    "comparable",
)


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pair(point: SweepPoint, key: LatencyFigure) -> str:
    return f"{_num(point[key]['p50'], 2)} / {_num(point[key]['p99'], 2)}"


def table_rows(sweep: SweepResult) -> list[list[str]]:
    axis = sweep.axis
    rows = []
    for name, points in sweep.variants.items():
        for p in points:
            load = f"{int(load_of(p, axis))}" if axis == LoadAxis.CONCURRENCY else f"{load_of(p, axis):g}/s"
            good = (
                "–" if p["goodput_rps"] is None else f"{p['goodput_rps']:.2f} / {p['goodput_chunk_rps']:.2f}"
            )
            rows.append(
                [
                    name,
                    load,
                    str(p["requests"]),
                    _num(p["output_tokens_per_s"]),
                    _num(p["requests_per_s"], 2),
                    _pair(p, "itl_ms"),
                    _num(p["chunk_itl_ms"]["p50"], 2),
                    _pair(p, "ttft_ms"),
                    _pair(p, "tpot_ms"),
                    _num(p["acceptance_length"], 2),
                    str(p["findings"]),
                    good,
                    f"no: {p['not_comparable']}" if p.get("not_comparable") else "yes",
                ]
            )
    return rows


EXPLANATION = (
    "Each point is a run folder under this one (`<variant>/c<load>-t<trial>/`; `itlaudit report` works "
    "on it). Token ITL divides by the server's token counts, chunk ITL by SSE chunks; under speculative "
    "decoding chunk ITL is about tokens/chunk times larger. Goodput counts requests/s that met every "
    "SLO with token-true TPOT, beside the figure chunk ITL taken as TPOT would give: the gap is what a "
    "chunk-counting benchmark gets wrong. Figures are medians over trials; error bars span them. A "
    "point cut short, with failed requests or mostly gibberish is not comparable: it is never ranked."
)


def convergence_lines(sweep: SweepResult) -> list[str]:
    """--trials auto: per point, the interval its trials reached and why they stopped."""
    lines = []
    for variant, points in sweep.variants.items():
        for point in points:
            stopped = point.get("convergence")
            found = stopped.get("interval") if isinstance(stopped, dict) else None
            if stopped is None or not isinstance(found, dict):
                continue
            interval = Interval(
                mean=found["mean"],
                low=found["low"],
                high=found["high"],
                confidence=found["confidence"],
                trials=found["trials"],
            ).text(" ms")
            lines.append(
                f"{variant} {sweep.axis} {load_of(point, sweep.axis)}: {stopped.get('metric')} {interval}; "
                f"{stopped.get('reason')}"
            )
    return lines


def render_markdown(sweep: SweepResult, images: Sequence[tuple[str, Path]]) -> str:
    lines = [f"# itlaudit sweep: {sweep.scenario}", ""]
    lines += [f"- {sentence}" for sentence in sweep.headline] or [
        "- one variant measured: no crossover to name"
    ]
    if sweep.goodput_slo:
        slo = ", ".join(f"{k} ≤ {v:g}" for k, v in sweep.goodput_slo.items())
        lines += ["", f"Goodput SLO: {slo}."]
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(sweep)]
    lines += ["", EXPLANATION, ""]
    if trials := convergence_lines(sweep):
        lines += ["Trials until the interval closed (`--trials auto`):", ""]
        lines += [f"- {line}" for line in trials] + [""]
    lines += [f"![{caption}]({path.name})\n" for caption, path in images]
    return "\n".join(lines) + "\n"


def render_html(sweep: SweepResult, images: Sequence[tuple[str, bytes]]) -> str:
    title = html.escape(sweep.scenario)
    sentences = "".join(f"<li>{inline_markdown(s)}</li>" for s in sweep.headline)
    parts = [f"<h1>itlaudit sweep: {title}</h1>", f'<div class="headline"><ul>{sentences}</ul></div>']
    figures = [figure_html(caption, png) for caption, png in images]
    parts += figures[:1]
    parts += [table_html(HEADER, table_rows(sweep)), f"<p>{inline_markdown(EXPLANATION)}</p>"]
    if trials := convergence_lines(sweep):
        items = "".join(f"<li>{html.escape(line)}</li>" for line in trials)
        parts.append(f"<p>Trials until the interval closed (--trials auto):</p><ul>{items}</ul>")
    parts += figures[1:]
    return page_html(f"itlaudit sweep: {sweep.scenario}", parts)


def write_sweep_report(sweep_dir: Path, sweep: SweepResult) -> None:
    """report.md/html with the plots; once a signal came (model.stop) without them: drawing them takes
    seconds of the 5 s an interrupt has, and the --resume that finishes the sweep writes it again."""
    images = [] if requested() else write_sweep_plots(sweep, sweep_dir)
    (sweep_dir / "report.md").write_text(render_markdown(sweep, images), encoding="utf-8")
    pngs = [(caption, path.read_bytes()) for caption, path in images]
    (sweep_dir / "report.html").write_text(render_html(sweep, pngs), encoding="utf-8")
