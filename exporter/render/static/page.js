// The live cold-start view: polls ./status and redraws one card per target.
// Every value from the document is set with textContent or CSSOM, never parsed as markup.
"use strict";
(function () {
  const POLL_MS = 1000;
  const STARTUP = ["starting", "downloading", "loading", "initializing"];
  const PHASES = STARTUP.concat(["ready", "serving", "sleeping", "degraded", "failed", "down"]);
  const main = document.getElementById("targets");
  const conn = document.getElementById("conn");
  const footer = document.getElementById("updated");
  const reads = new Map(); // target -> {at, bytes, rate}: read rate between two polls
  const TRAIL_EVERY = 3; // polls of /status per poll of /trail (it is the heavier document)
  const SVG = "http://www.w3.org/2000/svg";
  let trails = new Map(); // target -> its /trail entry
  let polls = 0;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function phaseClass(phase) {
    return "phase-" + (PHASES.includes(phase) ? phase : "down");
  }

  function dur(s) {
    if (s === null || s === undefined) return "-";
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  }

  function bytes(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
  }

  function pct(ratio) {
    return ratio === null || ratio === undefined ? "-" : Math.round(ratio * 100) + "%";
  }

  function readRate(t, takenAt) {
    const bytesRead = t.process ? t.process.read_bytes : null;
    const last = reads.get(t.target);
    if (bytesRead === null || bytesRead === undefined) { reads.delete(t.target); return null; }
    let rate = last ? last.rate : null;
    if (last && takenAt > last.at && bytesRead >= last.bytes) {
      rate = (bytesRead - last.bytes) / (takenAt - last.at);
    }
    reads.set(t.target, { at: takenAt, bytes: bytesRead, rate: rate });
    return rate;
  }

  function etaText(t) {
    const parts = [];
    if (t.eta_seconds !== null && t.eta_seconds !== undefined) parts.push("ETA " + dur(t.eta_seconds));
    const prev = t.previous_cold_start;
    if (t.typical_cold_start_seconds !== null && t.typical_cold_start_seconds !== undefined) {
      parts.push("usually ready in " + dur(t.typical_cold_start_seconds));
    } else if (prev && prev.outcome === "ready") {
      parts.push("last start took " + dur(prev.duration_seconds));
    }
    if (t.elapsed_seconds !== null && t.elapsed_seconds !== undefined) {
      parts.push(dur(t.elapsed_seconds) + " since the process started");
    }
    if (t.last_wake) parts.push("last wake from sleep took " + dur(t.last_wake.duration_seconds));
    if (t.download_bytes) {
      const rate = t.download_bytes_per_second;
      parts.push("downloaded " + bytes(t.download_bytes) + (rate ? " at " + bytes(rate) + "/s" : ""));
    }
    const report = t.engine_report;
    if (report && report.load_seconds !== null) {
      parts.push("the engine timed its load at " + dur(report.load_seconds));
    }
    if (report && report.disagreement) parts.push(report.disagreement);
    for (const m of (report && report.models) || []) {
      if (m.reason) parts.push("model " + m.name + " " + m.state.toLowerCase() + ": " + m.reason);
    }
    if (t.loader) {
      const rate = t.loader_bytes_per_second;
      parts.push("loader " + t.loader + (rate ? " at " + bytes(rate) + "/s" : ""));
    }
    return parts.join(" · ");
  }

  function head(t) {
    const h = el("div", "head");
    h.append(el("h2", "name", t.target));
    h.append(el("span", "badge phase " + phaseClass(t.phase), t.phase));
    if (t.stalled) h.append(el("span", "badge stall", "stalled"));
    const orphaned = Object.entries(t.orphaned_gpu_memory_bytes || {});
    if (orphaned.length) {
      const held = orphaned.map(([gpu, n]) => "GPU " + gpu + ": " + bytes(n)).join(", ");
      h.append(el("span", "badge stall", "held by the previous instance: " + held));
    }
    const meta = [t.engine, t.model, t.deployment].filter(Boolean).join(" · ");
    h.append(el("span", "meta", meta));
    return h;
  }

  function reason(t) {
    const p = el("p", "reason");
    if (t.phase === "down" && t.since) {
      // When it went down: the one fact a gone process leaves that does not age.
      p.append(el("span", "down-since", "down since " + new Date(t.since * 1000).toLocaleTimeString()), el("br"));
    }
    if (t.stalled && t.stall_reason) p.append(el("span", "stall-reason", t.stall_reason), el("br"));
    const why = t.failure_reason && !String(t.reason).includes(t.failure_reason);
    p.append(el("span", "", why ? t.failure_reason + ": " + t.reason : t.reason));
    // The decisive log line: text only (el sets textContent), never markup.
    if (t.reason_detail) p.append(el("br"), el("span", "reason-detail", t.reason_detail));
    return p;
  }

  function bar(ratio, fillClass) {
    const b = el("div", "bar");
    const fill = el("div", "fill " + (fillClass || ""));
    fill.style.width = (Math.max(0, Math.min(1, ratio || 0)) * 100).toFixed(1) + "%";
    b.append(fill);
    return b;
  }

  function progress(t) {
    const box = el("div", "progress");
    if ((t.progress_ratio === null || t.progress_ratio === undefined) && !STARTUP.includes(t.phase)) {
      return box; // down or failed before any progress: an empty bar says nothing
    }
    box.append(bar(t.progress_ratio, phaseClass(t.phase)), el("span", "pct", pct(t.progress_ratio)));
    box.append(el("span", "eta", etaText(t)));
    return box;
  }

  function segments(rows, scale, bounds) {
    const track = el("div", "track");
    for (const row of rows) {
      const seg = el("div", "seg " + phaseClass(row.phase) + (row.running ? " running" : ""));
      const bound = bounds[row.phase];
      seg.textContent = row.phase + " " + dur(row.seconds) + (bound ? " \u00b7 " + bound : "");
      seg.title = seg.textContent;
      seg.style.width = ((row.seconds / scale) * 100).toFixed(2) + "%";
      track.append(seg);
    }
    return track;
  }

  function timelineRow(label, rows, scale, end, cls, judged) {
    const r = el("div", "tl-row " + cls);
    const total = rows.reduce((sum, x) => sum + x.seconds, 0);
    const bounds = {};
    for (const b of judged) bounds[b.phase] = b.bound;
    r.append(el("span", "label", label), segments(rows, scale, bounds), el("span", "total", end(total)));
    return r;
  }

  // What bounded each phase of this start: one line a person can act on, under the timeline.
  function advice(judged) {
    const box = el("div", "bounds");
    for (const b of judged) box.append(el("p", "advice", b.bound + ": " + b.advice));
    return box;
  }

  function timeline(t) {
    const box = el("div", "timeline");
    const now = t.timeline || [];
    const prev = t.previous_cold_start;
    const prevRows = prev
      ? STARTUP.filter((p) => prev.phase_seconds[p] !== undefined)
          .map((p) => ({ phase: p, seconds: prev.phase_seconds[p], running: false }))
      : [];
    if (!now.length && !prevRows.length) return box;
    const sum = (rows) => rows.reduce((s, x) => s + x.seconds, 0);
    const scale = Math.max(sum(now), sum(prevRows), 1);
    box.append(el("div", "section-title", "phase timeline"));
    // The previous start on top, this one under it, on one time scale: compare at a glance.
    // While a start runs, the last finished one is the previous row; after, it is this one.
    const running = t.bounds || [];
    const last = t.last_start_bounds || [];
    const mine = running.length ? running : last;
    if (prevRows.length) {
      const how = prev.outcome === "ready" ? "ready in " : (prev.reason || "failed") + " after ";
      const judged = running.length ? last : [];
      box.append(timelineRow("previous", prevRows, scale, () => how + dur(prev.duration_seconds), "previous", judged));
    }
    if (now.length) {
      const done = t.phase === "failed" ? "failed after " : t.ready ? "ready in " : "";
      box.append(timelineRow("this start", now, scale, (s) => done + dur(s), "current", mine));
    }
    if (now.length && mine.length) box.append(advice(mine));
    return box;
  }

  function gpus(t) {
    const box = el("div", "gpu-box");
    const list = t.gpu_memory || [];
    if (!list.length) return box;
    box.append(el("div", "section-title", "GPU memory held by this server"));
    const grid = el("div", "gpus");
    for (const g of list) {
      const row = el("div", "gpu");
      const ratio = g.total_bytes ? g.used_bytes / g.total_bytes : null;
      const text = bytes(g.used_bytes) + (g.total_bytes ? " / " + bytes(g.total_bytes) : "");
      row.append(el("span", "", "GPU " + g.gpu), bar(ratio), el("span", "", text));
      grid.append(row);
    }
    for (const row of migRows(t)) grid.append(row);
    box.append(grid);
    return box;
  }

  // The MIG slices the server runs on: the slice's GPU instance and profile, its memory there.
  function migRows(t) {
    return (t.mig_memory || []).map((m) => {
      const row = el("div", "gpu mig");
      row.title = m.mig_uuid;
      const known = (v) => (v === null || v === undefined ? "?" : v);
      const where = "GPU " + known(m.gpu) + " MIG " + known(m.gpu_instance_id);
      const ratio = m.total_bytes ? m.used_bytes / m.total_bytes : null;
      const size = bytes(m.used_bytes) + (m.total_bytes ? " / " + bytes(m.total_bytes) : "");
      const text = size + (m.profile ? " " + m.profile : "");
      row.append(el("span", "", where), bar(ratio), el("span", "", text));
      return row;
    });
  }

  function facts(t, rate) {
    const parts = [];
    if (rate !== null && rate !== undefined) parts.push("read " + bytes(rate) + "/s");
    if (t.process) {
      parts.push("RSS " + bytes(t.process.rss_bytes));
      parts.push(t.process.processes + (t.process.processes === 1 ? " process" : " processes"));
    }
    if (t.last_evidence && STARTUP.includes(t.phase)) parts.push("last progress: " + t.last_evidence);
    if (t.restarts) parts.push("restarts " + t.restarts);
    return el("p", "facts", parts.join(" · "));
  }

  function notable(t) {
    const box = el("div", "notable");
    const lines = (t.notable_lines || []).filter((e) => e.class !== "benign").slice(-8);
    if (!lines.length) return box;
    box.append(el("div", "section-title", "notable log lines"));
    const ol = el("ol", "lines");
    for (const e of lines) {
      // A line older than this process is from an earlier start (a failed one, usually).
      const earlier = t.started_at && e.at < t.started_at - 1;
      const li = el("li", earlier ? "earlier" : "");
      const at = new Date(e.at * 1000).toLocaleTimeString();
      li.append(el("time", "", earlier ? at + " (earlier start)" : at));
      li.append(el("span", "cls " + (e.class === "fatal" ? "fatal" : ""), e.class));
      li.append(el("span", "text", e.text));
      ol.append(li);
    }
    box.append(ol);
    return box;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  function gpuSum(p) {
    const held = p.slice(5).filter((v) => v !== null);
    return held.length ? held.reduce((a, b) => a + b, 0) : null;
  }

  // The start drawn as it unfolds: one strip per signal over seconds since the process
  // started, phase bands behind, the previous start faint under this one.
  const STRIPS = [
    // A point is [t, read B/s, RSS, CPU cores, seconds since progress, bytes on each GPU...].
    { key: "gpu", title: "GPU memory", value: gpuSum, fmt: bytes },
    { key: "read", title: "read throughput", value: (p) => p[1], fmt: (v) => bytes(v) + "/s" },
    { key: "quiet", title: "time since progress", value: (p) => p[4], fmt: dur },
  ];
  const W = 600, H = 56;

  function stripPath(points, strip, span, top) {
    let d = "";
    for (const p of points) {
      const v = strip.value(p);
      if (v === null || v === undefined) continue;
      const x = (p[0] / span) * W;
      const y = H - (v / top) * (H - 4) - 2;
      d += (d ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
    }
    return d;
  }

  function bands(g, trail, span) {
    const list = trail.bands || [];
    const last = trail.points.length ? trail.points[trail.points.length - 1][0] : 0;
    list.forEach(([t, phase], i) => {
      const end = i + 1 < list.length ? list[i + 1][0] : Math.max(t, last);
      const r = svg("rect", { x: (t / span) * W, y: 0, width: Math.max(0, ((end - t) / span) * W), height: H });
      r.setAttribute("class", "band " + phaseClass(phase));
      g.append(r);
    });
  }

  function marks(g, trail, span) {
    for (const [t, kind, text] of trail.marks || []) {
      const tick = svg("line", { x1: (t / span) * W, x2: (t / span) * W, y1: H - 8, y2: H });
      tick.setAttribute("class", "mark " + kind);
      const tip = svg("title");
      tip.textContent = dur(t) + " " + kind + ": " + text; // text only, never markup
      tick.append(tip);
      g.append(tick);
    }
  }

  function strip(strip, entry, span) {
    const box = el("div", "strip strip-" + strip.key);
    const cur = entry.current, prev = entry.previous;
    const all = [...(cur ? cur.points : []), ...(prev ? prev.points : [])];
    const values = all.map(strip.value).filter((v) => v !== null && v !== undefined);
    let top = Math.max(1, ...values);
    const threshold = strip.key === "quiet" ? entry.stall_threshold_seconds : null;
    if (threshold) top = Math.max(top, threshold * 1.1);
    const last = values.length ? strip.fmt(strip.value(cur && cur.points.length ? cur.points[cur.points.length - 1] : all[all.length - 1])) : "";
    box.append(el("span", "strip-title", strip.title + (last ? ": " + last : "")));
    const s = svg("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none", role: "img" });
    s.setAttribute("aria-label", strip.title);
    if (cur) bands(s, cur, span);
    if (prev) {
      const p = svg("path", { d: stripPath(prev.points, strip, span, top) });
      p.setAttribute("class", "line previous");
      s.append(p);
    }
    if (cur) {
      const c = svg("path", { d: stripPath(cur.points, strip, span, top) });
      c.setAttribute("class", "line current");
      s.append(c);
      if (strip.key === "gpu") marks(s, cur, span);
    }
    if (threshold) {
      const y = H - (threshold / top) * (H - 4) - 2;
      const l = svg("line", { x1: 0, x2: W, y1: y, y2: y });
      l.setAttribute("class", "threshold");
      s.append(l);
    }
    box.append(s);
    return box;
  }

  function strips(t) {
    const box = el("div", "strips");
    const entry = trails.get(t.target);
    if (!entry || !(entry.current || entry.previous)) return box;
    const end = (tr) => (tr && tr.points.length ? tr.points[tr.points.length - 1][0] : 0);
    const span = Math.max(end(entry.current), end(entry.previous), 10);
    box.append(el("div", "section-title", "this start" + (entry.previous ? " (the previous one faint)" : "")));
    for (const s of STRIPS) box.append(strip(s, entry, span));
    return box;
  }

  function card(t, rate) {
    const c = el("section", "target " + phaseClass(t.phase) + (t.stalled ? " stalled" : ""));
    c.dataset.target = t.target;
    c.dataset.phase = t.phase;
    c.append(head(t), reason(t), progress(t), strips(t), timeline(t), gpus(t), facts(t, rate), notable(t));
    return c;
  }

  async function pollTrail() {
    try {
      const reply = await fetch("trail", { cache: "no-store", headers: { Accept: "application/json" } });
      if (!reply.ok) return;
      const doc = await reply.json();
      trails = new Map(doc.targets.map((e) => [e.target, e]));
    } catch (err) {
      // the strips wait for the next try; /status still drives the page
    }
  }

  function render(doc) {
    if (!doc.ready) {
      main.replaceChildren(el("p", "empty", "waiting for the exporter's first sample"));
      return;
    }
    if (!doc.targets.length) {
      main.replaceChildren(el("p", "empty", "no targets configured"));
      return;
    }
    main.replaceChildren(...doc.targets.map((t) => card(t, readRate(t, doc.taken_at))));
    const down = (doc.sources || []).filter((s) => !s.up && s.state !== "absent")
      .map((s) => s.source + (s.target ? "/" + s.target : "") + (s.error ? " (" + s.error + ")" : ""));
    footer.textContent = "updated " + new Date(doc.taken_at * 1000).toLocaleTimeString() +
      " · exporter " + doc.version + (down.length ? " · sources down: " + down.join(", ") : "");
  }

  async function poll() {
    if (polls++ % TRAIL_EVERY === 0) await pollTrail();
    try {
      const reply = await fetch("status", { cache: "no-store", headers: { Accept: "application/json" } });
      if (!reply.ok) throw new Error("HTTP " + reply.status);
      render(await reply.json());
      conn.hidden = true;
    } catch (err) {
      conn.textContent = "cannot read /status (" + err.message + "); retrying every second";
      conn.hidden = false;
    }
    setTimeout(poll, POLL_MS);
  }

  poll();
})();
