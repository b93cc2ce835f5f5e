// Small SVG plots for the dashboard: lines, stacked bars, markers. No
// framework: each call redraws one <svg> from its numbers.
"use strict";

const plot = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const M = { l: 44, r: 12, t: 12, b: 30 };

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  function niceStep(max, ticks) {
    const raw = max / ticks;
    const p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
    return 10 * p;
  }

  // Clears `svg` and draws its frame; returns scales.
  function frame(svg, o) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const w = svg.clientWidth || 600, h = svg.clientHeight || 220;
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    const x = v => M.l + (v / o.xmax) * (w - M.l - M.r);
    const y = v => h - M.b - (v / o.ymax) * (h - M.t - M.b);
    const axes = el("g", { class: "axes" }, svg);
    const ys = niceStep(o.ymax, 4);
    for (let v = 0; v <= o.ymax + 1e-9; v += ys) {
      el("line", { x1: M.l, x2: w - M.r, y1: y(v), y2: y(v), class: "grid" }, axes);
      el("text", { x: M.l - 6, y: y(v) + 4, "text-anchor": "end" }, axes).textContent = fmt(v);
    }
    const xs = niceStep(o.xmax, 8);
    for (let v = 0; v <= o.xmax + 1e-9; v += xs) {
      el("text", { x: x(v), y: h - M.b + 16, "text-anchor": "middle" }, axes).textContent = fmt(v);
    }
    if (o.xlabel) el("text", { x: w - M.r, y: h - 2, "text-anchor": "end", class: "label" }, axes).textContent = o.xlabel;
    if (o.ylabel) el("text", { x: 4, y: M.t - 2 + 10, class: "label" }, axes).textContent = o.ylabel;
    el("line", { x1: M.l, x2: M.l, y1: M.t, y2: h - M.b, class: "axis" }, axes);
    el("line", { x1: M.l, x2: w - M.r, y1: h - M.b, y2: h - M.b, class: "axis" }, axes);
    return { x, y, w, h };
  }

  function fmt(v) {
    return Math.abs(v - Math.round(v)) < 1e-9 ? String(Math.round(v)) : v.toFixed(1);
  }

  // Vertical markers: [{x, label, cls}]
  function markers(svg, s, list) {
    const g = el("g", { class: "markers" }, svg);
    list.forEach((m, i) => {
      el("line", { x1: s.x(m.x), x2: s.x(m.x), y1: M.t, y2: s.h - M.b, class: "marker " + (m.cls || "") }, g);
      el("text", { x: s.x(m.x) + 3, y: M.t + 10 + 12 * i, class: "marker-label " + (m.cls || "") }, g).textContent = m.label;
    });
  }

  // series: [{points: [[x, y]], cls, name}]
  function lines(svg, o) {
    const s = frame(svg, o);
    for (const ser of o.series) {
      const pts = ser.points.map(([a, b]) => `${s.x(a).toFixed(1)},${s.y(b).toFixed(1)}`).join(" ");
      el("polyline", { points: pts, class: "line " + ser.cls, "data-fleet": ser.fleet ?? "", "data-n": ser.points.length }, svg);
    }
    markers(svg, s, o.markers || []);
    return s;
  }

  // bars: [{x, stack: [{v, cls}]}], one unit of x wide
  function bars(svg, o) {
    const s = frame(svg, o);
    const g = el("g", { class: "bars" }, svg);
    const bw = Math.max(1, s.x(1) - s.x(0) - 2);
    for (const b of o.bars) {
      let base = 0;
      for (const part of b.stack) {
        if (!part.v) continue;
        el("rect", { x: s.x(b.x) + 1, width: bw, y: s.y(base + part.v), height: s.y(base) - s.y(base + part.v), class: "bar " + part.cls }, g);
        base += part.v;
      }
    }
    if (o.hline) {
      el("line", { x1: s.x(0), x2: s.x(o.xmax), y1: s.y(o.hline.y), y2: s.y(o.hline.y), class: "marker " + o.hline.cls }, svg);
      el("text", { x: s.x(o.xmax) - 4, y: s.y(o.hline.y) - 4, "text-anchor": "end", class: "marker-label " + o.hline.cls }, svg).textContent = o.hline.label;
    }
    markers(svg, s, o.markers || []);
    return s;
  }

  return { lines, bars };
})();
