/* serve/web/app.js: the dashboard (docs/dashboard.md). One script draws every page, from
 * JSON fetched from nas serve's API or, in a file written by `nas plot`, from the same JSON
 * inlined as window.NAS_DATA: one rendering path for both.
 *
 * Pages (the URL's #fragment): #/ experiments, #/e/NAME one experiment, #/e/NAME/t/N one
 * trial, #/compare/A,B,… several experiments. Charts are Chart.js (built into nas). After
 * drawing, elements carry what they show as data-* attributes (data-points, data-front,
 * data-rows, …) and <body> data-ready names the page drawn ("token" when it asks for a
 * token): the end-to-end test reads them.
 * Everything is built with textContent, never innerHTML: names, errors and logs are data. */
"use strict";
(function () {
  const inlined = window.NAS_DATA || null;
  /* The script runs in the page's <head>, before Chart.js and the body: it asks for the
   * page's data at once, and draws once the document (and so Chart.js) is there. */
  const documentReady = new Promise((resolve) => (document.readyState === "loading"
    ? document.addEventListener("DOMContentLoaded", resolve) : resolve()));
  let app = null;
  const POLL_MS = 3000;        /* live updates while an experiment runs */
  /* A live page whose poll got no answer retries after this long, doubling up to the most. */
  const RETRY_FIRST_MS = 3000, RETRY_MOST_MS = 30000;
  const TABLE_PAGE = 200;      /* rows of the trial table shown at once */
  const page = { charts: [], timer: null, token: 0 };
  const tableState = { sort: "number", desc: false, filter: "", status: "", shown: TABLE_PAGE };

  /* ---- small helpers ------------------------------------------------------------------ */

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else if (k === "class") el.className = v;
      else el.setAttribute(k, v);
    }
    for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
    return el;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return String(+v.toPrecision(5));
  }
  /* A time as YYYY-MM-DD HH:MM:SS, or briefly (for tables) MM-DD HH:MM. */
  function when(t, brief) {
    if (!t) return "–";
    const d = new Date(t * 1000), p = (n) => String(n).padStart(2, "0");
    const day = `${p(d.getMonth() + 1)}-${p(d.getDate())}`, time = `${p(d.getHours())}:${p(d.getMinutes())}`;
    return brief ? `${day} ${time}` : `${d.getFullYear()}-${day} ${time}:${p(d.getSeconds())}`;
  }
  function seconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  const enc = encodeURIComponent;
  /* Resolves once the next frame has been rendered, or after a second without frames (a
   * hidden tab renders none). */
  const nextFrame = () => new Promise((resolve) => {
    requestAnimationFrame(() => setTimeout(resolve, 0));
    setTimeout(resolve, 1000);
  });
  function badge(text) { return h("span", { class: "badge " + text }, text); }
  /* A colour from a value in [0, 1]: dark blue (0) over teal to yellow (1), readable on white. */
  function ramp(t) {
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const x = Math.min(Math.max(t, 0), 1) * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    const c = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  const PALETTE = ["#2f6fde", "#d1495b", "#00a087", "#edae49", "#6a4c93", "#3c8dad", "#8a5a44", "#e07a5f"];

  /* ---- data ----------------------------------------------------------------------------- */

  /* ---- the token (nas serve --token-file) ----------------------------------------------
   * Kept for the browser tab in sessionStorage and sent as a bearer header, never in a URL
   * the page asks for. A link may carry one in its fragment (#token=T, or #/e/NAME?token=T):
   * it is moved into sessionStorage and taken out of the address bar (and so out of the
   * tab's history) before anything is asked for. Fragments never reach a server. */
  const TOKEN_KEY = "nas-token";
  /* A part of the address as its text; a malformed %-escape (a hand-made link) as written,
   * rather than an exception that would leave the page on "Loading…". */
  function decoded(text) {
    try {
      return decodeURIComponent(text);
    } catch (e) {
      return text;
    }
  }
  function takeTokenFromFragment() {
    const hash = location.hash, at = hash.search(/(^#|\?)token=/);
    if (at < 0) return;
    const token = decoded(hash.slice(hash.indexOf("token=", at) + 6)).trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    const route = at === 0 ? "" : hash.slice(0, at);
    history.replaceState(null, "", location.pathname + location.search + route);
  }
  /* Thrown by api() on a 401: the page then asks for a token (tokenPage). */
  class TokenNeeded extends Error {}
  /* Thrown by api() for what usually passes: no whole answer came (the server is down or
   * restarting, the network failed), a gateway in front of it said so (502-504), or the
   * server failed (500: a database busy or restarting). A live page keeps what it shows and
   * tries again (show); its message is what the header says. Every other failure (4xx) is
   * the server's answer. */
  class TryAgain extends Error {}

  async function api(path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    let resp;
    try {
      resp = await fetch("api/v1/" + path, { headers: token ? { Authorization: "Bearer " + token } : {} });
    } catch (err) {
      throw new TryAgain("connection lost");
    }
    if (resp.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      throw new TokenNeeded(token ? "That token was refused." : "");
    }
    if (resp.status >= 502 && resp.status <= 504) throw new TryAgain("connection lost");
    const body = await resp.json().catch(() => null);
    if (body === null && resp.ok) throw new TryAgain("the answer was cut off");
    const why = (body && body.error) || resp.statusText;
    if (resp.status === 500) throw new TryAgain(`server error (${why})`);
    if (!resp.ok) throw new Error(why);
    return body;
  }

  /* The trials of a dashboard answer (columns) as rows, once per answer. */
  function trialRows(d) {
    if (d._rows) return d._rows;
    const t = d.trials, rows = [];
    for (let i = 0; i < t.number.length; i++) {
      const row = { i, number: t.number[i], status: t.status[i], attempts: t.attempts[i], duration: t.duration[i] };
      if (t.rung) row.rung = t.rung[i];
      for (const m of d.metrics) row["m:" + m] = t.metrics[m][i];
      for (const p of d.params) row["p:" + p] = t.params[p][i];
      rows.push(row);
    }
    d._rows = rows;
    return rows;
  }
  /* Objective value in its own direction, or null. */
  const objectiveOf = (d, j, i) => d.trials.metrics[d.objectives[j].name][i];
  /* Whether a is better than b for objective j. */
  const better = (d, j, a, b) => d.objectives[j].goal === "maximize" ? a > b : a < b;

  /* ---- charts --------------------------------------------------------------------------- */

  function chart(container, config) {
    const canvas = h("canvas");
    container.append(canvas);
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false,
                                     normalized: true }, config.options || {});
    const c = new Chart(canvas, config);
    page.charts.push(c);
    return c;
  }
  const WHOLE = () => ({ ticks: { precision: 0 } }); /* an axis of steps or counts: whole ticks only */
  function axis(title, extra) {
    return Object.assign({ type: "linear", title: { display: !!title, text: title } }, extra || {});
  }
  /* Tooltip and click for points that stand for trials: trialAt(datasetIndex, index) → number. */
  function trialEvents(d, trialAt, label) {
    return {
      onClick: (ev, elements) => {
        if (!elements.length || inlined) return;
        const n = trialAt(elements[0].datasetIndex, elements[0].index);
        if (n !== null && n !== undefined) location.hash = `#/e/${enc(d.experiment.name)}/t/${n}`;
      },
      onHover: (ev, elements) => { ev.native.target.style.cursor = elements.length && !inlined ? "pointer" : "default"; },
      plugins: { tooltip: { callbacks: { label: (ctx) => {
        const n = trialAt(ctx.datasetIndex, ctx.dataIndex);
        return n === null || n === undefined ? `${ctx.dataset.label}: ${fmt(ctx.parsed.y)}` : label(n, ctx);
      } } } },
    };
  }
  /* How many points of a drawn chart lie outside its axes' bounds (none should). */
  function pointsOffScale(c) {
    const { x, y } = c.scales;
    let n = 0;
    for (const set of c.data.datasets)
      for (const p of set.data) if (p.x < x.min || p.x > x.max || p.y < y.min || p.y > y.max) n++;
    return n;
  }
  /* Segments (arrays of {x, y}) as one dataset's points, separated by gaps: thousands of
   * curves draw as a few datasets. owner[k] is the trial of point k. */
  function segments(list) {
    const data = [], owner = [];
    for (const s of list) {
      for (const p of s.points) { data.push(p); owner.push(s.trial); }
      data.push({ x: NaN, y: null }); owner.push(null);
    }
    return { data, owner };
  }

  /* ---- one experiment: each chart ------------------------------------------------------------ */

  /* The Pareto front: every completed trial, the front (a line) and the reference point;
   * with 3+ objectives, one such chart per pair of objectives. */
  function frontCard(d) {
    const card = h("section", { class: "card" + (d.objectives.length > 2 ? " wide" : ""), id: "chart-front" },
                   h("h2", {}, "Pareto front"));
    const front = d.pareto.front, onFront = new Set(front.map((r) => r.trial));
    const rows = trialRows(d).filter((r) => r.status === "completed");
    card.dataset.front = front.length;
    card.dataset.points = rows.length;
    if (d.objectives.length < 2) {
      card.append(h("p", { class: "muted" }, `One objective: the front is the best trial (${front.length ? "trial " + front[0].trial : "none yet"}).`));
      return card;
    }
    const pairs = [];
    const offscale = []; /* per pair of objectives: trials drawn outside its chart's axes */
    for (let a = 0; a < d.objectives.length; a++)
      for (let b = a + 1; b < d.objectives.length; b++) pairs.push([a, b]);
    const holder = pairs.length > 1 ? h("div", { class: "pairs", style: `grid-template-columns: repeat(${Math.min(pairs.length, 3)}, 1fr)` }) : card;
    if (holder !== card) card.append(holder);
    for (const [a, b] of pairs) {
      const na = d.objectives[a].name, nb = d.objectives[b].name;
      /* Sorted by x: Chart.js takes data that skips parsing as sorted along x and sizes that
       * axis from its first and last points, so trials in their own order fell off the chart. */
      const others = rows.filter((r) => !onFront.has(r.number) && r["m:" + na] !== null && r["m:" + nb] !== null)
        .sort((p, q) => p["m:" + na] - q["m:" + na]);
      const line = front.map((r) => ({ x: r[na], y: r[nb], t: r.trial })).sort((p, q) => p.x - q.x);
      const ref = d.pareto.reference_point;
      /* Every trial's point is drawn without an outline (borderWidth 0; here and in the
       * objectives' charts): stroking 10 000 circles triples the drawing time. Its {x, y}
       * need no parsing (parsing: false, a third less time). */
      const sets = [
        { label: "trials", data: others.map((r) => ({ x: r["m:" + na], y: r["m:" + nb] })), owner: others.map((r) => r.number),
          backgroundColor: "rgba(95,107,122,0.35)", pointRadius: 2.5, pointHoverRadius: 5, borderWidth: 0, parsing: false },
        /* Joined by a line only with two objectives: a projection of a 3-D front is no curve. */
        { label: "front", data: line.map((p) => ({ x: p.x, y: p.y })), owner: line.map((p) => p.t), showLine: pairs.length === 1,
          borderColor: "#d1495b", backgroundColor: "#d1495b", pointRadius: 4, pointHoverRadius: 7, borderWidth: 2 },
        { label: "reference point", data: ref && ref[na] !== undefined ? [{ x: ref[na], y: ref[nb] }] : [], owner: [null],
          pointStyle: "crossRot", pointRadius: 9, borderWidth: 2, borderColor: "#1d2430", backgroundColor: "#1d2430" },
      ];
      const box = h("div", { class: "chart" });
      holder.append(box);
      /* The axes exist once the chart is laid out in the page: count then what they leave out. */
      const pair = offscale.length;
      offscale.push(0);
      const countOffScale = { id: "offscale", afterUpdate: (c) => {
        offscale[pair] = pointsOffScale(c);
        card.dataset.offscale = offscale.reduce((sum, n) => sum + n, 0);
      } };
      chart(box, { type: "scatter", data: { datasets: sets }, plugins: [countOffScale], options: Object.assign({
        scales: { x: axis(`${na} (${d.objectives[a].goal})`), y: axis(`${nb} (${d.objectives[b].goal})`) },
      }, trialEvents(d, (ds, k) => sets[ds].owner[k], (n, ctx) => `trial ${n}: ${na}=${fmt(ctx.parsed.x)}, ${nb}=${fmt(ctx.parsed.y)}`)) });
    }
    return card;
  }

  function hypervolumeCard(d) {
    const hist = d.hypervolume_history;
    const card = h("section", { class: "card", id: "chart-hypervolume", "data-points": hist.completed.length },
                   h("h2", {}, "Hypervolume over completed trials"));
    const box = h("div", { class: "chart" });
    card.append(box);
    const data = hist.completed.map((k, i) => ({ x: k, y: hist.hypervolume[i] }));
    chart(box, { type: "line", data: { datasets: [{ label: "hypervolume", data, borderColor: "#2f6fde",
      backgroundColor: "rgba(47,111,222,0.12)", fill: true, pointRadius: data.length > 60 ? 0 : 2, stepped: true }] },
      options: Object.assign({ scales: { x: axis("completed trials", WHOLE()), y: axis("hypervolume") } },
        trialEvents(d, (ds, k) => hist.trial[k], (n, ctx) => `after trial ${n}: ${fmt(ctx.parsed.y)}`)) });
    return card;
  }

  /* Each objective over trial numbers, with the best value so far. */
  function objectivesCard(d) {
    const card = h("section", { class: "card" + (d.objectives.length > 1 ? " wide" : ""), id: "chart-objectives" },
                   h("h2", {}, "Objectives over trials (best so far)"));
    const holder = h("div", { class: "pairs", style: `grid-template-columns: repeat(${Math.min(d.objectives.length, 3)}, 1fr)` });
    card.append(holder);
    const rows = trialRows(d).filter((r) => r.status === "completed");
    d.objectives.forEach((o, j) => {
      const points = rows.filter((r) => r["m:" + o.name] !== null);
      let best = null;
      const bestLine = points.map((r) => {
        const v = r["m:" + o.name];
        if (best === null || better(d, j, v, best)) best = v;
        return { x: r.number, y: best };
      });
      const sets = [
        { label: o.name, data: points.map((r) => ({ x: r.number, y: r["m:" + o.name] })), owner: points.map((r) => r.number),
          backgroundColor: "rgba(47,111,222,0.45)", pointRadius: 2.5, borderWidth: 0, parsing: false },
        { label: "best so far", data: bestLine, owner: [], showLine: true, stepped: true, pointRadius: 0,
          borderColor: "#d1495b", borderWidth: 2 },
      ];
      const box = h("div", { class: "chart", "data-points": points.length });
      holder.append(box);
      chart(box, { type: "scatter", data: { datasets: sets }, options: Object.assign({
        scales: { x: axis("trial", WHOLE()), y: axis(`${o.name} (${o.goal})`) },
      }, trialEvents(d, (ds, k) => (ds === 0 ? sets[0].owner[k] : null), (n, ctx) => `trial ${n}: ${o.name}=${fmt(ctx.parsed.y)}`)) });
    });
    return card;
  }

  /* Learning curves of one intermediate metric; early-stopped trials in red. */
  function curvesCard(d) {
    const card = h("section", { class: "card wide", id: "chart-curves" }, h("h2", {}, "Learning curves (intermediate values)"));
    if (!d.curves) {
      card.append(h("p", { class: "muted" }, "Loading…"));
      return card;
    }
    const names = Object.keys(d.curves);
    if (!names.length) {
      card.dataset.curves = 0;
      card.append(h("p", { class: "muted" }, "No trial reported intermediate values (reports with a step)."));
      return card;
    }
    const objectiveNames = d.objectives.map((o) => o.name);
    const metric = names.find((n) => objectiveNames.includes(n)) || names[0];
    const c = d.curves[metric], statusOf = new Map(trialRows(d).map((r) => [r.number, r.status]));
    const all = c.trial.map((t, k) => ({ trial: t, points: c.steps[k].map((s, i) => ({ x: s, y: c.values[k][i] })) }));
    const stopped = all.filter((s) => statusOf.get(s.trial) === "stopped"), others = all.filter((s) => statusOf.get(s.trial) !== "stopped");
    const a = segments(others), b = segments(stopped);
    card.dataset.curves = all.length;
    card.dataset.stopped = stopped.length;
    const sets = [
      { label: `${metric} (${others.length} trials)`, data: a.data, owner: a.owner, borderColor: "rgba(47,111,222,0.55)", backgroundColor: "rgba(47,111,222,0.55)", borderWidth: 1.2, pointRadius: 0, pointHitRadius: 4 },
      { label: `early-stopped (${stopped.length})`, data: b.data, owner: b.owner, borderColor: "rgba(209,73,91,0.9)", backgroundColor: "rgba(209,73,91,0.9)", borderWidth: 1.5, borderDash: [5, 3], pointRadius: 0, pointHitRadius: 4 },
    ];
    const box = h("div", { class: "chart" });
    card.append(box);
    chart(box, { type: "line", data: { datasets: sets }, options: Object.assign({
      spanGaps: false, scales: { x: axis("step", WHOLE()), y: axis(metric) }, interaction: { mode: "nearest", intersect: false },
    }, trialEvents(d, (ds, k) => sets[ds].owner[k], (n, ctx) => `trial ${n}, step ${ctx.parsed.x}: ${fmt(ctx.parsed.y)}`)) });
    return card;
  }

  /* Parallel coordinates: each trial a line over the parameters' axes (normalised to [0, 1];
   * categories spread evenly) and the first objective's, coloured by that objective. */
  function parallelCard(d) {
    const card = h("section", { class: "card wide", id: "chart-parallel" }, h("h2", {}, ""));
    const o = d.objectives[0];
    card.firstChild.textContent = `Parameters (parallel coordinates), coloured by ${o.name}`;
    const rows = trialRows(d).filter((r) => r.status === "completed" && r["m:" + o.name] !== null);
    const keys = d.params.map((p) => "p:" + p).concat(["m:" + o.name]);
    const scale = keys.map((k) => {
      const values = rows.map((r) => r[k]).filter((v) => v !== null && v !== undefined);
      if (values.some((v) => typeof v !== "number")) {
        const cats = [...new Set(values.map(String))].sort();
        return (v) => (v === null || v === undefined ? null : cats.length > 1 ? cats.indexOf(String(v)) / (cats.length - 1) : 0.5);
      }
      /* A loop, not Math.min(...values): that many arguments overflow the stack from ~125 000 on. */
      let lo = Infinity, hi = -Infinity;
      for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
      return (v) => (v === null || v === undefined ? null : hi > lo ? (v - lo) / (hi - lo) : 0.5);
    });
    const colourKey = keys.length - 1;
    /* Lines fall in BUCKETS colour bands, each band one dataset (fast at 10 000 trials):
     * band 0 holds the best values, dark; Chart.js draws dataset 0 last, on top. */
    const BUCKETS = 8, bands = Array.from({ length: BUCKETS }, () => []);
    for (const r of rows) {
      let t = scale[colourKey](r[keys[colourKey]]);
      if (o.goal === "maximize") t = 1 - t;
      bands[Math.min(BUCKETS - 1, Math.floor(t * BUCKETS))].push({ trial: r.number,
        points: keys.map((k, a) => ({ x: a, y: scale[a](r[k]) })) });
    }
    const sets = bands.map((band, b) => {
      const s = segments(band);
      return { label: `band ${b + 1}`, data: s.data, owner: s.owner, borderColor: ramp(b / (BUCKETS - 1)),
               borderWidth: 1.2, pointRadius: 0, pointHitRadius: 3 };
    });
    card.dataset.points = rows.length;
    const box = h("div", { class: "chart", style: "height: 340px" });
    card.append(box);
    const events = trialEvents(d, (ds, k) => sets[ds].owner[k], (n) => {
      const r = trialRows(d)[d.trials.number.indexOf(n)];
      return `trial ${n}: ` + keys.map((k) => `${k.slice(2)}=${fmt(r[k])}`).join(", ");
    });
    events.plugins.legend = { display: false };
    chart(box, { type: "line", data: { datasets: sets }, options: Object.assign({
      spanGaps: false, interaction: { mode: "nearest", intersect: false },
      scales: { x: axis("", { min: 0, max: keys.length - 1, ticks: { stepSize: 1, autoSkip: false,
                                callback: (v) => (keys[v] || "").slice(2) } }),
                y: axis("normalised", { min: 0, max: 1 }) },
    }, events) });
    return card;
  }

  /* The trial table: sortable by any column, filtered by text and status, shown in pages. */
  function tableCard(d) {
    const card = h("section", { class: "card wide", id: "trials-card" }, h("h2", {}, "Trials"));
    const columns = [["number", "#"], ["status", "status"]]
      .concat(d.metrics.map((m) => ["m:" + m, m]), d.params.map((p) => ["p:" + p, p]),
              [["duration", "duration"], ["attempts", "attempts"]],
              d.trials.rung ? [["rung", "rung"]] : []);
    const statuses = [...new Set(d.trials.status)].sort();
    const count = h("span", { class: "muted" });
    const filter = h("input", { type: "search", placeholder: "filter (any column)", value: tableState.filter });
    const status = h("select", {}, h("option", { value: "" }, "every status"), statuses.map((s) => h("option", { value: s, selected: s === tableState.status ? "" : null }, s)));
    const more = h("button", {}, "show more");
    const table = h("table", { id: "trials" }), tbody = h("tbody");
    const head = h("tr", {}, columns.map(([key, title]) => h("th", { "data-key": key, class: key === tableState.sort ? (tableState.desc ? "sorted-desc" : "sorted-asc") : null,
      on: { click: () => { tableState.desc = tableState.sort === key ? !tableState.desc : false; tableState.sort = key; draw(true); } } }, title)));
    table.append(h("thead", {}, head), tbody);
    card.append(h("div", { class: "tools" }, filter, status, count, more), h("div", { class: "scroll" }, table));
    function draw(resort) {
      const text = tableState.filter.toLowerCase();
      let rows = trialRows(d).filter((r) => (!tableState.status || r.status === tableState.status) &&
        (!text || columns.some(([k]) => String(r[k] === null || r[k] === undefined ? "" : fmt(r[k])).toLowerCase().includes(text))));
      const key = tableState.sort, sign = tableState.desc ? -1 : 1;
      rows = rows.slice().sort((a, b) => {
        const x = a[key], y = b[key];
        if (x === y) return a.number - b.number;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * sign;
      });
      if (resort) for (const th of head.children) th.className = th.dataset.key === key ? (tableState.desc ? "sorted-desc" : "sorted-asc") : "";
      tbody.replaceChildren(...rows.slice(0, tableState.shown).map((r) => h("tr", { "data-trial": r.number,
        on: { click: () => { if (!inlined) location.hash = `#/e/${enc(d.experiment.name)}/t/${r.number}`; } } },
        columns.map(([k]) => k === "status" ? h("td", {}, badge(r.status))
          : h("td", { class: typeof r[k] === "number" ? "num" : null }, k === "duration" ? seconds(r[k]) : fmt(r[k]))))));
      table.dataset.rows = rows.length;
      table.dataset.shown = Math.min(rows.length, tableState.shown);
      count.textContent = `${rows.length} of ${d.trials.number.length} trials` + (rows.length > tableState.shown ? `, first ${tableState.shown} shown` : "");
      more.hidden = rows.length <= tableState.shown;
    }
    filter.addEventListener("input", () => { tableState.filter = filter.value; tableState.shown = TABLE_PAGE; draw(); });
    status.addEventListener("change", () => { tableState.status = status.value; tableState.shown = TABLE_PAGE; draw(); });
    more.addEventListener("click", () => { tableState.shown += TABLE_PAGE * 5; draw(); });
    draw();
    return card;
  }

  /* ---- pages ----------------------------------------------------------------------------- */

  function progressBar(e) {
    const c = e.counts, budget = Math.max(e.progress.budget || 0, e.trials, 1);
    const part = (k) => h("span", { class: k, style: `width: ${(100 * (c[k] || 0)) / budget}%` });
    return h("span", {}, h("span", { class: "progress", title: `${c.completed} completed, ${c.running} running, ${c.failed} failed of ${e.progress.budget}` },
      part("completed"), part("running"), part("failed"), part("stopped")),
      `${c.completed} done · ${c.running} running · ${c.failed + (c.timeout || 0)} failed` +
      (c.stopped ? ` · ${c.stopped} stopped` : "") + ` / ${e.progress.budget || "∞"}`);
  }
  function bestOrVolume(e) {
    if (e.best) return Object.entries(e.best).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    return e.front_size ? `HV ${fmt(e.hypervolume)} · ${e.front_size} on the front` : "–";
  }
  function crumbs(...parts) {
    document.getElementById("crumbs").replaceChildren(...parts.map((p) => (p.href ? h("a", { href: p.href }, "/ " + p.text) : h("span", {}, "/ " + p.text))));
  }
  /* The header's mark of a polled page; <body data-live> says which ("live", "retrying" or
   * "") for the end-to-end test. */
  function mark(state, text) {
    const el = document.getElementById("live");
    el.textContent = text;
    el.className = state;
    document.body.dataset.live = state;
  }
  function live(on) { mark(on ? "live" : "", on ? "● live (updates every 3 s)" : ""); }
  /* why: what went wrong (TryAgain's message); updatedAt: Unix seconds of the last answer;
   * retryMs: when the next try goes. */
  function retrying(why, updatedAt, retryMs) {
    mark("retrying", `${why}, retrying… (last update ${when(updatedAt)}; next try in ${retryMs / 1000} s)`);
  }

  function listPage(list) {
    crumbs();
    const picked = new Set();
    const go = h("button", { disabled: "" }, "compare selected");
    go.addEventListener("click", () => { location.hash = "#/compare/" + [...picked].map(enc).join(","); });
    /* An experiment whose stored spec does not load comes with only its name, status,
     * start and why (docs/api.md): that row says why, in place of what it cannot show. */
    const rows = list.experiments.map((e) => h("tr", { "data-experiment": e.name, "data-error": e.error ? "" : null },
      h("td", {}, e.error ? null : h("input", { type: "checkbox", on: { change: (ev) => { ev.target.checked ? picked.add(e.name) : picked.delete(e.name); go.disabled = picked.size < 2; } } })),
      h("td", {}, h("a", { href: `#/e/${enc(e.name)}` }, e.name)), h("td", {}, badge(e.status)),
      e.error ? h("td", { colspan: 3, class: "error" }, e.error)
              : [h("td", {}, progressBar(e)), h("td", {}, bestOrVolume(e)), h("td", {}, badge(e.scheduler.state))],
      h("td", { title: when(e.created_at) }, when(e.created_at, true)), h("td", { title: when(e.updated_at) }, when(e.updated_at, true))));
    const table = h("table", { id: "experiments", "data-rows": rows.length },
      h("thead", {}, h("tr", {}, ["", "experiment", "status", "progress", "best / hypervolume", "scheduler", "started", "updated"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows));
    app.replaceChildren(h("h1", {}, "Experiments"),
      list.experiments.length ? h("section", { class: "card" }, h("div", { class: "tools" }, go), h("div", { class: "scroll" }, table))
                              : h("p", { class: "muted" }, "No experiment in this storage yet: start one with nas run SPEC.yaml."));
    return list.experiments.some((e) => e.status === "running");
  }

  const CARDS = { front: frontCard, hypervolume: hypervolumeCard, objectives: objectivesCard, curves: curvesCard,
                  parallel: parallelCard, table: tableCard };

  /* The cards drawn before the first paint: the ones at the top of the page. The others
   * follow one per frame, so the first paint waits for none of them. */
  const FIRST_CARDS = ["front", "hypervolume"];

  /* The page: its summary and first cards at once, then (on a page's first draw; a redraw
   * while live draws at once, so that the page never shrinks under the reader) the other
   * cards frame by frame, and its learning curves, fetched meanwhile (most of the bytes) or
   * inlined by nas plot. Resolves to whether to keep polling. */
  async function experimentPage(d, kind, progressive) {
    const token = page.token, grid = drawSummary(d);
    /* One objective has no front to draw, and its "hypervolume" is only its best value, which
     * the objective's own chart shows: those two cards are left out unless asked for. */
    const single = d.objectives.length < 2;
    const names = Object.keys(CARDS).filter((name) => (kind ? kind === name : !(single && (name === "front" || name === "hypervolume"))));
    const curves = d.curves || inlined ? null : api(`experiments/${enc(d.experiment.name)}/curves`);
    curves?.catch(() => {}); /* its failure is reported where it is awaited */
    for (const name of names) {
      if (progressive && !FIRST_CARDS.includes(name)) {
        await nextFrame();
        if (token !== page.token) return false;
      }
      grid.append(CARDS[name](d));
    }
    if (progressive) {
      await nextFrame();
      if (token !== page.token) return false;
      document.body.dataset.drawnMs = Math.round(performance.now());
    }
    const placeholder = document.getElementById("chart-curves");
    if (placeholder && curves) {
      d.curves = (await curves).curves;
      if (token === page.token) placeholder.replaceWith(curvesCard(d));
    }
    return d.experiment.status === "running" || d.experiment.scheduler.state === "alive";
  }

  /* The title and summary line of an experiment; returns the (empty) grid for its cards. */
  function drawSummary(d) {
    const e = d.experiment;
    crumbs({ text: e.name });
    const summary = h("div", { class: "summary" }, badge(e.status), progressBar(e),
      h("span", {}, h("b", {}, "best: "), bestOrVolume(e)),
      h("span", {}, h("b", {}, "scheduler: "), e.scheduler.state === "alive" ? e.scheduler.holder : e.scheduler.state === "dead" ? "dead (lease left behind)" : "none"),
      h("span", {}, h("b", {}, "started: "), when(e.created_at)), h("span", {}, h("b", {}, "updated: "), when(e.updated_at)),
      inlined ? h("span", { class: "muted" }, `written by nas plot at ${when(d.generated_at)}`) : null);
    const grid = h("div", { class: "grid" });
    app.replaceChildren(h("h1", {}, e.name), summary, grid);
    return grid;
  }

  function kv(obj) {
    const entries = Object.entries(obj || {});
    return entries.length ? h("dl", {}, entries.map(([k, v]) => [h("dt", { "data-name": k }, k), h("dd", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v))]))
                          : h("p", { class: "muted" }, "none");
  }

  function trialPage(name, t) {
    crumbs({ text: name, href: `#/e/${enc(name)}` }, { text: `trial ${t.number}` });
    const cards = [
      h("section", { class: "card", id: "trial-params", "data-count": Object.keys(t.params).length }, h("h2", {}, "Parameters"), kv(t.params)),
      h("section", { class: "card", id: "trial-metrics", "data-count": Object.keys(t.metrics).length }, h("h2", {}, "Metrics"), kv(t.metrics)),
      h("section", { class: "card", id: "trial-times" }, h("h2", {}, "Timings and attempts"), kv({
        created: when(t.created_at), started: when(t.started_at), finished: when(t.finished_at),
        "queued for": t.started_at && t.created_at ? seconds(t.started_at - t.created_at) : "–",
        "ran for": t.finished_at && t.started_at ? seconds(t.finished_at - t.started_at) : "–",
        attempts: t.attempts, "job id": t.job_id || "–", "run folder": t.run_dir || "–" })),
    ];
    const curves = Object.entries(t.intermediate || {});
    const curveCard = h("section", { class: "card", id: "trial-curve", "data-curves": curves.length }, h("h2", {}, "Intermediate values"));
    cards.push(curveCard);
    if (t.error) cards.push(h("section", { class: "card wide" }, h("h2", {}, "Error"), h("pre", { class: "error" }, t.error)));
    if (t.model) cards.push(h("section", { class: "card", id: "trial-model" }, h("h2", {}, "Saved model"),
      h("p", {}, h("a", { href: "file://" + t.model.weights }, t.model.weights)), t.model.about ? h("pre", {}, JSON.stringify(t.model.about, null, 2)) : null));
    cards.push(h("section", { class: "card wide" }, h("h2", {}, "stdout (tail)"), h("pre", {}, t.stdout_tail || "(empty)")));
    cards.push(h("section", { class: "card wide" }, h("h2", {}, "stderr (tail)"), h("pre", {}, t.stderr_tail || "(empty)")));
    app.replaceChildren(h("h1", {}, `${name}: trial ${t.number} `, badge(t.status)), h("div", { class: "grid" }, cards));
    if (!curves.length) {
      curveCard.append(h("p", { class: "muted" }, "No intermediate values reported."));
    } else {
      const box = h("div", { class: "chart" });
      curveCard.append(box);
      chart(box, { type: "line", data: { datasets: curves.map(([m, pts], k) => ({ label: m, yAxisID: k ? "y1" : "y",
        data: pts.map((p) => ({ x: p[0], y: p[1] })), borderColor: PALETTE[k % PALETTE.length], backgroundColor: PALETTE[k % PALETTE.length], pointRadius: 2 })) },
        options: { scales: { x: axis("step", WHOLE()), y: axis(curves[0][0]), y1: curves.length > 1 ? axis(curves[1][0], { position: "right", grid: { drawOnChartArea: false } }) : { display: false } } } });
    }
    return t.status === "running" || t.status === "queued";
  }

  function comparePage(c) {
    const names = c.experiments.map((e) => e.experiment);
    crumbs({ text: "compare " + names.join(", ") });
    const obj = c.objectives, ref = c.reference_point;
    const table = h("table", { id: "compare-table" }, h("thead", {}, h("tr", {}, ["experiment", "trials", "on the front", "hypervolume"].map((t) => h("th", {}, t)))),
      h("tbody", {}, c.experiments.map((e) => h("tr", { "data-experiment": e.experiment, "data-front": e.front_size },
        h("td", {}, inlined ? e.experiment : h("a", { href: `#/e/${enc(e.experiment)}` }, e.experiment)), h("td", { class: "num" }, e.trials),
        h("td", { class: "num" }, e.front_size), h("td", { class: "num" }, fmt(e.hypervolume))))));
    const chartCard = h("section", { class: "card wide", id: "chart-compare" }, h("h2", {}, "Fronts at one reference point"));
    app.replaceChildren(h("h1", {}, "Comparison"),
      h("p", { class: "muted" }, "Hypervolumes measured at one common reference point: " + obj.map((o) => `${o.name}=${fmt(ref[o.name])}`).join(", ")),
      h("div", { class: "grid" }, h("section", { class: "card" }, h("h2", {}, "Hypervolume"), table), chartCard));
    const box = h("div", { class: "chart" });
    chartCard.append(box);
    if (obj.length >= 2) {
      const [a, b] = [obj[0].name, obj[1].name];
      const sets = c.experiments.map((e, k) => ({ label: e.experiment, showLine: true, borderWidth: 2, pointRadius: 4,
        borderColor: PALETTE[k % PALETTE.length], backgroundColor: PALETTE[k % PALETTE.length],
        data: e.front.map((r) => ({ x: r[a], y: r[b], t: r.trial })).sort((p, q) => p.x - q.x) }));
      sets.push({ label: "reference point", data: [{ x: ref[a], y: ref[b] }], pointStyle: "crossRot", pointRadius: 9, borderColor: "#1d2430", borderWidth: 2 });
      chartCard.dataset.points = c.experiments.reduce((s, e) => s + e.front.length, 0);
      chart(box, { type: "scatter", data: { datasets: sets }, options: {
        scales: { x: axis(`${a} (${obj[0].goal})`), y: axis(`${b} (${obj[1].goal})`) },
        plugins: { tooltip: { callbacks: { label: (ctx) => (ctx.raw.t === undefined ? "reference point" : `${ctx.dataset.label}, trial ${ctx.raw.t}: ${fmt(ctx.parsed.x)}, ${fmt(ctx.parsed.y)}`) } } } } });
    } else {
      chart(box, { type: "bar", data: { labels: names, datasets: [{ label: "hypervolume", data: c.experiments.map((e) => e.hypervolume), backgroundColor: PALETTE }] } });
    }
    return false;
  }

  /* The form that asks for a token; on submit it keeps it for the tab and draws the page. */
  function tokenPage(refused) {
    crumbs();
    const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: "",
                               placeholder: "token", "aria-label": "token" });
    const form = h("form", { class: "card token", id: "token-form" }, h("h2", {}, "This nas serve needs a token"),
      h("p", {}, "A token from the server's token file (", h("code", {}, "nas serve --token-file"),
        "); a read token is enough to look. It is kept for this browser tab only and sent in a header, never in a URL."),
      refused ? h("p", { class: "error", id: "token-refused" }, refused) : null,
      h("div", { class: "tools" }, input, h("button", { type: "submit" }, "Open")));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      route();
    });
    app.replaceChildren(h("h1", {}, "Token needed"), form);
    input.focus();
  }

  /* ---- routing and live updates ----------------------------------------------------------- */

  function clear() {
    for (const c of page.charts) c.destroy();
    page.charts = [];
    clearTimeout(page.timer);
  }
  /* The data as text, to tell whether a poll brought anything new: without the times that
   * change with every answer, nor what drawing added to it (_rows, curves). */
  function snapshot(data) {
    return JSON.stringify(data, function (k, v) {
      if (this === data && (k === "_rows" || k === "curves")) return undefined;
      return k === "generated_at" || k === "holder" ? undefined : v;
    });
  }

  /* Draws a page from load() (a promise of its data) with draw(data, first) → whether to
   * keep polling (first: the page's first draw, not a redraw); polls again while it says
   * so, redrawing only when the data changed. A poll of a drawn page that gets no answer
   * or a 500 (TryAgain) leaves the page as it is, says so, and tries again after
   * RETRY_FIRST_MS, doubling up to RETRY_MOST_MS, until the server answers; any other
   * failure (a 404: the experiment was deleted; a refused token) ends the page. A draw
   * that failed on the way (its learning curves' request lost) is drawn again by the
   * next answer, changed or not. */
  async function show(load, draw, ready) {
    const token = ++page.token;
    /* last: the snapshot of the data last drawn whole; null while a draw is unfinished */
    let drawn = false, last = null, updatedAt = 0, retryMs = RETRY_FIRST_MS;
    const step = async () => {
      try {
        const data = await load();
        updatedAt = Date.now() / 1000;
        retryMs = RETRY_FIRST_MS;
        await documentReady;
        app = document.getElementById("app");
        if (token !== page.token) return;
        /* The first draw does not wait for the text (tens of ms at 10 000 trials). */
        const first = !drawn, text = first ? null : snapshot(data);
        let again = true;
        if (first || last === null || text !== last) {
          const started = performance.now();
          clear();
          const drawing = draw(data, first);
          drawn = true;
          last = null;
          document.body.dataset.renderMs = Math.round(performance.now() - started);
          if (first) {
            /* Painted: the frame after drawing has passed (Chart.js renders in it). Since the
             * page was asked for; an experiment page then draws its other cards (<body
             * data-drawn-ms>). */
            await nextFrame();
            if (!document.body.dataset.firstDrawMs) document.body.dataset.firstDrawMs = Math.round(performance.now());
          }
          again = await drawing;
          last = text === null ? snapshot(data) : text;
          if (token !== page.token) return;
          document.body.dataset.ready = ready;
        }
        live(again);
        if (again && !inlined) page.timer = setTimeout(step, POLL_MS);
      } catch (err) {
        await documentReady;
        app = document.getElementById("app");
        if (token !== page.token) return;
        if (err instanceof TryAgain && drawn && !inlined) {
          retrying(err.message, updatedAt, retryMs);
          page.timer = setTimeout(step, retryMs);
          retryMs = Math.min(2 * retryMs, RETRY_MOST_MS);
          return;
        }
        clear();
        live(false);
        if (err instanceof TokenNeeded) {
          tokenPage(err.message);
          document.body.dataset.ready = "token";
          return;
        }
        app.replaceChildren(h("p", { class: "error" }, String(err.message || err)));
        document.body.dataset.ready = "error";
      }
    };
    await step();
  }

  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decoded);
    if (document.body) document.body.dataset.ready = "";
    if (inlined) {
      if (inlined.page === "compare") return show(async () => inlined.compare, comparePage, "compare");
      return show(async () => inlined.dashboard, (d, first) => experimentPage(d, inlined.kind, first), "experiment");
    }
    if (parts[0] === "e" && parts[1] && parts[2] === "t" && parts[3] !== undefined)
      return show(() => api(`experiments/${enc(parts[1])}/trials/${enc(parts[3])}`), (t) => trialPage(parts[1], t), "trial");
    if (parts[0] === "e" && parts[1])
      return show(() => api(`experiments/${enc(parts[1])}/dashboard`), (d, first) => experimentPage(d, null, first), "experiment");
    if (parts[0] === "compare" && parts[1])
      return show(() => api(`compare?experiments=${parts[1].split(",").map(enc).join(",")}`), comparePage, "compare");
    return show(() => api("experiments"), listPage, "experiments");
  }

  window.addEventListener("hashchange", () => { takeTokenFromFragment(); tableState.shown = TABLE_PAGE; route(); });
  takeTokenFromFragment();
  route();
})();
