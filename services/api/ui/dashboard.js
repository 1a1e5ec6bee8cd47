// lodestream live dashboard: one snapshot (/ui/api/summary), then the pushed feed
// (/events/stream, resumed by the browser with Last-Event-ID). Nothing here polls the API;
// the only timer redraws rates from events already received. Every value from the API
// reaches the page through textContent, never as HTML.
"use strict";

const RATE_WINDOW_S = 10;       // finished/s is averaged over this
const SPARK_BUCKET_S = 5;       // throughput history: one point per bucket...
const SPARK_BUCKETS = 24;       // ...over two minutes
const MAX_FAILURES = 20;

const $ = (id) => document.getElementById(id);
const S = {
  position: 0, counts: {}, jobs: {}, cores: {}, sessions: {}, failures: [],
  finished: {}, failed: {}, finishTimes: {}, targets: {}, final: new Set(),
  history: null, feed: null, pushed: 0,
};

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

async function api(path, options) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  if (response.status === 401) { showLogin(); throw new Error("not logged in"); }
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response.status === 204 ? null : response.json();
}

// --- login -------------------------------------------------------------------------------

async function logIn(token) {
  await api("/ui/session", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
  });
}

function showLogin() {
  if (S.feed) { S.feed.close(); S.feed = null; }
  $("board").hidden = true; $("login").hidden = false; $("logout").hidden = true;
  setFeed("down", "logged out");
}

// --- state -------------------------------------------------------------------------------

function bump(site, state, by) {
  const states = (S.counts[site] ||= {});
  states[state] = Math.max(0, (states[state] || 0) + by);
}

function load(snapshot) {
  S.position = snapshot.position;
  S.counts = snapshot.counts;
  S.jobs = snapshot.jobs;
  S.cores = snapshot.running_cores;
  S.targets = snapshot.targets;
  S.final = new Set(snapshot.final);
  S.sessions = {};
  for (const s of snapshot.sessions) S.sessions[s.id] = s;
  S.failures = snapshot.failures.map((f) => ({ ...f, at: null }));
  for (const site of snapshot.sites) {
    S.counts[site] ||= {};
    S.finished[site] = S.counts[site].JOB_FINISHED || 0;
    S.failed[site] = S.counts[site].FAILED || 0;
    S.finishTimes[site] ||= [];
  }
  $("who").textContent = snapshot.user;
}

function placementCores(placement) {
  let cores = 0;
  for (const p of placement || []) cores += (p.cores || []).length;
  return Math.max(cores, 1);
}

function apply(ev) {
  S.pushed += 1;
  S.position = Math.max(S.position, ev.seq);
  const [kind] = ev.type.split(".");
  if (kind === "job") applyJob(ev);
  else if (ev.type === "session.opened") {
    const cores = ev.data.nodes.reduce((n, node) => n + node.cores, 0);
    S.sessions[ev.aggregate_id] = { id: ev.aggregate_id, site: ev.site, cores };
  } else if (ev.type === "session.closed" || ev.type === "session.expired") {
    delete S.sessions[ev.aggregate_id];
  }
  if (S.history && S.history.job === ev.aggregate_id) addHistoryRow(historyRow(ev));
  schedule();
}

function applyJob(ev) {
  const id = ev.aggregate_id, site = ev.site, known = S.jobs[id];
  if (ev.type === "job.started") S.cores[id] = placementCores(ev.data.placement);
  // The projector's rule (fold.js): a job created runnable is PREPROCESSED, not CREATED.
  const target = stateAfter(S.targets, known ? known[1] : null, ev.type, ev.data.skipped);
  if (!target || (known && known[1] === target)) return;  // lease events keep the state
  if (known) bump(known[0], known[1], -1);
  bump(site, target, +1);
  if (target !== "RUNNING") delete S.cores[id];
  if (S.final.has(target)) delete S.jobs[id]; else S.jobs[id] = [site, target];
  if (target === "JOB_FINISHED") {
    S.finished[site] = (S.finished[site] || 0) + 1;
    (S.finishTimes[site] ||= []).push(Date.now() / 1000);
  } else if (target === "FAILED" || target === "RUN_ERROR") {
    if (target === "FAILED") S.failed[site] = (S.failed[site] || 0) + 1;
    S.failures = S.failures.filter((f) => f.job_id !== id);
    S.failures.unshift({ job_id: id, site, state: target, cause: causeOf(ev.data), seq: ev.seq });
    S.failures.length = Math.min(S.failures.length, MAX_FAILURES);
  }
}

