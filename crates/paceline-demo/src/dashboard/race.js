// The race page: listens to /race/events (server-sent events) and draws
// the buckets, the requests per second, the counters and the last
// response as the gateway and the client saw them.
"use strict";

const $ = id => document.getElementById(id);
const S = {
  controls: { refill_per_s: 4, depth: 8, workers: 10 },
  run: null,        // the controls of the run shown
  floor: 10.5,
  jobs: 50,
  capacity: 40,
  ticks: [],
  last: null,
  fleets: null,     // the final reports
  running: false,
  runs: 0,
  xmax: 14,
};

function floorOf(c, jobs) {
  return Math.max(0, jobs - c.depth) / c.refill_per_s;
}

function showFloor() {
  const c = readControls();
  const f = floorOf(c, S.jobs);
  $("floor").textContent = `floor ${f.toFixed(1)} s`;
  const rest = Math.max(0, S.jobs - c.depth);
  $("floor-why").textContent = `${Math.min(S.jobs, c.depth)} jobs at once from the full bucket, then ${rest} at ${c.refill_per_s} a second = ${f.toFixed(1)} s`;
}

function readControls() {
  return {
    refill_per_s: parseInt($("refill").value, 10) || 0,
    depth: parseInt($("depth").value, 10) || 0,
    workers: parseInt($("workers").value, 10) || 0,
  };
}

function setControls(c) {
  $("refill").value = c.refill_per_s;
  $("depth").value = c.depth;
  $("workers").value = c.workers;
  showFloor();
}

for (const id of ["refill", "depth", "workers"]) $(id).addEventListener("input", showFloor);

