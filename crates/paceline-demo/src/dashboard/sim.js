// The simulator's view: the herd with and without jitter and the export
// job, from /sim.json, played second by second.
"use strict";

const $ = id => document.getElementById(id);
let SIM = null;
let shown = 1; // the share of the time axis drawn (1: all)

function herd(i, upTo) {
  const s = SIM.herd.series[i];
  const per = s.per_second.filter(p => p.t_s <= upTo);
  const xmax = Math.max(15, ...s.per_second.map(p => p.t_s + 1));
  plot.bars($(`herd-${i}`), {
    xmax, ymax: SIM.herd.clients,
    bars: per.map(p => ({ x: p.t_s, stack: [{ v: p.requests, cls: s.name }] })),
    markers: [{ x: SIM.herd_params.retry_after_s, label: "Retry-After", cls: "floor" }],
    xlabel: "seconds after the rejection", ylabel: "retries/s",
  });
}

function cumulative(v) {
  let sum = 0;
  return v.map(x => (sum += x));
}

function exportPlots(upTo) {
  const e = SIM.export;
  const lines = key => e.fleets.map((f, i) => {
    const tl = f.timeline, b = tl.bucket_s;
    const pts = [[0, 0]];
    cumulative(tl[key]).forEach((c, k) => { if ((k + 1) * b <= upTo + b) pts.push([(k + 1) * b, key === "sent" ? c / 1000 : c]); });
    return { fleet: i, cls: f.name === "naive" ? "naive" : "coop", points: pts };
  });
  const xmax = Math.max(e.floor_s * 1.15, ...e.fleets.map(f => (f.finished_at_s || 0) * 1.05));
  const marks = [{ x: e.floor_s, label: `floor ${e.floor_s.toFixed(0)} s`, cls: "floor" }];
  e.fleets.forEach(f => { if (f.finished_at_s && f.finished_at_s <= upTo) marks.push({ x: f.finished_at_s, label: `${f.name} ${f.finished_at_s.toFixed(0)} s`, cls: f.name === "naive" ? "naive" : "coop" }); });
  plot.lines($("export-done"), { xmax, ymax: e.fleets[0].jobs, series: lines("served"), markers: marks, xlabel: "seconds", ylabel: "records" });
  const sentMax = Math.max(...e.fleets.map(f => f.requests)) / 1000;
  plot.lines($("export-sent"), { xmax, ymax: sentMax * 1.05, series: lines("sent"), markers: marks, xlabel: "seconds", ylabel: "k requests" });
}

function render() {
  const t = shown;
  herd(0, 15 * t); herd(1, 15 * t);
  exportPlots(SIM.export.floor_s * 1.2 * t);
  $("clock").textContent = t < 1 ? `playing… ${(t * 100).toFixed(0)}%` : "";
}

$("play").addEventListener("click", () => {
  if (!SIM) return;
  const t0 = performance.now();
  const step = now => {
    shown = Math.min(1, (now - t0) / 6000);
    render();
    if (shown < 1) requestAnimationFrame(step);
  };
  requestAnimationFrame(step);
});

fetch("/sim.json").then(r => r.json()).then(v => {
  SIM = v;
  $("herd-n").textContent = v.herd.clients.toLocaleString("en");
  $("herd-ra").textContent = v.herd_params.retry_after_s;
  $("herd-blip").textContent = v.herd_params.blip_s;
  $("exp-n").textContent = v.export_params.records.toLocaleString("en");
  $("exp-q").textContent = `${v.export_params.quota / v.export_params.window_s}/s, burst ${v.export_params.quota}`;
  $("exp-w").textContent = v.export_params.workers;
  $("export-table").textContent = v.export.fleets.map(f => `${f.name}: ${f.jobs_done.toLocaleString("en")} records, ${f.requests.toLocaleString("en")} requests, finished at ${f.finished_at_s} s`).join("\n");
  render();
  document.body.dataset.state = "ready";
});