function causeOf(data) {
  const said = [data.reason, ...(data.cause || [])].filter(Boolean).join(": ");
  const code = data.return_code === undefined || data.return_code === null ? "" : `exit ${data.return_code}`;
  return said || [code, (data.stderr_tail || "").trim()].filter(Boolean).join(": ");
}

// --- drawing -----------------------------------------------------------------------------

let scheduled = false;
function schedule() {
  if (!scheduled) { scheduled = true; setTimeout(render, 200); }
}

function rate(site, now) {
  const times = S.finishTimes[site] || [];
  const horizon = now - SPARK_BUCKET_S * SPARK_BUCKETS;
  while (times.length && times[0] < horizon) times.shift();
  return times.filter((t) => t >= now - RATE_WINDOW_S).length / RATE_WINDOW_S;
}

function sparkline(site, now) {
  const buckets = new Array(SPARK_BUCKETS).fill(0);
  for (const t of S.finishTimes[site] || []) {
    const i = SPARK_BUCKETS - 1 - Math.floor((now - t) / SPARK_BUCKET_S);
    if (i >= 0 && i < SPARK_BUCKETS) buckets[i] += 1;
  }
  const top = Math.max(1, ...buckets);
  const points = buckets.map((n, i) => `${(i * 180) / (SPARK_BUCKETS - 1)},${27 - (n / top) * 26}`);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 180 28");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  return svg;
}

function siteNumbers(site) {
  const counts = S.counts[site] || {};
  let backlog = 0;
  for (const [state, n] of Object.entries(counts)) {
    if (!S.final.has(state) && state !== "RUNNING") backlog += n;
  }
  let total = 0, busy = 0;
  for (const s of Object.values(S.sessions)) if (s.site === site) total += s.cores;
  for (const [id, n] of Object.entries(S.cores)) if ((S.jobs[id] || [])[0] === site) busy += n;
  return { backlog, running: counts.RUNNING || 0, total, busy };
}

function render() {
  scheduled = false;
  const now = Date.now() / 1000;
  $("position").textContent = S.position;
  $("pushed").textContent = S.pushed;
  const body = $("sites").tBodies[0];
  body.replaceChildren();
  for (const site of Object.keys(S.counts).sort()) {
    const n = siteNumbers(site);
    const row = el("tr");
    row.dataset.site = site;
    const cell = (key, value) => { const td = el("td", value, "num"); td.dataset.k = key; row.append(td); };
    row.append(el("td", site));
    cell("rate", rate(site, now).toFixed(2));
    cell("finished", S.finished[site] || 0);
    cell("failed", S.failed[site] || 0);
    cell("backlog", n.backlog);
    cell("running", n.running);
    const util = n.total ? Math.min(1, n.busy / n.total) : 0;
    cell("nodes", n.total ? `${n.busy}/${n.total} cores (${Math.round(util * 100)}%)` : "no pilot");
    const bar = el("span", null, "bar");
    bar.style.width = `${Math.round(util * 60)}px`;
    row.lastChild.append(bar);
    const spark = el("td");
    spark.append(sparkline(site, now));
    row.append(spark);
    body.append(row);
  }
  const totals = {};
  for (const counts of Object.values(S.counts)) {
    for (const [state, count] of Object.entries(counts)) {
      if (!S.final.has(state)) totals[state] = (totals[state] || 0) + count;
    }
  }
  const states = $("states").tBodies[0];
  states.replaceChildren();
  for (const [state, count] of Object.entries(totals).sort()) {
    if (!count) continue;
    const row = el("tr");
    row.dataset.state = state;
    row.append(el("td", state), el("td", count, "num"));
    states.append(row);
  }
  const failures = $("failures");
  failures.replaceChildren();
  for (const f of S.failures) {
    const item = el("li");
    item.append(jobLink(f.job_id), el("span", ` ${f.state} at ${f.site}`), el("span", f.cause || "(no cause recorded)", "cause"));
    failures.append(item);
  }
  if (!S.failures.length) failures.append(el("li", "none"));
}

