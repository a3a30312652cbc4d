// framerelay operator console: one small ES module, no dependencies, no build step.
// The token lives in this tab's sessionStorage and goes out as "Authorization: Bearer"
// on every request; the server keeps no session. Event streams are read with fetch()
// (EventSource cannot send headers). Every value from the server is written with
// textContent, never as HTML.

import { followJobs } from "./console_jobs.js";

const TOKEN_KEY = "framerelay.console.token";
const BOX = "#00ff66"; // boxes and labels on the live view (tests read this colour)
const TRAIL = "#ffb000";
const TRAIL_POINTS = 40;
const RETRY_MS = 2000;

const $ = (id) => document.getElementById(id);
const state = {
  token: null, session: null, rows: [], sort: { key: "id", dir: 1 }, filter: "",
  table: null, live: null, editing: null, fleet: null,
};

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${state.token}`, ...extra };
}

function messageOf(body, status) {
  if (body && typeof body.detail === "string") return body.detail;
  if (body && Array.isArray(body.detail)) {
    return body.detail.map((d) => {
      const where = (d.loc || []).filter((p) => p !== "body").join(".");
      return where ? `${where}: ${d.msg}` : d.msg;
    }).join("\n");
  }
  if (body && body.message) return body.message;
  return `HTTP ${status}`;
}

async function errorOf(response) {
  let body = null;
  try { body = await response.json(); } catch { /* not JSON */ }
  return new HttpError(response.status, messageOf(body, response.status));
}

async function api(method, path, body) {
  const init = { method, headers: headers(), cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    const error = await errorOf(response);
    signOut(`Signed out: ${error.message}`);
    throw error;
  }
  if (!response.ok) throw await errorOf(response);
  return response.status === 204 ? null : response.json();
}

// Server-sent events over fetch: calls onEvent(name, data) for each event until the
// server ends the stream or `signal` aborts it.
async function readEvents(path, onEvent, signal) {
  const response = await fetch(path, { headers: headers(), signal, cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

// -- signing in and out ------------------------------------------------------------

async function signIn(token) {
  state.token = token;
  const session = await api("GET", "/v1/console/session");
  state.session = session;
  sessionStorage.setItem(TOKEN_KEY, token);
  showApp();
}

function signOut(reason = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  state.session = null;
  state.rows = [];
  state.fleet = null;
  if (state.table) state.table.abort();
  closeLive();
  $("app").hidden = true;
  $("signout").hidden = true;
  $("who").textContent = "";
  $("streams").tBodies[0].replaceChildren();
  rowNodes.clear();
  $("login").hidden = false;
  $("login-error").textContent = reason;
}

function showApp() {
  const s = state.session;
  $("login").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  $("who").textContent = `${s.subject} · ${s.can_write ? "can change streams" : "read only"}`;
  $("add").hidden = !s.can_write; // a viewer's page shows no controls to change streams
  closeForm();
  followTable();
}

// -- the streams table -------------------------------------------------------------

async function followTable() {
  const control = new AbortController();
  state.table = control;
  followHistory(control);
  followFleet(control);
  followJobs(control, api);
  while (!control.signal.aborted) {
    try {
      await readEvents("/v1/console/streams", onTableEvent, control.signal);
    } catch (error) {
      if (control.signal.aborted) return;
      if (error.status === 401) { signOut(`Signed out: ${error.message}`); return; }
      $("status-line").textContent = `connection lost (${error.message}); retrying ...`;
    }
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
}

function onTableEvent(name, data) {
  if (name === "expired") { signOut(data.reason); return; }
  if (name !== "streams") return;
  state.rows = data.streams;
  const running = data.streams.filter((r) => r.state === "RUNNING").length;
  const at = new Date(data.at * 1000).toLocaleTimeString();
  $("status-line").textContent =
    `updated ${at} · ${data.streams.length} streams · ${running} running`;
  renderStreams();
  renderWorkers(data.workers);
}

function visibleRows() {
  const needle = state.filter.toLowerCase();
  const rows = state.rows.filter((r) => !needle
    || [r.id, r.state, r.worker || "", r.source].some((v) => v.toLowerCase().includes(needle)));
  const { key, dir } = state.sort;
  return rows.sort((a, b) => {
    const x = a[key], y = b[key];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
}

function number(value, digits = 1) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

// Rows are kept by stream id and updated in place: a button under the pointer is never
// replaced between press and release by the next second's update.
const rowNodes = new Map();

function renderStreams() {
  const body = $("streams").tBodies[0];
  const rows = visibleRows();
  const shown = new Set(rows.map((r) => r.id));
  for (const [id, tr] of rowNodes) {
    if (!shown.has(id)) { tr.remove(); rowNodes.delete(id); }
  }
  rows.forEach((r, i) => {
    let tr = rowNodes.get(r.id);
    if (!tr) {
      tr = element("tr");
      tr.dataset.stream = r.id;
      for (let c = 0; c < 13; c++) tr.append(element("td"));
      tr.append(actions(r));
      rowNodes.set(r.id, tr);
    }
    fillRow(tr.cells, r);
    if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
  });
  for (const th of $("streams").tHead.rows[0].cells) {
    th.classList.toggle("sorted", th.dataset.key === state.sort.key);
    th.classList.toggle("desc", th.dataset.key === state.sort.key && state.sort.dir < 0);
  }
}

function cell(td, text, className = "", extra = null) {
  td.className = className;
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (extra) td.append(extra);
}

function fillRow(cells, r) {
  const breach = r.latency_slo_ms && r.latency_p99_ms > r.latency_slo_ms;
  cell(cells[0], r.id);
  cell(cells[1], r.state, `state-${r.state}`, r.error ? element("span", r.error, "reason") : null);
  cell(cells[2], r.epoch, "num");
  cell(cells[3], number(r.fps_in), "num");
  cell(cells[4], number(r.fps_out), "num");
  cell(cells[5], r.results, "num");
  cell(cells[6], r.dropped, "num");
  cells[6].title = Object.entries(r.drops).map(([k, v]) => `${k}: ${v}`).join("\n") || "none";
  cell(cells[7], number(r.latency_p50_ms, 0), "num");
  cell(cells[8], number(r.latency_p99_ms, 0), breach ? "num breach" : "num");
  cell(cells[9], r.latency_slo_ms, "num",
    r.slo_breaches ? element("span", `${r.slo_breaches} over`, "reason") : null);
  cell(cells[10], r.latency_from);
  cell(cells[11], r.worker);
  cell(cells[12], tierOf(r.id));
}

function actions(row) {
  const cell = element("td", null, "actions");
  const view = element("button", "View");
  view.type = "button";
  view.dataset.action = "view";
  view.addEventListener("click", () => openLive(row.id));
  cell.append(view);
  if (state.session && state.session.can_write) {
    const edit = element("button", "Edit");
    edit.type = "button";
    edit.dataset.action = "edit";
    edit.addEventListener("click", () => editStream(row.id));
    const remove = element("button", "Remove");
    remove.type = "button";
    remove.dataset.action = "remove";
    remove.addEventListener("click", () => removeStream(row.id));
    cell.append(edit, remove);
  }
  return cell;
}

function renderWorkers(workers) {
  const rows = workers.map((w) => {
    const tr = element("tr");
    const stateCell = element("td", w.state, `state-${w.state}`);
    if (w.stall_reason) stateCell.append(element("span", w.stall_reason, "reason"));
    tr.append(element("td", w.name), element("td", w.worker_id ?? "–"), stateCell,
      element("td", w.streams, "num"), element("td", number(w.rtt_p95_ms, 0), "num"),
      element("td", w.stalls, "num"));
    return tr;
  });
  $("workers").tBodies[0].replaceChildren(...rows);
}

// -- the last hour (GET /v1/history: a point every 10 s, kept by the ingest) ---------

const HISTORY_MS = 10000;
const COLOURS = { in: "#58a6ff", out: "#3fb950", p50: "#58a6ff", p99: "#f0883e", drops: "#f85149" };

async function followHistory(control) {
  while (!control.signal.aborted) {
    const id = state.live ? state.live.id : null;
    const query = id ? `?stream=${encodeURIComponent(id)}` : "?totals_only=true";
    try {
      const history = await api("GET", `/v1/history${query}`);
      const series = id ? history.streams[id] : history.total;
      $("history-of").textContent = id ? `stream ${id}` : "all streams";
      drawHistory(history.timestamps, series);
      $("history-note").textContent = history.timestamps.length
        ? "" : "no point yet: the ingest keeps one every 10 s";
    } catch (error) {
      if (control.signal.aborted) return;
      $("history-note").textContent = `history unavailable: ${error.message}`;
    }
    await new Promise((resolve) => setTimeout(resolve, HISTORY_MS));
  }
}

function drawHistory(times, s) {
  chart($("chart-fps"), times, [[s.fps_in, COLOURS.in], [s.fps_out, COLOURS.out]]);
  chart($("chart-latency"), times, [[s.latency_p50_ms, COLOURS.p50], [s.latency_p99_ms, COLOURS.p99]]);
  chart($("chart-drops"), times, [[s.drops, COLOURS.drops]]);
}

// One small line chart: the last hour on x, 0..max on y (nulls are gaps).
function chart(canvas, times, lines) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, top = 14, bottom = h - 14;
  ctx.clearRect(0, 0, w, h);
  const values = lines.flatMap(([v]) => v || []).filter((v) => v !== null && isFinite(v));
  const max = Math.max(1, ...values);
  const known = times.filter((t) => t !== null);
  const end = known.length ? known[known.length - 1] : Date.now() / 1000; // the server's clock
  const start = end - 3600;
  const x = (t) => ((t - start) / 3600) * w;
  const y = (v) => bottom - (v / max) * (bottom - top);
  ctx.strokeStyle = "#2a3240";
  ctx.beginPath();
  ctx.moveTo(0, bottom + 0.5);
  ctx.lineTo(w, bottom + 0.5);
  ctx.stroke();
  ctx.fillStyle = "#8b95a5";
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText(`${max.toFixed(max < 10 ? 1 : 0)}`, 2, top - 3);
  ctx.fillText("-60 min", 2, h - 2);
  ctx.fillText("now", w - 22, h - 2);
  ctx.lineWidth = 1.5;
  for (const [line, colour] of lines) {
    if (!line) continue;
    ctx.strokeStyle = colour;
    ctx.beginPath();
    let open = false;
    line.forEach((v, i) => {
      if (v === null || times[i] === null || !isFinite(v)) { open = false; return; }
      if (open) ctx.lineTo(x(times[i]), y(v));
      else ctx.moveTo(x(times[i]), y(v));
      open = true;
    });
    ctx.stroke();
  }
}

// -- workers and fleet (GET /v1/console/fleet: the orchestrator, through the ingest) ---

const FLEET_MS = 2000;

async function followFleet(control) {
  while (!control.signal.aborted) {
    try {
      renderFleet(await api("GET", "/v1/console/fleet"));
    } catch (error) {
      if (control.signal.aborted) return;
      $("fleet-note").textContent = `fleet unavailable: ${error.message}`;
    }
    await new Promise((resolve) => setTimeout(resolve, FLEET_MS));
  }
}

function money(value, digits = 2) {
  return value === null || value === undefined ? "–" : `$${Number(value).toFixed(digits)}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function renderFleet(fleet) {
  state.fleet = fleet;
  if (!fleet.configured) {
    $("fleet-body").hidden = true;
    $("fleet-cost").textContent = "";
    $("fleet-note").textContent = "No orchestrator is configured for this ingest "
      + "(FRAMERELAY_INGEST_ORCHESTRATOR_URL): the worker tunnels below are what it knows.";
    return;
  }
  $("fleet-body").hidden = false;
  $("fleet-source").textContent = `${fleet.provider ?? ""} · ${fleet.orchestrator}`;
  const c = fleet.cost || {};
  $("fleet-cost").textContent = `${money(c.usd_per_hr)}/h now · `
    + `${money(c.usd_per_stream_hr, 3)} per stream-hour (${c.streams_placed ?? 0} streams) · `
    + `saves ${money(c.savings_usd_per_hr)}/h (${number(c.savings_pct, 0)} %) against all `
    + `on-demand`;
  const note = $("fleet-note");
  note.textContent = fleet.error ? `${fleet.stale ? "stale data: " : ""}${fleet.error}` : "";
  note.className = fleet.stale ? "stale" : "muted";
  $("pods").tBodies[0].replaceChildren(...fleet.pods.map(podRow));
  const events = [...fleet.events].reverse().map((e) => {
    const li = element("li");
    li.append(element("span", new Date(e.t * 1000).toLocaleTimeString(), "muted"), " ",
      element("span", e.kind, "kind"), ` ${[e.pod, e.stream].filter(Boolean).join(" · ")}: `,
      element("span", e.reason));
    return li;
  });
  $("events").replaceChildren(...events);
  const h = fleet.history;
  if (h) {
    chart($("chart-cost"), h.t, [[h.usd_per_hr, COLOURS.out],
      [h.ondemand_usd_per_hr, COLOURS.p99]]);
  }
}

