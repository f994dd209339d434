// claimd status page: fetches the JSON API every few seconds and re-renders.
// Everything from the data goes into the DOM through textContent or attributes,
// never through innerHTML: a job's name, error or output is shown, never run.
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  const REFRESH_MS = 1000 * Math.min(300, Math.max(1, Number(params.get("refresh")) || 5));
  const INSTANTS = Math.min(200, Math.max(1, Number(params.get("instants")) || 30));
  const TERMINAL = new Set(["succeeded", "failed", "skipped", "cancelled"]);

  // What each cell looks like and says. The glyph and the title carry the
  // meaning too: colour is never the only signal.
  const LOOKS = {
    succeeded: { glyph: "✓", label: "succeeded" },
    failed: { glyph: "✗", label: "failed" },
    stuck: { glyph: "!", label: "stuck (lease expired)" },
    missing: { glyph: "?", label: "missing (no run, no recorded reason)" },
    skipped: { glyph: "–", label: "skipped by a policy" },
    dropped: { glyph: "·", label: "dropped by the catch-up policy" },
    paused: { glyph: "‖", label: "paused (the job was paused then)" },
    pruned: { glyph: "·", label: "pruned (older than history_retention)" },
    cancelled: { glyph: "⊘", label: "cancelled" },
    running: { glyph: "▶", label: "running" },
    pending: { glyph: "…", label: "due, not started yet" },
  };
  const STATE_LOOK = { succeeded: "succeeded", failed: "failed", skipped: "skipped",
    cancelled: "cancelled", running: "running", claimed: "pending", pending: "pending" };

  let serverSkewMs = 0; // the database's clock minus this browser's
  let lastGood = null;
  let openCell = null; // {job, at} of the cell whose detail is open
  let openRun = null; // the run shown in the detail panel, as the API gave it
  let timer = null;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, String(value));
      else if (key === "onclick") node.addEventListener("click", value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // "2026-12-01T02:00:00.123+01:00" -> "2026-12-01 02:00:00" (the zone is said apart)
  function wall(iso) {
    return iso ? iso.replace("T", " ").slice(0, 19) : "—";
  }

  function ago(iso) {
    if (!iso) return "";
    const seconds = Math.round((Date.now() + serverSkewMs - Date.parse(iso)) / 1000);
    const size = Math.abs(seconds);
    const text = size < 90 ? `${size} s` : size < 5400 ? `${Math.round(size / 60)} min`
      : size < 129600 ? `${Math.round(size / 3600)} h` : `${Math.round(size / 86400)} d`;
    return seconds >= 0 ? `${text} ago` : `in ${text}`;
  }

  function lookOf(cell) {
    if (cell.status === "in_progress" || cell.status === "extra") {
      return STATE_LOOK[cell.state] || "pending";
    }
    return cell.status;
  }

  async function getJson(path) {
    const response = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (!response.ok) {
      const reason = body && body.error ? body.error : `HTTP ${response.status}`;
      throw new Error(`${path}: ${reason}`);
    }
    return body;
  }

  function renderHealth(status) {
    const list = document.getElementById("health");
    const names = { postgres: "PostgreSQL", nats: "NATS" };
    const items = Object.entries(status.checks || {}).map(([key, value]) => {
      const ok = value === "ok";
      return el("li", { class: ok ? "ok" : "bad", title: ok ? "reachable" : String(value) },
        el("span", { class: "dot", "aria-hidden": "true" }, ok ? "●" : "▲"),
        `${names[key] || key}: `, el("strong", {}, ok ? "ok" : String(value)));
    });
    list.replaceChildren(...items);
  }

  function renderCounters(status) {
    const c = status.counters || {};
    const reasons = Object.entries(c.deliveries_skipped_by_reason || {})
      .filter(([, n]) => n > 0).map(([r, n]) => `${r}: ${n}`).join(", ");
    const facts = [
      ["duplicate deliveries skipped", c.deliveries_skipped, reasons || "none so far"],
      ["fenced completions", c.fenced_completions,
        "completions refused because the run's epoch moved on"],
      ["redeliveries", c.redeliveries, "messages JetStream delivered more than once"],
    ];
    document.getElementById("counters").replaceChildren(...facts.map(([name, value, why]) =>
      el("div", { class: "counter", title: why },
        el("dt", {}, name), el("dd", {}, String(value === undefined ? "—" : value)))));
  }

  // The jobs the config file rejected at its last load: a new one never runs,
  // a broken edit of a running one leaves its old definition running.
  function renderRejected(status) {
    const rejected = status.config_rejected || [];
    const section = document.getElementById("rejected");
    section.hidden = rejected.length === 0;
    document.getElementById("rejected-list").replaceChildren(...rejected.map((r) =>
      el("li", { class: "rejected-job", "data-job": r.job },
        el("strong", {}, r.job), " ",
        el("span", { class: `badge ${r.old_definition_running ? "paused" : "look-failed"}`,
          "data-role": "rejected-verdict" },
        r.old_definition_running ? "the old definition keeps running" : "not running"),
        el("pre", { class: "error", "data-role": "rejected-error" },
          `${r.path}${r.field ? `: field '${r.field}'` : ""}: ${r.error}`))));
  }

  function renderLegend() {
    const order = ["succeeded", "failed", "running", "pending", "skipped", "dropped",
      "cancelled", "paused", "pruned", "missing", "stuck"];
    document.getElementById("legend").replaceChildren(...order.map((look) =>
      el("li", {}, el("span", { class: `cell look-${look}`, "aria-hidden": "true" },
        LOOKS[look].glyph), LOOKS[look].label)));
  }

  function fact(name, value, extra, cls) {
    return el("div", { class: `fact ${cls || ""}` }, el("dt", {}, name),
      el("dd", {}, value, extra ? el("span", { class: "muted" }, ` ${extra}`) : null));
  }

  function lastOutcome(job) {
    const last = job.last_outcome;
    if (!last) return fact("last outcome", "none yet");
    const look = STATE_LOOK[last.state] || last.state;
    const value = el("span", {},
      el("span", { class: `badge look-${look}` }, last.state),
      ` ${wall(last.scheduled_local)}`,
      el("span", { class: "muted" }, ` (${ago(last.finished_at || last.scheduled_at)})`));
    const node = fact("last outcome", value, null, "wide");
    if (last.error) {
      node.querySelector("dd").append(el("pre", { class: "error", "data-role": "last-error" },
        last.error));
    }
    return node;
  }

  function cellTitle(job, cell) {
    const look = LOOKS[lookOf(cell)];
    let text = `${wall(cell.scheduled_local)} ${job.timezone}: ${look.label}`;
    if (cell.status === "extra") text += " (a triggered run at an instant the schedule does not name)";
    if (cell.attempt) text += `, attempt ${cell.attempt}`;
    if (cell.reason && cell.reason !== cell.state) text += ` — ${cell.reason}`;
    return text;
  }

  function renderGrid(job, grid) {
    const cells = (grid ? grid.cells : []).map((cell) => {
      const look = lookOf(cell);
      const title = cellTitle(job, cell);
      const open = openCell && openCell.job === job.name && openCell.at === cell.scheduled_at;
      return el("button", {
        type: "button", class: `cell look-${look}${cell.status === "extra" ? " extra" : ""}${open ? " open" : ""}`,
        title, "aria-label": title, "data-job": job.name, "data-at": cell.scheduled_at,
        "data-status": cell.status, "data-look": look, "data-run": cell.run_id,
        onclick: () => openDetail(job, cell),
      }, LOOKS[look].glyph);
    });
    const caption = cells.length
      ? `last ${cells.length} instant${cells.length === 1 ? "" : "s"}, oldest first`
      : "no instant due yet";
    return el("div", { class: "grid-wrap" },
      el("p", { class: "grid-caption muted" }, caption),
      el("div", { class: "grid", role: "group", "aria-label": `${job.name}: ${caption}`,
        "data-job": job.name }, ...cells));
  }

  function renderJob(job, grid) {
    const badges = [];
    if (job.paused) badges.push(el("span", { class: "badge paused" }, "paused"));
    if (!job.enabled) badges.push(el("span", { class: "badge removed" }, "removed"));
    if (job.config_rejected) {
      badges.push(el("span", { class: "badge look-failed", "data-role": "edit-rejected",
        title: `${job.config_rejected.error} (the old definition keeps running)` }, "edit rejected"));
    }
    const words = grid ? grid.schedule_words : job.schedule;
    const backlogCls = job.backlog > 0 ? "warn" : "";
    const oldest = job.backlog > 0 && job.oldest_due ? `oldest due ${ago(job.oldest_due)}` : null;
    return el("article", { class: "job", "data-job": job.name },
      el("header", { class: "job-head" },
        el("h2", {}, job.name), ...badges,
        el("p", { class: "schedule", title: job.schedule },
          words, el("span", { class: "zone" }, job.timezone))),
      el("dl", { class: "facts" },
        fact("next fire", job.next_fire_local ? wall(job.next_fire_local) : "none",
          job.next_fire ? `(${ago(job.next_fire)})` : null),
        fact("last success", job.last_success_local ? wall(job.last_success_local) : "never",
          job.last_success ? `(${ago(job.last_success)})` : null, job.last_success ? "" : "warn"),
        fact("overdue backlog", String(job.backlog), oldest, backlogCls),
        fact("look-ahead", String(job.ahead), "written ahead, not yet due"),
        fact("running", String(job.running)),
        fact("failures (24 h)", String(job.failures_24h), null, job.failures_24h > 0 ? "bad" : ""),
        lastOutcome(job)),
      renderGrid(job, grid));
  }

  function render(jobs, grid, status) {
    renderHealth(status);
    renderCounters(status);
    renderRejected(status);
    const byName = new Map((grid ? grid.jobs : []).map((g) => [g.name, g]));
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset : null;
    const cards = jobs.map((job) => renderJob(job, byName.get(job.name)));
    const box = document.getElementById("jobs");
    box.replaceChildren(...(cards.length ? cards
      : [el("p", { class: "muted" }, "No jobs: the config file defines none.")]));
    if (focused && focused.at) { // keep keyboard focus on the same cell across refreshes
      const same = [...box.querySelectorAll("button.cell")].find(
        (b) => b.dataset.job === focused.job && b.dataset.at === focused.at);
      if (same) same.focus();
    }
  }

  async function refresh() {
    clearTimeout(timer);
    const updated = document.getElementById("updated");
    try {
      const [jobs, grid, status] = await Promise.all([
        getJson("/api/jobs"), getJson(`/api/grid?instants=${INSTANTS}`), getJson("/api/status")]);
      serverSkewMs = Date.parse(grid.now) - Date.now();
      render(jobs, grid, status);
      lastGood = new Date();
      updated.className = "updated";
      updated.textContent = `updated ${lastGood.toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
      if (openRun && !TERMINAL.has(openRun.state)) await loadRun(openRun.id);
    } catch (error) {
      updated.className = "updated stale";
      updated.textContent = `update failed: ${error.message}` +
        (lastGood ? ` · showing ${lastGood.toLocaleTimeString()}` : "");
    } finally {
      timer = setTimeout(tick, REFRESH_MS);
    }
  }

  function tick() {
    if (document.hidden) { timer = setTimeout(tick, REFRESH_MS); return; }
    refresh();
  }

  // --- the run detail --------------------------------------------------------

  function row(name, value) {
    return el("div", { class: "fact" }, el("dt", {}, name), el("dd", {}, value));
  }

  function showPanel(title, ...content) {
    const panel = document.getElementById("detail");
    document.getElementById("detail-title").textContent = title;
    document.getElementById("detail-body").replaceChildren(...content);
    if (panel.hidden) {
      panel.hidden = false;
      panel.focus();
    }
  }

  function closeDetail() {
    document.getElementById("detail").hidden = true;
    openCell = null;
    openRun = null;
    document.querySelectorAll("button.cell.open").forEach((b) => b.classList.remove("open"));
  }

  // Each attempt as a small block (a table would overflow a phone).
  function attemptsList(run) {
    if (!run.attempts.length) return el("p", { class: "muted" }, "No attempt finished yet.");
    return el("ol", { class: "attempts" }, ...run.attempts.map((a) => el("li", { class: "attempt" },
      el("div", { class: "attempt-head" },
        el("strong", {}, `attempt ${a.attempt}`),
        el("span", { class: `badge look-${STATE_LOOK[a.outcome] || "pending"}` }, a.outcome),
        a.exit_code === null ? null : el("span", {}, `exit ${a.exit_code}`),
        el("span", { class: "muted" }, `epoch ${a.claim_epoch}`)),
      el("div", { class: "muted" }, `${a.worker || "?"} · ${wall(a.started_at)} → ${wall(a.finished_at)} UTC`),
      a.error ? el("pre", { class: "error" }, a.error) : null)));
  }

  // "10:00 Europe/Berlin · 09:00 UTC", once when the job's zone is UTC.
  function both(local, utc, zone) {
    return zone === "UTC" ? `${wall(utc)} UTC` : `${wall(local)} ${zone} · ${wall(utc)} UTC`;
  }

  function renderRun(run) {
    const look = STATE_LOOK[run.state] || "pending";
    const lease = run.lease_expires_at
      ? `${run.lease_owner || "?"} until ${wall(run.lease_expires_at)} UTC${run.lease_expired ? " (expired)" : ""}`
      : "none";
    showPanel(`${run.job} · ${wall(run.scheduled_local)} ${run.timezone}`,
      el("dl", { class: "facts detail-facts" },
        row("state", el("span", { class: `badge look-${look}`, "data-role": "run-state" }, run.state)),
        row("scheduled", both(run.scheduled_local, run.scheduled_at, run.timezone)),
        row("trigger", run.trigger),
        row("attempt", `${run.attempt} (claim epoch ${run.claim_epoch})`),
        row("started", run.started_at ? `${wall(run.started_at)} UTC` : "—"),
        row("finished", run.finished_at ? `${wall(run.finished_at)} UTC` : "—"),
        row("lease", lease),
        row("exit code", run.exit_code === null ? "—" : String(run.exit_code)),
        row("run id", el("code", {}, run.id))),
      run.error ? el("h3", {}, "error") : null,
      run.error ? el("pre", { class: "error", "data-role": "run-error" }, run.error) : null,
      el("h3", {}, "output tail"),
      run.output_tail ? el("pre", { class: "output", "data-role": "output" }, run.output_tail)
        : el("p", { class: "muted" }, "no output recorded"),
      el("h3", {}, `attempts (${run.attempts.length})`),
      attemptsList(run));
  }

  async function loadRun(runId) {
    try {
      openRun = await getJson(`/api/runs/${encodeURIComponent(runId)}`);
      if (openRun && openCell) renderRun(openRun);
    } catch (error) {
      showPanel("run", el("p", { class: "error" }, `could not load the run: ${error.message}`));
    }
  }

  function openDetail(job, cell) {
    openCell = { job: job.name, at: cell.scheduled_at };
    document.querySelectorAll("button.cell.open").forEach((b) => b.classList.remove("open"));
    document.querySelectorAll("button.cell").forEach((b) => {
      if (b.dataset.job === job.name && b.dataset.at === cell.scheduled_at) b.classList.add("open");
    });
    if (cell.run_id) {
      openRun = null;
      showPanel(`${job.name} · ${wall(cell.scheduled_local)} ${job.timezone}`,
        el("p", { class: "muted" }, "loading…"));
      loadRun(cell.run_id);
      return;
    }
    openRun = null;
    const look = LOOKS[lookOf(cell)];
    showPanel(`${job.name} · ${wall(cell.scheduled_local)} ${job.timezone}`,
      el("dl", { class: "facts detail-facts" },
        row("status", el("span", { class: `badge look-${lookOf(cell)}` }, look.label)),
        row("scheduled", both(cell.scheduled_local, cell.scheduled_at, job.timezone)),
        row("why", cell.reason || "—")),
      el("p", { class: "muted" }, "No run row for this instant. The same answer from the CLI: "),
      el("pre", { class: "output" },
        `claimd audit ${job.name} --from ${cell.scheduled_at} --to ${cell.scheduled_at}`));
  }

  document.addEventListener("DOMContentLoaded", () => {
    renderLegend();
    document.getElementById("detail-close").addEventListener("click", closeDetail);
    document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDetail(); });
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
    refresh();
  });
})();