// A UUIDv7 begins with its creation time: jobs of the same minute share their first eight
// digits, so a person is shown the random tail (what `lode job show` also accepts).
function shortId(id) {
  return id.replace(/-/g, "").slice(-8);
}

function jobLink(id) {
  const a = el("a", shortId(id), "job");
  a.title = id;
  a.addEventListener("click", () => showHistory(id));
  return a;
}

// --- search and history (reads the user asks for) ------------------------------------------

async function search(event) {
  event.preventDefault();
  const params = new URLSearchParams();
  for (const [field, name] of [["q-id", "job_id"], ["q-site", "site"], ["q-app", "app"],
                               ["q-state", "state"], ["q-tag", "tag"]]) {
    const value = $(field).value.trim();
    if (value) params.set(name, value);
  }
  $("search-error").textContent = "";
  const body = $("results").tBodies[0];
  try {
    const jobs = await api(`/ui/api/jobs?${params}`);
    body.replaceChildren();
    for (const job of jobs) {
      const row = el("tr");
      const first = el("td");
      first.append(jobLink(job.id));
      row.append(first, el("td", job.site), el("td", job.app), el("td", job.state), el("td", job.updated_at));
      body.append(row);
    }
    if (!jobs.length) body.append(el("tr", "no job matches"));
  } catch (err) {
    $("search-error").textContent = err.message;
  }
}

function historyRow(ev) {
  const detail = ev.data.reason || (ev.data.cause || []).join(": ") || ev.data.stderr_tail || "";
  return [ev.seq, ev.occurred_at, ev.type, S.targets[ev.type] || ev.to_state || "", ev.actor, detail];
}

function addHistoryRow(values) {
  const row = el("tr");
  values.forEach((v, i) => row.append(el("td", v, i === 5 ? "detail" : undefined)));
  $("history").tBodies[0].append(row);
}

async function showHistory(id) {
  try {
    const events = await api(`/ui/api/jobs/${encodeURIComponent(id)}/events`);
    S.history = { job: id };
    $("history-job").textContent = id;
    $("history").tBodies[0].replaceChildren();
    for (const ev of events) {
      addHistoryRow([ev.seq, ev.occurred_at, ev.type, ev.to_state || "", ev.actor,
                     ev.data.reason || (ev.data.cause || []).join(": ") || ""]);
    }
    $("history-panel").hidden = false;
  } catch (err) {
    $("search-error").textContent = err.message;
  }
}

// --- the feed ----------------------------------------------------------------------------

function setFeed(state, text) {
  $("feed").dataset.state = state;
  $("feed").textContent = text;
}

function follow() {
  // The snapshot is the fold up to its position; the feed starts right after it. On a
  // reconnect (after a lag, a restart) the browser sends Last-Event-ID, which wins.
  const feed = new EventSource(`/events/stream?since=${S.position}`);
  S.feed = feed;
  feed.onopen = () => setFeed("live", "live");
  feed.onmessage = (message) => apply(JSON.parse(message.data));
  feed.addEventListener("lagged", (message) => {
    setFeed("lagged", `behind at ${JSON.parse(message.data).last_seq}; resuming`);
  });
  feed.onerror = () => setFeed(feed.readyState === EventSource.CLOSED ? "down" : "connecting",
                               feed.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting");
}

async function start() {
  $("login").hidden = true;
  const snapshot = await api("/ui/api/summary");
  load(snapshot);
  $("board").hidden = false;
  $("logout").hidden = false;
  render();
  follow();
  setInterval(render, 1000);  // rates decay with time even when no event comes
}

async function main() {
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await logIn($("token").value);
      $("token").value = "";
      await start();
    } catch (err) {
      $("login-error").textContent = err.message;
    }
  });
  $("search").addEventListener("submit", search);
  $("logout").addEventListener("click", async () => {
    await api("/ui/session", { method: "DELETE" });
    showLogin();
  });
  // A link such as /ui#token=... logs in once; the fragment never reaches a server and is
  // removed from the address bar and history at once.
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.get("token")) {
    history.replaceState(null, "", location.pathname);
    try { await logIn(fragment.get("token")); } catch (err) { $("login-error").textContent = err.message; }
  }
  try { await start(); } catch (_) { /* showLogin() has run */ }
}

main();