function podRow(p) {
  const tr = element("tr");
  tr.dataset.pod = p.name;
  const stateCell = element("td", p.ready ? `${p.state} · ready` : p.state,
    p.ready ? "state-UP" : "state-STALLED");
  if (p.error) stateCell.append(element("span", p.error, "reason"));
  tr.append(element("td", p.name), element("td", p.provider), element("td", tierName(p)),
    element("td", p.gpu ?? "–"), stateCell,
    element("td", number(p.canary_ms, 0), "num"), element("td", duration(p.uptime_s), "num"),
    element("td", money(p.usd_per_hr, 3), "num"), element("td", p.streams.length, "num"));
  return tr;
}

// The tier of the pod serving a stream, when the orchestrator placed it.
function tierOf(streamId) {
  const pods = state.fleet && state.fleet.configured ? state.fleet.pods : [];
  const pod = pods.find((p) => p.streams.includes(streamId));
  return pod ? tierName(pod) : null;
}

function tierName(pod) {
  return pod.spot && !pod.tier.includes("spot") ? `${pod.tier} (spot)` : pod.tier;
}

// -- adding, editing, removing -----------------------------------------------------

function openForm(title, values, needsPassword) {
  const form = $("stream-form");
  form.reset();
  $("form-title").textContent = title;
  $("form-error").textContent = "";
  for (const [name, value] of Object.entries(values)) {
    const input = form.elements[name];
    if (!input || value === null || value === undefined) continue;
    if (input.type === "checkbox") input.checked = Boolean(value);
    else input.value = value;
  }
  form.elements.id.readOnly = state.editing !== null;
  $("password-field").hidden = !needsPassword;
  form.hidden = false;
  form.elements[state.editing === null ? "id" : "url"].focus();
}

