// itlaudit track publish: draws the page's plotly figures and opens the detail panel on a click.
// Everything it reads is in the page (#dashboard-data); nothing is fetched, so a page opens from disk.
// Every string comes from a history someone else may have written: each goes into the HTML through
// esc() (attributes included), and a link only through link(), which takes http(s) URLs alone.
"use strict";
(function () {
  const blob = JSON.parse(document.getElementById("dashboard-data").textContent);
  const page = blob.page;
  const figures = blob.figures;

  const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function esc(text) {
    const shown = text === null || text === undefined ? "–" : String(text);
    return shown.replace(/[&<>"']/g, (c) => ENTITIES[c]);
  }

  // An <a> to an http(s) URL, or the label alone: publish drops other schemes, and this holds anyway.
  function link(url, label, cls) {
    if (typeof url !== "string" || !/^https?:\/\//i.test(url)) return null;
    return `<a${cls ? ` class="${cls}"` : ""} href="${esc(url)}">${esc(label)}</a>`;
  }

  function fmt(value) {
    return value === null || value === undefined ? "–" : Number(value).toPrecision(4);
  }

  for (const [id, fig] of Object.entries(figures)) {
    const div = document.getElementById(id);
    if (div) Plotly.newPlot(div, fig.data, fig.layout, fig.config);
  }
  if (page.index) return;

  const chart = document.getElementById("chart");
  const detail = document.getElementById("detail");

  // The points of one variant in build order, to find the previous one a distribution is set beside.
  function previous(point) {
    let best = null;
    for (const p of Object.values(page.points)) {
      if (p.variant !== point.variant || p.validity !== "" || p.order >= point.order) continue;
      if (!page.samples[p.id]) continue;
      if (best === null || p.order > best.order) best = p;
    }
    return best;
  }

  function showPoint(id, sample) {
    const p = page.points[id];
    if (!p) return;
    const commit = link(p.commit_url, p.commit, "commit") || esc(p.commit);
    const values = Object.entries(p.values)
      .map(([k, v]) => `<tr><td>${esc(k)}</td><td>${fmt(v)}</td></tr>`)
      .join("");
    const validity = p.validity === "" ? "valid" : `<b class="bad">not a measurement: ${esc(p.reason || p.validity)}</b>`;
    detail.innerHTML =
      `<h3>${esc(p.variant)} · build ${esc(p.order)}</h3>` +
      `<p>${esc(p.build)}${p.flavour ? " (" + esc(p.flavour) + ")" : ""}<br>commit ${commit}<br>${validity}<br>` +
      `${esc(p.requests)} requests, ${esc(p.errors)} errors` +
      `${p.run_dir ? "<br>run folder <code>" + esc(p.run_dir) + "</code>" : ""}</p>` +
      `<div id="distribution" class="distribution"></div><table class="values">${values}</table>`;
    const mine = page.samples[id];
    const dist = document.getElementById("distribution");
    if (!mine || !mine[sample]) {
      dist.innerHTML = "<p class=\"none\">raw samples of this build are not in the page (publish keeps the newest builds and those around each change: --sample-builds)</p>";
      return;
    }
    const boxes = [];
    const before = previous(p);
    if (before) {
      boxes.push({
        type: "box", y: page.samples[before.id][sample], name: `build ${before.order}`,
        boxpoints: "all", jitter: 0.4, pointpos: 0, marker: { size: 4, color: "#9e9e9e" },
        meta: { kind: "distribution", point: before.id },
      });
    }
    boxes.push({
      type: "box", y: mine[sample], name: `build ${p.order}`,
      boxpoints: "all", jitter: 0.4, pointpos: 0, marker: { size: 4, color: "#1f77b4" },
      meta: { kind: "distribution", point: p.id },
    });
    Plotly.newPlot(dist, boxes, {
      height: 260, margin: { l: 50, r: 10, t: 30, b: 30 }, showlegend: false,
      title: { text: `${page.labels[sample] || sample} per request`, font: { size: 12 } },
    }, { displaylogo: false });
  }

  function showChange(index) {
    const c = page.changes[index];
    if (!c) return;
    const evidence = c.evidence
      .map((e) => `<tr><td>${esc(e.variant)}</td><td>${esc(e.series)}</td><td>${fmt(e.before)} → ${fmt(e.after)}</td>` +
        `<td>${e.ratio === null ? "–" : Number(e.ratio).toFixed(2) + "×"}</td><td>${e.p_value === null ? "–" : Number(e.p_value).toExponential(1)}</td></tr>`)
      .join("");
    const signals = Object.entries(c.signals)
      .map(([k, v]) => `<li>${esc(k)}: ${esc(typeof v === "number" ? fmt(v) : v)}</li>`).join("");
    const culprit = link(c.culprit_url, "the culprit's commit", "culprit-commit");
    const range = link(c.compare_url, "every commit of the answer range", "compare");
    const dropped = (c.dropped || []).map((d) => `<p class="dropped">link not drawn: ${esc(d)}</p>`).join("");
    detail.innerHTML =
      `<h3 style="border-left:6px solid ${esc(c.colour)};padding-left:6px">${esc(c.class)} ${esc(c.kind)} at build ${esc(c.order)}</h3>` +
      `<p class="summary">${esc(c.summary)}</p>` +
      `<p>state: ${esc(c.state)}${c.closed_by ? ", closed by " + esc(c.closed_by) : ""}<br>` +
      `last good: ${esc(c.last_good_build)}<br>id <code>${esc(c.id)}</code></p>` +
      `<p class="culprit">bisect: ${esc(c.bisect || "not bisected (itlaudit track bisect " + c.id + ")")}</p>` +
      (culprit ? `<p>${culprit}</p>` : "") +
      (range ? `<p>${range}</p>` : "") +
      dropped +
      (c.bisect_dir ? `<p>bisect folder <code>${esc(c.bisect_dir)}</code></p>` : "") +
      (evidence ? `<table class="values"><tr><th>variant</th><th>series</th><th>median</th><th>ratio</th><th>p</th></tr>${evidence}</table>` : "") +
      (signals ? `<ul class="signals">${signals}</ul>` : "");
  }

  function focusChange(index) {
    const c = page.changes[index];
    if (!c) return;
    const from = c.last_good_order === null ? c.order - 10 : Math.min(c.last_good_order, c.order) - 10;
    Plotly.relayout(chart, { "xaxis.range": [from, c.order + 10] });
    showChange(index);
  }

  chart.on("plotly_click", (event) => {
    const hit = event.points[0];
    const meta = hit.data.meta || {};
    if (meta.kind === "change") showChange(hit.customdata);
    else if (meta.kind === "point" || meta.kind === "invalid") showPoint(hit.customdata, meta.sample);
  });

  document.querySelectorAll("tr.change").forEach((row) => {
    row.addEventListener("click", () => {
      focusChange(page.changes.findIndex((c) => c.id === row.dataset.change));
    });
  });

  const wanted = location.hash.startsWith("#change-") ? location.hash.slice(8) : null;
  if (wanted) focusChange(page.changes.findIndex((c) => c.id === wanted));
})();
