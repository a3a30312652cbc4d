// framerelay console: the jobs panel (GET /v1/console/jobs: the orchestrator's batch
// jobs, through the ingest). Every value from the server is written with textContent,
// never as HTML.

const JOBS_MS = 2000;

const $ = (id) => document.getElementById(id);

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function money(value) {
  return value === null || value === undefined ? "–" : `$${Number(value).toFixed(4)}`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// Polls the panel every JOBS_MS while `control` is not aborted (the page is signed in);
// `api(method, path)` is the page's authenticated fetch.
export async function followJobs(control, api) {
  while (!control.signal.aborted) {
    try {
      renderJobs(await api("GET", "/v1/console/jobs"));
    } catch (error) {
      if (control.signal.aborted) return;
      $("jobs-note").textContent = `jobs unavailable: ${error.message}`;
    }
    await new Promise((resolve) => setTimeout(resolve, JOBS_MS));
  }
}

function renderJobs(panel) {
  const note = $("jobs-note");
  if (!panel.configured) {
    $("jobs-body").hidden = true;
    note.className = "muted";
    note.textContent = "No orchestrator is configured for this ingest "
      + "(FRAMERELAY_INGEST_ORCHESTRATOR_URL): no batch jobs to show.";
    return;
  }
  $("jobs-body").hidden = false;
  const running = panel.jobs.filter((j) => j.state === "running").length;
  $("jobs-summary").textContent = `${panel.jobs.length} jobs · ${running} running`;
  if (panel.error) {
    note.className = panel.stale ? "stale" : "error";
    note.textContent = `${panel.stale ? `stale data (${duration(panel.age_s)} old): ` : ""}`
      + panel.error;
  } else {
    note.className = "muted";
    note.textContent = panel.jobs.length ? "" : "No batch jobs yet (framerelay jobs submit).";
  }
  $("jobs").tBodies[0].replaceChildren(...panel.jobs.map(jobRow));
}

function progressCell(j) {
  const td = element("td");
  const meter = element("div", null, "meter");
  const bar = element("progress");
  bar.max = j.frames_total || 1;
  bar.value = j.frames_total ? Math.min(j.frames_done, j.frames_total) : 0;
  if (j.frames_total === null) bar.removeAttribute("value"); // indeterminate: total unknown
  const total = j.frames_total === null ? "?" : j.frames_total;
  const pct = j.percent === null ? "" : ` (${j.percent.toFixed(1)} %)`;
  meter.append(bar, element("span", `${j.frames_done} / ${total} frames${pct}`, "frames"));
  td.append(meter);
  return td;
}

function jobRow(j) {
  const tr = element("tr");
  tr.dataset.job = j.id;
  const stateCell = element("td", j.state, `job-${j.state}`);
  if (j.error) stateCell.append(element("span", j.error, "reason"));
  const cost = element("td", money(j.cost_usd), "num");
  cost.append(element("span", j.ended ? "final" : "so far", "reason"));
  tr.append(element("td", j.id), stateCell, element("td", j.model), progressCell(j),
    element("td", j.ended ? "–" : duration(j.eta_s), "num"), cost,
    element("td", duration(j.duration_s), "num"),
    element("td", `${j.tasks_done} / ${j.tasks_total}`, "num"));
  return tr;
}