function formValues() {
  const form = $("stream-form");
  const out = {};
  for (const name of ["id", "url", "tracker", "password"]) {
    const value = form.elements[name].value.trim();
    if (value) out[name] = value;
  }
  for (const name of ["fps", "latency_slo_ms"]) {
    const text = form.elements[name].value.trim();
    if (text) out[name] = Number(text);
  }
  out.realtime = form.elements.realtime.checked;
  out.loop = form.elements.loop.checked;
  return out;
}

async function editStream(id) {
  try {
    const detail = await api("GET", `/v1/streams/${encodeURIComponent(id)}`);
    state.editing = detail.config;
    openForm(`Edit ${id}`, detail.config, detail.config.password === "***");
  } catch (error) {
    $("status-line").textContent = `cannot edit ${id}: ${error.message}`;
  }
}

// The API masks credentials ("***") in what it shows; sending them back would replace
// the real ones. The edited definition is the shown one with the form's fields on top,
// and the page refuses to send a masked value.
function definition() {
  const values = formValues();
  if (state.editing === null) return values;
  const merged = { ...state.editing, ...values };
  if (!values.password && merged.password === "***") delete merged.password;
  if (state.editing.password === "***" && !values.password) {
    throw new Error("password: re-enter it (the API does not show it)");
  }
  if (!values.latency_slo_ms && "latency_slo_ms" in merged) merged.latency_slo_ms = null;
  const masked = Object.entries(merged).filter(([, v]) => JSON.stringify(v).includes("***"));
  if (masked.length) {
    throw new Error(`${masked.map(([k]) => k).join(", ")}: hidden credentials; re-enter `
      + "them here, or change this stream with the API or the CLI");
  }
  return merged;
}

