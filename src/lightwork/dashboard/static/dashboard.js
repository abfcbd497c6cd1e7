// The lightwork dashboard page: plain JavaScript, one canvas per chart, no library.
// Data comes pushed by Server-Sent Events (/api/events), about once a second; the tasks
// table is paged, filtered and sorted by the server, so the DOM holds one page of rows.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  view: "overview", window: 30, actions: false, lastOverview: null, stream: null,
  tasks: { state: "", name: "", worker: "", sort: "submitted", order: "desc", page: 0 },
};
let source = null;

// ---------------------------------------------------------------- formatting
function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function fmtSignedBytes(n) {
  if (n === null || n === undefined) return "–";
  return (n > 0 ? "+" : n < 0 ? "−" : "") + fmtBytes(Math.abs(n));
}
function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s >= 100) return s.toFixed(0) + " s";
  if (s >= 1) return s.toFixed(2) + " s";
  if (s >= 1e-3) return (s * 1e3).toFixed(1) + " ms";
  return (s * 1e6).toFixed(0) + " µs";
}
function fmtNumber(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString(); }
function shortName(name) {
  const tail = String(name).split(".<locals>.").pop();
  return tail;
}
function colorOf(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return `hsl(${h % 360}, 62%, 52%)`;
}
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

// ---------------------------------------------------------------- plumbing
function query() {
  const p = new URLSearchParams({ view: state.view });
  if (state.view === "stream") p.set("window", state.window);
  if (state.view === "tasks") {
    for (const [k, v] of Object.entries(state.tasks)) p.set(k, v);
  }
  return p;
}

function connect() {
  if (source) source.close();
  if (state.view === "stacks" || state.view === "profile") {
    source = null; connectOverviewOnly(); return;
  }
  source = new EventSource("/api/events?" + query().toString());
  source.addEventListener("update", (event) => render(JSON.parse(event.data)));
  source.onerror = () => setLiveness(state.lastOverview && state.lastOverview.ended
    ? "ended" : "reconnecting…");
}

function connectOverviewOnly() {
  source = new EventSource("/api/events?view=overview");
  source.addEventListener("update", (event) => render(JSON.parse(event.data)));
}

function setLiveness(text) {
  const pill = $("liveness");
  pill.textContent = text;
  pill.className = "pill " + (text === "live" ? "live" : text === "ended" ? "ended" : "");
}

function render(payload) {
  const overview = payload.overview;
  state.lastOverview = overview;
  state.actions = !!overview.actions;
  $("session").textContent = "session " + overview.session;
  setLiveness(overview.ended ? "ended" : "live");
  renderBanners(overview);
  renderOverview(overview);
  if (payload.stream) renderStream(payload.stream);
  if (payload.tasks) renderTasks(payload.tasks);
  if (payload.functions) renderFunctions(payload.functions);
  if (payload.actors) renderActors(payload.actors);
  if (payload.objects) renderObjects(payload.objects);
}

function renderBanners(view) {
  const box = $("banners");
  box.replaceChildren();
  if (view.ended) {
    box.append(el("div", "The session ended: " + (view.end_reason || "the program exited") +
      ". This is its final state.", "ended"));
  }
  for (const text of view.banners || []) box.append(el("div", text));
}

// ---------------------------------------------------------------- overview
const STATE_COLORS = {
  RUNNING: "#2563eb", RUNNING_IN_RAY_GET: "#7c3aed", RUNNING_IN_RAY_WAIT: "#a855f7",
  SUBMITTED_TO_WORKER: "#0891b2", PENDING_NODE_ASSIGNMENT: "#f59e0b",
  PENDING_ARGS_AVAIL: "#fbbf24", FINISHED: "#16a34a", FAILED: "#dc2626",
};

