/* kubecell dashboard: draws the columnar payload of /api/snapshot with plotly.js and follows /api/stream.
 *
 * The payload's layout is documented in kubecell/scheduler/observe/web/payload.py. Events on the stream carry the small
 * part of each new snapshot (figures, VCs); the page records them in its history and fetches the full map
 * again only while it is visible, one fetch at a time. The element #map exposes what it shows for tests:
 * data-cycle (the snapshot drawn), data-allocated-gpus (GPUs with a share taken, whole cluster), and the
 * plot's own data (y = node names, x = GPU indices, customdata = milli-GPU allocated per cell).
 */
"use strict";
(() => {
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                   "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d"];
  const OTHER = "other", OTHER_COLOR = "#7f7f7f", FREE = "#e9ecf1";
  const HISTORY = 720;          // points kept per VC: 12 minutes at one update a second
  const MAX_TABLE_ROWS = 200;
  const params = new URLSearchParams(location.search);
  const ROWS = Math.max(1, parseInt(params.get("rows") || "50", 10) || 50);
  const PLOT_CONFIG = {displaylogo: false, responsive: true};

  const state = {
    payload: null, page: 0, filter: "", rows: [], colors: new Map(), history: [], lastKey: null,
    fetching: false, again: false, stale: false, drawMs: null, firstDrawnAt: null,
  };
  window.kubecell = state;

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const fmt = (x, d = 1) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
  const when = (t) => new Date(t * 1000).toLocaleTimeString();
  const keyOf = (s) => `${s.cycle}@${s.takenAt}`;

  function colorOf(name) {
    if (name === OTHER) return OTHER_COLOR;
    if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
    return state.colors.get(name);
  }

  function tint(hex, weight) {  // hex mixed with white; weight 1 = the colour itself
    const n = parseInt(hex.slice(1), 16);
    const mix = (c) => Math.round(255 - (255 - c) * weight);
    return `rgb(${mix((n >> 16) & 255)},${mix((n >> 8) & 255)},${mix(n & 255)})`;
  }

  function setConnection(text) { const el = $("connection"); el.textContent = text; el.dataset.state = text; }

  /* ---- figures, banner, history: from every update ---- */

  function applySummary(s) {
    const m = s.summary;
    $("card-allocated").textContent = `${fmt(m.allocatedGpus)} / ${m.totalGpus}`;
    $("card-fragmentation").textContent = `${fmt(100 * m.fragmentation)} %`;
    $("card-unallocated").textContent = fmt(m.unallocatedGpus);
    $("card-running").textContent = m.runningJobs;
    $("card-pending").textContent = m.pendingJobs;
    $("card-health").textContent = `${m.unhealthyGpus} · ${m.excludedNodes}`;
    $("status").textContent = `cycle ${s.cycle} · ${when(s.takenAt)} · ${s.leading ? "leading" : "standby"}`;
    const banner = $("banner");
    banner.hidden = !s.rebuilding;
    banner.textContent = s.rebuilding
      ? `The scheduler is rebuilding its state from the API server: showing its last snapshot (cycle ${s.cycle}, ` +
        `${when(s.takenAt)}) until it is done.` : "";
    const key = keyOf(s);
    if (key !== state.lastKey) {
      state.lastKey = key;
      const point = {t: new Date(s.takenAt * 1000), vcs: {}};
      s.vcs.name.forEach((name, i) => { point.vcs[name] = [s.vcs.allocated[i], s.vcs.guaranteed[i]]; });
      state.history.push(point);
      if (state.history.length > HISTORY) state.history.splice(0, state.history.length - HISTORY);
      drawHistory();
    }
    drawVcTable(s.vcs);
  }

  function drawHistory() {
    const names = [];
    for (const point of state.history) for (const name of Object.keys(point.vcs)) if (!names.includes(name)) names.push(name);
    const t = state.history.map((p) => p.t);
    const traces = [];
    for (const name of names) {  // plotly reads a trace name as its markup (<a href>, <span style>): escaped
      const color = colorOf(name);
      const series = (i) => state.history.map((p) => (p.vcs[name] ? p.vcs[name][i] : null));
      traces.push({x: t, y: series(0), name: `${esc(name)} allocated`, legendgroup: name, mode: "lines+markers",
                   marker: {size: 4}, line: {color, width: 2}, type: "scatter"});
      traces.push({x: t, y: series(1), name: `${esc(name)} guaranteed`, legendgroup: name, mode: "lines",
                   line: {color, width: 1.5, dash: "dash"}, type: "scatter"});
    }
    Plotly.react($("vc-history"), traces, {
      height: 320, margin: {l: 50, r: 10, t: 10, b: 40}, yaxis: {title: {text: "GPUs"}, rangemode: "tozero"},
      xaxis: {type: "date"}, legend: {orientation: "h", y: -0.2}, hovermode: "x unified",
    }, PLOT_CONFIG);
  }

  function fillTable(id, rows) {
    const body = $(id).tBodies[0];
    const fresh = document.createElement("tbody");
    for (const cells of rows) {
      const tr = document.createElement("tr");
      for (const [value, numeric] of cells) {
        const td = document.createElement("td");
        td.textContent = value;
        if (numeric) td.className = "num";
        tr.appendChild(td);
      }
      fresh.appendChild(tr);
    }
    body.replaceWith(fresh);
  }

  function drawVcTable(v) {
    fillTable("vc-table", v.name.map((name, i) => [[name], [fmt(v.guaranteed[i]), 1], [fmt(v.guaranteedInUse[i]), 1],
      [fmt(v.borrowed[i]), 1], [fmt(v.opportunistic[i]), 1], [v.running[i], 1], [v.pending[i], 1]]));
  }

  function drawTables(p) {
    const q = p.pending;
    $("queue-count").textContent = `(${p.summary.pendingJobs} waiting${q.job.length < p.summary.pendingJobs
      ? `, the first ${q.job.length} shown` : ""})`;
    fillTable("queue", q.job.slice(0, MAX_TABLE_ROWS).map((job, i) => [[job], [q.vc[i]], [q.pods[i], 1],
      [fmt(q.gpus[i], 2), 1], [`${fmt(q.waitingSeconds[i], 0)} s`, 1], [q.reasonKind[i]], [q.reason[i]]]));
    const d = p.decisions;
    fillTable("decisions", d.job.slice(0, MAX_TABLE_ROWS).map((job, i) => [[when(d.at[i])], [job], [d.vc[i]],
      [d.action[i]], [d.nodes[i].join(" ")], [d.gpus[i].join(" ")], [d.score[i] === null ? "–" : fmt(d.score[i], 3), 1],
      [d.detail[i]]]));
  }

  /* ---- the allocation map ---- */

  function nodeMatches(p, n, q) {
    if (p.nodes.name[n].toLowerCase().includes(q) || String(p.racks[p.nodes.rack[n]]).toLowerCase().includes(q)) return true;
    for (let g = p.nodes.gpuStart[n]; g < p.nodes.gpuStart[n + 1]; g++) {
      const o = p.gpus.owner[g];
      if (o >= 0 && p.vcNames[o].toLowerCase().includes(q)) return true;
      for (let k = p.gpus.podStart[g]; k < p.gpus.podStart[g + 1]; k++) {
        if (p.podNames[p.gpus.pods[k]].toLowerCase().includes(q)) return true;
      }
    }
    return false;
  }

  function selectRows() {
    const p = state.payload, q = state.filter.trim().toLowerCase();
    state.rows = [];
    for (let n = 0; n < p.nodes.name.length; n++) if (!q || nodeMatches(p, n, q)) state.rows.push(n);
  }

  function cellText(p, n, g, unhealthy) {
    const k = p.gpus.kind[g], o = p.gpus.owner[g];
    const owners = o < 0 ? "free" : [o, ...(p.coOwners[g] || [])].map((i) => p.vcNames[i]).join(", ");
    const pods = [];
    for (let j = p.gpus.podStart[g]; j < p.gpus.podStart[g + 1]; j++) pods.push(p.podNames[p.gpus.pods[j]]);
    const lines = [`<b>${esc(p.nodes.name[n])}</b> · GPU ${p.gpus.index[g]}`,
      `${esc(p.kinds.model[k])} (${p.kinds.memoryMib[k]} MiB)`,
      `${p.gpus.milli[g]} / ${p.kinds.milliTotal[k]} milli · ${p.gpus.memoryMib[g]} MiB taken`, `VC: ${esc(owners)}`];
    if (pods.length) lines.push(`pods: ${pods.slice(0, 6).map(esc).join(", ")}${pods.length > 6 ? ` +${pods.length - 6}` : ""}`);
    if (unhealthy) lines.push("<b>unhealthy</b>");
    if (p.excluded[n]) lines.push(`node excluded: ${esc(p.excluded[n])}`);
    return lines.join("<br>");
  }

  function colorscale(p) {
    const bands = p.vcNames.length + 1;  // band 0: free; band b: VC b-1, from a pale tint (a sliver) to full
    const scale = [[0, FREE], [0.999 / bands, FREE]];
    p.vcNames.forEach((name, i) => {
      const color = colorOf(name), b = i + 1;
      scale.push([b / bands, tint(color, 0.22)], [Math.min(1, (b + 0.999) / bands), tint(color, 1)]);
    });
    if (scale[scale.length - 1][0] < 1) scale.push([1, scale[scale.length - 1][1]]);
    return {scale, bands};
  }

  function drawMap() {
    if (!state.payload) return;
    const p = state.payload, started = performance.now();
    const pages = Math.max(1, Math.ceil(state.rows.length / ROWS));
    state.page = Math.max(0, Math.min(state.page, pages - 1));
    const shown = state.rows.slice(state.page * ROWS, (state.page + 1) * ROWS);
    const unhealthy = new Set(p.unhealthy);
    let width = 1;
    for (const n of shown) {
      for (let g = p.nodes.gpuStart[n]; g < p.nodes.gpuStart[n + 1]; g++) width = Math.max(width, p.gpus.index[g] + 1);
    }
    const z = [], text = [], milli = [], names = [], marks = {x: [], y: [], text: []}, cut = {x: [], y: [], text: []};
    for (const n of shown) {
      const name = p.nodes.name[n];
      const zr = new Array(width).fill(null), tr = new Array(width).fill(""), mr = new Array(width).fill(null);
      for (let g = p.nodes.gpuStart[n]; g < p.nodes.gpuStart[n + 1]; g++) {
        const i = p.gpus.index[g], k = p.gpus.kind[g], o = p.gpus.owner[g];
        const share = Math.max(p.gpus.milli[g] / p.kinds.milliTotal[k],
                               p.kinds.memoryMib[k] ? p.gpus.memoryMib[g] / p.kinds.memoryMib[k] : 0);
        zr[i] = o < 0 ? 0 : o + 1 + 0.999 * Math.min(1, share);
        mr[i] = p.gpus.milli[g];
        tr[i] = cellText(p, n, g, unhealthy.has(g));
        if (unhealthy.has(g)) { marks.x.push(i); marks.y.push(name); marks.text.push(tr[i]); }
      }
      if (p.excluded[n]) { cut.x.push(-0.8); cut.y.push(name); cut.text.push(`${esc(name)}: ${esc(p.excluded[n])}`); }
      z.push(zr); text.push(tr); milli.push(mr); names.push(name);
    }
    const {scale, bands} = colorscale(p);
    const traces = [
      {type: "heatmap", z, x: [...Array(width).keys()], y: names, text, customdata: milli, zmin: 0, zmax: bands,
       colorscale: scale, showscale: false, xgap: 1, ygap: 1, hovertemplate: "%{text}<extra></extra>", name: "GPUs"},
      {type: "scatter", mode: "markers", x: marks.x, y: marks.y, text: marks.text, name: "unhealthy",
       hovertemplate: "%{text}<extra></extra>", marker: {symbol: "x-thin-open", size: 11, color: "#111",
       line: {width: 2, color: "#111"}}, showlegend: false},
      {type: "scatter", mode: "markers", x: cut.x, y: cut.y, text: cut.text, name: "excluded",
       hovertemplate: "%{text}<extra></extra>", marker: {symbol: "circle-x-open", size: 11, color: "#b91c1c"},
       showlegend: false},
    ];
    const height = Math.max(160, 60 + 15 * shown.length);
    $("map").style.height = `${height}px`;  // plotly's responsive mode sizes the plot to its box: give it one
    const layout = {
      height, margin: {l: 110, r: 10, t: 30, b: 20},
      xaxis: {side: "top", tickmode: "array", tickvals: [...Array(width).keys()], range: [-1.1, width - 0.5],
              title: {text: "GPU", standoff: 2}, zeroline: false, showgrid: false, fixedrange: true},
      yaxis: {type: "category", autorange: "reversed", tickfont: {size: 10}, showgrid: false, fixedrange: true},
      plot_bgcolor: "#fff", hoverlabel: {align: "left"},
    };
    Plotly.react($("map"), traces, layout, PLOT_CONFIG);
    const map = $("map");
    map.dataset.cycle = String(p.cycle);
    map.dataset.allocatedGpus = String(p.summary.allocatedCells);
    map.dataset.shownNodes = String(shown.length);
    $("page-label").textContent = state.rows.length
      ? `nodes ${state.page * ROWS + 1}–${state.page * ROWS + shown.length} of ${state.rows.length} (page ${state.page + 1}/${pages})`
      : "no node matches";
    drawOverview(pages);
    drawLegend(p);
    state.drawMs = performance.now() - started;
  }

  function drawOverview(pages) {
    const el = $("overview"), p = state.payload;
    el.hidden = pages <= 1;
    if (pages <= 1) return;
    const z = [], text = [];
    for (let page = 0; page < pages; page++) {
      const zr = new Array(ROWS).fill(null), tr = new Array(ROWS).fill("");
      for (let j = 0; j < ROWS; j++) {
        const n = state.rows[page * ROWS + j];
        if (n === undefined) break;
        let taken = 0, total = 0;
        for (let g = p.nodes.gpuStart[n]; g < p.nodes.gpuStart[n + 1]; g++) {
          taken += p.gpus.milli[g]; total += p.kinds.milliTotal[p.gpus.kind[g]];
        }
        zr[j] = total ? taken / total : 0;
        tr[j] = `${esc(p.nodes.name[n])}: ${fmt(100 * zr[j], 0)} % allocated · page ${page + 1}`;
      }
      z.push(zr); text.push(tr);
    }
    const height = Math.min(200, Math.max(70, 24 + 3 * pages));
    el.style.height = `${height}px`;
    Plotly.react(el, [{type: "heatmap", z, text, zmin: 0, zmax: 1, colorscale: [[0, "#f1f3f6"], [1, "#1e3a8a"]],
      showscale: false, hovertemplate: "%{text}<extra></extra>"}], {
      height, margin: {l: 110, r: 10, t: 4, b: 4},
      xaxis: {visible: false, fixedrange: true}, yaxis: {autorange: "reversed", visible: false, fixedrange: true},
      shapes: [{type: "rect", xref: "paper", x0: 0, x1: 1, y0: state.page - 0.5, y1: state.page + 0.5,
                line: {color: "#d97706", width: 2}}],
    }, PLOT_CONFIG);
    if (!el.dataset.bound) {
      el.dataset.bound = "1";
      el.on("plotly_click", (ev) => { state.page = ev.points[0].y; drawMap(); });
    }
  }

  function drawLegend(p) {
    const legend = $("legend");
    legend.replaceChildren(...[...p.vcNames, "free"].map((name) => {
      const span = document.createElement("span"), swatch = document.createElement("i");
      swatch.style.background = name === "free" ? FREE : colorOf(name);
      span.append(swatch, name);
      return span;
    }));
  }

  /* ---- loading and following ---- */

  function render(p) {
    state.payload = p;
    applySummary(p);
    selectRows();
    drawMap();
    drawTables(p);
    if (state.firstDrawnAt === null) {
      state.firstDrawnAt = performance.now();
      document.body.dataset.drawnMs = String(Math.round(state.firstDrawnAt));
    }
  }

  async function refresh() {
    if (state.fetching) { state.again = true; return; }
    state.fetching = true;
    try {
      do {
        state.again = false;
        const answer = await fetch("/api/snapshot", {cache: "no-store"});
        if (!answer.ok) {
          const body = await answer.json().catch(() => ({detail: answer.statusText}));
          const banner = $("banner");
          banner.hidden = false;
          banner.textContent = `No snapshot to show: ${body.detail || body.error}`;
          break;
        }
        render(await answer.json());
      } while (state.again);
    } catch (error) {
      setConnection("reconnecting");
    } finally {
      state.fetching = false;
    }
  }

  function follow() {
    const stream = new EventSource("/api/stream");
    stream.onopen = () => setConnection("live");
    stream.onerror = () => setConnection("reconnecting");
    stream.addEventListener("snapshot", (event) => {
      setConnection("live");
      const s = JSON.parse(event.data);
      applySummary(s);
      if (state.payload && keyOf(s) === keyOf(state.payload)) return;
      if (document.hidden) state.stale = true; else refresh();
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && state.stale) { state.stale = false; refresh(); }
    });
  }

  function controls() {
    let timer = null;
    $("filter").addEventListener("input", (event) => {
      clearTimeout(timer);
      timer = setTimeout(() => { state.filter = event.target.value; state.page = 0; selectRows(); drawMap(); }, 200);
    });
    $("prev").addEventListener("click", () => { state.page -= 1; drawMap(); });
    $("next").addEventListener("click", () => { state.page += 1; drawMap(); });
  }

  controls();
  refresh().then(follow);
})();