async function saveStream(event) {
  event.preventDefault();
  $("form-error").textContent = "";
  try {
    const body = definition();
    if (state.editing === null) await api("POST", "/v1/streams", body);
    else await api("PUT", `/v1/streams/${encodeURIComponent(body.id)}`, body);
    closeForm();
  } catch (error) {
    $("form-error").textContent = error.message;
  }
}

function closeForm() {
  state.editing = null;
  $("stream-form").hidden = true;
}

async function removeStream(id) {
  if (!window.confirm(`Remove stream ${id}? It stops, and its definition is deleted.`)) return;
  try {
    await api("DELETE", `/v1/streams/${encodeURIComponent(id)}`);
  } catch (error) {
    $("status-line").textContent = `cannot remove ${id}: ${error.message}`;
  }
}

// -- the live view -----------------------------------------------------------------

function openLive(id) {
  closeLive();
  const control = new AbortController();
  const live = { id, control, paused: false, drawing: Promise.resolve(), trails: new Map(),
    epoch: null };
  state.live = live;
  $("live-panel").hidden = false;
  $("live-title").textContent = `Live view: ${id}`;
  $("live-info").textContent = "waiting for the next result ...";
  $("pause").textContent = "Pause";
  const path = `/v1/console/streams/${encodeURIComponent(id)}/live`;
  readEvents(path, (name, data) => onLiveEvent(live, name, data), control.signal)
    .then(() => { if (state.live === live) $("live-info").textContent = "the live view ended"; })
    .catch((error) => {
      if (control.signal.aborted) return;
      if (error.status === 401) { signOut(`Signed out: ${error.message}`); return; }
      $("live-info").textContent = `live view unavailable: ${error.message}`;
    });
}