async function post(path, body) {
  const r = await fetch(path, {
    method: "POST",
    headers: body ? { "content-type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  let msg = null;
  try { msg = await r.json(); } catch (_) { /* no body */ }
  return { ok: r.ok, status: r.status, msg };
}

$("play").addEventListener("click", async () => {
  $("error").textContent = "";
  const c = await post("/race/controls", readControls());
  if (!c.ok) {
    $("error").textContent = (c.msg && c.msg.error) || `refused (${c.status})`;
    return;
  }
  await start();
});

$("replay").addEventListener("click", async () => {
  $("error").textContent = "";
  await start();
});

async function start() {
  const r = await post("/race/run");
  if (r.status === 409) $("error").textContent = "a race is running; wait for it to finish";
}

// --- the feed ---------------------------------------------------------

function onMessage(m) {
  switch (m.type) {
    case "hello":
      S.jobs = m.jobs; S.capacity = m.capacity_per_s; S.runs = m.runs; S.running = m.running;
      S.instances = m.instances || 1; S.store = m.store || "memory";
      $("capacity").textContent = m.capacity_per_s;
      $("naive-retry").textContent = m.naive_retry_ms;
      setControls(m.controls);
      if (m.run) {
        S.run = m.run.controls; S.floor = m.run.floor_s;
        S.ticks = m.run.ticks || []; S.last = m.run.last_response;
        S.fleets = m.run.fleets; $("table").textContent = m.run.table || "";
        S.admitted = m.run.admitted;
      }
      break;
    case "start":
      S.run = m.controls; S.floor = m.floor_s; S.jobs = m.jobs; S.runs = m.run;
      S.ticks = []; S.last = null; S.fleets = null; S.running = true; S.admitted = null;
      S.instances = m.instances || 1; S.store = m.store || "memory";
      $("table").textContent = "";
      setControls(m.controls);
      break;
    case "tick":
      S.ticks.push(m.tick);
      if (m.last_response) S.last = m.last_response;
      break;
    case "done":
      S.fleets = m.report.fleets; S.running = false; S.admitted = m.report.admitted;
      $("table").textContent = m.table;
      break;
  }
  schedule();
}

let pending = false;
function schedule() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => { pending = false; render(); });
}

function connect() {
  const es = new EventSource("/race/events");
  es.onmessage = e => onMessage(JSON.parse(e.data));
  es.onerror = () => { $("status").textContent = "connection lost; trying again…"; };
}

// --- drawing ----------------------------------------------------------

function render() {
  const c = S.run || S.controls;
  const last = S.ticks[S.ticks.length - 1];
  const done = !S.running && S.fleets;
  document.body.dataset.state = S.running ? "running" : done ? "done" : "idle";
  document.body.dataset.runs = S.runs;
  document.body.dataset.ticks = S.ticks.length;
  // the time axis: the floor and some room, stretched only while a fleet
  // is still running past it, fixed once the race is over
  const t = last ? last.t_s : 0;
  const finish = last ? Math.max(...last.fleets.map(f => f.finished_at_s || 0)) : 0;
  let xmax = Math.max(S.floor * 1.25 + 1, 4);
  if (S.running && t > xmax * 0.95) xmax = t * 1.1;
  if (!S.running && finish > xmax * 0.95) xmax = finish * 1.1;
  S.xmax = Math.ceil(xmax);
  status(t, done, last);
  deployment();
  tokens(c);
  perSecond(0); perSecond(1);
  counters(c, last);
  lastResponse();
}

function status(t, done, last) {
  if (!last) {
    $("status").textContent = S.running ? "Starting…" : "Nothing has been sent yet. Press play.";
    return;
  }
  const word = S.running ? "running" : done ? "finished" : "stopped";
  $("status").textContent = `elapsed ${t.toFixed(1)} s · ${word} · gateway capacity ${S.capacity} req/s · floor ${S.floor.toFixed(1)} s`;
}

// How many gateways the fleets go through, and where they count.
function deployment() {
  const n = S.instances || 1;
  const where = S.store === "redis"
    ? "all counting in one shared Redis, so together they hold each key to the one published limit"
    : n > 1 ? "each counting alone in its own memory, so a key gets the published limit once per gateway"
    : "which counts in its own memory";
  const front = n > 1 ? `${n} gateways behind a round-robin front, ` : "one gateway, ";
  const each = n > 1 ? ` Each gateway passes ${S.capacity} requests a second, and the bucket chart shows gateway 1's buckets.` : "";
  $("deployment").textContent = `The fleets send to ${front}${where}.${each} Look at "admitted vs one limit" once the race ends.`;
  document.body.dataset.instances = n;
  document.body.dataset.store = S.store || "memory";
}

function markers() {
  const m = [{ x: S.floor, label: `floor ${S.floor.toFixed(1)} s`, cls: "floor" }];
  const last = S.ticks[S.ticks.length - 1];
  if (last) last.fleets.forEach((f, i) => {
    if (f.finished_at_s != null) m.push({ x: f.finished_at_s, label: `${i ? "naive" : "cooperative"} ${f.finished_at_s.toFixed(2)} s`, cls: i ? "naive" : "coop" });
  });
  return m;
}

function tokens(c) {
  const series = [0, 1].map(i => ({
    fleet: i, cls: i ? "naive" : "coop",
    points: S.ticks.map(t => [t.t_s, t.fleets[i].tokens]),
  }));
  plot.lines($("tokens"), { xmax: S.xmax, ymax: c.depth, series, markers: markers(), xlabel: "seconds", ylabel: "tokens" });
}

// Requests per whole second by outcome, from the cumulative ticks.
function seconds(i) {
  const out = [];
  let prev = { served: 0, rejected_429: 0, dropped: 0 };
  let s = 1;
  for (let k = 0; k < S.ticks.length; k++) {
    const t = S.ticks[k];
    const endOfSecond = t.t_s >= s || k === S.ticks.length - 1;
    if (!endOfSecond) continue;
    const f = t.fleets[i];
    out.push({ x: s - 1, served: f.served - prev.served, r429: f.rejected_429 - prev.rejected_429, dropped: f.dropped - prev.dropped });
    prev = f;
    s = Math.floor(t.t_s) + 1;
  }
  return out;
}

function perSecond(i) {
  const secs = seconds(i);
  const ymax = Math.max(S.capacity, ...secs.map(b => b.served + b.r429 + b.dropped), 5);
  plot.bars($(`rate-${i}`), {
    xmax: S.xmax, ymax,
    bars: secs.map(b => ({ x: b.x, stack: [{ v: b.served, cls: "served" }, { v: b.r429, cls: "r429" }, { v: b.dropped, cls: "dropped" }] })),
    hline: { y: (S.run || S.controls).refill_per_s, label: "refill rate", cls: "floor" },
    markers: markers(), xlabel: "seconds", ylabel: "requests/s",
  });
}

function cell(k, f, text) {
  const td = document.querySelector(`#counters tr[data-k="${k}"] td[data-f="${f}"]`);
  if (td) td.textContent = text;
}

function counters(c, last) {
  for (const i of [0, 1]) {
    const final = S.fleets && !S.running ? S.fleets[i] : null;
    const t = last ? last.fleets[i] : null;
    const v = (k, dflt) => final ? final[k] : t ? t[k] : dflt;
    cell("jobs", i, `${v("jobs_done", 0)}/${S.jobs}`);
    cell("requests", i, String(v("requests", 0)));
    cell("rejected_429", i, String(v("rejected_429", 0)));
    cell("dropped", i, String(v("dropped", 0)));
    const tok = t ? t.tokens : c.depth;
    cell("tokens", i, `${tok.toFixed(1)}/${c.depth}`);
    const fin = final ? final.finished_at_s : t ? t.finished_at_s : null;
    cell("finished", i, fin == null ? "—" : `${fin.toFixed(2)} s`);
    const a = S.admitted && !S.running ? S.admitted[i] : null;
    cell("admitted", i, a ? `${a.admitted} of ${a.one_limit_allows.toFixed(1)} (${a.times_the_limit.toFixed(2)}×)` : "—");
  }
}

const EXPLAIN = {
  "ratelimit-policy": v => `the published budget: a bucket of ${(v.match(/q=(\d+)/) || [])[1]} tokens refilled over ${(v.match(/w=(\d+)/) || [])[1]} s`,
  "ratelimit": v => {
    const r = (v.match(/r=(\d+)/) || [])[1], t = (v.match(/t=(\d+)/) || [])[1];
    return `right now: ${r} whole token${r === "1" ? "" : "s"} left, full again in ${t} s (rounded up)`;
  },
  "retry-after": v => `come back in ${v} s at the earliest: the emergency brake, not the speedometer`,
};

function lastResponse() {
  const r = S.last;
  if (!r) { $("last-raw").textContent = "waiting for the first response…"; $("last-explained").innerHTML = ""; return; }
  const reason = { 200: "OK", 429: "Too Many Requests", 503: "Service Unavailable" }[r.status] || "";
  $("last-raw").textContent = [`HTTP/1.1 ${r.status} ${reason}   (at ${r.t_s.toFixed(2)} s)`, ...r.fields.map(([k, v]) => `${k}: ${v}`)].join("\n");
  const dl = $("last-explained");
  dl.innerHTML = "";
  const add = (k, v) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  };
  for (const [k, v] of r.fields) if (EXPLAIN[k]) add(k, EXPLAIN[k](v));
  const every = r.window_s && r.limit ? ` (one every ${(r.window_s / r.limit).toFixed(2)} s)` : "";
  const next = r.status === 200
    ? (r.remaining ? "it may send again at once" : `it sends the next one when the next token drips in${every}`)
    : `it waits ${r.retry_after_s ?? "?"} s, with jitter, before it tries again`;
  add("the client concludes", `${r.outcome}: ${r.remaining ?? "?"} of ${r.limit ?? "?"} tokens left, so ${next}`);
}

connect();
render();
