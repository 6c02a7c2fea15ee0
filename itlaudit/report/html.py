"""report.html: one self-contained file a reader can mail, attach to a CI run or open offline.

Images are embedded as data: URIs, the styles are inline, and a Content-Security-Policy forbids every
fetch and script, so the page cannot phone home or run anything. Every string that came from a server
or a file (variant names, error messages, finding text, model names) goes through html.escape: a
finding quoting generated text must not be able to inject markup. Pure: PNG bytes in, a string out.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence

from itlaudit.analysis.importers import ImportedBenchmark
from itlaudit.analysis.summary import RunSummary, VariantSummary
from itlaudit.model.codes import Finding
from itlaudit.report.markdown import (
    CATEGORY_HEADER,
    CATEGORY_NOTE,
    EXPLANATION,
    FINDING_EXAMPLES,
    FINDINGS_FILE,
    NO_FINDINGS,
    RESULT_NOTE,
    SERVER_HEADING,
    SERVER_NOTE,
    category_rows,
    finding_groups,
    floor_lines,
    headline,
    import_rows,
    report_warnings,
    result_rows,
    server_rows,
    summary_rows,
)

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1180px; margin: 2em auto; padding: 0 1em;
       color: #222; }
.headline { background: #f3f7ff; border-left: 5px solid #1f77b4; padding: .6em 1.2em; font-size: 17px; }
.warning { background: #fff3f0; border-left: 5px solid #d62728; padding: .6em 1.2em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: .3em .7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; }
code { background: #f4f4f4; padding: 0 .2em; }
.context { color: #444; font-size: 13px; padding-left: 1.2em; } .context li { margin: .1em 0; }
"""


def inline_markdown(markdown_text: str) -> str:
    """One of itlaudit's own Markdown sentences as HTML: escaped first, so only the few marks our
    sentences use (bold, italics, code) become tags and nothing inside them can. The entities that
    markdown.escape put around foreign text are read back first, so the page shows "<" and "&", not
    "&lt;"."""
    text = html.escape(html.unescape(markdown_text))
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    text = re.sub(r"\*(.+?)\*", r"<em>\1</em>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def figure_html(caption: str, png: bytes) -> str:
    """A PNG embedded as a data: URI with its caption: the page stays one file that fetches nothing."""
    data = base64.b64encode(png).decode("ascii")
    alt = html.escape(caption)
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{alt}"><figcaption>{alt}</figcaption></figure>'
    )


def table_html(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table of raw strings, every cell escaped (cells may hold server text or names)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary_table(summary: RunSummary) -> str:
    return table_html(["metric (p50 / p90 / p99 over requests)", *summary.variants], summary_rows(summary))


def _imported(imp: ImportedBenchmark, variant: str, block: VariantSummary | None) -> str:
    title = f"{imp.tool} ({imp.source}) beside itlaudit {variant}"
    table = table_html(
        ["figure", f"what {imp.tool} calls it", imp.tool, f"itlaudit {variant}"], import_rows(imp, block)
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in imp.notes)
    return f"<h2>{html.escape(title)}</h2><p>Figures are p50 (mean).</p>{table}<ul>{notes}</ul>"


def _findings(findings: Sequence[Finding]) -> str:
    """The Markdown report's findings list (markdown.finding_groups: one cause per entry)."""
    groups = finding_groups(findings)
    if not groups:
        return f"<p>{html.escape(NO_FINDINGS)}</p>"
    items = []
    for group in groups:
        examples = "".join(
            f"<li>{html.escape(f.request_id or 'run-level')}: {html.escape(f.message)}</li>"
            for f in group.members[:FINDING_EXAMPLES]
        )
        if len(group.members) > FINDING_EXAMPLES:
            examples += f"<li>… and {len(group.members) - FINDING_EXAMPLES} more (see {FINDINGS_FILE})</li>"
        examples += "".join(
            f"<li>{html.escape(f.code)}, on the same requests: {html.escape(f.message)}</li>"
            for f in group.also
        )
        items.append(f"<li>{inline_markdown(group.heading)}<ul>{examples}</ul></li>")
    return f"<ul>{''.join(items)}</ul>"


def render_html(
    title: str,
    summary: RunSummary,
    findings: Sequence[Finding],
    *,
    images: Sequence[tuple[str, bytes]] = (),
    imported: Sequence[tuple[ImportedBenchmark, str]] = (),
    context: Sequence[tuple[str, str]] = (),
) -> str:
    """The run's context (report.context) in one compact list, then the headline and the first
    figure (token vs chunk ITL) before any table: "is it faster?" is answered above the fold."""
    variants = summary.variants
    sentences = "".join(f"<li>{inline_markdown(s)}</li>" for s in headline(summary))
    parts = [f"<h1>itlaudit: {html.escape(title)}</h1>"]
    if context:
        facts = "".join(f"<li><strong>{html.escape(k)}</strong>: {html.escape(v)}</li>" for k, v in context)
        parts.append(f'<ul class="context">{facts}</ul>')
    parts.append(f'<div class="headline"><ul>{sentences}</ul></div>')
    for warning in report_warnings(summary):
        parts.append(f'<p class="warning">{inline_markdown(warning)}</p>')
    figures = [figure_html(caption, png) for caption, png in images]
    parts += figures[:1]
    parts += ["<h2>Result</h2>", f"<p>{inline_markdown(RESULT_NOTE)}</p>"]
    parts.append(table_html(["figure", *variants], result_rows(summary)))
    parts += ["<h2>Per-request figures</h2>", _summary_table(summary)]
    parts.append(f"<p>{inline_markdown(EXPLANATION)}</p>")
    # The findings before the other figures: they say which figures can be read at all.
    parts += ["<h2>Findings</h2>", _findings(findings)]
    for name, block in variants.items():
        rows = category_rows(block)
        if rows:
            parts += [
                f"<h3>By category: {html.escape(name)}</h3><p>{CATEGORY_NOTE}</p>",
                table_html(CATEGORY_HEADER, rows),
            ]
    server = server_rows(summary)
    if server:
        parts += [
            f"<h2>{SERVER_HEADING}</h2><p>{inline_markdown(SERVER_NOTE)}</p>",
            table_html(["signal", *variants], server),
        ]
    floors = [line.removeprefix("- ") for line in floor_lines(summary) if line]
    if floors:
        parts.append("<ul>" + "".join(f"<li>{inline_markdown(line)}</li>" for line in floors) + "</ul>")
    parts += figures[1:]
    parts += [_imported(imp, variant, variants.get(variant)) for imp, variant in imported]
    return page_html(f"itlaudit: {title}", parts)


def page_html(title: str, parts: Sequence[str]) -> str:
    """The self-contained page around already-built HTML parts: inline styles, and a CSP that forbids
    every fetch and script. `title` is raw text (escaped here)."""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