function closeLive() {
  if (state.live) state.live.control.abort();
  state.live = null;
  $("live-panel").hidden = true;
}

function onLiveEvent(live, name, data) {
  if (name === "expired") { signOut(data.reason); return; }
  if (name === "gone") { $("live-info").textContent = data.reason; return; }
  if (name !== "frame" || live.paused || state.live !== live) return;
  live.drawing = live.drawing.then(() => draw(live, data)).catch((error) => {
    $("live-info").textContent = `cannot draw a frame: ${error.message}`;
  });
}

async function draw(live, { result, frame }) {
  const bytes = Uint8Array.from(atob(frame.jpeg), (c) => c.charCodeAt(0));
  const image = await createImageBitmap(new Blob([bytes], { type: "image/jpeg" }));
  const canvas = $("live");
  const width = Math.min(960, frame.src_w);
  const scale = width / frame.src_w;
  canvas.width = width;
  canvas.height = Math.round(frame.src_h * scale);
  const ctx = canvas.getContext("2d");
  ctx.drawImage(image, frame.pad_x, frame.pad_y, frame.new_w, frame.new_h,
    0, 0, canvas.width, canvas.height);
  image.close();
  if (live.epoch !== result.epoch) live.trails.clear(); // a new epoch: another timeline
  live.epoch = result.epoch;
  remember(live, result.detections);
  if ($("trails").checked) drawTrails(ctx, live, scale);
  drawBoxes(ctx, result.detections, scale);
  Object.assign(canvas.dataset, { epoch: result.epoch, seq: result.seq, pts: result.pts,
    resultId: result.id, scale });
  $("live-info").textContent = `epoch ${result.epoch} · frame ${result.seq} · `
    + `pts ${result.pts_time.toFixed(3)} s · ${result.detections.length} objects · `
    + `latency ${Math.round(result.latency_ms)} ms`;
}