function renderOverview(o) {
  const counts = $("task-counts");
  counts.replaceChildren();
  const all = Object.assign({}, o.tasks.live, o.tasks.ended);
  for (const [name, n] of Object.entries(all)) {
    const row = el("div");
    row.append(el("span", name.toLowerCase().replaceAll("_", " ") + ": "),
      el("b", fmtNumber(n), "count-" + name));
    counts.append(row);
  }
  if (!Object.keys(all).length) counts.append(el("div", "no tasks yet", "muted"));
  $("throughput").textContent = o.throughput === null ? "–" : fmtNumber(o.throughput);
  const res = $("resources");
  res.replaceChildren();
  for (const [name, [used, total]] of Object.entries(o.resources || {})) {
    // memory and object_store_memory are bytes (Ray's names); the rest are counts
    const show = name.endsWith("memory") ? fmtBytes : (v) => +v.toFixed(2);
    res.append(el("div", `${name}: ${show(used)} / ${show(total)}`));
    res.append(bar(total ? used / total : 0));
  }
  const store = $("store");
  store.replaceChildren();
  const s = o.store || {};
  if (s.cluster_bytes !== undefined) {  // a cluster run: values live on its workers
    store.append(el("div", `${fmtNumber(s.objects)} objects held by the driver; ` +
      `${fmtBytes(s.cluster_bytes)} stored on the cluster's workers`));
  } else {
    store.append(el("div", `${fmtNumber(s.objects)} objects, ${fmtBytes(s.shared_memory_bytes)} ` +
      "in shared memory"));
  }
  const budget = s.budget;
  if (budget) { store.append(el("div", "budget " + fmtBytes(budget))); store.append(bar(s.shared_memory_bytes / budget)); }
  if (s.spilled_bytes !== undefined) {
    store.append(el("div", `spilled to disk: ${fmtBytes(s.spilled_bytes)} now, ${fmtNumber(s.spilled_total)} objects in all`));
  }
  drawHistory(o.history || []);
  renderProgress(o.progress || [], o.graphs || []);
  renderFindings(o.findings);
  renderWorkers(o.workers || []);
}

function bar(fraction) {
  const outer = el("div", null, "bar");
  const inner = el("div");
  inner.style.width = Math.max(0, Math.min(1, fraction || 0)) * 100 + "%";
  outer.append(inner);
  return outer;
}

function renderProgress(calls, graphs) {
  const box = $("progress");
  box.replaceChildren();
  if (!calls.length && !graphs.length) {
    box.textContent = "no get(), wait() or Dask graph running"; box.className = "muted"; return;
  }
  box.className = "";
  for (const g of graphs) {
    const text = `Dask graph ${g.name} (${fmtNumber(g.keys)} output${g.keys === 1 ? "" : "s"}): ` +
      `${fmtNumber(g.done)} of ${fmtNumber(g.total)} tasks done, ${fmtNumber(g.running)} running, ` +
      `for ${fmtSeconds(g.since)}`;
    box.append(el("div", text, "progress-graph"));
    box.append(bar(g.total ? g.done / g.total : 0));
  }
  for (const call of calls) {
    const text = call.ready === null
      ? `${call.kind}() on ${fmtNumber(call.objects)} objects (${call.thread}), for ${fmtSeconds(call.since)}`
      : `${call.kind}(): ${fmtNumber(call.ready)} of ${fmtNumber(call.objects)} ready ` +
        `(${call.thread}), blocked for ${fmtSeconds(call.since)}`;
    box.append(el("div", text, "progress-call"));
    if (call.ready !== null) box.append(bar(call.objects ? call.ready / call.objects : 1));
  }
}

function renderFindings(findings) {
  const box = $("findings");
  box.replaceChildren();
  if (findings === null || findings === undefined) {
    box.textContent = "the advisor is off (init(advisor=False))"; box.className = "muted"; return;
  }
  if (!findings.length) { box.textContent = "no findings"; box.className = "muted"; return; }
  box.className = "";
  for (const f of findings) {
    const card = el("div", null, "finding");
    card.append(el("b", `[${f.kind}] ${f.title}`));
    if (f.callsite) card.append(el("div", `${f.callsite[0]}:${f.callsite[1]} in ${f.callsite[2]}`, "where"));
    card.append(el("div", "Fix: " + f.suggestion));
    box.append(card);
  }
}

