"""`itlaudit track publish`, clicked through in a real headless browser (Debian's chromium driven by
Playwright): the 60-nightly history of tests/test_track.py (a 128-token cap on builds 25–32, a 30 %
slowdown from 40, K3's speedup lost from 50) beside a steady second fingerprint, published, then the
index and the fingerprint page opened from file://. What is counted on screen is what plotly drew
(its SVG markers), against what the history holds.

chromium is the machine's (/usr/bin/chromium, `apt-get install -y chromium`; scripts/test installs
it), never a browser Playwright downloads. Without it the tests fail with that line: a dashboard
nobody opened is not tested.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from simkit import itlaudit
from track_scale import synthetic_point
from trackkit import FAMILY, sixty_nightlies

from itlaudit.analysis.changes import SERVER_SERIES, STREAM_SERIES, VALID, Change, Point
from itlaudit.track.db import open_history
from itlaudit.track.publish import CLASS_COLOURS, MANIFEST, publish

pytestmark = pytest.mark.heavy  # Debian's chromium, driven by Playwright

CHROMIUM = Path("/usr/bin/chromium")
STEADY = {**FAMILY, "model": "steady"}
CULPRIT = f"0040{'c' * 36}"  # the slowdown's first bad build, as `track bisect` names it
COMPARE = f"https://github.com/vllm-project/vllm/compare/0039{'c' * 36}...{CULPRIT}"
UNBUILT = "0031cccc could not be built (wheel missing)"
# Set to write the docs' screenshot (docs/img/track-dashboard.png) from the page the tests open.
SCREENSHOT_ENV = "ITLAUDIT_DASHBOARD_SCREENSHOT"


@dataclass(frozen=True)
class Site:
    out: Path
    db: str
    points: list[Point]
    changes: list[Change]
    family: str  # the planted history's


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The two fingerprints' history, the slowdown at 40 bisected, published with the CLI."""
    tmp = tmp_path_factory.mktemp("dashboard")
    db = str(tmp / "history.sqlite")
    rng = np.random.default_rng(7)
    steady = [
        synthetic_point(STEADY, "K0", b, rng, itl_ms=30, acceptance=1, output_len=64) for b in range(1, 31)
    ]
    history = open_history(db)
    history.add_rows([*sixty_nightlies(0), *steady])
    slowdown = next(c for c in history.check() if c.order == 40)
    answer = {"first_bad": CULPRIT, "message": "first bad build found", "compare_url": COMPARE}
    history.record_bisect(slowdown.id, "found", CULPRIT, {**answer, "dir": str(tmp / "bisect-40")})
    cap = next(c for c in history.check() if c.order == 25)
    history.record_bisect(cap.id, "failed", None, {"message": UNBUILT, "dir": str(tmp / "bisect-25")})
    points, changes = history.points(), history.check()
    history.close()
    done = itlaudit("track", "publish", "--out", str(tmp / "site"), "--db", db)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("published 2 fingerprint page(s), 4 change(s)")
    family = slowdown.family
    return Site(tmp / "site", db, points, changes, family)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        pytest.fail("playwright is missing: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A tab that records every request it makes, every script error and every dialog (what a planted
    `alert()` opens): a page must fetch nothing but its own files, raise nothing and run no script
    but its own."""
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    seen: dict[str, list[str]] = {"requests": [], "errors": []}
    tab.on("request", lambda r: seen["requests"].append(r.url))
    tab.on("pageerror", lambda e: seen["errors"].append(str(e)))
    tab.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    tab.on("dialog", lambda d: (seen["errors"].append(f"dialog: {d.message}"), d.dismiss()))
    tab.seen = seen
    yield tab
    assert seen["errors"] == []
    assert [u for u in seen["requests"] if not u.startswith("file://")] == []
    tab.close()


def _open(page: Any, path: Path) -> None:
    page.goto(path.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.main-svg').length > 0")


# The SVG group plotly drew trace i of a figure into (d3 binds each group to its trace's calcdata).
_TRACE_GROUP = """const group = (gd, i) => [...gd.querySelectorAll('g.trace')].find(
    (g) => g.__data__ && g.__data__[0] && g.__data__[0].trace && g.__data__[0].trace.index === i);"""


def _drawn(page: Any, div: str) -> list[dict[str, Any]]:
    """Each trace of a figure: its meta, its x values, and how many markers and lines plotly drew."""
    return page.evaluate(
        f"""(div) => {{
            {_TRACE_GROUP}
            const gd = document.getElementById(div);
            const count = (g, selector) => (g ? g.querySelectorAll(selector).length : 0);  // empty: no group
            return gd.data.map((t, i) => ({{
                meta: t.meta || {{}},
                x: t.x || null,
                markers: count(group(gd, i), 'path.point'),
                lines: count(group(gd, i), 'path.js-line'),
            }}));
        }}""",
        div,
    )


def _centre(page: Any, trace: str, key: str, value: Any) -> tuple[float, float]:
    """Where on screen plotly drew the chart's marker whose `key` (x, customdata) is `value`, in the
    first trace whose meta matches `trace` (a JS predicate over meta)."""
    box = page.evaluate(
        f"""([key, value]) => {{
            {_TRACE_GROUP}
            const gd = document.getElementById('chart');
            const i = gd.data.findIndex((t) => t.meta && ({trace})(t.meta));
            const k = gd.data[i][key].indexOf(value);
            const r = [...group(gd, i).querySelectorAll('path.point')]
                .find((el) => el.__data__.i === k).getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        }}""",
        [key, value],
    )
    return float(box[0]), float(box[1])


def _family_page(site: Site) -> Path:
    return site.out / f"{site.family}.html"


def test_the_index_lists_each_fingerprint_with_its_sparkline_status_and_open_changes(
    site: Site, page: Any
) -> None:
    _open(page, site.out / "index.html")
    rows = page.query_selector_all("tr.fingerprint")
    families = {p.family for p in site.points}
    assert {r.get_attribute("data-family") for r in rows} == families
    status = {r.get_attribute("data-family"): r.query_selector(".status").inner_text() for r in rows}
    steady = next(f for f in families if f != site.family)
    assert status == {site.family: "2 open regression(s)", steady: "ok"}
    for family in families:
        lines = _drawn(page, f"spark-{family}")
        assert [t["meta"]["variant"] for t in lines] == sorted(
            {p.variant for p in site.points if p.family == family}
        )
        for trace in lines:
            valid = [
                p.order
                for p in site.points
                if p.family == family and p.variant == trace["meta"]["variant"] and p.validity == VALID
            ]
            assert sorted(x for x in trace["x"] if x is not None) == sorted(valid)
            assert trace["lines"] >= 1
    # The open regressions, each linked to its change on the fingerprint's page, with its bisect.
    table = page.query_selector_all("table.changes tr.change")
    assert [r.get_attribute("data-change") for r in table] == [
        c.id for c in site.changes if c.kind == "regression" and c.closed_by is None
    ]
    assert f"culprit {CULPRIT}" in table[0].inner_text() and "not bisected" in table[1].inner_text()


def test_the_fingerprint_page_draws_every_series_from_the_history(site: Site, page: Any) -> None:
    _open(page, _family_page(site))
    traces = _drawn(page, "chart")
    mine = [p for p in site.points if p.family == site.family]
    invalid = {(p.variant, p.order) for p in mine if p.validity != VALID}
    assert len(invalid) == 2 * 8  # builds 25–32, K0 and K3
    # The generated history has no server figures: no server series gets a row.
    assert not {t["meta"].get("series") for t in traces} & {spec.name for spec in SERVER_SERIES}
    for spec in STREAM_SERIES:
        drawn = {t["meta"]["variant"]: t for t in traces if t["meta"].get("series") == spec.name}
        assert set(drawn) == {"K0", "K3"}
        for variant, trace in drawn.items():
            valid = [p for p in mine if p.variant == variant and p.validity == VALID and p.values[spec.name]]
            assert trace["markers"] == len(valid), (spec.name, variant)
            # An invalid build is a hole in every series, never a (fast) value.
            assert not {(variant, x) for x in trace["x"]} & invalid
    # The speedup: K0's p50 over K3's wherever both were valid (each build of 55, less the 8 capped).
    speedup = next(t for t in traces if t["meta"].get("series") == "speedup")
    assert speedup["markers"] == len({p.order for p in mine if p.validity == VALID})
    # The validity lane: a cross for each invalid point, a dot for each valid one.
    crosses = [t for t in traces if t["meta"].get("kind") == "invalid"]
    assert sum(t["markers"] for t in crosses) == len(invalid)
    assert {(t["meta"]["variant"], x) for t in crosses for x in t["x"]} == invalid
    # One marker per change, one line per change and one shaded band over the capped builds.
    changes = [c for c in site.changes if c.family == site.family]
    marks = next(t for t in traces if t["meta"].get("kind") == "change")
    assert (marks["markers"], marks["x"]) == (len(changes), [c.order for c in changes])
    shapes = page.evaluate("() => document.getElementById('chart').layout.shapes")
    lines = [s for s in shapes if s["type"] == "line"]
    assert [(s["x0"] + 0.5, s["line"]["color"]) for s in lines] == [
        (c.order, CLASS_COLOURS[c.change_class]) for c in changes
    ]
    assert [(s["x0"], s["x1"]) for s in shapes if s["type"] == "rect"] == [(24.5, 32.5)]
    assert page.locator("path.point").count() > 0 and page.locator(".shapelayer path").count() >= 5


def _marker_centre(page: Any, order: int) -> tuple[float, float]:
    """Where on screen plotly drew the change marker at build `order`."""
    return _centre(page, "(m) => m.kind === 'change'", "x", order)


def _click(page: Any, x: float, y: float) -> None:
    """A person's click: the pointer rests on the marker first. plotly takes a click's point from its
    last hover, which it updates at most every 50 ms; a jump-and-click would click the previous one."""
    page.mouse.move(x, y, steps=3)
    page.wait_for_timeout(120)
    page.mouse.click(x, y)


def test_hovering_and_clicking_a_change_shows_its_culprit(site: Site, page: Any) -> None:
    _open(page, _family_page(site))
    x, y = _marker_centre(page, 40)
    page.mouse.move(x, y)
    hover = page.wait_for_selector(".hoverlayer .hovertext")
    assert "token ITL p50 of K0 worse from build" in hover.text_content()
    assert f"bisect: culprit {CULPRIT}" in hover.text_content()
    _click(page, x, y)
    detail = page.locator("#detail")
    assert "speed regression at build 40" in detail.inner_text()
    assert detail.locator(".culprit").inner_text() == f"bisect: culprit {CULPRIT}"
    assert detail.locator("a.culprit-commit").get_attribute("href") == (
        f"https://github.com/vllm-project/vllm/commit/{CULPRIT}"
    )
    assert detail.locator(f'a[href="{COMPARE}"]').count() == 1
    if os.environ.get(SCREENSHOT_ENV):
        target = Path(__file__).parent.parent / "docs" / "img" / "track-dashboard.png"
        target.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(target), clip={"x": 0, "y": 0, "width": 1400, "height": 1000})
    # The cap's bisection failed: the panel says how.
    _click(page, *_marker_centre(page, 25))
    assert detail.locator(".culprit").inner_text() == f"bisect: failed: {UNBUILT}"
    # The lost speedup at 50 is not bisected, and says how to.
    _click(page, *_marker_centre(page, 50))
    change = next(c for c in site.changes if c.order == 50)
    assert (
        detail.locator(".culprit").inner_text() == f"bisect: not bisected (itlaudit track bisect {change.id})"
    )


def test_clicking_a_point_shows_its_commit_and_per_request_distribution(site: Site, page: Any) -> None:
    _open(page, _family_page(site))
    point = next(p for p in site.points if p.family == site.family and p.variant == "K0" and p.order == 41)
    centre = _centre(page, "(m) => m.series === 'itl_p50' && m.variant === 'K0'", "customdata", point.id)
    _click(page, *centre)
    link = page.locator("#detail a.commit")
    assert link.get_attribute("href") == f"https://github.com/vllm-project/vllm/commit/0041{'c' * 36}"
    page.wait_for_function("() => document.querySelectorAll('#distribution path.point').length > 0")
    boxes = _drawn(page, "distribution")
    # This build's 16 requests beside the previous build's (40), each request one dot.
    assert [t["meta"]["point"] for t in boxes][-1] == point.id
    assert [t["markers"] for t in boxes] == [16, 16]


def test_dragging_zooms_every_row_and_a_change_row_focuses_it(site: Site, page: Any) -> None:
    _open(page, _family_page(site))
    before = page.evaluate("() => document.getElementById('chart')._fullLayout.xaxis.range.slice()")
    box = page.locator("#chart .draglayer .xy2 .nsewdrag").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.4, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=5)
    page.mouse.up()
    after = page.evaluate("() => document.getElementById('chart')._fullLayout.xaxis.range.slice()")
    assert after[1] - after[0] < (before[1] - before[0]) / 2
    # A row of the change list zooms onto its change and opens it.
    page.locator("table.changes tr.change").first.click()
    assert "speed regression at build 40" in page.locator("#detail").inner_text()


def test_publish_refuses_a_folder_it_did_not_write_and_replaces_its_own(site: Site, tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    done = itlaudit("track", "publish", "--out", str(foreign), "--db", site.db)
    assert done.returncode == 2
    assert "holds other files" in done.stderr and "Traceback" not in done.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    again = tmp_path / "again"
    shutil.copytree(site.out, again)
    (again / f"{'f' * 16}.html").write_text("a page of an earlier publish")
    manifest = json.loads((again / MANIFEST).read_text())
    manifest["pages"].append(f"{'f' * 16}.html")
    (again / MANIFEST).write_text(json.dumps(manifest))
    done = itlaudit("track", "publish", "--out", str(again), "--db", site.db)
    assert done.returncode == 0, done.stderr
    assert not (again / f"{'f' * 16}.html").exists()
    assert sorted(json.loads((again / MANIFEST).read_text())["pages"]) == sorted(
        f"{f}.html" for f in {p.family for p in site.points}
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--db", "{tmp}/empty.sqlite"], "the history holds no points"),
        (["--github-repo", "not a repo"], "--github-repo not a repo: give OWNER/NAME"),
        (["--sample-builds", "-1"], "--sample-builds -1: give 0 or more builds"),
    ],
)
def test_bad_publish_input_is_one_line_exit_2(site: Site, tmp_path: Path, args: list[str], says: str) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--db" not in args:
        args += ["--db", site.db]
    done = itlaudit("track", "publish", "--out", str(tmp_path / "site"), *args)
    assert done.returncode == 2
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_page_keeps_only_the_samples_asked_for_and_says_so(site: Site, page: Any, tmp_path: Path) -> None:
    """--sample-builds 0: only the builds around each change carry their requests; another build's
    panel says why it has none rather than drawing an empty distribution."""
    done = itlaudit(
        "track", "publish", "--out", str(tmp_path / "lean"), "--db", site.db, "--sample-builds", "0"
    )
    assert done.returncode == 0, done.stderr
    _open(page, tmp_path / "lean" / f"{site.family}.html")
    by_order = {p.order: p for p in site.points if p.family == site.family and p.variant == "K0"}
    k0 = "(m) => m.series === 'itl_p50' && m.variant === 'K0'"
    _click(page, *_centre(page, k0, "customdata", by_order[10].id))
    assert "raw samples of this build are not in the page" in page.locator("#distribution").inner_text()
    _click(page, *_centre(page, k0, "customdata", by_order[41].id))
    page.wait_for_function("() => document.querySelectorAll('#distribution path.point').length > 0")
    assert [t["markers"] for t in _drawn(page, "distribution")] == [16, 16]


# A history anyone could have written (issue 39 item 3): markup in every name and version it holds, and
# bisect answers whose compare_url is a `javascript:` URL or an http one that carries a quote. CI cost:
# ~6.5 s (the history built and published in-process, 0.5 s; three pages opened and clicked, ~2 s each).
HOSTILE_VARIANT = "<img src=x onerror=alert(1)>"
HOSTILE_VERSION = "<!--<script>"  # a server's /version: once made its page draw nothing
HOSTILE_MODELS = ("</script><script>alert(2)</script>", "<b onmouseover=alert(3)>bold</b>")
HOSTILE_COMMIT = '"><svg onload=alert(4)>'
HOSTILE_CULPRIT = "<img src=y onerror=alert(5)>"
JS_URL = "javascript:alert(6)"
QUOTED_URL = 'https://example.com/compare" onmouseover="alert(7)'


@dataclass(frozen=True)
class HostileSite:
    out: Path
    points: list[Point]
    urls: dict[str, str]  # family -> the compare_url its change's bisection holds


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> HostileSite:
    """Two fingerprints of 24 builds, K0 and a variant named with markup, 30 % slower from build 13
    (one change each, bisected), every version, commit and run folder holding markup; published."""
    tmp = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(11)
    points = []
    for model in HOSTILE_MODELS:
        for build in range(1, 25):
            for variant, itl in (("K0", 20.0), (HOSTILE_VARIANT, 9.0)):
                slow = 1.3 if build >= 13 else 1.0
                family = {**FAMILY, "model": model}
                made = synthetic_point(
                    family, variant, build, rng, itl_ms=itl * slow, acceptance=1, output_len=64
                )
                points.append(
                    replace(
                        made,
                        build_version=HOSTILE_VERSION,
                        build_commit=f"{HOSTILE_COMMIT}{build}",
                        run_dir="<script>alert(8)</script>",
                    )
                )
    history = open_history(str(tmp / "history.sqlite"))
    history.add_rows(points)
    changes = sorted(history.check(), key=lambda c: c.family)
    assert [c.order for c in changes] == [13, 13]
    urls = {}
    for change, url in zip(changes, (JS_URL, QUOTED_URL), strict=True):
        answer = {"message": "<script>alert(9)</script>", "compare_url": url, "dir": "<b>dir</b>"}
        history.record_bisect(change.id, "found", HOSTILE_CULPRIT, answer)
        urls[change.family] = url
    points = history.points()
    publish(history, tmp / "site")
    history.close()
    return HostileSite(tmp / "site", points, urls)


def _ran_nothing(page: Any) -> None:
    """No element carries an event handler, no link is a script, no planted image was fetched (the
    page fixture adds: no dialog, no script error, no request off disk)."""
    handlers = page.evaluate(
        """() => [...document.querySelectorAll('*')].filter((el) => [...el.attributes].some(
            (a) => a.name.startsWith('on') || /^\\s*javascript:/i.test(a.value))).length"""
    )
    assert handlers == 0
    assert page.locator("script").count() == 3  # plotly, the data, dashboard.js
    assert not [u for u in page.seen["requests"] if u.rsplit("/", 1)[-1] in ("x", "y")]


@pytest.mark.fault_row("R31")
def test_a_hostile_history_draws_its_index_as_text(hostile: HostileSite, page: Any) -> None:
    _open(page, hostile.out / "index.html")
    titles = page.locator("tr.fingerprint td:first-child").all_inner_texts()
    assert sorted(t.split(" · ")[0] for t in titles) == sorted(HOSTILE_MODELS)
    for family in hostile.urls:
        lines = _drawn(page, f"spark-{family}")
        assert len(lines) == 2 and all(t["lines"] >= 1 for t in lines)
    assert page.locator("table.changes tr.change").count() == 2
    _ran_nothing(page)


@pytest.mark.fault_row("R31")
@pytest.mark.parametrize("url", [JS_URL, QUOTED_URL])
def test_a_hostile_history_draws_every_panel_and_runs_no_script(
    hostile: HostileSite, page: Any, url: str
) -> None:
    """The chart draws every point of both variants; the change's panel shows its culprit and message
    as text, and its compare link only when it is http(s) (quote and all in its href), saying so when
    it is dropped; a point's panel shows its commit as text and draws its requests."""
    family = next(f for f, u in hostile.urls.items() if u == url)
    _open(page, hostile.out / f"{family}.html")
    mine = [p for p in hostile.points if p.family == family]
    names = {spec.name for spec in STREAM_SERIES}
    drawn = [t for t in _drawn(page, "chart") if t["meta"].get("series") in names]
    assert len(drawn) == 2 * len(STREAM_SERIES)
    assert [t["markers"] for t in drawn] == [len(mine) // 2] * len(drawn)
    assert HOSTILE_VARIANT in page.locator("#chart .legendtext").all_text_contents()
    _click(page, *_marker_centre(page, 13))
    detail = page.locator("#detail")
    assert detail.locator(".culprit").inner_text() == f"bisect: culprit {HOSTILE_CULPRIT}"
    if url == JS_URL:
        assert detail.locator("a.compare").count() == 0
        assert JS_URL in detail.locator(".dropped").inner_text()
        assert JS_URL in page.locator("body > p.dropped").inner_text()
    else:
        assert detail.locator("a.compare").get_attribute("href") == QUOTED_URL
        detail.locator("a.compare").hover()
        assert page.locator("p.dropped").count() == 0
    point = next(p for p in mine if p.variant == HOSTILE_VARIANT and p.order == 20)
    k3 = f"(m) => m.series === 'itl_p50' && m.variant === {json.dumps(HOSTILE_VARIANT)}"
    _click(page, *_centre(page, k3, "customdata", point.id))
    assert f"{HOSTILE_COMMIT}20" in detail.inner_text() and HOSTILE_VERSION in detail.inner_text()
    page.wait_for_function("() => document.querySelectorAll('#distribution path.point').length > 0")
    _ran_nothing(page)