function drawBoxes(ctx, detections, scale) {
  ctx.lineWidth = 3;
  ctx.strokeStyle = BOX;
  ctx.font = "13px system-ui, sans-serif";
  ctx.textBaseline = "bottom";
  for (const d of detections) {
    const [x1, y1, x2, y2] = d.box.map((v) => v * scale);
    ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
    const track = d.tracker_id >= 0 ? ` #${d.tracker_id}` : "";
    const label = `${d.class_name}${track} ${d.confidence.toFixed(2)}`;
    const w = ctx.measureText(label).width + 6;
    const top = Math.max(16, y1);
    ctx.fillStyle = BOX;
    ctx.fillRect(x1 - 1.5, top - 16, w, 16);
    ctx.fillStyle = "#000";
    ctx.fillText(label, x1 + 2, top - 1);
  }
}

function remember(live, detections) {
  for (const d of detections) {
    if (d.tracker_id < 0) continue;
    const [x1, y1, x2, y2] = d.box;
    const points = live.trails.get(d.tracker_id) || [];
    points.push([(x1 + x2) / 2, y2]);
    if (points.length > TRAIL_POINTS) points.shift();
    live.trails.set(d.tracker_id, points);
  }
  if (live.trails.size > 500) live.trails.delete(live.trails.keys().next().value);
}

function drawTrails(ctx, live, scale) {
  ctx.lineWidth = 2;
  ctx.strokeStyle = TRAIL;
  for (const points of live.trails.values()) {
    if (points.length < 2) continue;
    ctx.beginPath();
    points.forEach(([x, y], i) => (i ? ctx.lineTo(x * scale, y * scale)
      : ctx.moveTo(x * scale, y * scale)));
    ctx.stroke();
  }
}

// -- wiring ------------------------------------------------------------------------

function wire() {
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("login-error").textContent = "";
    try {
      await signIn($("token").value.trim());
      $("token").value = "";
    } catch (error) {
      state.token = null;
      $("login-error").textContent = `Not signed in: ${error.message}`;
    }
  });
  $("signout").addEventListener("click", () => signOut());
  $("filter").addEventListener("input", (event) => {
    state.filter = event.target.value;
    renderStreams();
  });
  for (const th of $("streams").tHead.rows[0].cells) {
    if (!th.dataset.key) continue;
    th.addEventListener("click", () => {
      const same = state.sort.key === th.dataset.key;
      state.sort = { key: th.dataset.key, dir: same ? -state.sort.dir : 1 };
      renderStreams();
    });
  }
  $("add").addEventListener("click", () => {
    state.editing = null;
    openForm("Add a stream", { realtime: false, loop: false }, false);
  });
  $("stream-form").addEventListener("submit", saveStream);
  $("cancel").addEventListener("click", closeForm);
  $("close-live").addEventListener("click", closeLive);
  $("pause").addEventListener("click", () => {
    if (!state.live) return;
    state.live.paused = !state.live.paused;
    $("pause").textContent = state.live.paused ? "Resume" : "Pause";
  });
}

async function start() {
  wire();
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (!saved) { signOut(); return; }
  try {
    await signIn(saved);
  } catch (error) {
    signOut(`Sign in again: ${error.message}`);
  }
}

start();
