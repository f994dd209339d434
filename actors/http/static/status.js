// claimd status page: fetches the JSON API every few seconds and updates the page in place.
// Everything from the data goes into the DOM through textContent or attributes,
// never through innerHTML: a job's name, error or output is shown, never run.
//
// Built for a thousand jobs: a summary line, one table row per job (sorted and
// filtered here), and a job's detail (its facts and run grid) one click away.
// A refresh updates the nodes it already has, keyed by job and instant, rather
// than building new ones: a click whose press and release straddle a refresh
// (a node replaced between mousedown and mouseup gets no click) still lands.
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  const REFRESH_MS = 1000 * Math.min(300, Math.max(1, Number(params.get("refresh")) || 5));
  const INSTANTS = Math.min(200, Math.max(1, Number(params.get("instants")) || 30));
  const TERMINAL = new Set(["succeeded", "failed", "skipped", "cancelled"]);
  // A job's state, one per job, in the order the table sorts them (worst first).
  // The API decides it (its `state`: actors/domain/job_state.py); the page shows it.
  const STATES = {
    failing: { glyph: "✗", says: "its last run failed" },
    overdue: { glyph: "!", says: "a run due more than 10 s ago has not started" },
    rejected: { glyph: "⚠", says: "the config file rejected it, or its last edit" },
    paused: { glyph: "‖", says: "paused by an operator: nothing is due" },
    removed: { glyph: "–", says: "no longer in the config file" },
    running: { glyph: "▶", says: "its first run is running, none has finished yet" },
    healthy: { glyph: "✓", says: "last run fine, nothing overdue" },
  };
  const RANK = Object.fromEntries(Object.keys(STATES).map((s, i) => [s, i]));
  const SUMMARY_ORDER = ["healthy", "running", "failing", "overdue", "paused", "rejected", "removed"];

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
  const TRIGGER_WORDS = { manual: "triggered by an operator", backfill: "a backfill" };

  const COLUMNS = [
    { key: "name", label: "job" }, { key: "state", label: "state" },
    { key: "schedule", label: "schedule" }, { key: "next", label: "next fire" },
    { key: "last", label: "last outcome" }, { key: "overdue", label: "overdue" },
  ];

  const view = {
    q: params.get("q") || "",
    state: STATES[params.get("state")] ? params.get("state") : "",
    sort: COLUMNS.some((c) => c.key === params.get("sort")) ? params.get("sort") : "state",
    desc: params.get("desc") === "1",
  };
  const openJobs = new Set(params.getAll("job"));

  let serverSkewMs = 0; // the server's clock minus this browser's
  let lastGood = null;
  let openCell = null; // {job, at} of the cell whose detail is open
  let openRun = null; // the run shown in the detail panel, as the API gave it
  let timer = null;
  let inFlight = null; // the refresh under way: a second one waits for it
  let loaded = false;
  const entries = new Map(); // job name -> its entry: the job, its state and its nodes
  const grids = new Map(); // job name -> its grid from /api/grid

  const $ = (id) => document.getElementById(id);

  // Once a replica has tokens configured its reads need one (scope read): the
  // page asks for it, keeps it for this tab only (sessionStorage, never a
  // cookie or localStorage) and sends it as a bearer header.
  const TOKEN_KEY = "claimd.token";
  class NeedsToken extends Error {}

  function storedToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (_) { return ""; }
  }

  function askForToken(refused) {
    if (refused) { try { sessionStorage.removeItem(TOKEN_KEY); } catch (_) { /* private mode */ } }
    setText($("token-why"), refused
      ? "That token was not accepted. Give a token of scope read or operate."
      : "This replica's reads need a bearer token (scope read or operate). It is kept for this tab only.");
    $("token-form").hidden = false;
    $("token-input").focus();
  }

  function onTokenSubmit(event) {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    try { sessionStorage.setItem(TOKEN_KEY, token); } catch (_) { /* private mode */ }
    $("token-input").value = "";
    $("token-form").hidden = true;
    refresh();
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // Change a node only where it differs: the table is rewritten every refresh.
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }
  function setAttr(node, name, value) {
    if (value === null || value === undefined) {
      if (node.hasAttribute(name)) node.removeAttribute(name);
    } else if (node.getAttribute(name) !== String(value)) {
      node.setAttribute(name, String(value));
    }
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
    const headers = { Accept: "application/json" };
    const token = storedToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(path, { cache: "no-store", headers });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (response.status === 401) throw new NeedsToken(token ? "refused" : "");
    if (!response.ok) {
      const reason = body && body.error ? body.error : `HTTP ${response.status}`;
      throw new Error(`${path}: ${reason}`);
    }
    const date = Date.parse(response.headers.get("Date") || "");
    if (!Number.isNaN(date)) serverSkewMs = date - Date.now();
    return body;
  }

  // An operator's action (needs a token of scope operate): the API's answer or its error.
  async function postJson(path, body) {
    const headers = { Accept: "application/json", "Content-Type": "application/json" };
    const token = storedToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(path, {
      method: "POST", cache: "no-store", headers, body: JSON.stringify(body || {}),
    });
    let answer = null;
    try { answer = await response.json(); } catch (_) { answer = null; }
    if (response.status === 401) throw new NeedsToken("refused");
    if (response.status === 403) throw new Error("this token may only read (an action needs scope operate)");
    if (!response.ok) throw new Error(answer && answer.error ? answer.error : `HTTP ${response.status}`);
    return answer;
  }

  // The actions a job offers on the page, shown once a token is held (without one
  // the API refuses every action); each answers in the line below the buttons.
  function jobActions(job) {
    if (job.rejectedOnly || !job.enabled || !storedToken()) return null;
    const said = el("p", { class: "action-result muted", "data-role": "action-result", "aria-live": "polite" });
    const act = (label, path, body, role) => el("button", { type: "button", class: "action", "data-action": role },
      label);
    const buttons = [
      act("Run now", "trigger", {}, "trigger"),
      job.paused ? act("Resume (skip the paused instants)", "resume", {}, "resume")
        : act("Pause", "pause", {}, "pause"),
    ];
    for (const button of buttons) {
      button.addEventListener("click", async () => {
        const role = button.dataset.action;
        button.disabled = true;
        try {
          const answer = await postJson(`/api/jobs/${encodeURIComponent(job.name)}/${role}`, {});
          said.className = "action-result";
          said.textContent = answer && answer.message ? answer.message : `${role}: done`;
          refresh();
        } catch (error) {
          if (error instanceof NeedsToken) { askForToken(true); return; }
          said.className = "action-result error";
          said.textContent = error.message;
        } finally {
          button.disabled = false;
        }
      });
    }
    return el("div", { class: "actions", "data-role": "job-actions" }, ...buttons, said);
  }

  // --- the header: servers, counters, rejected jobs ----------------------------

  function renderHealth(status) {
    const names = { postgres: "PostgreSQL", nats: "NATS" };
    $("health").replaceChildren(...Object.entries(status.checks || {}).map(([key, value]) => {
      const ok = value === "ok";
      return el("li", { class: ok ? "ok" : "bad", title: ok ? "reachable" : String(value) },
        el("span", { class: "dot", "aria-hidden": "true" }, ok ? "●" : "▲"),
        `${names[key] || key}: `, el("strong", {}, ok ? "ok" : String(value)));
    }));
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
    $("counters").replaceChildren(...facts.map(([name, value, why]) =>
      el("div", { class: "counter", title: why },
        el("dt", {}, name), el("dd", {}, String(value === undefined ? "—" : value)))));
  }

  // The jobs the config file rejected at its last load: a new one never runs,
  // a broken edit of a running one leaves its old definition running.
  function renderRejected(rejected) {
    $("rejected").hidden = rejected.length === 0;
    $("rejected-list").replaceChildren(...rejected.map((r) =>
      el("li", { class: "rejected-job", "data-job": r.job },
        el("strong", {}, r.job), " ",
        el("span", { class: `badge ${r.old_definition_running ? "paused" : "look-failed"}`,
          "data-role": "rejected-verdict" },
        r.old_definition_running ? "the old definition keeps running" : "not running"),
        el("pre", { class: "error", "data-role": "rejected-error" }, rejectionText(r)))));
  }

  // The last notifications (docs/notifications.md): each one's state and last answer.
  // Their own request: a replica without the outbox (503) leaves the section hidden.
  function renderNotifications(list) {
    const shown = Array.isArray(list) ? list : [];
    $("notifications").hidden = shown.length === 0;
    $("notifications-list").replaceChildren(...shown.map((n) => {
      const last = n.attempt_log.length ? n.attempt_log[n.attempt_log.length - 1] : null;
      const answer = last ? `${last.outcome}${last.status ? ` ${last.status}` : ""}` : "not tried yet";
      return el("li", { class: "notification", "data-event": n.event, "data-state": n.state },
        el("strong", {}, n.job), " ",
        el("span", { class: `badge ${n.state === "sent" ? "look-succeeded" : "look-failed"}`,
          "data-role": "notification-event" }, `${n.event} → ${n.sink}: ${n.state}`), " ",
        el("span", { class: "muted", title: n.created_at }, `${ago(n.created_at)} · ` +
          `${n.attempts} attempt${n.attempts === 1 ? "" : "s"} · ${answer}`),
        n.last_error ? el("pre", { class: "error" }, n.last_error) : "");
    }));
  }

  function rejectionText(r) {
    return `${r.path}${r.field ? `: field '${r.field}'` : ""}: ${r.error}`;
  }

  function renderLegend() {
    const order = ["succeeded", "failed", "running", "pending", "skipped", "dropped",
      "cancelled", "paused", "pruned", "missing", "stuck"];
    $("legend").replaceChildren(...order.map((look) =>
      el("li", {}, el("span", { class: `cell look-${look}`, "aria-hidden": "true" },
        LOOKS[look].glyph), LOOKS[look].label)),
    el("li", {}, el("span", { class: "cell look-succeeded manual", "aria-hidden": "true" },
      LOOKS.succeeded.glyph), "ringed: a run an operator made (manual, backfill)"));
  }

  // --- the jobs: state, summary, table -----------------------------------------

  // The API's state; a new job the config file rejected is not in the catalog (no state).
  function stateOf(job) {
    if (job.rejectedOnly) return "rejected";
    return STATES[job.state] ? job.state : "healthy";
  }

  // The catalog's jobs, and the new jobs the config file rejected (never in the catalog).
  function jobsOf(jobs, rejected) {
    const known = new Set(jobs.map((j) => j.name));
    const extra = rejected.filter((r) => !known.has(r.job)).map((r) => ({
      name: r.job, rejectedOnly: true, rejection: r, enabled: false, paused: false,
      schedule_words: "—", timezone: "", backlog: 0, last_outcome: null, next_fire: null,
    }));
    return [...jobs, ...extra];
  }

  function compare(a, b) {
    const byName = a.job.name < b.job.name ? -1 : a.job.name > b.job.name ? 1 : 0;
    const nullsLast = (x, y) => (x === y ? 0 : x === null ? 1 : y === null ? -1 : x < y ? -1 : 1);
    let order = 0;
    switch (view.sort) {
      case "state": order = RANK[a.state] - RANK[b.state]; break;
      case "schedule": order = a.job.schedule_words.localeCompare(b.job.schedule_words); break;
      case "next": order = nullsLast(a.job.next_fire, b.job.next_fire); break;
      case "last": order = nullsLast(a.job.last_outcome && a.job.last_outcome.scheduled_at,
        b.job.last_outcome && b.job.last_outcome.scheduled_at); break;
      case "overdue": order = a.job.overdue - b.job.overdue; break;
      default: order = byName;
    }
    return (view.desc ? -order : order) || byName;
  }

  function matches(entry) {
    if (view.state && entry.state !== view.state) return false;
    return !view.q || entry.job.name.toLowerCase().includes(view.q.toLowerCase());
  }

  function hrefWith(changes) {
    const next = new URLSearchParams(window.location.search);
    for (const [key, value] of Object.entries(changes)) {
      if (value) next.set(key, value); else next.delete(key);
    }
    const text = next.toString();
    return text ? `?${text}` : window.location.pathname;
  }

  function remember() {
    const next = new URLSearchParams(window.location.search);
    for (const key of ["q", "state", "sort", "desc", "job"]) next.delete(key);
    if (view.q) next.set("q", view.q);
    if (view.state) next.set("state", view.state);
    if (view.sort !== "state") next.set("sort", view.sort);
    if (view.desc) next.set("desc", "1");
    for (const name of openJobs) next.append("job", name);
    const text = next.toString();
    window.history.replaceState(null, "", text ? `?${text}` : window.location.pathname);
  }

  function renderSummary(all) {
    const counts = Object.fromEntries(Object.keys(STATES).map((s) => [s, 0]));
    for (const entry of all) counts[entry.state] += 1;
    const links = SUMMARY_ORDER.filter((s) => s !== "removed" || counts.removed > 0).map((s) =>
      el("a", { href: hrefWith({ state: view.state === s ? "" : s }), class: `count state-${s}`,
        "data-state": s, "data-count": counts[s], title: STATES[s].says,
        "aria-current": view.state === s ? "true" : null },
      el("span", { class: "glyph", "aria-hidden": "true" }, STATES[s].glyph),
      el("strong", {}, counts[s].toLocaleString("en")), ` ${s}`));
    const total = el("a", { href: hrefWith({ state: "" }), class: "count total",
      "data-state": "", "data-count": all.length, "aria-current": view.state ? null : "true" },
    el("strong", {}, all.length.toLocaleString("en")), ` job${all.length === 1 ? "" : "s"}`);
    $("summary").replaceChildren(total, ":", ...links.flatMap((a, i) => (i ? [" · ", a] : [" ", a])));
  }

  function renderHead() {
    $("jobs-head").replaceChildren(...COLUMNS.map((c) => {
      const sorted = view.sort === c.key;
      return el("th", { scope: "col", class: `col-${c.key}`,
        "aria-sort": sorted ? (view.desc ? "descending" : "ascending") : null },
      el("button", { type: "button", class: "sort", "data-sort": c.key,
        title: `sort by ${c.label}` }, c.label,
      el("span", { class: "arrow", "aria-hidden": "true" }, sorted ? (view.desc ? " ▼" : " ▲") : "")));
    }));
  }

  // One row's nodes, made once per job and kept across refreshes.
  function newEntry(name) {
    const td = (key) => el("td", { class: `col-${key}`,
      "data-label": COLUMNS.find((c) => c.key === key).label });
    const entry = {
      tr: el("tr", { class: "job-row", "data-job": name }),
      nameButton: el("button", { type: "button", class: "job-name", "data-job": name,
        "aria-expanded": "false", title: "show this job's runs" }, name),
      badge: el("span", { class: "badge look-failed", "data-role": "edit-rejected", hidden: "" },
        "edit rejected"),
      cells: Object.fromEntries(COLUMNS.map((c) => [c.key, td(c.key)])),
      detailTr: null,
    };
    entry.cells.name.append(entry.nameButton, " ", entry.badge);
    entry.tr.append(...COLUMNS.map((c) => entry.cells[c.key]));
    return entry;
  }

  function fillRow(entry) {
    const { job, state, cells } = entry;
    setAttr(entry.tr, "data-state", state);
    setAttr(entry.nameButton, "aria-expanded", openJobs.has(job.name) ? "true" : "false");
    entry.badge.hidden = !job.config_rejected;
    setAttr(entry.badge, "title", job.config_rejected
      ? `${job.config_rejected.error} (the old definition keeps running)` : null);
    const stateSays = job.rejectedOnly ? rejectionText(job.rejection) : STATES[state].says;
    setLine(cells.state, `state state-${state}`, `${STATES[state].glyph} ${state}`, null, stateSays);
    setLine(cells.schedule, "", job.schedule_words, job.timezone, job.schedule || null);
    setLine(cells.next, "", job.next_fire_local ? wall(job.next_fire_local)
      : job.paused ? "paused" : "none", job.next_fire ? ago(job.next_fire) : null, null);
    const last = job.last_outcome;
    if (last) {
      const manual = last.trigger && last.trigger !== "schedule" ? ` · ${last.trigger}` : "";
      setLine(cells.last, `badge look-${STATE_LOOK[last.state] || last.state}`,
        `${last.state} ${wall(last.scheduled_local)}`,
        `${ago(last.finished_at || last.scheduled_at)}${manual}`, last.error || null);
    } else {
      // The first run of a long job is running: not "none yet".
      setLine(cells.last, "", job.running > 0 ? "running, none finished yet" : "none yet", null, null);
    }
    const oldest = job.backlog > 0 && job.oldest_due ? `oldest due ${ago(job.oldest_due)}` : null;
    setLine(cells.overdue, job.overdue > 0 ? "num warn" : "num", String(job.overdue), null, oldest);
  }

  // A table cell as a main text (with a class) and a muted second line.
  function setLine(td, cls, text, extra, title) {
    if (!td.firstChild) td.append(el("span", {}), el("span", { class: "sub muted" }));
    const [main, sub] = td.children;
    setAttr(main, "class", cls || null);
    setText(main, text);
    setText(sub, extra || "");
    sub.hidden = !extra;
    setAttr(td, "title", title);
  }

  // Put the rows in ``ordered`` order, moving only those out of place (a moved
  // node loses a click in progress, as a replaced one does).
  function placeRows(ordered) {
    const body = $("jobs");
    let cursor = body.firstChild;
    for (const entry of ordered) {
      for (const node of [entry.tr, entry.detailTr]) {
        if (!node) continue;
        if (node === cursor) cursor = cursor.nextSibling;
        else body.insertBefore(node, cursor);
      }
    }
    while (cursor) { // rows of jobs that are gone
      const next = cursor.nextSibling;
      cursor.remove();
      cursor = next;
    }
  }

  function renderTable(jobs, rejected) {
    const all = jobsOf(jobs, rejected).map((job) => {
      let entry = entries.get(job.name);
      if (!entry) { entry = newEntry(job.name); entries.set(job.name, entry); }
      entry.job = job;
      entry.state = stateOf(job);
      return entry;
    });
    const names = new Set(all.map((e) => e.job.name));
    for (const [name, gone] of [...entries]) {
      if (names.has(name)) continue;
      gone.tr.remove();
      if (gone.detailTr) gone.detailTr.remove();
      entries.delete(name);
    }
    all.sort(compare);
    let shown = 0;
    for (const entry of all) {
      fillRow(entry);
      const visible = matches(entry);
      if (visible) shown += 1;
      if (entry.tr.hidden === visible) entry.tr.hidden = !visible;
      if (openJobs.has(entry.job.name)) renderJobDetail(entry);
      else if (entry.detailTr) { entry.detailTr.remove(); entry.detailTr = null; }
      if (entry.detailTr && entry.detailTr.hidden === visible) entry.detailTr.hidden = !visible;
    }
    placeRows(all);
    renderSummary(all);
    setText($("shown"), shown === all.length ? `${all.length.toLocaleString("en")} shown`
      : `${shown.toLocaleString("en")} of ${all.length.toLocaleString("en")} shown`);
    $("no-jobs").hidden = all.length > 0 && shown > 0;
    setText($("no-jobs"), all.length ? "No job matches the filter." : "No jobs: the config file defines none.");
  }

  function rerender() {
    remember();
    renderHead();
    if (lastGood) renderTable(lastGood.jobs, lastGood.rejected);
  }

  // --- a job's detail: its facts and its run grid ------------------------------

  function fact(name, value, extra, cls) {
    return el("div", { class: `fact ${cls || ""}` }, el("dt", {}, name),
      el("dd", {}, value, extra ? el("span", { class: "muted" }, ` ${extra}`) : null));
  }

  function lastOutcome(job) {
    const last = job.last_outcome;
    if (!last) return fact("last outcome", job.running > 0 ? "running, none finished yet" : "none yet");
    const look = STATE_LOOK[last.state] || last.state;
    const value = el("span", {},
      el("span", { class: `badge look-${look}` }, last.state),
      ` ${wall(last.scheduled_local)}`,
      last.trigger && last.trigger !== "schedule" ? el("span", { class: "badge manual-tag" }, last.trigger) : null,
      el("span", { class: "muted" }, ` (${ago(last.finished_at || last.scheduled_at)})`));
    const node = fact("last outcome", value, null, "wide");
    if (last.error) {
      node.querySelector("dd").append(el("pre", { class: "error", "data-role": "last-error" },
        last.error));
    }
    return node;
  }

  function facts(job) {
    if (job.rejectedOnly) {
      return [fact("rejected", "the config file rejected this new job: it never runs", null, "wide"),
        el("pre", { class: "error", "data-role": "last-error" }, rejectionText(job.rejection))];
    }
    const oldest = job.backlog > 0 && job.oldest_due ? `oldest due ${ago(job.oldest_due)}` : null;
    return [
      fact("next fire", job.next_fire_local ? wall(job.next_fire_local) : "none",
        job.next_fire ? `(${ago(job.next_fire)})` : null),
      fact("last success", job.last_success_local ? wall(job.last_success_local) : "never",
        job.last_success ? `(${ago(job.last_success)})` : null, job.last_success ? "" : "warn"),
      fact("backlog (overdue)", `${job.backlog} (${job.overdue})`, oldest, job.overdue > 0 ? "warn" : ""),
      fact("look-ahead", String(job.ahead), "written ahead, not yet due"),
      fact("running", String(job.running)),
      fact("failures (24 h)", String(job.failures_24h), null, job.failures_24h > 0 ? "bad" : ""),
      lastOutcome(job),
    ];
  }

  function renderJobDetail(entry) {
    const { job } = entry;
    if (!entry.detailTr) {
      entry.article = el("article", { class: "job", "data-job": job.name, id: `job-${job.name}` });
      entry.head = el("header", { class: "job-head" });
      entry.facts = el("dl", { class: "facts" });
      entry.caption = el("p", { class: "grid-caption muted" });
      entry.grid = el("div", { class: "grid", role: "group", "data-job": job.name });
      entry.cellsByAt = new Map();
      entry.article.append(entry.head, entry.facts,
        el("div", { class: "grid-wrap" }, entry.caption, entry.grid));
      entry.detailTr = el("tr", { class: "job-detail", "data-job": job.name },
        el("td", { colspan: COLUMNS.length }, entry.article));
    }
    const badges = [];
    if (job.paused) badges.push(el("span", { class: "badge paused" }, "paused"));
    if (!job.enabled && !job.rejectedOnly) badges.push(el("span", { class: "badge removed" }, "removed"));
    if (job.config_rejected) {
      badges.push(el("span", { class: "badge look-failed", title: job.config_rejected.error },
        "edit rejected"));
    }
    entry.head.replaceChildren(el("h2", {}, job.name), ...badges,
      el("p", { class: "schedule", title: job.schedule || "" },
        job.schedule_words, job.timezone ? el("span", { class: "zone" }, job.timezone) : null));
    entry.facts.replaceChildren(...facts(job));
    // The buttons are made once per state (a refresh must not take a click away).
    const actionsKey = `${job.paused}:${job.enabled}:${Boolean(storedToken())}`;
    if (entry.actionsKey !== actionsKey) {
      entry.actionsKey = actionsKey;
      if (entry.actions) entry.actions.remove();
      entry.actions = jobActions(job);
      if (entry.actions) entry.facts.after(entry.actions);
    }
    renderGrid(entry, grids.get(job.name));
  }

  function cellTitle(grid, cell) {
    const look = LOOKS[lookOf(cell)];
    let text = `${wall(cell.scheduled_local)} ${grid.timezone}: ${look.label}`;
    if (cell.trigger && cell.trigger !== "schedule") {
      text += `, ${TRIGGER_WORDS[cell.trigger] || cell.trigger} (${cell.trigger})`;
    }
    if (cell.status === "extra") text += " (a triggered run at an instant the schedule does not name)";
    if (cell.attempt) text += `, attempt ${cell.attempt}`;
    if (cell.reason && cell.reason !== cell.state) text += ` — ${cell.reason}`;
    return text;
  }

  // The grid's cells, keyed by instant: a cell keeps its node while it is shown.
  function renderGrid(entry, grid) {
    if (!grid) {
      setText(entry.caption, entry.job.rejectedOnly ? "never ran" : "loading the run grid…");
      return;
    }
    const seen = new Set();
    const nodes = grid.cells.map((cell) => {
      seen.add(cell.scheduled_at);
      let node = entry.cellsByAt.get(cell.scheduled_at);
      if (!node) {
        node = el("button", { type: "button", "data-job": grid.name, "data-at": cell.scheduled_at });
        entry.cellsByAt.set(cell.scheduled_at, node);
      }
      const look = lookOf(cell);
      const manual = cell.trigger && cell.trigger !== "schedule";
      const open = openCell && openCell.job === grid.name && openCell.at === cell.scheduled_at;
      const title = cellTitle(grid, cell);
      setAttr(node, "class", `cell look-${look}${cell.status === "extra" ? " extra" : ""}`
        + `${manual ? " manual" : ""}${open ? " open" : ""}`);
      setAttr(node, "title", title);
      setAttr(node, "aria-label", title);
      setAttr(node, "data-status", cell.status);
      setAttr(node, "data-look", look);
      setAttr(node, "data-trigger", cell.trigger);
      setAttr(node, "data-run", cell.run_id);
      setText(node, LOOKS[look].glyph);
      return node;
    });
    for (const at of [...entry.cellsByAt.keys()]) {
      if (!seen.has(at)) { entry.cellsByAt.get(at).remove(); entry.cellsByAt.delete(at); }
    }
    let cursor = entry.grid.firstChild;
    for (const node of nodes) {
      if (node === cursor) cursor = cursor.nextSibling;
      else entry.grid.insertBefore(node, cursor);
    }
    const caption = nodes.length
      ? `last ${nodes.length} instant${nodes.length === 1 ? "" : "s"}, oldest first`
      : "no instant due yet";
    setText(entry.caption, caption);
    setAttr(entry.grid, "aria-label", `${grid.name}: ${caption}`);
  }

  async function gridOf(name) {
    try {
      const grid = await getJson(`/api/grid?job=${encodeURIComponent(name)}&instants=${INSTANTS}`);
      return grid.jobs[0] ? [name, grid.jobs[0], grid.now] : [name, null, null];
    } catch (_) {
      return [name, null, null]; // a rejected new job has no grid; the table says why
    }
  }

  function keepGrids(found) {
    for (const [name, grid, now] of found) {
      if (grid) grids.set(name, grid); else grids.delete(name);
      if (now) serverSkewMs = Date.parse(now) - Date.now();
    }
  }

  async function toggleJob(name) {
    if (openJobs.has(name)) {
      openJobs.delete(name);
      grids.delete(name);
      rerender();
      return;
    }
    openJobs.add(name);
    rerender(); // the facts at once; the grid when it comes
    keepGrids([await gridOf(name)]);
    const entry = entries.get(name);
    if (entry && openJobs.has(name) && entry.detailTr) renderGrid(entry, grids.get(name));
  }

  // --- refresh -------------------------------------------------------------------

  function afterPaint() {
    return new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  }

  async function refresh() {
    if (inFlight) return inFlight;
    clearTimeout(timer);
    inFlight = (async () => {
      const updated = $("updated");
      performance.mark("claimd:refresh-start");
      try {
        const [jobs, status, ...found] = await Promise.all([getJson("/api/jobs"),
          getJson("/api/status"), ...[...openJobs].map(gridOf)]);
        keepGrids(found);
        const rejected = status.config_rejected || [];
        lastGood = { jobs, rejected, at: new Date() };
        renderHealth(status);
        renderCounters(status);
        renderRejected(rejected);
        renderTable(jobs, rejected);
        getJson("/api/notifications?limit=10").then(renderNotifications, () => renderNotifications(null));
        updated.className = "updated";
        updated.textContent = `updated ${lastGood.at.toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
        await afterPaint();
        performance.mark("claimd:refresh-end");
        if (!loaded) { // navigation start to the first full table, painted
          loaded = true;
          performance.measure("claimd:load", undefined, "claimd:refresh-end");
        } else {
          performance.measure("claimd:refresh", "claimd:refresh-start", "claimd:refresh-end");
        }
        if (openRun && !TERMINAL.has(openRun.state)) await loadRun(openRun.id);
      } catch (error) {
        updated.className = "updated stale";
        if (error instanceof NeedsToken) {
          askForToken(error.message === "refused");
          updated.textContent = "waiting for a token";
          return;
        }
        updated.textContent = `update failed: ${error.message}` +
          (lastGood ? ` · showing ${lastGood.at.toLocaleTimeString()}` : "");
      } finally {
        inFlight = null;
        if ($("token-form").hidden) timer = setTimeout(tick, REFRESH_MS);
      }
    })();
    return inFlight;
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
    const panel = $("detail");
    $("detail-title").textContent = title;
    // replaceChildren writes a null as the text "null": leave the absent parts out.
    $("detail-body").replaceChildren(...content.filter((c) => c !== null && c !== undefined));
    if (panel.hidden) {
      panel.hidden = false;
      panel.focus();
    }
  }

  function markOpen() {
    document.querySelectorAll("button.cell.open").forEach((b) => b.classList.remove("open"));
    if (!openCell) return;
    const entry = entries.get(openCell.job);
    const node = entry && entry.cellsByAt && entry.cellsByAt.get(openCell.at);
    if (node) node.classList.add("open");
  }

  function closeDetail() {
    stopLive();
    $("detail").hidden = true;
    openCell = null;
    openRun = null;
    markOpen();
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
      a.error ? el("pre", { class: "error" }, a.error) : null,
      // The attempt's own output (none for attempts recorded before claimd kept it).
      a.output_tail ? el("pre", { class: "output", "data-role": "attempt-output" }, a.output_tail)
        : null)));
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
        row("trigger", el("span", { "data-role": "run-trigger" }, run.trigger)),
        row("attempt", `${run.attempt} (claim epoch ${run.claim_epoch})`),
        row("started", run.started_at ? `${wall(run.started_at)} UTC` : "—"),
        row("finished", run.finished_at ? `${wall(run.finished_at)} UTC` : "—"),
        row("lease", lease),
        row("exit code", run.exit_code === null ? "—" : String(run.exit_code)),
        row("run id", el("code", {}, run.id)),
        row("link", el("a", { href: runLink(run), "data-role": "run-link" }, "this run"))),
      runActions(run),
      run.error ? el("h3", {}, "error") : null,
      run.error ? el("pre", { class: "error", "data-role": "run-error" }, run.error) : null,
      liveOutput(run),
      el("h3", {}, "output tail"),
      run.output_tail ? el("pre", { class: "output", "data-role": "output" }, run.output_tail)
        : el("p", { class: "muted" }, "no output recorded"),
      el("h3", {}, `attempts (${run.attempts.length})`),
      attemptsList(run));
  }

  // --- live output: the run's lines as they are printed ------------------------
  // GET /api/runs/{id}/output/stream (Server-Sent Events) read with fetch, not
  // EventSource: EventSource cannot send the bearer token. One stream at a time; the
  // block is kept across the panel's refreshes, and the stream ends with the run.
  let live = null; // { runId, block, pre, said, controller }

  function stopLive() {
    if (live && live.controller) live.controller.abort();
    live = null;
  }

  function liveOutput(run) {
    if (TERMINAL.has(run.state)) {
      if (live && live.runId === run.id) return live.block; // the end shown as it came
      return null;
    }
    if (live && live.runId === run.id) return live.block;
    stopLive();
    const pre = el("pre", { class: "output live", "data-role": "live-output", "aria-live": "off" });
    const said = el("p", { class: "muted", "data-role": "live-state", "aria-live": "polite" }, "connecting…");
    const block = el("div", { class: "live-output" }, el("h3", {}, "live output"), said, pre);
    live = { runId: run.id, block, pre, said, controller: new AbortController() };
    followOutput(live);
    return block;
  }

  function onLiveEvent(state, name, data) {
    if (name === "output") {
      state.pre.append(document.createTextNode(data.text));
      state.pre.scrollTop = state.pre.scrollHeight;
    } else if (name === "notice") {
      state.pre.append(el("span", { class: "muted" }, `[${data.text}]\n`));
    } else if (name === "end") {
      setText(state.said, `the run ended: ${data.state}`);
      state.controller = null;
      if (live === state && openRun && openRun.id === state.runId) loadRun(state.runId);
    }
  }

  async function followOutput(state) {
    const headers = { Accept: "text/event-stream" };
    const token = storedToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    try {
      const response = await fetch(`/api/runs/${encodeURIComponent(state.runId)}/output/stream`,
        { cache: "no-store", headers, signal: state.controller.signal });
      if (!response.ok || !response.body) {
        setText(state.said, `live output unavailable (HTTP ${response.status})`);
        return;
      }
      setText(state.said, "following the output as it is printed");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let name = "message";
      let data = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let at;
        while ((at = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, at).replace(/\r$/, "");
          buffer = buffer.slice(at + 1);
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
          else if (line === "" && data) {
            onLiveEvent(state, name, JSON.parse(data));
            name = "message";
            data = "";
          }
        }
      }
      if (state.controller) setText(state.said, "the stream closed; reopen the run to follow again");
    } catch (error) {
      if (error.name !== "AbortError") setText(state.said, `live output stopped: ${error.message}`);
    }
  }

  // A link that opens this page on this run (its job's detail and the run panel).
  function runLink(run) {
    const next = new URLSearchParams();
    next.set("job", run.job);
    next.set("run", run.id);
    return `?${next}`;
  }

  function runActions(run) {
    if (!storedToken() || !["pending", "claimed", "running"].includes(run.state)) return null;
    const said = el("p", { class: "action-result muted", "aria-live": "polite" });
    const button = el("button", { type: "button", class: "action", "data-action": "cancel" }, "Cancel this run");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const answer = await postJson(`/api/runs/${encodeURIComponent(run.id)}/cancel`, {});
        said.textContent = answer && answer.message ? answer.message : "cancelled";
        loadRun(run.id);
      } catch (error) {
        said.className = "action-result error";
        said.textContent = error.message;
        button.disabled = false;
      }
    });
    return el("div", { class: "actions" }, button, said);
  }

  async function loadRun(runId) {
    try {
      openRun = await getJson(`/api/runs/${encodeURIComponent(runId)}`);
      if (openRun && openCell) renderRun(openRun);
    } catch (error) {
      showPanel("run", el("p", { class: "error" }, `could not load the run: ${error.message}`));
    }
  }

  function openDetail(name, at) {
    const grid = grids.get(name);
    const cell = grid && grid.cells.find((c) => c.scheduled_at === at);
    if (!cell) return;
    openCell = { job: name, at };
    markOpen();
    openRun = null;
    const title = `${name} · ${wall(cell.scheduled_local)} ${grid.timezone}`;
    if (cell.run_id) {
      showPanel(title, el("p", { class: "muted" }, "loading…"));
      loadRun(cell.run_id);
      return;
    }
    const look = LOOKS[lookOf(cell)];
    showPanel(title,
      el("dl", { class: "facts detail-facts" },
        row("status", el("span", { class: `badge look-${lookOf(cell)}` }, look.label)),
        row("scheduled", both(cell.scheduled_local, cell.scheduled_at, grid.timezone)),
        row("why", cell.reason || "—")),
      el("p", { class: "muted" }, "No run row for this instant. The same answer from the CLI: "),
      el("pre", { class: "output" },
        `claimd audit ${name} --from ${cell.scheduled_at} --to ${cell.scheduled_at}`));
  }

  // --- wiring ----------------------------------------------------------------------

  function onTableClick(event) {
    const target = event.target instanceof Element ? event.target : null;
    const cell = target && target.closest("button.cell");
    if (cell) { openDetail(cell.dataset.job, cell.dataset.at); return; }
    const name = target && target.closest("button.job-name");
    if (name) { toggleJob(name.dataset.job); return; }
    const sort = target && target.closest("button.sort");
    if (sort) {
      view.desc = view.sort === sort.dataset.sort ? !view.desc : false;
      view.sort = sort.dataset.sort;
      rerender();
    }
  }

  function onSummaryClick(event) {
    const link = event.target instanceof Element ? event.target.closest("a.count") : null;
    if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    event.preventDefault();
    view.state = link.dataset.state;
    $("filter-state").value = view.state;
    rerender();
  }

  document.addEventListener("DOMContentLoaded", () => {
    renderLegend();
    renderHead();
    $("filter-text").value = view.q;
    $("filter-state").value = view.state;
    $("filter-text").addEventListener("input", (e) => { view.q = e.target.value.trim(); rerender(); });
    $("filter-state").addEventListener("change", (e) => { view.state = e.target.value; rerender(); });
    $("filters").addEventListener("submit", (e) => e.preventDefault());
    $("token-form").addEventListener("submit", onTokenSubmit);
    $("jobs-table").addEventListener("click", onTableClick);
    $("summary").addEventListener("click", onSummaryClick);
    $("detail-close").addEventListener("click", closeDetail);
    document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDetail(); });
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
    refresh();
    // A link to one run (?job=NAME&run=ID): its panel opens with the page.
    const linked = params.get("run");
    if (linked) {
      openCell = { job: params.get("job") || "", at: null };
      loadRun(linked);
    }
  });
})();
