"""report.md and bisect.png: the answer first, then every probe with a link to its build.

Pure rendering from the state; rerunnable at any time, so an interrupted bisection still has a report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from itlaudit.analysis.server_metrics import SignalChange, signal_changes
from itlaudit.analysis.validity import NOT_COMPARABLE, block_validity
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.figures import ProbeFigures
from itlaudit.bisect.providers.pip import PipOptions
from itlaudit.bisect.settings import ProbeSetup
from itlaudit.bisect.state import ProbeRecord, State
from itlaudit.bisect.verdict import ScriptJudge
from itlaudit.errors import ItlauditError
from itlaudit.model.vocabulary import Verdict
from itlaudit.report.diff import why_it_moved
from itlaudit.report.markdown import table_cell
from itlaudit.workflows.run_folder import RunFolder

REPORT_FILE = "report.md"
PLOT_FILE = "bisect.png"
_COLOURS: dict[str, str] = {  # keyed by Verdict, a StrEnum: a verdict read back as text finds it
    Verdict.GOOD: "#2e7d32",
    Verdict.BAD: "#c62828",
    Verdict.SKIP: "#9e9e9e",
    Verdict.UNKNOWN: "#f9a825",
}
# Beside a variant's figures in a probe that breaks analysis.validity's rule (cut short, failing,
# gibberish): its ITL is not a speed, whatever the verdict column says about the regression.
_UNLIKE = "⚠"


def build_url(build: Build, setup: ProbeSetup) -> str:
    """A commit on GitHub, or a release (the pip provider's builds) on PyPI."""
    if build.kind == "commit":
        return f"https://github.com/{setup.github_repo}/commit/{build.ref}"
    package = setup.provider.package if isinstance(setup.provider, PipOptions) else "vllm"
    return f"https://pypi.org/project/{package}/{build.ref}/"


def compare_url(old: Build, new: Build, github_repo: str) -> str:
    """GitHub's diff of everything the answer range holds (tags for releases: vLLM tags are v<version>)."""
    if old.kind == "commit":
        return f"https://github.com/{github_repo}/compare/{old.ref}...{new.ref}"
    return f"https://github.com/{github_repo}/compare/v{old.ref}...v{new.ref}"


def _tokens(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def variant_names(state: State) -> list[str]:
    """Variants in the order the probes ran them."""
    names: dict[str, None] = {}
    for probe in state.probes:
        names.update(dict.fromkeys(probe.get("metrics", {})))
    return list(names)


def render_markdown(state: State) -> str:
    settings = state.settings
    builds: list[Build] = state.builds
    result = state.result
    names = variant_names(state)
    lines = [f"# itlaudit bisect: {settings.good} → {settings.bad}", ""]
    lines.append(f"**{result.message or 'bisection in progress'}**")
    if result.explanation:
        lines += ["", f"What changed: {result.explanation}"]
    if result.compare_url:
        lines += ["", f"Changes in the answer range: {result.compare_url}"]
    header = "".join(f" {n} token ITL ms | {n} chunk ITL ms | {n} tokens p50 |" for n in names)
    lines += [
        "",
        f"Provider `{settings.setup.provider.kind}`, verdict `--regress {settings.regress.text}`"
        + (f" (script `{settings.regress.script}`)" if isinstance(settings.regress, ScriptJudge) else "")
        + (", looking for the fix" if settings.find_fix else "")
        + f", scenario `{settings.setup.scenario}`, variants {', '.join(names) or '–'}, "
        f"{len(builds)} builds in range, {len(state.probes)} probes in {state.rounds} rounds"
        + (f" (up to {settings.parallel} at once)" if settings.parallel > 1 else "")
        + ". Figures are medians over every trial's requests.",
        "",
        f"| # | round | position | build | version | verdict | trials |{header} reason |",
        "|---|---|---|---|---|---|---|" + "---|---|---|" * len(names) + "---|",
    ]
    unlike: list[str] = []
    for n, probe in enumerate(state.probes, 1):
        build = builds[probe["index"]]
        link = f"[{build.label}]({build_url(build, settings.setup)})"
        figures = ""
        for name in names:
            m = probe.get("metrics", {}).get(name, {})
            validity = block_validity(m, base=_base_metrics(probe, names, name)) if m else None
            mark = f" {_UNLIKE}" if validity and not validity.comparable else ""
            if validity and mark:
                unlike.append(f"#{n} {name}: {validity.reason}")
            figures += (
                f" {_fmt(m.get('itl_p50_ms'))}{mark} | {_fmt(m.get('chunk_itl_p50_ms'))} | "
                f"{_tokens(m.get('completion_tokens_p50'))} |"
            )
        reason = table_cell(str(probe.get("reason", "")))
        lines.append(
            f"| {n} | {probe.get('round', n)} | {probe['index'] + 1}/{len(builds)} | {link} | "
            f"{probe.get('version') or '–'} | {probe['verdict']} | {probe.get('trials', 0)} |{figures} "
            f"{reason} |"
        )
    if unlike:
        lines += [
            "",
            f"{_UNLIKE} {NOT_COMPARABLE} (cut short, failing or gibberish): " + "; ".join(unlike) + ".",
        ]
    moved = why_it_moved(boundary_moved(state))
    if moved:
        lines += ["", *moved[:-1]]  # the section ends the file; its trailing blank line is not needed
    return "\n".join(lines) + "\n"


def boundary_moved(state: State) -> list[SignalChange]:
    """The server and GPU signals that changed across the answer: the last good build's probe against
    the first bad one's (hunting a fix, the last unfixed against the first fixed), compared as `diff`
    compares two runs. Nothing while the answer is a range of candidates or a probe's files are gone."""
    result = state.result
    if result.first_bad is None or result.last_good is None:
        return []
    before, after = _probe_of_ref(state, result.last_good), _probe_of_ref(state, result.first_bad)
    if before is None or after is None:
        return []
    return signal_changes(_server_blocks(Path(before["dir"])), _server_blocks(Path(after["dir"])))


def _probe_of_ref(state: State, ref: str) -> ProbeRecord | None:
    return next((p for p in state.probes if state.builds[p["index"]].ref == ref), None)


def _server_blocks(probe_dir: Path) -> dict[str, dict[str, Any]]:
    """Each variant's server block (summary.json's `server`) in its probe's last trial that has one:
    the trial folders' derivation already holds them, so nothing is derived again."""
    blocks: dict[str, dict[str, Any]] = {}
    trials = sorted(probe_dir.glob("trial-*"), key=lambda p: int(p.name.split("-")[1]))
    for trial in trials:
        try:
            blocks.update(RunFolder.open(trial).summary.server)
        except (OSError, ValueError, ItlauditError):
            continue  # a trial cut short has no summary; the others still tell
    return blocks


def _base_metrics(probe: ProbeRecord, names: Sequence[str], name: str) -> ProbeFigures | None:
    """The baseline variant's figures in the same probe, which `name`'s quality is judged against
    (None for the baseline itself or a probe without it)."""
    if not names or name == names[0]:
        return None
    return probe.get("metrics", {}).get(names[0]) or None


# What bisect.png draws when the answer's flipped signal is not the rule's own figure (--regress auto
# judges several): the figure that moved, so the picture shows why the boundary is where it is.
_SIGNAL_FIGURES = {
    "truncation": ("completion_tokens_p50", "completion tokens p50"),
    "errors": ("errors", "failed requests"),
}


def plotted_figure(state: State) -> tuple[str, str]:
    """(probe figure key, axis label): the rule's figure, or the one of the signal that flipped at
    the answer when token ITL did not (a cap found by `--regress auto` plots output length)."""
    flipped = state.result.signals
    if "itl" not in flipped:
        for signal in flipped:
            if signal in _SIGNAL_FIGURES:
                return _SIGNAL_FIGURES[signal]
    return state.settings.regress.plotted


def render_plot(state: State, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, label = plotted_figure(state)
    probes = sorted(state.probes, key=lambda p: p["index"])
    fig, ax = plt.subplots(figsize=(9, 4))
    markers = "os^Dv"
    for n, name in enumerate(variant_names(state)):
        for probe in probes:
            metrics = probe.get("metrics", {}).get(name, {})
            value = metrics.get(key)
            verdict_colour = _COLOURS.get(probe["verdict"], "black")
            base = _base_metrics(probe, variant_names(state), name)
            hollow = bool(metrics) and not block_validity(metrics, base=base).comparable
            # No figure: a cross at 0 (an unfilled marker takes no edge colour).
            if not isinstance(value, (int, float)):
                ax.scatter(probe["index"], 0, color=verdict_colour, marker="x", s=40, zorder=3)
                continue
            ax.scatter(
                probe["index"],
                value,
                facecolors="none" if hollow else verdict_colour,
                edgecolors=verdict_colour,
                marker=markers[n % len(markers)],
                s=40,
                zorder=3,
            )
        ax.scatter([], [], color="black", marker=markers[n % len(markers)], label=name)
    ax.set_xticks([p["index"] for p in probes])
    ax.set_xticklabels([state.builds[p["index"]].label for p in probes], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(label)
    ax.set_title(f"{state.settings.good} → {state.settings.bad} (range order)")
    for verdict, colour in _COLOURS.items():
        ax.scatter([], [], color=colour, label=verdict)
    ax.scatter([], [], facecolors="none", edgecolors="black", label=f"hollow: {NOT_COMPARABLE}")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(state: State, bisect_dir: Path, *, plot: bool) -> None:
    (bisect_dir / REPORT_FILE).write_text(render_markdown(state), encoding="utf-8")
    if plot and state.probes:
        render_plot(state, bisect_dir / PLOT_FILE)
