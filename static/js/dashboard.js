/* The live dashboard: panels from /ws/telemetry/ ({"type": "snapshot", "panels": {...}}, one
   message per inference worker per interval; see dashboard/web/panels.py), charts with uPlot,
   and the recent requests with their phase timelines. */
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("dashboard-data").textContent);
  const $ = (id) => document.getElementById(id);
  const INTERVAL_MS = Math.max(250, config.interval_s * 1000);
  const WINDOW_S = 5 * 60; // the charts' span
  const STALE_MS = Math.max(5000, INTERVAL_MS * 10); // a worker silent this long is dropped
  const MiB = 1024 * 1024;

  const workers = new Map(); // worker name -> {panels, seen}
  let lastFinished = null;

  // --- formatting ------------------------------------------------------------------------------

  const ms = (s) => (s === null || s === undefined ? "–" : s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(2) + " s");
  const tps = (v) => (v === null || v === undefined ? "–" : v >= 100 ? String(Math.round(v)) : v.toFixed(1));
  const pct = (v) => (v === null || v === undefined ? "–" : Math.round(v) + "%");
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    if (n >= 1024 * MiB) return (n / (1024 * MiB)).toFixed(1) + " GiB";
    return Math.round(n / MiB) + " MiB";
  }
  const text = (id, value) => { $(id).textContent = value; };

  // --- charts ------------------------------------------------------------------------------

  const COLORS = { prompt: "#2f6fde", output: "#d9480f", p50: "#2b8a3e", p95: "#e8a100", p99: "#c92a2a",
    queue: "#7048e8", active: "#0c8599", used: "#d9480f", own: "#2f6fde", total: "#868e96", kv: "#7048e8", cpu: "#2b8a3e" };

  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });

  function makeChart(id, series) {
    const element = $(id);
    const data = [[], ...series.map(() => [])];
    const plot = new uPlot({
      width: Math.max(200, element.clientWidth),
      height: 170,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max * 1.1, 1)] } },
      axes: [
        { stroke: "#868e96", grid: { stroke: "#8881" }, space: 70, values: (u, splits) => splits.map(clock) },
        { stroke: "#868e96", grid: { stroke: "#8882" }, size: 55 },
      ],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: COLORS[s.key], width: 2, spanGaps: true,
        fill: s.fill ? COLORS[s.key] + "22" : undefined }))],
    }, data, element);
    return { plot, data, element, series };
  }

  const charts = {
    prompt: makeChart("c-prompt", [{ key: "prompt", label: "prompt tok/s", fill: true }]),
    output: makeChart("c-output", [{ key: "output", label: "output tok/s", fill: true }]),
    ttft: makeChart("c-ttft", [{ key: "p50", label: "p50" }, { key: "p95", label: "p95" }, { key: "p99", label: "p99" }]),
    itl: makeChart("c-itl", [{ key: "p50", label: "p50" }, { key: "p95", label: "p95" }, { key: "p99", label: "p99" }]),
    seq: makeChart("c-seq", [{ key: "queue", label: "queue depth" }, { key: "active", label: "active sequences" }]),
    mem: null, // made on the first reading, when it is known whether there is a GPU
    load: makeChart("c-load", [{ key: "kv", label: "KV cache fill" }, { key: "cpu", label: "CPU" }]),
  };

  function push(chart, time, values) {
    chart.data[0].push(time);
    values.forEach((v, i) => chart.data[i + 1].push(v === undefined ? null : v));
    while (chart.data[0].length && chart.data[0][0] < time - WINDOW_S) chart.data.forEach((col) => col.shift());
    chart.plot.setData(chart.data);
  }

  // GPU: used, this worker's share and the total per box; no GPU: the worker's RSS and the
  // model weights it maps (the box's total RAM would flatten both to a line at the bottom).
  // "The worker" is the worker process with its runner processes: the models live in those.
  const MEMORY_SERIES = {
    gpu: [{ key: "used", label: "GPU used" }, { key: "own", label: "this worker + runners" }, { key: "total", label: "GPU total" }],
    ram: [{ key: "used", label: "worker RSS (runners included)" }, { key: "own", label: "model weights (mmap)" }],
  };
  let memoryKind = null;

  function memoryChart(kind) {
    if (memoryKind !== kind) {
      if (charts.mem) charts.mem.plot.destroy();
      charts.mem = makeChart("c-mem", MEMORY_SERIES[kind]);
      memoryKind = kind;
    }
    return charts.mem;
  }

  window.addEventListener("resize", () => {
    Object.values(charts).filter(Boolean).forEach((c) => c.plot.setSize({ width: Math.max(200, c.element.clientWidth), height: 170 }));
  });

  // --- aggregating the workers --------------------------------------------------------------

  function worst(list, key) {
    const values = list.map((d) => d[key]).filter((v) => v !== null && v !== undefined);
    return values.length ? Math.max(...values) : null;
  }

  function aggregate() {
    const now = Date.now();
    for (const [name, entry] of workers) if (now - entry.seen > STALE_MS) workers.delete(name);
    const all = [...workers.values()].map((e) => e.panels);
    const sum = (key) => all.reduce((acc, p) => acc + (p[key] || 0), 0);
    const cpu = all.map((p) => p.cpu_percent).filter((v) => v !== null && v !== undefined);
    return {
      count: all.length,
      panels: all,
      prompt_tps: sum("prompt_tps"),
      output_tps: sum("output_tps"),
      queue_depth: sum("queue_depth"),
      active_sequences: sum("active_sequences"),
      finished: sum("finished"),
      kv_fill: all.length ? Math.max(...all.map((p) => p.kv_fill || 0)) : 0,
      cpu: cpu.length ? cpu.reduce((a, b) => a + b, 0) / cpu.length : null,
      ttft: { p50: worst(all.map((p) => p.ttft), "p50"), p95: worst(all.map((p) => p.ttft), "p95"), p99: worst(all.map((p) => p.ttft), "p99") },
      itl: { p50: worst(all.map((p) => p.itl), "p50"), p95: worst(all.map((p) => p.itl), "p95"), p99: worst(all.map((p) => p.itl), "p99") },
    };
  }

  function memoryTotals(all) {
    // GPUs when any worker has one (NVML); otherwise each worker's RSS and its models' size.
    const gpus = all.flatMap((p) => p.memory.gpus.map((g) => ({ worker: p.worker, ...g })));
    if (gpus.length) {
      return { kind: "gpu", gpus,
        used: gpus.reduce((a, g) => a + g.used_bytes, 0), own: gpus.reduce((a, g) => a + g.process_bytes, 0),
        total: gpus.reduce((a, g) => a + g.total_bytes, 0) };
    }
    return { kind: "ram", gpus: [],
      used: all.reduce((a, p) => a + p.memory.rss_bytes, 0), own: all.reduce((a, p) => a + p.memory.model_bytes, 0),
      total: all.reduce((a, p) => a + (p.memory.ram_total_bytes || 0), 0) };
  }

  // --- drawing -------------------------------------------------------------------------------

  function bar(label, parts, total, caption) {
    const row = document.createElement("div");
    row.className = "mem-row";
    const name = document.createElement("div");
    name.className = "mem-name";
    name.textContent = label;
    const track = document.createElement("div");
    track.className = "mem-track";
    parts.forEach((part) => {
      const fill = document.createElement("div");
      fill.className = "mem-fill " + part.cls;
      fill.style.width = total ? Math.min(100, (100 * part.value) / total).toFixed(2) + "%" : "0";
      fill.title = part.title;
      track.append(fill);
    });
    const value = document.createElement("div");
    value.className = "mem-value";
    value.textContent = caption;
    row.append(name, track, value);
    return row;
  }

  function drawMemory(all, totals) {
    const box = $("memory-bars");
    box.replaceChildren();
    if (totals.kind === "gpu") {
      $("memory-title").textContent = "GPU memory (NVML)";
      $("c-mem-caption").textContent = "GPU memory · MiB";
      totals.gpus.forEach((g) => {
        box.append(bar((all.length > 1 ? g.worker + " · " : "") + "GPU " + g.index + " · " + g.name,
          [{ cls: "mem-own", value: g.process_bytes, title: "this worker and its runner processes" },
           { cls: "mem-other", value: Math.max(0, g.used_bytes - g.process_bytes), title: "other processes" }],
          g.total_bytes, bytes(g.used_bytes) + " used of " + bytes(g.total_bytes) + " · worker + runners " + bytes(g.process_bytes)));
      });
    } else {
      $("memory-title").textContent = "Memory (no GPU: the worker's RSS, its runner processes included, and the mmap'd model size)";
      $("c-mem-caption").textContent = "Memory · MiB (no GPU: worker + runners RSS and model size)";
      all.forEach((p) => {
        const m = p.memory;
        box.append(bar(p.worker + " · RAM",
          [{ cls: "mem-own", value: Math.min(m.model_bytes, m.rss_bytes), title: "model (mmap'd)" },
           { cls: "mem-other", value: Math.max(0, m.rss_bytes - m.model_bytes), title: "rest of the worker and its runners" }],
          m.ram_total_bytes || m.rss_bytes, "worker RSS incl. runners " + bytes(m.rss_bytes) +
          " (runners " + bytes(m.runners_rss_bytes) + ") · models " + bytes(m.model_bytes) +
          " · box " + bytes(m.ram_total_bytes)));
      });
    }
    const legend = document.createElement("p");
    legend.className = "muted small";
    legend.textContent = totals.kind === "gpu" ? "dark: this worker and its runner processes · light: other processes"
      : "dark: model weights (mmap'd) · light: the rest of the worker's and its runners' resident memory";
    box.append(legend);
  }

  // --- runner processes ----------------------------------------------------------------------

  const FAULTY = new Set(["crashed", "backing off", "failed"]);

  function ago(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s >= 3600) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m ago";
    if (s >= 60) return Math.floor(s / 60) + "m " + (s % 60) + "s ago";
    return s + "s ago";
  }

  function drawRunners() {
    // Times in a runner row are relative to its worker's snapshot (panels.py): what passed since
    // the snapshot arrived is added here, so the browser's clock never meets the worker's.
    const now = Date.now();
    const entries = [...workers.values()];
    const rows = entries.flatMap((e) => (e.panels.runners || []).map((r) =>
      ({ worker: e.panels.worker, since: (now - e.seen) / 1000, ...r })));
    const body = $("runners");
    body.replaceChildren();
    if (!rows.length) {
      const row = document.createElement("tr");
      cell(row, "No runner process yet: one starts when a model loads.", "muted").colSpan = 6;
      body.append(row);
      return;
    }
    rows.forEach((r) => {
      const row = document.createElement("tr");
      cell(row, (entries.length > 1 ? r.worker + " · " : "") + r.model);
      cell(row, r.state + (r.state === "running" && r.pid !== null ? " · pid " + r.pid : ""), FAULTY.has(r.state) ? "error" : "");
      cell(row, String(r.restarts), "num");
      cell(row, r.last_exit ? r.last_exit + (r.last_exit_ago !== null ? " · " + ago(r.last_exit_ago + r.since) : "") : "–");
      const wait = r.retry_in !== null ? Math.ceil(r.retry_in - r.since) : null;
      cell(row, r.state === "backing off" ? (wait !== null && wait > 0 ? "retrying in " + wait + " s" : "retrying at the next request") : "–");
      cell(row, r.note || "").style.whiteSpace = "normal"; // a sentence: let it wrap
      body.append(row);
    });
  }

  function sample() {
    const a = aggregate();
    const time = Date.now() / 1000;
    if (!a.count) {
      text("workers", "no worker reporting");
      return;
    }
    const totals = memoryTotals(a.panels);
    text("t-prompt-tps", tps(a.prompt_tps));
    text("t-output-tps", tps(a.output_tps));
    text("t-ttft", ms(a.ttft.p50));
    text("t-ttft-tail", "p95 " + ms(a.ttft.p95) + " · p99 " + ms(a.ttft.p99));
    text("t-itl", ms(a.itl.p50));
    text("t-itl-tail", "p95 " + ms(a.itl.p95) + " · p99 " + ms(a.itl.p99));
    text("t-queue", String(a.queue_depth));
    text("t-active", String(a.active_sequences));
    const decoding = a.panels.reduce((acc, p) => acc + Object.values(p.models).reduce((s, m) => s + m.decoding, 0), 0);
    text("t-active-tail", "active · " + decoding + " decoding");
    text("t-kv", pct(a.kv_fill * 100));
    text("t-cpu", pct(a.cpu));
    const cores = a.panels.map((p) => p.cpu_count).filter(Boolean);
    text("t-cpu-tail", cores.length ? "busy, " + cores[0] + " cores" : "busy");
    text("workers", a.panels.map((p) => (p.mode === "embedded" ? "runners supervised by the web process" : "worker " + p.worker)).join(", "));
    const loaded = a.panels.flatMap((p) => p.loaded.map((m) => m.name + (m.busy ? " · answering" : "")));
    const loading = a.panels.map((p) => p.loading).filter(Boolean);
    text("loaded", (loaded.length ? "loaded: " + loaded.join(", ") : "no model loaded") +
      (loading.length ? " · loading " + loading.join(", ") + "…" : ""));
    drawMemory(a.panels, totals);
    drawRunners();

    const toMs = (v) => (v === null || v === undefined ? null : v * 1000);
    push(charts.prompt, time, [a.prompt_tps]);
    push(charts.output, time, [a.output_tps]);
    push(charts.ttft, time, [toMs(a.ttft.p50), toMs(a.ttft.p95), toMs(a.ttft.p99)]);
    push(charts.itl, time, [toMs(a.itl.p50), toMs(a.itl.p95), toMs(a.itl.p99)]);
    push(charts.seq, time, [a.queue_depth, a.active_sequences]);
    const memory = [totals.used / MiB, totals.own / MiB];
    if (totals.kind === "gpu") memory.push(totals.total / MiB);
    push(memoryChart(totals.kind), time, memory);
    push(charts.load, time, [a.kv_fill * 100, a.cpu]);

    if (lastFinished !== null && a.finished !== lastFinished) loadRequests();
    lastFinished = a.finished;
  }

  // --- recent requests and their timeline ------------------------------------------------------

  function cell(row, value, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = value;
    row.append(td);
    return td;
  }

  function drawTable(requests) {
    const body = $("requests");
    body.replaceChildren();
    if (!requests.length) {
      const row = document.createElement("tr");
      const td = cell(row, "No requests yet. Send a chat message or call the API.", "muted");
      td.colSpan = 13;
      body.append(row);
      return;
    }
    requests.forEach((r) => {
      const row = document.createElement("tr");
      row.className = "outcome-" + r.outcome;
      cell(row, new Date(r.start * 1000).toLocaleTimeString());
      cell(row, r.model);
      cell(row, r.source);
      cell(row, r.client);
      const outcome = cell(row, r.outcome);
      if (r.error) outcome.title = r.error;
      cell(row, r.prompt_tokens + (r.cached_tokens ? " (" + r.cached_tokens + ")" : ""), "num");
      cell(row, String(r.output_tokens), "num");
      cell(row, ms(r.queue_time), "num");
      cell(row, ms(r.ttft), "num");
      cell(row, tps(r.prompt_tps), "num");
      cell(row, tps(r.decode_tps), "num");
      cell(row, ms(r.itl_p95), "num");
      cell(row, ms(r.total_time), "num");
      body.append(row);
    });
  }

  function drawTimeline(requests) {
    // The newest requests on one wall-clock axis, so a prefill that overlapped someone else's
    // decode shows as bars stacked in the same moment.
    const box = $("timeline");
    box.replaceChildren();
    const shown = requests.filter((r) => r.timeline.length).slice(0, 12).reverse();
    if (!shown.length) return;
    const begin = Math.min(...shown.map((r) => r.start));
    const end = Math.max(...shown.map((r) => r.start + Math.max(r.total_time || 0, ...r.timeline.map((p) => p.end))));
    const span = Math.max(end - begin, 0.001);
    shown.forEach((r) => {
      const lane = document.createElement("div");
      lane.className = "lane";
      const label = document.createElement("div");
      label.className = "lane-label";
      label.textContent = r.client + " · " + r.source + " · " + r.prompt_tokens + "→" + r.output_tokens + " tok";
      const track = document.createElement("div");
      track.className = "lane-track";
      r.timeline.forEach((p) => {
        const seg = document.createElement("div");
        seg.className = "seg ph-" + p.phase;
        seg.style.left = ((100 * (r.start + p.start - begin)) / span).toFixed(3) + "%";
        seg.style.width = Math.max(0.2, (100 * (p.end - p.start)) / span).toFixed(3) + "%";
        seg.title = p.phase + ": " + ms(p.end - p.start) + (p.tokens ? " · " + p.tokens + " tokens" : "");
        track.append(seg);
      });
      lane.append(label, track);
      box.append(lane);
    });
    const axis = document.createElement("div");
    axis.className = "lane axis";
    const left = document.createElement("div");
    left.className = "lane-label muted";
    left.textContent = new Date(begin * 1000).toLocaleTimeString();
    const right = document.createElement("div");
    right.className = "lane-track axis-track muted";
    right.textContent = "span " + ms(span);
    axis.append(left, right);
    box.append(axis);
  }

  let loadingRequests = false;
  async function loadRequests() {
    if (loadingRequests) return;
    loadingRequests = true;
    try {
      const response = await fetch("/dashboard/requests/", { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (response.ok) {
        const body = await response.json();
        drawTable(body.requests);
        drawTimeline(body.requests);
      }
    } finally {
      loadingRequests = false;
    }
  }

  // --- the socket ------------------------------------------------------------------------------

  let delay = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/telemetry/");
    socket.addEventListener("open", () => { delay = 500; text("live-state", "live"); $("live-state").className = "live on"; });
    socket.addEventListener("message", (event) => {
      const frame = JSON.parse(event.data);
      if (frame.type === "snapshot") workers.set(frame.panels.worker || "worker", { panels: frame.panels, seen: Date.now() });
    });
    socket.addEventListener("close", (event) => {
      $("live-state").className = "live";
      if (event.code === 4401 || event.code === 4403) {
        text("live-state", "not allowed: log in as an administrator");
        return;
      }
      text("live-state", "disconnected; reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    });
  }

  drawTable(config.requests);
  drawTimeline(config.requests);
  connect();
  setInterval(sample, INTERVAL_MS);
  setInterval(loadRequests, 15000); // requests served by another worker, or missed changes
})();