function renderWorkers(rows) {
  table($("workers"), rows, [
    ["worker", (r) => r.worker_id === 0 ? "driver"
      : r.address ? `${r.worker_id} (${r.address})` : r.worker_id],
    ["pid", (r) => r.pid], ["kind", (r) => r.kind], ["state", (r) => r.state],
    ["actor", (r) => r.actor_class || ""], ["running", (r) => r.running ? shortName(r.running) : ""],
    ["queued", (r) => r.queued, "num"], ["CPU %", (r) => r.cpu_percent === null ? "–" : r.cpu_percent, "num"],
    ["RSS", (r) => fmtBytes(r.rss), "num"],
  ]);
}

// Syncs come about once a second while a page is open; a longer gap between two history
// points means nobody watched meanwhile.
const HISTORY_GAP_S = 5;

function drawHistory(points) {
  const canvas = $("history");
  const ctx = sizeCanvas(canvas, 160);
  const w = canvas.clientWidth, h = 160;
  ctx.clearRect(0, 0, w, h);
  if (points.length < 2) { ctx.fillStyle = "#6b7480"; ctx.fillText("collecting…", 10, 20); return; }
  const series = {};
  for (const [, live] of points) for (const k of Object.keys(live)) series[k] = true;
  const names = Object.keys(series);
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  let max = 1;
  const rates = points.map((p, i) => i === 0 ? 0 :
    Math.max(0, (p[2] + p[3] - points[i - 1][2] - points[i - 1][3]) / Math.max(1e-3, p[0] - points[i - 1][0])));
  for (const [, live] of points) for (const k of names) max = Math.max(max, live[k] || 0);
  const maxRate = Math.max(1, ...rates);
  const x = (t) => 40 + (w - 50) * (t - t0) / Math.max(1e-3, t1 - t0);
  const y = (v, m) => h - 20 - (h - 30) * v / m;
  ctx.strokeStyle = "#d9dee4"; ctx.beginPath(); ctx.moveTo(40, h - 20); ctx.lineTo(w - 10, h - 20); ctx.stroke();
  ctx.fillStyle = "#6b7480"; ctx.font = "11px sans-serif";
  ctx.fillText(String(max), 4, 14); ctx.fillText("0", 4, h - 20);
  ctx.fillText(`${(t1 - t0).toFixed(0)} s`, w - 40, h - 5);
  const legend = $("history-legend");
  legend.replaceChildren();
  // No point is sampled while no page is open: across such a gap the states are unknown,
  // so their lines break there; the finished rate is each interval's average, drawn flat
  // over its interval (a long interval's average is known, its shape is not).
  const joined = (i) => i > 0 && points[i][0] - points[i - 1][0] <= HISTORY_GAP_S;
  for (const name of names) {
    ctx.strokeStyle = STATE_COLORS[name] || "#999"; ctx.lineWidth = 1.5; ctx.beginPath();
    points.forEach(([t, live], i) => { const px = x(t), py = y(live[name] || 0, max); joined(i) ? ctx.lineTo(px, py) : ctx.moveTo(px, py); });
    ctx.stroke();
    const item = el("span", name.toLowerCase().replaceAll("_", " "));
    item.style.setProperty("--swatch", STATE_COLORS[name] || "#999");
    legend.append(item);
  }
  ctx.strokeStyle = "#16a34a"; ctx.setLineDash([4, 3]); ctx.beginPath();
  points.forEach(([t], i) => {
    if (i === 0) return;
    const py = y(rates[i], maxRate);
    joined(i) ? ctx.lineTo(x(points[i - 1][0]), py) : ctx.moveTo(x(points[i - 1][0]), py);
    ctx.lineTo(x(t), py);
  });
  ctx.stroke(); ctx.setLineDash([]);
  const done = el("span", `finished per second (dashed, max ${maxRate.toFixed(0)})`);
  done.style.setProperty("--swatch", "#16a34a");
  legend.append(done);
}

function sizeCanvas(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 800;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// ---------------------------------------------------------------- task stream
const ROW_H = 22, LABEL_W = 150;

function renderStream(s) {
  state.stream = s;
  const canvas = $("stream");
  const rows = [{ worker_id: 0, label: "driver (get/wait)" }].concat(s.rows);
  const height = 24 + rows.length * ROW_H;
  const ctx = sizeCanvas(canvas, height);
  const w = canvas.clientWidth;
  ctx.clearRect(0, 0, w, height);
  const x = (t) => LABEL_W + (w - LABEL_W - 10) * (t - s.start) / Math.max(1e-6, s.end - s.start);
  const rowIndex = new Map(rows.map((r, i) => [r.worker_id, i]));
  ctx.font = "12px sans-serif";
  rows.forEach((r, i) => {
    ctx.fillStyle = i % 2 ? "#fafbfc" : "#fff";
    ctx.fillRect(0, 20 + i * ROW_H, w, ROW_H);
    ctx.fillStyle = r.alive === false ? "#9ca3af" : "#1d232b";
    ctx.fillText(r.label, 6, 20 + i * ROW_H + 15);
  });
  ctx.fillStyle = "#6b7480";
  for (let k = 0; k <= 5; k++) {
    const t = s.start + (s.end - s.start) * k / 5;
    ctx.fillText(`${(t - s.end).toFixed(0)} s`, x(t) - (k === 5 ? 24 : 0), 14);
  }
  const boxes = [];
  const used = new Set();
  for (const span of s.spans) {
    const [worker, nameIdx, start, end, taskId, loaded, finished, stateIdx] = span;
    const i = rowIndex.get(worker);
    if (i === undefined) continue;
    const name = s.names[nameIdx];
    used.add(name);
    const x0 = Math.max(LABEL_W, x(start)), x1 = Math.max(x0 + 1, x(end));
    const y0 = 20 + i * ROW_H + 3;
    ctx.fillStyle = s.states[stateIdx] === "FAILED" ? "#dc2626" : colorOf(name);
    ctx.fillRect(x0, y0, x1 - x0, ROW_H - 6);
    boxes.push({ x0, x1, y0, y1: y0 + ROW_H - 6, info: () => spanInfo(name, taskId, start, end, loaded, finished, s.states[stateIdx]) });
  }
  for (const [worker, name, start, taskId, st] of s.running) {
    const i = rowIndex.get(worker);
    if (i === undefined) continue;
    used.add(name);
    const x0 = Math.max(LABEL_W, x(start)), x1 = Math.max(x0 + 2, x(s.end));
    const y0 = 20 + i * ROW_H + 3;
    ctx.globalAlpha = 0.45; ctx.fillStyle = colorOf(name); ctx.fillRect(x0, y0, x1 - x0, ROW_H - 6);
    ctx.globalAlpha = 1; ctx.strokeStyle = colorOf(name); ctx.strokeRect(x0 + 0.5, y0 + 0.5, x1 - x0 - 1, ROW_H - 7);
    boxes.push({ x0, x1, y0, y1: y0 + ROW_H - 6, info: () => `${name}\ntask ${taskId} · ${st}\nrunning for ${fmtSeconds(s.end - start)}` });
  }
  for (const [kind, start, end, count, where] of s.driver) {
    const x0 = Math.max(LABEL_W, x(start)), x1 = Math.max(x0 + 1, x(end));
    const y0 = 23;
    ctx.fillStyle = kind === "get" ? "#6b7280" : "#a8a29e";
    ctx.fillRect(x0, y0, x1 - x0, ROW_H - 6);
    boxes.push({ x0, x1, y0, y1: y0 + ROW_H - 6, info: () => `driver blocked in ${kind}() on ${count} object(s)\n` +
      `${fmtSeconds(end - start)}${where ? "\n" + where : ""}` });
  }
  state.streamBoxes = boxes;
  const legend = $("stream-legend");
  legend.replaceChildren();
  for (const name of [...used].sort().slice(0, 30)) {
    const item = el("span", shortName(name));
    item.style.setProperty("--swatch", colorOf(name));
    legend.append(item);
  }
  $("stream-note").textContent = `${fmtNumber(s.spans.length)} tasks ended in the window, ` +
    `${s.running.length} running` + (s.capped ? ` — showing the newest ${fmtNumber(s.max_spans)} only` : "");
}

function spanInfo(name, taskId, start, end, loaded, finished, st) {
  const lines = [name, `task ${taskId} · ${st}`, `duration ${fmtSeconds(end - start)}`];
  if (loaded > 0 && loaded >= start) lines.push(`load args ${fmtSeconds(loaded - start)}`);
  if (finished > 0 && loaded > 0) lines.push(`execute ${fmtSeconds(finished - loaded)}`);
  if (finished > 0 && end >= finished) lines.push(`store result ${fmtSeconds(end - finished)}`);
  return lines.join("\n");
}

function onStreamHover(event) {
  const tip = $("tooltip");
  const canvas = $("stream");
  const rect = canvas.getBoundingClientRect();
  const px = event.clientX - rect.left, py = event.clientY - rect.top;
  const hit = (state.streamBoxes || []).find((b) => px >= b.x0 - 1 && px <= b.x1 + 1 && py >= b.y0 && py <= b.y1);
  if (!hit) { tip.classList.add("hidden"); return; }
  tip.textContent = hit.info();
  tip.classList.remove("hidden");
  // Beside the pointer, flipped to its left near the window's right edge.
  const width = tip.offsetWidth;
  const left = event.clientX + 12 + width > window.innerWidth ? event.clientX - 12 - width : event.clientX + 12;
  tip.style.left = Math.max(0, left) + "px";
  tip.style.top = event.clientY + 12 + "px";
}

// ---------------------------------------------------------------- tables
function table(node, rows, columns, sortable) {
  node.replaceChildren();
  const head = el("tr");
  for (const [title, , cls, key] of columns) {
    const th = el("th", title, cls);
    if (sortable && key) {
      th.classList.add("sortable");
      th.dataset.sort = key;
      if (state.tasks.sort === key) th.classList.add(state.tasks.order === "asc" ? "sorted-asc" : "sorted-desc");
    }
    head.append(th);
  }
  node.append(head);
  for (const row of rows) {
    const tr = el("tr");
    for (const [, get, cls] of columns) {
      const value = get(row);
      const td = el("td", null, cls);
      if (value instanceof Node) td.append(value); else td.textContent = value === null || value === undefined ? "" : String(value);
      tr.append(td);
    }
    node.append(tr);
  }
  if (!rows.length) {
    const tr = el("tr"); const td = el("td", "nothing to show", "muted");
    td.colSpan = columns.length; tr.append(td); node.append(tr);
  }
}

function renderTasks(t) {
  const select = $("f-state");
  if (select.options.length <= 1) for (const s of t.states) select.append(new Option(s, s));
  const names = $("f-names");
  if (names.childElementCount !== t.names.length) {
    names.replaceChildren(...t.names.slice(0, 500).map((n) => new Option(n)));
  }
  const pages = Math.max(1, Math.ceil(t.total / t.page_size));
  $("page-info").textContent = `page ${t.page + 1} of ${fmtNumber(pages)} · ${fmtNumber(t.total)} matching · ` +
    `${fmtNumber(t.recorded)} recorded`;
  $("prev").disabled = t.page === 0;
  $("next").disabled = t.page + 1 >= pages;
  const columns = [
    ["task", (r) => taskLink(r.task_id), "num", "task_id"], ["function", (r) => shortName(r.name), "", "name"],
    ["state", (r) => stateCell(r.state, r.is_debugger_paused), "", "state"], ["worker", (r) => r.worker_id, "num", "worker_id"],
    ["submitted", (r) => fmtSeconds(r.submitted_s), "num", "submitted"],
    ["queued", (r) => fmtSeconds(r.queued_s), "num", "queued_s"], ["run", (r) => fmtSeconds(r.run_s), "num", "run_s"],
    ["args", (r) => fmtBytes(r.arg_size), "num", "arg_size"], ["result", (r) => fmtBytes(r.result_size), "num", "result_size"],
    ["peak mem", (r) => fmtBytes(r.rss_peak), "num"], ["mem change", (r) => fmtSignedBytes(r.rss_change), "num"],
    ["retries", (r) => r.retries, "num"], ["error", (r) => r.error || ""],
  ];
  if (state.actions) columns.push(["", (r) => r.live ? actionButton("cancel", { task_id: r.task_id }) : ""]);
  table($("tasks"), t.rows, columns, true);
}

function stateCell(s, paused) {
  // A call paused in the debugger (breakpoint(), post-mortem) is still RUNNING, as in Ray.
  return paused ? el("span", s + " · paused in the debugger", "state-" + s + " state-paused")
    : el("span", s, "state-" + s);
}

function actionButton(kind, body) {
  const button = el("button", kind === "cancel" ? "Cancel" : "Kill", "action");
  button.addEventListener("click", async () => {
    if (!confirm(`${kind} ${JSON.stringify(body)}?`)) return;
    const reply = await fetch("/api/actions/" + kind, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const data = await reply.json();
    if (!reply.ok) alert(data.error);
  });
  return button;
}

function renderFunctions(f) {
  table($("functions"), f.functions, [
    ["function", (r) => r.name], ["tasks", (r) => fmtNumber(r.count), "num"],
    ["by state", (r) => Object.entries(r.state_counts).map(([k, v]) => `${k.toLowerCase()} ${v}`).join(", ")],
    ["p50 run", (r) => fmtSeconds(r.p50_run_s), "num"], ["p95 run", (r) => fmtSeconds(r.p95_run_s), "num"],
    ["mean run", (r) => fmtSeconds(r.mean_run_s), "num"],
    ["p50 queued", (r) => fmtSeconds(r.p50_queued_s), "num"], ["p95 queued", (r) => fmtSeconds(r.p95_queued_s), "num"],
    ["queued (total)", (r) => fmtSeconds(r.total_queued_s), "num"],
  ]);
}

function renderActors(a) {
  const columns = [
    ["actor", (r) => r.actor_id.slice(-8)], ["class", (r) => r.class_name], ["name", (r) => r.name || ""],
    ["state", (r) => r.state], ["pid", (r) => r.pid], ["restarts", (r) => `${r.restarts} / ${r.max_restarts}`, "num"],
    ["running", (r) => (r.methods_running || []).join(", ")], ["pending calls", (r) => r.queued, "num"],
    ["calls done", (r) => fmtNumber(r.calls_done), "num"], ["death cause", (r) => r.death_cause || ""],
  ];
  if (state.actions) columns.push(["", (r) => r.state !== "DEAD" ? actionButton("kill", { actor_id: r.actor_id }) : ""]);
  table($("actors"), a.actors, columns);
}

function renderObjects(o) {
  const box = $("objects-summary");
  box.replaceChildren();
  if (o.error) { box.append(el("div", o.error, "muted")); return; }
  box.append(el("div", `${fmtNumber(o.objects)} objects, ${fmtBytes(o.total_bytes)} ` +
    `(${fmtBytes(o.shared_memory_bytes)} in shared memory), ${fmtNumber(o.freed_objects)} freed`));
  for (const g of o.by_reference_kind || []) box.append(el("div", `${g.kind}: ${g.count} objects, ${fmtBytes(g.bytes)}`, "muted"));
  for (const g of o.by_owner || []) box.append(el("div", `owner ${g.owner}: ${g.count} objects, ${fmtBytes(g.bytes)}`, "muted"));
  table($("objects"), o.largest || [], [
    ["object", (r) => r.object_id.slice(-10)], ["size", (r) => fmtBytes(r.size), "num"], ["owner", (r) => r.owner],
    ["made by", (r) => r.task_name || ""], ["state", (r) => r.state], ["reference", (r) => r.reference_kind || ""],
    ["where", (r) => r.location || ""],
  ]);
}

// ---------------------------------------------------------------- stacks
function renderStackTargets() {
  const box = $("stack-targets");
  box.replaceChildren();
  const workers = (state.lastOverview && state.lastOverview.workers) || [];
  const targets = [["all", "All processes"], ["driver", "Driver"]].concat(
    workers.filter((w) => w.worker_id).map((w) => [String(w.worker_id),
      `worker ${w.worker_id}${w.actor_class ? " (" + w.actor_class + ")" : ""}`]));
  for (const [target, label] of targets) {
    const button = el("button", label);
    button.dataset.target = target;
    button.addEventListener("click", () => loadStacks(target));
    box.append(button);
  }
}

function taskLink(taskId) {
  const link = el("a", String(taskId));
  link.href = "#";
  link.addEventListener("click", (event) => { event.preventDefault(); loadTaskOutput(taskId); });
  return link;
}

async function loadTaskOutput(taskId) {
  // What one task printed, as the driver kept it (its last lines; stderr marked).
  const pre = $("task-output");
  pre.textContent = "loading task " + taskId + "'s output…";
  const reply = await fetch("/api/logs?task=" + encodeURIComponent(taskId));
  const data = await reply.json();
  pre.className = "";
  if (!reply.ok) { pre.textContent = data.error; return; }
  const lines = [];
  for (const call of data.tasks) {
    lines.push(`── task ${call.task_id} · ${call.name} · worker ${call.worker_id} (pid ${call.pid})` +
      (call.dropped ? ` · ${call.dropped} earlier lines dropped` : ""));
    for (const [stream, text] of call.lines) lines.push((stream === "stderr" ? "! " : "  ") + text);
  }
  pre.textContent = lines.length ? lines.join("\n") : `task ${taskId} printed nothing (that the driver kept)`;
}

async function loadStacks(target) {
  const pre = $("stack-text");
  pre.textContent = "dumping stacks…";
  const reply = await fetch("/api/stacks?target=" + encodeURIComponent(target));
  const data = await reply.json();
  pre.className = "";
  pre.textContent = reply.ok ? data.text : data.error;
}

// ---------------------------------------------------------------- profile
// While the view is open the page asks for 2 s of samples again and again (the server
// runs the task profiler for each request) and adds each answer's call trees to its own:
// one tree for all tasks, one per task function. A box's width is its share of its tree.
const profile = { trees: {}, samples: 0, seconds: 0, workers: new Set(), running: false,
  zoom: null, hz: 100 };

function addTree(into, tree) {
  into.value += tree.value;
  for (const child of tree.children) {
    let mine = into.kids[child.name];
    if (!mine) mine = into.kids[child.name] = { name: child.name, value: 0, kids: {} };
    addTree(mine, child);
  }
}

async function profileLoop() {
  if (profile.running) return;
  profile.running = true;
  try {
    while (state.view === "profile") {
      $("profile-note").textContent = "sampling…";
      let reply, data;
      try {
        reply = await fetch("/api/profile?seconds=2");
        data = await reply.json();
      } catch (error) {
        $("profile-note").textContent = "the dashboard did not answer";
        return;
      }
      if (!reply.ok) {
        $("profile-note").textContent = data.error;
        if (reply.status === 410) return;  // the program ended
        await new Promise((resolve) => setTimeout(resolve, 2000));
        continue;
      }
      profile.hz = data.hz;
      profile.samples += data.samples;
      profile.seconds += data.seconds;
      for (const w of data.workers) profile.workers.add(w);
      for (const [label, tree] of Object.entries(data.trees)) {
        if (!profile.trees[label]) profile.trees[label] = { name: label, value: 0, kids: {} };
        addTree(profile.trees[label], tree);
      }
      renderProfile();
    }
  } finally {
    profile.running = false;
  }
}

function renderProfile() {
  const pick = $("profile-pick");
  const labels = Object.keys(profile.trees).sort((a, b) =>
    a === "all tasks" ? -1 : b === "all tasks" ? 1 : profile.trees[b].value - profile.trees[a].value);
  if ([...pick.options].map((o) => o.value).join("\n") !== labels.join("\n")) {
    const chosen = pick.value;
    pick.replaceChildren(...labels.map((l) => new Option(l, l)));
    if (labels.includes(chosen)) pick.value = chosen;
  }
  $("profile-note").textContent = `${fmtNumber(profile.samples)} samples at ${profile.hz} Hz over ` +
    `${profile.seconds.toFixed(1)} s from ${profile.workers.size} workers (sampling while open)`;
  const tree = profile.trees[pick.value];
  const box = $("flame");
  box.replaceChildren();
  if (!tree || !tree.value) { box.style.height = "40px"; return; }
  let root = tree;
  for (const name of profile.zoom || []) root = (root && root.kids[name]) || null;
  if (!root) { profile.zoom = null; root = tree; }
  const rows = [];
  const place = (node, x, depth, path) => {
    const width = node.value / root.value;
    if (width < 0.002) return;
    rows.push(depth);
    const frame = el("div", node.name, "frame");
    frame.style.left = (100 * x) + "%";
    frame.style.width = (100 * width) + "%";
    frame.style.top = (depth * 18) + "px";
    frame.style.background = colorOf(node.name);
    frame.dataset.path = JSON.stringify(path);
    frame.title = `${node.name}\n${node.value} samples, ${(node.value / profile.hz).toFixed(2)} s, ` +
      `${(100 * width).toFixed(1)}%`;
    frame.addEventListener("mouseover", () => { $("profile-info").textContent = frame.title.replace("\n", ": "); });
    frame.addEventListener("click", () => { profile.zoom = path; renderProfile(); });
    box.append(frame);
    let cx = x;
    for (const child of Object.values(node.kids).sort((a, b) => b.value - a.value)) {
      place(child, cx, depth + 1, path.concat([child.name]));
      cx += child.value / root.value;
    }
  };
  place(root, 0, 0, profile.zoom || []);
  box.style.height = (18 * (Math.max(...rows) + 1) + 2) + "px";
}

// ---------------------------------------------------------------- navigation
function show(view) {
  state.view = view;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === "view-" + view);
  if (view === "stacks") renderStackTargets();
  if (view === "profile") profileLoop();
  history.replaceState(null, "", "#" + view);
  connect();
}

function onTasksFilter() {
  state.tasks.state = $("f-state").value;
  state.tasks.name = $("f-name").value.trim();
  state.tasks.worker = $("f-worker").value.trim();
  state.tasks.page = 0;
  connect();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.view));
  $("window").addEventListener("change", () => { state.window = Number($("window").value); connect(); });
  $("stream").addEventListener("mousemove", onStreamHover);
  $("stream").addEventListener("mouseleave", () => $("tooltip").classList.add("hidden"));
  $("f-state").addEventListener("change", onTasksFilter);
  $("f-name").addEventListener("change", onTasksFilter);
  $("f-worker").addEventListener("change", onTasksFilter);
  $("prev").addEventListener("click", () => { state.tasks.page = Math.max(0, state.tasks.page - 1); connect(); });
  $("next").addEventListener("click", () => { state.tasks.page += 1; connect(); });
  $("tasks").addEventListener("click", (event) => {
    const key = event.target.dataset && event.target.dataset.sort;
    if (!key) return;
    if (state.tasks.sort === key) state.tasks.order = state.tasks.order === "desc" ? "asc" : "desc";
    else { state.tasks.sort = key; state.tasks.order = "desc"; }
    state.tasks.page = 0;
    connect();
  });
  $("profile-pick").addEventListener("change", () => { profile.zoom = null; renderProfile(); });
  $("profile-unzoom").addEventListener("click", () => { profile.zoom = null; renderProfile(); });
  $("profile-clear").addEventListener("click", () => {
    Object.assign(profile, { trees: {}, samples: 0, seconds: 0, workers: new Set(), zoom: null });
    renderProfile();
  });
  const start = location.hash.slice(1);
  show(["overview", "stream", "tasks", "functions", "actors", "objects", "stacks", "profile"]
    .includes(start) ? start : "overview");
});
