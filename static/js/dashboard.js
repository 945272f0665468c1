/* The live dashboard: panels from /ws/telemetry/ ({"type": "snapshot", "panels": {...}}, one
   message per inference worker per interval; see dashboard/web/panels.py), charts with uPlot,
   the engine's step composition, and the recent requests with their phase timelines.

   One window (30 s / 5 min / 1 h, remembered in localStorage) drives every tile and chart: the
   engine sends its throughput and percentiles per window with a 30-point chart for each, so a
   window is right from the first snapshot; queue, memory, KV and CPU are sampled here. */
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("dashboard-data").textContent);
  const $ = (id) => document.getElementById(id);
  const INTERVAL_MS = Math.max(250, config.interval_s * 1000);
  const HISTORY_S = 3600; // what this page keeps of its own samples: the longest window
  const STALE_MS = Math.max(5000, INTERVAL_MS * 10); // a worker silent this long is dropped
  const MiB = 1024 * 1024;
  const WINDOWS = { 30: "30 s", 300: "5 min", 3600: "1 h" };
  const WINDOW_KEY = "dashboard.window";

  const workers = new Map(); // worker name -> {panels, seen}
  let lastFinished = null;
  let windowS = Number(localStorage.getItem(WINDOW_KEY)) || 300;
  if (!WINDOWS[windowS]) windowS = 300;
  const openedAt = Date.now() / 1000;

  // --- formatting ------------------------------------------------------------------------------

  const none = (v) => v === null || v === undefined || Number.isNaN(v);
  const ms = (s) => (none(s) ? "–" : s < 1 ? Math.round(s * 1000) + " ms" : s < 100 ? s.toFixed(2) + " s" : Math.round(s) + " s");
  const tps = (v) => (none(v) ? "–" : v >= 100 ? String(Math.round(v)) : v.toFixed(1));
  const pct = (v) => (none(v) ? "–" : Math.round(v) + "%");
  const count = (n, one, many) => n + " " + (n === 1 ? one : many || one + "s");
  function bytes(n) {
    if (none(n)) return "–";
    if (n >= 1024 * MiB) return (n / (1024 * MiB)).toFixed(1) + " GiB";
    return Math.round(n / MiB) + " MiB";
  }
  function duration(s) {
    if (none(s)) return "–";
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }
  const text = (id, value) => { $(id).textContent = value; };
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  const hhmm = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  const msAxis = (v) => (v >= 1000 ? (v / 1000).toFixed(v >= 10000 ? 0 : 1) + " s" : Math.round(v) + " ms");

  // --- charts ------------------------------------------------------------------------------

  const COLORS = { prompt: "#2f6fde", output: "#d9480f", p50: "#2b8a3e", p95: "#e8a100", p99: "#c92a2a",
    queue: "#7048e8", active: "#0c8599", used: "#d9480f", own: "#2f6fde", total: "#868e96", kv: "#7048e8",
    cpu: "#2b8a3e", decode: "#d9480f", background: "#f2a77e", verify: "#0c8599", step: "#7048e8", target: "#c92a2a",
    image: "#9c36b5", encoding: "rgba(156, 54, 181, 0.55)", unbound: "rgba(134, 142, 150, 0.16)" };
  const AXIS = "#868e96";

  // A y axis as wide as its longest label, so "12.5 s" or "1,200" is never clipped.
  function axisSize(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    let size = axis.ticks.size + axis.gap + 6;
    const longest = (values || []).reduce((acc, v) => (String(v).length > acc.length ? String(v) : acc), "");
    if (longest) {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / devicePixelRatio;
    }
    return Math.ceil(size);
  }

  function makeChart(id, series, options) {
    const opts = options || {};
    const element = $(id);
    const data = [[], ...series.map(() => [])];
    const plot = new uPlot({
      width: Math.max(200, element.clientWidth),
      height: 170,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max((max || 0) * 1.1, opts.floor || 1)] } },
      axes: [
        { stroke: AXIS, grid: { stroke: "#8881" }, space: 60, values: (u, splits) => splits.map(windowS > 600 ? hhmm : clock) },
        { stroke: AXIS, grid: { stroke: "#8882" }, size: axisSize, values: opts.values },
      ],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: COLORS[s.key], width: 2, spanGaps: !opts.points,
        points: { show: !!opts.points, size: 5, fill: COLORS[s.key] },
        fill: s.fill ? COLORS[s.key] + "22" : undefined }))],
    }, data, element);
    return { plot, element, series };
  }

  const msValues = (u, splits) => splits.map(msAxis);
  const charts = {
    prompt: makeChart("c-prompt", [{ key: "prompt", label: "prompt tok/s", fill: true }]),
    output: makeChart("c-output", [{ key: "output", label: "output tok/s", fill: true }]),
    ttft: makeChart("c-ttft", [{ key: "p50", label: "p50" }, { key: "p95", label: "p95" }, { key: "p99", label: "p99" }],
      { values: msValues, points: true, floor: 10 }),
    itl: makeChart("c-itl", [{ key: "p50", label: "p50" }, { key: "p95", label: "p95" }, { key: "p99", label: "p99" }],
      { values: msValues, points: true, floor: 10 }),
    seq: makeChart("c-seq", [{ key: "queue", label: "queue depth" }, { key: "active", label: "active sequences" }]),
    mem: null, // made on the first reading, when it is known whether there is a GPU
    load: makeChart("c-load", [{ key: "kv", label: "KV cache fill" }, { key: "cpu", label: "CPU" }]),
  };

  // The page's own samples (gauges), kept for the longest window and shown for the chosen one.
  const history = { seq: [[], [], []], mem: null, load: [[], [], []] };

  function sampleInto(columns, time, values) {
    columns[0].push(time);
    values.forEach((v, i) => columns[i + 1].push(none(v) ? null : v));
    while (columns[0].length && columns[0][0] < time - HISTORY_S) columns.forEach((c) => c.shift());
  }

  function show(chart, data, now) {
    chart.plot.setData(data, false);
    chart.plot.setScale("x", { min: now - windowS, max: now });
  }

  // The engine's 30-point chart of a window: the last point is the slot filling now.
  function seriesData(series, keys, scale, now) {
    const n = (series[keys[0]] || []).length;
    const x = [];
    for (let i = 0; i < n; i++) x.push(now - (n - 1 - i) * series.step_s);
    return [x, ...keys.map((k) => (series[k] || []).map((v) => (none(v) ? null : v * scale)))];
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
      history.mem = [[], ...MEMORY_SERIES[kind].map(() => [])];
      memoryKind = kind;
    }
    return charts.mem;
  }

  // --- the step composition ----------------------------------------------------------------

  // A few steps are drawn as narrow bars on the right, not as slabs; fewer slots on a phone.
  const STEP_SLOTS_MIN = document.getElementById("c-steps").clientWidth < 500 ? 24 : 60;
  // background, interactive and paused: null from an engine without priorities; verify and
  // output: null from an engine without speculation; image and encoding: null from one that
  // reads no images; target_ms and predicted_ms: null from one whose step log has no budget.
  const NO_STEPS = { ago: [], decode: [], prompt: [], ms: [], seqs: [], background: null, interactive: null, paused: null,
    verify: null, output: null, image: null, encoding: null, target_ms: null, predicted_ms: null };
  let steps = { ...NO_STEPS, target: null, model: "" };

  const stepsElement = $("c-steps");
  const stepsPlot = new uPlot({
    width: Math.max(300, stepsElement.clientWidth),
    height: 260,
    legend: { show: false },
    cursor: { drag: { x: false, y: false }, y: false, points: { show: false } },
    scales: {
      x: { time: false, range: (u) => { const n = steps.ago.length; return [n - Math.max(n, STEP_SLOTS_MIN) - 0.5, n - 0.5]; } },
      tok: { distr: 4, asinh: 1, range: (u, min, max) => [0, Math.max((max || 0) * 1.3, 8)] },
      ms: { range: (u, min, max) => [0, Math.max((max || 0) * 1.15, (steps.target || 0) * 1.6, 1)] },
    },
    axes: [
      { stroke: AXIS, grid: { show: false }, space: 90, label: "when the step ended",
        values: (u, splits) => {
          // Steps are uneven in time: a label that repeats the one before it is left out.
          let previous = "";
          return splits.map((i) => {
            const a = steps.ago[Math.round(i)];
            const label = none(a) ? "" : "−" + a.toFixed(a < 10 ? 1 : 0) + " s";
            if (label === previous) return "";
            previous = label;
            return label;
          });
        } },
      { scale: "tok", stroke: AXIS, grid: { stroke: "#8882" }, size: axisSize, label: "tokens in the step",
        splits: (u) => [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000].filter((v) => v <= u.scales.tok.max) },
      { scale: "ms", side: 1, stroke: COLORS.step, grid: { show: false }, size: axisSize, label: "step time", values: msValues },
    ],
    series: [
      {},
      { label: "prompt tokens", scale: "tok", fill: COLORS.prompt, stroke: COLORS.prompt, width: 0,
        paths: uPlot.paths.bars({ size: [0.86, 28], gap: 0 }), points: { show: false } },
      // Over the prompt bar, up to the decode tokens and the step's image positions: what shows
      // of it is the prompt tokens that were an image's (fed from the encoder's embeddings).
      { label: "image tokens", scale: "tok", fill: COLORS.image, stroke: COLORS.image, width: 0,
        paths: uPlot.paths.bars({ size: [0.86, 28], gap: 0 }), points: { show: false } },
      // A step's decode tokens in the colour of drafted ones, the streams' own token over it: what
      // shows of the first is the drafted tokens verified (a part of the decode tokens).
      { label: "drafted tokens verified", scale: "tok", fill: COLORS.verify, stroke: COLORS.verify, width: 0,
        paths: uPlot.paths.bars({ size: [0.86, 28], gap: 0 }), points: { show: false } },
      { label: "decode tokens", scale: "tok", fill: COLORS.decode, stroke: COLORS.decode, width: 0,
        paths: uPlot.paths.bars({ size: [0.86, 28], gap: 0 }), points: { show: false } },
      { label: "background decode tokens", scale: "tok", fill: COLORS.background, stroke: COLORS.background, width: 0,
        paths: uPlot.paths.bars({ size: [0.86, 28], gap: 0 }), points: { show: false } },
      { label: "step time", scale: "ms", stroke: COLORS.step, width: 1.5, spanGaps: true,
        points: { show: (u) => steps.ago.length < 90, size: 4, fill: COLORS.step } },
    ],
    hooks: { setCursor: [(u) => stepReadout(u.cursor.idx)], drawAxes: [drawUnbound], draw: [drawTarget, drawEncoding] },
  }, [[], [], [], [], [], [], []], stepsElement);

  // Along the top of the plot: the steps that ended while the image encoder was busy. It runs
  // beside the steps (its own thread), so a picture being read shows as a band over them.
  function drawEncoding(u) {
    if (!steps.encoding) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.fillStyle = COLORS.encoding;
    steps.encoding.forEach((busy, i) => {
      if (!busy) return;
      const left = Math.max(u.bbox.left, u.valToPos(i - 0.5, "x", true));
      const right = Math.min(u.bbox.left + u.bbox.width, u.valToPos(i + 0.5, "x", true));
      if (right > left) ctx.fillRect(left, u.bbox.top, right - left, 5 * devicePixelRatio);
    });
    ctx.restore();
  }

  // Behind the bars: the steps that carried no interactive stream, where the ITL target did not
  // bind (background work alone runs at the machine's best batch size, not under the target).
  function drawUnbound(u) {
    if (!steps.interactive) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.fillStyle = COLORS.unbound;
    steps.interactive.forEach((bound, i) => {
      if (bound) return;
      const left = Math.max(u.bbox.left, u.valToPos(i - 0.5, "x", true));
      const right = Math.min(u.bbox.left + u.bbox.width, u.valToPos(i + 0.5, "x", true));
      if (right > left) ctx.fillRect(left, u.bbox.top, right - left, u.bbox.height);
    });
    ctx.restore();
  }

  // The ITL target across the whole plot, on the step-time axis: a step above it made every
  // writing stream wait longer than the target for its next token.
  function drawTarget(u) {
    if (!steps.target) return;
    const y = Math.round(u.valToPos(steps.target, "ms", true)) + 0.5;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = COLORS.target;
    ctx.lineWidth = 1.5 * devicePixelRatio;
    ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
    ctx.beginPath();
    ctx.moveTo(u.bbox.left, y);
    ctx.lineTo(u.bbox.left + u.bbox.width, y);
    ctx.stroke();
    ctx.restore();
  }

  function stepReadout(i) {
    const box = $("steps-readout");
    if (none(i) || i < 0 || i >= steps.ago.length) {
      box.textContent = "Hover a bar for its numbers.";
      return;
    }
    const d = steps.decode[i], p = steps.prompt[i], t = steps.ms[i];
    const background = steps.background ? steps.background[i] : 0;
    const verify = steps.verify ? steps.verify[i] : 0;
    const parts = [];
    if (d) parts.push(count(d, "decode token") + " (" + count(d - verify, "stream") + " writing" + (background ? ", " + background + " of them background" : "") +
      (verify ? "; " + count(verify, "drafted token") + " verified" : "") + ")");
    const image = steps.image ? steps.image[i] : 0;
    if (p) parts.push(count(p, "prompt token") + " of a prompt being read" + (image ? " (" + image + " of them an image's)" : ""));
    const out = steps.output ? " · " + count(steps.output[i], "token") + " out" : "";
    let target = steps.target ? (t <= steps.target ? ", within" : ", over") + " the " + Math.round(steps.target) + " ms ITL target" : "";
    if (steps.interactive && !steps.interactive[i]) target = "; no interactive stream, so the ITL target did not bind";
    // The engine's own record (panels.py BUDGET_STEP_COLUMNS): the target that bounded this step
    // (a background step's is the cost curve's knee) and what the scheduler predicted it would take.
    if (steps.target_ms) {
      const bound = steps.target_ms[i];
      target = bound ? " of a " + Math.round(bound) + " ms target (" + Math.round((100 * t) / bound) + " % used)" : "; no target bound it (a prompt read whole with nobody decoding)";
    }
    if (steps.predicted_ms && steps.predicted_ms[i]) target += ", " + msAxis(steps.predicted_ms[i]) + " predicted";
    const paused = steps.paused && steps.paused[i] ? " · " + count(steps.paused[i], "request") + " paused" : "";
    const encoding = steps.encoding && steps.encoding[i] ? " · the encoder was reading " + count(steps.encoding[i], "image") : "";
    box.textContent = "Step " + steps.ago[i].toFixed(2) + " s ago: " + (parts.join(" + ") || "no tokens") + out + " · ran " +
      msAxis(t) + target + " · " + count(steps.seqs[i], "sequence") + " in the batch" + paused + encoding + ".";
  }

  function drawSteps(all) {
    // The model whose engine stepped last (with several loaded, the busy one).
    let best = null;
    all.forEach((p) => Object.entries(p.models).forEach(([name, m]) => {
      const s = m.steps;
      if (!s || !s.ago.length) return;
      const last = s.ago[s.ago.length - 1];
      if (!best || last < best.last) best = { name, m, last };
    }));
    const targetMs = best && best.m.itl_target ? best.m.itl_target * 1000 : config.itl_target_ms;
    text("steps-target", Math.round(targetMs) + " ms");
    if (!best) {
      steps = { ...NO_STEPS, target: targetMs, model: "" };
      stepsPlot.setData([[], [], [], [], [], [], []]);
      legendFor(steps);
      text("steps-summary", "no engine step in the last minute: nothing is running");
      return;
    }
    const s = best.m.steps;
    steps = { ...s, target: targetMs, model: best.name };
    const n = s.ago.length;
    const x = s.ago.map((_, i) => i);
    const total = s.decode.map((d, i) => d + s.prompt[i] || null);
    const decode = s.decode.map((d) => d || null);
    const own = s.decode.map((d, i) => d - (s.verify ? s.verify[i] : 0) || null);
    const background = (s.background || []).map((b) => b || null);
    const image = s.decode.map((d, i) => (s.image && s.image[i] ? d + s.image[i] : null));
    stepsPlot.setData([x, total, image, decode, own, background, s.ms]);
    legendFor(s);
    const withPrompt = s.prompt.filter((p) => p > 0).length;
    const mixed = s.prompt.filter((p, i) => p > 0 && s.decode[i] > 0).length;
    // The target counts only where it bound: a step of background work alone was not held to it.
    const bound = s.interactive ? s.ms.map((t, i) => s.interactive[i] ? t : null).filter((t) => t !== null) : s.ms;
    const within = bound.filter((t) => t <= targetMs).length;
    const span = s.ago[0] - s.ago[n - 1];
    const models = all.reduce((acc, p) => acc + Object.keys(p.models).length, 0);
    let targetPart = Math.round((100 * within) / Math.max(1, bound.length)) + "% within the target";
    if (!bound.length) targetPart = "no interactive stream in any of them: the target did not bind";
    else if (bound.length < n) targetPart += " (of the " + count(bound.length, "step") + " it bound; " + (n - bound.length) + " without an interactive stream)";
    const use = best.m.step_budget;
    if (use) {
      // Each step's own target: the ITL target where a person read it, a background step's knee where not.
      targetPart += " · the steps used " + Math.round(100 * use.used_p50) + " % of their own target (median; " + Math.round(100 * use.used_p90) + " % at p90)" +
        (!use.error_p90 ? "" : use.error_p90 > 1 ? ", 9 in 10 ran at most " + Math.round(100 * (use.error_p90 - 1)) + " % over their prediction"
          : ", 9 in 10 ran within their prediction");
    }
    const pausedMost = s.paused ? Math.max(0, ...s.paused) : 0;
    const drafting = s.verify ? s.verify.filter((v) => v > 0).length : 0;
    const imaging = s.image ? s.image.filter((v) => v > 0).length : 0;
    const encoding = s.encoding ? s.encoding.filter((v) => v > 0).length : 0;
    text("steps-summary", (models > 1 ? best.name + " · " : "") + "last " + count(n, "step") + " over " + duration(span) +
      " · " + withPrompt + " carried prompt tokens (" + mixed + " beside a stream) · " + targetPart +
      (pausedMost ? " · up to " + count(pausedMost, "request") + " paused" : "") +
      (drafting ? " · " + drafting + " verified drafted tokens" : "") +
      (imaging ? " · " + imaging + " fed image tokens" : "") + (encoding ? " · " + encoding + " ended while the encoder read images" : ""));
  }

  // The legend names background tokens and unbound steps only when the engine reports them.
  function legendFor(s) {
    $("legend-background").hidden = !s.background;
    $("legend-verify").hidden = !s.verify;
    $("legend-image").hidden = !s.image;
    $("legend-encoding").hidden = !s.encoding;
    $("legend-unbound").hidden = !s.interactive;
    $("note-unbound").hidden = !s.interactive;
  }

  window.addEventListener("resize", () => {
    Object.values(charts).filter(Boolean).forEach((c) => c.plot.setSize({ width: Math.max(200, c.element.clientWidth), height: 170 }));
    stepsPlot.setSize({ width: Math.max(300, stepsElement.clientWidth), height: 260 });
  });

  // --- aggregating the workers --------------------------------------------------------------

  const PCTS = ["p50", "p95", "p99", "max"];

  function worstOf(list) {
    const out = { count: 0 };
    PCTS.forEach((k) => {
      const values = list.map((d) => d && d[k]).filter((v) => !none(v));
      out[k] = values.length ? Math.max(...values) : null;
    });
    out.count = list.reduce((acc, d) => acc + ((d && d.count) || 0), 0);
    return out;
  }

  // One window over several workers: throughput added, each percentile its worst.
  function combineWindows(list) {
    if (list.length === 1) return list[0];
    const series = { step_s: Math.max(0, ...list.map((w) => w.series.step_s)) };
    Object.keys(list[0].series).filter((k) => k !== "step_s").forEach((key) => {
      series[key] = list[0].series[key].map((_, i) => {
        const values = list.map((w) => w.series[key][i]).filter((v) => !none(v));
        if (key.endsWith("_tps")) return values.reduce((a, b) => a + b, 0);
        return values.length ? Math.max(...values) : null;
      });
    });
    return {
      prompt_tps: list.reduce((a, w) => a + w.prompt_tps, 0), output_tps: list.reduce((a, w) => a + w.output_tps, 0),
      ended: list.reduce((a, w) => a + w.ended, 0), ttft: worstOf(list.map((w) => w.ttft)), itl: worstOf(list.map((w) => w.itl)),
      series,
    };
  }

  function aggregate() {
    const now = Date.now();
    for (const [name, entry] of workers) if (now - entry.seen > STALE_MS) workers.delete(name);
    const all = [...workers.values()].map((e) => e.panels);
    const sum = (get) => all.reduce((acc, p) => acc + (get(p) || 0), 0);
    const cpu = all.map((p) => p.cpu_percent).filter((v) => !none(v));
    const models = all.flatMap((p) => Object.values(p.models));
    const windows = all.map((p) => p.windows && p.windows[String(windowS)]).filter(Boolean);
    return {
      count: all.length,
      panels: all,
      now: { prompt_tps: sum((p) => p.now && p.now.prompt_tps), output_tps: sum((p) => p.now && p.now.output_tps) },
      window: windows.length ? combineWindows(windows) : null,
      queue_depth: sum((p) => p.queue_depth),
      active_sequences: sum((p) => p.active_sequences),
      prefilling: models.reduce((acc, m) => acc + m.prefilling, 0),
      decoding: models.reduce((acc, m) => acc + m.decoding, 0),
      finished: sum((p) => p.finished),
      kv_fill: all.length ? Math.max(...all.map((p) => p.kv_fill || 0)) : 0,
      cpu: cpu.length ? cpu.reduce((a, b) => a + b, 0) / cpu.length : null,
      streams: all.flatMap((p) => p.streams || []),
      shares: combineShares(all),
      apps: Object.assign({}, ...all.map((p) => p.apps || {})),
      window_s: Math.max(0, ...models.map((m) => m.window_s || 0)) || 10,
      step_yield: combineYields(models),
      speculation: combineSpeculation(models),
      vision: combineVision(models),
    };
  }

  // Tokens per step per writing stream over every model's recent steps (panels.py step_yield);
  // null when no engine says what its steps sampled.
  function combineYields(models) {
    const yields = models.map((m) => m.step_yield).filter(Boolean);
    if (!yields.length) return null;
    return { stream_steps: yields.reduce((acc, y) => acc + y.stream_steps, 0), tokens: yields.reduce((acc, y) => acc + y.tokens, 0) };
  }

  // Every image-reading model's encoder (panels.py VisionPanel), added up; null when none reads
  // images.
  function combineVision(models) {
    const readings = models.map((m) => m.vision).filter(Boolean);
    if (!readings.length) return null;
    const add = (key) => readings.reduce((acc, v) => acc + v[key], 0);
    return { images_encoded: add("images_encoded"), images_cached: add("images_cached"), encoding: add("encoding"),
      encode_s: add("encode_s"), failed: add("failed"), requests: add("requests") };
  }

  // Every model's speculation since its load, added up, with the modes they run in; null when
  // no engine reports speculation.
  function combineSpeculation(models) {
    const readings = models.map((m) => m.speculation).filter(Boolean);
    if (!readings.length) return null;
    return { modes: [...new Set(readings.map((r) => r.mode))].sort(),
      drafted: readings.reduce((acc, r) => acc + r.drafted, 0), accepted: readings.reduce((acc, r) => acc + r.accepted, 0) };
  }

  // Every worker's shares added up per share and priority; null when no engine reports them
  // (an engine from before fair share): the page then shows no table for them.
  function combineShares(all) {
    const reported = all.map((p) => p.shares).filter((list) => Array.isArray(list));
    if (!reported.length) return null;
    const merged = new Map();
    reported.flat().forEach((row) => {
      const key = JSON.stringify([row.share, row.priority]);
      const into = merged.get(key);
      if (!into) { merged.set(key, { ...row }); return; }
      ["running", "waiting", "paused", "tokens_recent"].forEach((k) => { into[k] += row[k]; });
    });
    return [...merged.values()];
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

  // --- the machine: which llama.cpp, each card's load, each runner's GPU memory ---------------

  // panels.machine (dashboard/web/panels.py machine_panel): NVML's figures of each card and, per
  // runner, its GPU memory as NVML counts it beside what llama.cpp says it allocated there. A box
  // without a GPU says so instead of showing zeros; a figure a card does not report says so.
  const BUILD = { gpu: "llama.cpp built for a GPU (layers offloaded)", cpu: "llama.cpp built for the CPU only" };

  function drawMachine(all) {
    const box = $("machine");
    box.replaceChildren();
    all.forEach((p) => {
      const m = p.machine;
      if (!m) return;
      const who = all.length > 1 ? p.worker + " · " : "";
      const build = m.build ? BUILD[m.build] : "llama.cpp's build: known once a model is loaded";
      const line = document.createElement("p");
      line.textContent = who + (m.gpu ? build : "no GPU · " + build);
      box.append(line);
      m.cards.forEach((c) => {
        const figures = [
          none(c.utilization) ? "load not reported" : pct(c.utilization) + " busy",
          none(c.temperature_c) ? "temperature not reported" : Math.round(c.temperature_c) + " °C",
          none(c.power_w) ? "power not reported"
            : Math.round(c.power_w) + " W" + (none(c.power_limit_w) ? "" : " of " + Math.round(c.power_limit_w) + " W"),
        ];
        const row = document.createElement("p");
        row.textContent = who + "GPU " + c.index + " · " + c.name + ": " + figures.join(" · ");
        box.append(row);
      });
      if (m.runners.length) box.append(gpuTable(m.runners, who));
    });
  }

  function gpuTable(runners, who) {
    const reported = (v) => (none(v) ? "not reported" : bytes(v));
    const head = document.createElement("tr");
    ["runner", "GPU memory (NVML)", "weights", "KV cache", "compute", "layers on the GPU"].forEach((label, i) => {
      const th = document.createElement("th");
      th.textContent = label;
      if (i) th.className = "num";
      head.append(th);
    });
    const body = document.createElement("tbody");
    runners.forEach((r) => {
      const row = document.createElement("tr");
      cell(row, who + r.model + (r.pid !== null ? " · pid " + r.pid : ""));
      cell(row, reported(r.nvml_bytes), "num");
      cell(row, reported(r.weights_bytes), "num");
      cell(row, reported(r.kv_bytes), "num");
      cell(row, reported(r.compute_bytes), "num");
      cell(row, none(r.gpu_layers) ? "–" : r.gpu_layers + " of " + r.layers, "num");
      body.append(row);
    });
    const thead = document.createElement("thead");
    thead.append(head);
    const table = document.createElement("table");
    table.className = "requests";
    table.append(thead, body);
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    wrap.append(table);
    return wrap;
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

  // --- the boxes: one card per inference worker ------------------------------------------------

  // panels.box (dashboard/web/boxes.py): the worker's host, models by the registry's names
  // (loaded first), its load, free memory and runners.
  // A loaded model's image encoder (panels.py VisionPanel): "images 3 encoded · 2 from the
  // cache · 550 ms encoding · encoder busy"; "" for a model that reads no images.
  function visionLine(v) {
    if (!v) return "";
    return "images " + v.images_encoded + " encoded · " + v.images_cached + " from the cache · " + ms(v.encode_s) +
      " encoding · " + (v.encoding ? "encoder busy (" + count(v.encoding, "image") + ")" : "encoder idle") +
      (v.failed ? " · " + v.failed + " unreadable" : "");
  }

  function boxCard(box, runnersFaulty, modelPanels) {
    const card = document.createElement("article");
    card.className = "box";
    card.setAttribute("aria-label", "box " + box.worker);
    const head = document.createElement("div");
    head.className = "box-head";
    const title = document.createElement("h3");
    title.textContent = box.worker;
    const host = document.createElement("span");
    host.className = "muted";
    host.textContent = box.host ? "on " + box.host : "";
    const state = document.createElement("span");
    state.className = "box-state" + (runnersFaulty ? " bad" : box.state.startsWith("loading") ? " busy" : "");
    state.textContent = box.state;
    head.append(title, host, state);

    const figures = document.createElement("p");
    figures.className = "box-figures";
    const figure = (label, value) => {
      const span = document.createElement("span");
      const b = document.createElement("b");
      b.textContent = value;
      span.append(b, " " + label);
      figures.append(span);
    };
    figure("answering", String(box.running));
    figure("waiting", String(box.queue_depth));
    const loaded = box.models.filter((m) => m.loaded);
    const free = loaded.reduce((acc, m) => acc + (m.slots_free || 0), 0);
    const total = loaded.reduce((acc, m) => acc + (m.slots_total || 0), 0);
    if (total) figure("slots free", free + " / " + total);
    figure("RAM free", bytes(box.ram_free_bytes));
    if (!none(box.vram_free_bytes)) figure("VRAM free", bytes(box.vram_free_bytes));

    const list = document.createElement("ul");
    list.className = "box-models";
    if (!box.models.length) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "no model file on this box";
      list.append(li);
    }
    const runners = new Map((box.runners || []).map((r) => [r.model, r.state]));
    [...loaded, ...box.models.filter((m) => !m.loaded)].forEach((m) => {
      const li = document.createElement("li");
      if (m.loaded) li.className = "is-loaded";
      const name = document.createElement("span");
      name.className = "model-name";
      name.textContent = m.name;
      if (m.sha256) name.title = "sha256 " + m.sha256;
      const where = document.createElement("span");
      where.className = "model-where";
      const runner = runners.get(m.name);
      let encoder = null; // the model's image encoder, a line of its own under the name
      if (m.loaded) {
        const parts = ["loaded"];
        if (m.n_ctx) parts.push(m.n_ctx + " ctx");
        if (m.slots_total) parts.push(m.slots_free + "/" + m.slots_total + " slots free");
        where.textContent = parts.join(" · ");
        // In split mode a loaded model's name is its aliases, joined ("a, b"); the engine's is one.
        const engine = m.name.split(", ").map((n) => modelPanels && modelPanels[n]).find(Boolean);
        const vision = visionLine(engine && engine.vision);
        if (vision) {
          encoder = document.createElement("span");
          encoder.className = "model-vision";
          encoder.title = "the image encoder since the model loaded: pictures it encoded, pictures its cache already had, the time reading them took, and whether it is reading one now";
          encoder.textContent = vision;
        }
      } else {
        where.textContent = runner && FAULTY.has(runner) ? "runner " + runner : "on disk";
      }
      li.append(name, where);
      if (encoder) li.append(encoder);
      list.append(li);
    });
    card.append(head, figures, list);
    return card;
  }

  function drawBoxes(all) {
    const box = $("boxes");
    box.replaceChildren();
    const boxes = all.map((p) => p.box).filter(Boolean);
    const models = new Map(all.filter((p) => p.box).map((p) => [p.box.worker, p.models]));
    if (!boxes.length) {
      const p = document.createElement("p");
      p.className = "muted";
      p.textContent = all.length ? "the boxes are not known yet" : "no inference worker reporting";
      box.append(p);
      text("boxes-summary", config.mode === "split" ? "no inference worker reporting" : "one box: this one");
      return;
    }
    boxes.sort((a, b) => a.worker.localeCompare(b.worker)).forEach((b) =>
      box.append(boxCard(b, (b.runners || []).some((r) => r.state === "backing off" || r.state === "failed"), models.get(b.worker))));
    const loadedOn = boxes.filter((b) => b.models.some((m) => m.loaded)).length;
    text("boxes-summary", config.mode === "split"
      ? count(boxes.length, "inference worker") + " · " + loadedOn + " with a model loaded"
      : "one box: this one");
  }

  // --- kept prompts: each model's warm memory -------------------------------------------------

  // panels.py PromptCachePanel, per worker and model: each tier against its bound, where the
  // admissions found their cached tokens, the time it saved. A model without tiers says so.
  const TIER_NAMES = { resident: "resident", ram: "RAM", disk: "disk", miss: "none" };
  const rate = (v) => (none(v) ? "–" : v >= 1e9 ? (v / 1e9).toFixed(1) + " GB/s" : Math.round(v / 1e6) + " MB/s");

  function tierBar(label, tier) {
    const over = tier.bytes > tier.bound;
    const row = bar(label, [{ cls: over ? "kept-over" : "kept-fill", value: tier.bytes, title: label + " tier" }], tier.bound,
      bytes(tier.bytes) + " of " + bytes(tier.bound) + " · " + count(tier.entries, "prompt"));
    if (over) row.classList.add("over-bound");
    return row;
  }

  function keptTable(kept) {
    const table = document.createElement("table");
    table.className = "requests kept-table";
    const head = document.createElement("tr");
    [["found in", ""], ...Object.values(TIER_NAMES).map((name) => [name, "num"])].forEach(([label, cls]) => {
      const th = document.createElement("th");
      th.className = cls;
      th.textContent = label;
      head.append(th);
    });
    const requests = document.createElement("tr");
    cell(requests, "requests");
    Object.keys(TIER_NAMES).forEach((tier) => { cell(requests, String(kept.admitted[tier]), "num"); });
    const tokens = document.createElement("tr");
    cell(tokens, "tokens").title = "cached tokens reused: prompt tokens not read again";
    Object.keys(TIER_NAMES).forEach((tier) => { cell(tokens, tier === "miss" ? "–" : kept.tokens[tier].toLocaleString("en"), "num"); });
    const thead = document.createElement("thead");
    thead.append(head);
    const tbody = document.createElement("tbody");
    tbody.append(requests, tokens);
    table.append(thead, tbody);
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    wrap.append(table);
    return wrap;
  }

  function keptCard(title, kept) {
    const card = document.createElement("article");
    card.className = "kept-model";
    card.setAttribute("aria-label", "kept prompts of " + title);
    const head = document.createElement("div");
    head.className = "box-head";
    const name = document.createElement("h3");
    name.textContent = title;
    const state = document.createElement("span");
    state.className = "box-state" + (kept.enabled ? "" : " off");
    state.textContent = kept.enabled ? (kept.disk ? "RAM and disk" : "RAM only") : "no warm memory";
    head.append(name, state);
    card.append(head);

    const admitted = Object.values(kept.admitted).reduce((a, b) => a + b, 0);
    const hits = admitted - kept.admitted.miss;
    const fromTiers = kept.admitted.ram + kept.admitted.disk;
    const figures = document.createElement("p");
    figures.className = "box-figures kept-figures";
    const figure = (label, value, title) => {
      const span = document.createElement("span");
      const b = document.createElement("b");
      b.textContent = value;
      span.append(b, " " + label);
      if (title) span.title = title;
      figures.append(span);
    };
    figure("of " + count(admitted, "request") + " found cached tokens", admitted ? pct((100 * hits) / admitted) : "–",
      "requests admitted since the model loaded whose prompt began with tokens the box had read");
    if (kept.enabled) {
      figure("from RAM or disk", admitted ? pct((100 * fromTiers) / admitted) : "–", "of those requests, the ones restored from a tier");
      figure("prompt time saved", ms(kept.saved_s), "what reading the restored tokens again would have taken, less the restores");
    }
    card.append(figures);

    if (!kept.enabled) {
      const note = document.createElement("p");
      note.className = "muted small";
      note.textContent = "No warm memory: finished turns stay only in their sequence slots, and a prompt is read again once its slot is needed (PROMPT_CACHE_RAM=0, or the runner cannot save a sequence).";
      card.append(note, keptTable(kept));
      return card;
    }
    const bars = document.createElement("div");
    bars.className = "memory-bars kept-bars";
    bars.append(tierBar("RAM", kept.ram));
    if (kept.disk) bars.append(tierBar("disk", kept.disk));
    else {
      const ramOnly = document.createElement("p");
      ramOnly.className = "muted small";
      ramOnly.textContent = "No disk tier: prompts are kept in RAM only (PROMPT_CACHE_DISK=0, or its directory could not be used).";
      bars.append(ramOnly);
    }
    card.append(bars, keptTable(kept));

    const rates = document.createElement("p");
    rates.className = "muted small";
    // A rate is the engine's measurement once it has restored from that tier; before, it is
    // the engine's prior (a guess low for any machine), which is not worth showing as a reading.
    const restored = kept.admitted.ram + kept.admitted.disk;
    const rateWords = restored ? " · restore rate " + rate(kept.restore_bytes_per_s) + " from RAM" +
      (kept.disk && kept.admitted.disk ? ", " + rate(kept.disk_bytes_per_s) + " from disk" : "") : "";
    rates.textContent = (restored ? "Restoring took " + ms(kept.restore_s) + rateWords : "Nothing restored yet") +
      " · saved " + kept.saved + ", spilled to disk " + kept.spilled + ", dropped " + kept.dropped +
      (kept.spill_failed ? ", failed to spill " + kept.spill_failed : "") + (kept.unreadable ? ", unreadable " + kept.unreadable : "");
    card.append(rates);
    return card;
  }

  function drawKept(all) {
    const box = $("kept");
    box.replaceChildren();
    const several = all.length > 1;
    const rows = all.flatMap((p) => Object.entries(p.models).filter(([, m]) => m.prompt_cache)
      .map(([name, m]) => ({ title: (several ? p.worker + " · " : "") + name, kept: m.prompt_cache })));
    if (!rows.length) {
      const p = document.createElement("p");
      p.className = "muted";
      p.textContent = all.length ? "No model loaded: a model's kept prompts show here when it loads (those on disk wait for it)." : "no inference worker reporting";
      box.append(p);
      text("kept-summary", "warm memory: what the box has read, kept past its sequence slot");
      return;
    }
    rows.sort((a, b) => a.title.localeCompare(b.title)).forEach((r) => box.append(keptCard(r.title, r.kept)));
    const ram = rows.reduce((acc, r) => acc + (r.kept.ram ? r.kept.ram.bytes : 0), 0);
    const disk = rows.reduce((acc, r) => acc + (r.kept.disk ? r.kept.disk.bytes : 0), 0);
    const saved = rows.reduce((acc, r) => acc + r.kept.saved_s, 0);
    text("kept-summary", rows.some((r) => r.kept.enabled) ? bytes(ram) + " in RAM · " + bytes(disk) + " on disk · " + ms(saved) + " of prompt reading saved since load"
      : "no warm memory on this box");
  }

  // --- the streams answering now -----------------------------------------------------------

  // A share's name: the consumer sends the names of the ids it saw (panels.apps); an id it
  // could not name reads as it is, a request that names nobody as "–".
  const appName = (share, apps) => (share === null || share === undefined ? "–" : apps[share] || share);

  function priorityCell(row, priority) {
    const td = cell(row, "");
    const badge = document.createElement("span");
    badge.className = "prio prio-" + priority;
    badge.textContent = priority;
    td.append(badge);
    return td;
  }

  function drawStreams(streams, several, apps) {
    const body = $("streams");
    body.replaceChildren();
    if (!streams.length) {
      const row = document.createElement("tr");
      cell(row, "Nothing is running.", "muted").colSpan = 9;
      body.append(row);
      return;
    }
    streams.forEach((s) => {
      const row = document.createElement("tr");
      if (s.paused) row.className = "paused";
      cell(row, (several ? s.model + " · " : "") + s.id);
      cell(row, appName(s.share, apps), "app");
      priorityCell(row, s.priority);
      const doing = s.phase === "decoding" ? "writing" : "reading the prompt";
      cell(row, s.paused ? "paused while " + doing : doing, s.paused ? "state-paused" : "");
      cell(row, s.computed + " / " + s.prompt_tokens + (s.cached_tokens ? " (" + s.cached_tokens + " cached)" : ""), "num");
      cell(row, s.output_tokens + (s.max_tokens ? " / " + s.max_tokens : ""), "num");
      const live = cell(row, s.phase === "decoding" ? tps(s.tps) : "–", "num live-tps");
      // A paused stream waits by design: its silence is not a stall.
      if (s.phase === "decoding" && !s.paused && !none(s.last_token_ago) && s.last_token_ago > 1) live.classList.add("stalled");
      cell(row, s.phase === "decoding" ? ms(s.last_token_ago) + " ago" : "–", "num");
      cell(row, duration(s.age), "num");
      body.append(row);
    });
  }

  // --- apps and people: each share at each priority ---------------------------------------------

  function drawShares(shares, apps, windowSeconds) {
    const card = $("shares-card");
    card.hidden = shares === null;
    if (shares === null) return;
    text("shares-tokens-head", "tokens, last " + duration(windowSeconds));
    const body = $("shares");
    body.replaceChildren();
    const total = shares.reduce((acc, r) => acc + r.tokens_recent, 0);
    const order = { interactive: 0, background: 1 };
    const rows = shares.map((r) => ({ ...r, name: r.share === null ? "no app or person named" : appName(r.share, apps) }))
      .sort((a, b) => a.name.localeCompare(b.name) || order[a.priority] - order[b.priority]);
    if (!rows.length) {
      const row = document.createElement("tr");
      cell(row, "No app or person has been served in the last " + duration(windowSeconds) + ".", "muted").colSpan = 7;
      body.append(row);
    }
    rows.forEach((r) => {
      const row = document.createElement("tr");
      cell(row, r.name, r.share === null ? "app muted" : "app").title = r.share || "";
      priorityCell(row, r.priority);
      const part = total ? r.tokens_recent / total : 0;
      const td = cell(row, "", "share-col");
      const track = document.createElement("span");
      track.className = "share-track";
      const fill = document.createElement("span");
      fill.className = "share-fill prio-fill-" + r.priority;
      fill.style.width = (100 * part).toFixed(1) + "%";
      track.append(fill);
      const value = document.createElement("span");
      value.className = "share-value";
      value.textContent = total ? Math.round(100 * part) + "%" : "–";
      td.append(track, value);
      cell(row, String(r.running), "num");
      cell(row, String(r.waiting), "num");
      cell(row, String(r.paused), "num" + (r.paused ? " state-paused" : ""));
      cell(row, String(r.tokens_recent), "num");
      body.append(row);
    });
    const running = rows.reduce((acc, r) => acc + r.running, 0);
    const waiting = rows.reduce((acc, r) => acc + r.waiting, 0);
    const paused = rows.reduce((acc, r) => acc + r.paused, 0);
    text("shares-summary", "per app key or person, and per priority · " + running + " running · " + waiting +
      " waiting · " + paused + " paused · " + total + " tokens served in the last " + duration(windowSeconds));
  }

  // --- tiles ---------------------------------------------------------------------------------

  function percentiles(id, dist) {
    const box = $(id);
    box.replaceChildren();
    ["p50", "p95", "p99"].forEach((k) => {
      const item = document.createElement("span");
      item.className = "pct pct-" + k;
      const label = document.createElement("b");
      label.textContent = k;
      const value = document.createElement("span");
      value.textContent = dist ? ms(dist[k]) : "–";
      item.append(label, value);
      box.append(item);
    });
  }

  function drawTiles(a) {
    const w = a.window;
    const label = WINDOWS[windowS];
    text("t-prompt-tps", tps(a.now.prompt_tps));
    text("t-output-tps", tps(a.now.output_tps));
    text("t-prompt-tail", "tok/s now\n" + (w ? tps(w.prompt_tps) : "–") + " avg over " + label);
    text("t-output-tail", "tok/s now\n" + (w ? tps(w.output_tps) : "–") + " avg over " + label);
    const ttft = w && w.ttft.count ? w.ttft : null;
    const itl = w && w.itl.count ? w.itl : null;
    percentiles("t-ttft", ttft);
    percentiles("t-itl", itl);
    text("t-ttft-tail", ttft ? count(ttft.count, "first token") + " in the last " + label + " · max " + ms(ttft.max)
      : "no first token in the last " + label);
    text("t-itl-tail", itl ? count(itl.count, "gap") + " between tokens in the last " + label + " · max " + ms(itl.max)
      : "no tokens written in the last " + label);
    drawDecodeSteps(a.step_yield, a.speculation);
    $("t-prompt-images").hidden = !a.vision;
    if (a.vision) text("t-prompt-images", "images " + a.vision.images_encoded + " encoded · " + a.vision.images_cached + " cached · " +
      (a.vision.encoding ? "encoder busy" : "encoder idle"));
    text("t-queue", String(a.queue_depth));
    text("t-active", String(a.active_sequences));
    text("t-active-tail", a.active_sequences ? a.prefilling + " reading · " + a.decoding + " writing" : "active now");
    text("t-kv", pct(a.kv_fill * 100));
    text("t-cpu", pct(a.cpu));
    const cores = a.panels.map((p) => p.cpu_count).filter(Boolean);
    text("t-cpu-tail", cores.length ? "busy now, " + cores[0] + " cores" : "busy now");
  }

  // The generation tile's last lines: tokens per step (1 without speculation) and what
  // speculation kept of what it drafted.
  function drawDecodeSteps(yields, speculation) {
    $("t-output-steps").hidden = !yields;
    if (yields) {
      text("t-output-steps", (yields.stream_steps ? (yields.tokens / yields.stream_steps).toFixed(2) : "–") + " tokens/step");
    }
    $("t-output-spec").hidden = !speculation;
    if (!speculation) return;
    // Short: the tile is narrow; its title says the rest.
    let kept = " · none drafted yet";
    if (speculation.drafted) kept = " · " + speculation.accepted + "/" + speculation.drafted + " drafts kept";
    else if (speculation.modes.every((mode) => mode === "off")) kept = "";
    text("t-output-spec", "speculation " + speculation.modes.join("/") + kept);
  }

  function resetTiles() {
    // No worker reports: nothing runs that this page can see, so "now" reads 0, not the last value.
    drawTiles({ now: { prompt_tps: 0, output_tps: 0 }, window: null, queue_depth: 0, active_sequences: 0,
      prefilling: 0, decoding: 0, kv_fill: 0, cpu: null, panels: [] });
    drawStreams([], false, {});
    drawShares(null, {}, 10);
    drawSteps([]);
    drawKept([]);
  }

  function sample() {
    const a = aggregate();
    const now = Date.now() / 1000;
    if (!a.count) {
      text("workers", "no worker reporting");
      text("loaded", "no model loaded");
      drawBoxes([]);
      resetTiles();
      return;
    }
    const totals = memoryTotals(a.panels);
    drawTiles(a);
    text("workers", a.panels.map((p) => (p.mode === "embedded" ? "runners supervised by the web process" : "worker " + p.worker)).join(", "));
    const loaded = a.panels.flatMap((p) => p.loaded.map((m) => m.name + (m.busy ? " · answering" : "")));
    const loading = a.panels.map((p) => p.loading).filter(Boolean);
    text("loaded", (loaded.length ? "loaded: " + loaded.join(", ") : "no model loaded") +
      (loading.length ? " · loading " + loading.join(", ") + "…" : ""));
    drawBoxes(a.panels);
    drawMemory(a.panels, totals);
    drawMachine(a.panels);
    drawRunners();
    drawStreams(a.streams, a.panels.reduce((acc, p) => acc + Object.keys(p.models).length, 0) > 1, a.apps);
    drawShares(a.shares, a.apps, a.window_s);
    drawSteps(a.panels);
    drawKept(a.panels);

    // The page's own samples, then every chart drawn over the chosen window.
    sampleInto(history.seq, now, [a.queue_depth, a.active_sequences]);
    const memory = [totals.used / MiB, totals.own / MiB];
    if (totals.kind === "gpu") memory.push(totals.total / MiB);
    const memChart = memoryChart(totals.kind);
    sampleInto(history.mem, now, memory);
    sampleInto(history.load, now, [a.kv_fill * 100, a.cpu]);
    show(charts.seq, history.seq, now);
    show(memChart, history.mem, now);
    show(charts.load, history.load, now);
    if (a.window) {
      const s = a.window.series;
      show(charts.prompt, seriesData(s, ["prompt_tps"], 1, now), now);
      show(charts.output, seriesData(s, ["output_tps"], 1, now), now);
      show(charts.ttft, seriesData(s, ["ttft_p50", "ttft_p95", "ttft_p99"], 1000, now), now);
      show(charts.itl, seriesData(s, ["itl_p50", "itl_p95", "itl_p99"], 1000, now), now);
    }
    const since = now - openedAt;
    text("charts-note", "Throughput and latency: from the engine, one point per " + duration(a.window ? a.window.series.step_s : windowS / 30) +
      " over the last " + WINDOWS[windowS] + ". Queue, memory, KV and CPU: sampled by this page" +
      (since < windowS ? ", open for " + duration(since) + " of the window." : "."));

    if (lastFinished !== null && a.finished !== lastFinished) loadRequests();
    lastFinished = a.finished;
  }

  // --- recent requests and their timeline ------------------------------------------------------

  let requests = config.requests;

  function cell(row, value, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = value;
    row.append(td);
    return td;
  }

  // What happened to a request, in words ("stop" and "cancelled" are the engine's words).
  function outcome(r) {
    if (r.outcome === "stop") return "finished";
    if (r.outcome === "length") return "hit the length limit";
    if (r.outcome === "cancelled") {
      if (r.error && /disconnect/.test(r.error)) return "stopped: the client left";
      return r.source === "chat" ? "stopped by the user" : "stopped by the client";
    }
    if (r.outcome === "error") return "failed: " + (r.error || "unknown error");
    return r.outcome;
  }

  // Why the router sent a request to its box (inference/serving/routing.py's reasons).
  const ROUTES = {
    conversation: "its conversation's box: the KV of the earlier turns is there",
    loaded: "the model was loaded there, and that box was the least busy",
    "second copy": "every loaded copy was full, so this box loaded another",
    "can load": "the box had the file and room to load it",
    "by path": "the model's digest was not known yet: any box with its path",
    "shared queue": "no box had announced itself: the first one free took it",
  };
  const ROUTE_WORDS = { conversation: "conversation", loaded: "least busy", "second copy": "second copy",
    "can load": "had room", "by path": "by path", "shared queue": "first free" };

  // The box that answered and, briefly, why: "inference@nas · conversation"; "–" embedded.
  function boxOf(r) {
    if (!r.worker) return "–";
    return r.worker + (r.route ? " · " + (ROUTE_WORDS[r.route] || r.route) : "");
  }

  function drawTable(list) {
    const body = $("requests");
    body.replaceChildren();
    if (!list.length) {
      const row = document.createElement("tr");
      const td = cell(row, "No requests yet. Send a chat message or call the API.", "muted");
      td.colSpan = config.mode === "split" ? 14 : 13;
      body.append(row);
      return;
    }
    list.forEach((r) => {
      const row = document.createElement("tr");
      row.className = "outcome-" + r.outcome;
      cell(row, new Date(r.start * 1000).toLocaleTimeString());
      cell(row, r.model);
      cell(row, r.source);
      cell(row, r.client);
      if (config.mode === "split") { // embedded: one box, nothing to say
        const box = cell(row, boxOf(r), "box-col");
        if (r.route) box.title = ROUTES[r.route] || r.route;
      }
      const out = cell(row, outcome(r), "outcome");
      if (r.error) out.title = r.error;
      cell(row, r.prompt_tokens + (r.cached_tokens ? " · " + r.cached_tokens + " cached" : ""), "num");
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

  const endOf = (r) => r.start + Math.max(r.total_time || 0, ...r.timeline.map((p) => p.end));

  // A row of the timeline in words: "1819-token prompt, read in 6 chunks while 1 stream kept
  // writing; answered 512 tokens". The streams are the other shown requests whose decode
  // overlapped this one's prefill chunks.
  function explain(r, all) {
    const chunks = r.timeline.filter((p) => p.phase === "prefill");
    const writers = all.filter((o) => o !== r && o.timeline.some((d) => d.phase === "decode" &&
      chunks.some((c) => o.start + d.start < r.start + c.end && r.start + c.start < o.start + d.end))).length;
    const computed = r.prompt_tokens - (r.cached_tokens || 0);
    let read = r.prompt_tokens + "-token prompt";
    if (r.cached_tokens) read += " (" + r.cached_tokens + " of them cached, " + computed + " computed)";
    if (chunks.length) read += ", read in " + count(chunks.length, "chunk") + (writers ? " while " + count(writers, "stream") + " kept writing" : "");
    const load = r.timeline.find((p) => p.phase === "load");
    const encode = r.timeline.find((p) => p.phase === "encode");
    if (encode) read += " (" + (encode.tokens || r.image_tokens || 0) + " of them image tokens)";
    const lines = [
      (load ? "waited " + ms(load.end - load.start) + " for the model to load; " : "") +
        (encode ? "read its images in " + ms(encode.end - encode.start) + "; " : "") + read +
        "; answered " + count(r.output_tokens, "token") + " (" + outcome(r) + ").",
      (encode ? "encode " + ms(r.encode_time) + " · " : "") + "queue " + ms(r.queue_time) + " · first token after " + ms(r.ttft) + " · prompt " + tps(r.prompt_tps) +
        " tok/s · writing " + tps(r.decode_tps) + " tok/s · total " + ms(r.total_time),
      r.client + " · " + r.source + " · " + r.model + (r.worker ? " · answered by " + r.worker +
        (r.route ? " (" + (ROUTES[r.route] || r.route) + ")" : "") : "") + " · " + new Date(r.start * 1000).toLocaleTimeString(),
    ];
    return lines;
  }

  function niceStep(span, maxTicks) {
    const raw = span / Math.max(1, maxTicks);
    const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
    return steps.find((s) => s >= raw) || 3600;
  }

  const tip = $("timeline-tip");
  function showTip(lines, x, y) {
    tip.replaceChildren(...lines.map((line, i) => {
      const p = document.createElement("p");
      p.textContent = line;
      if (i) p.className = "muted";
      return p;
    }));
    tip.hidden = false;
    tip.style.left = Math.max(4, Math.min(x + 12, window.innerWidth - tip.offsetWidth - 8)) + "px";
    tip.style.top = (y + 16 + tip.offsetHeight > window.innerHeight ? y - tip.offsetHeight - 10 : y + 16) + "px";
  }

  function drawTimeline(list) {
    // The window's requests on one wall-clock axis, newest on top like the table, so a prefill
    // that overlapped someone's decode shows as bars in the same moment.
    const box = $("timeline");
    box.replaceChildren();
    tip.hidden = true;
    const now = Date.now() / 1000;
    const withPhases = list.filter((r) => r.timeline.length);
    const shown = withPhases.filter((r) => endOf(r) >= now - windowS).slice(0, 12);
    if (!shown.length) {
      text("timeline-note", withPhases.length ? "No request in the last " + WINDOWS[windowS] +
        "; the latest started " + ago(now - withPhases[0].start) + ". Choose a longer window to see it." : "");
      return;
    }
    const begin = Math.max(now - windowS, Math.min(...shown.map((r) => r.start)));
    const end = Math.max(...shown.map(endOf));
    const span = Math.max(end - begin, 0.001);
    const at = (t) => (100 * (t - begin)) / span;
    text("timeline-note", count(shown.length, "request") + " in the last " + WINDOWS[windowS] + " (at most 12) · " +
      duration(span) + " from the first start to the last end · hover or tap a row to read it");
    shown.forEach((r) => {
      const lane = document.createElement("div");
      lane.className = "lane outcome-" + r.outcome;
      const label = document.createElement("div");
      label.className = "lane-label";
      const who = document.createElement("span");
      who.textContent = r.client + " · " + r.source;
      const size = document.createElement("span");
      size.className = "muted";
      size.textContent = " · " + r.prompt_tokens + " in → " + r.output_tokens + " out";
      label.append(who, size);
      const track = document.createElement("div");
      track.className = "lane-track";
      r.timeline.forEach((p) => {
        const left = Math.max(0, at(r.start + p.start));
        const right = Math.min(100, at(r.start + p.end));
        if (right < 0 || left > 100) return;
        const seg = document.createElement("div");
        seg.className = "seg ph-" + p.phase;
        seg.style.left = left.toFixed(3) + "%";
        seg.style.width = Math.max(0.25, right - left).toFixed(3) + "%";
        track.append(seg);
      });
      const lines = explain(r, shown);
      lane.addEventListener("mousemove", (e) => showTip(lines, e.clientX, e.clientY));
      lane.addEventListener("mouseleave", () => { tip.hidden = true; });
      lane.addEventListener("click", (e) => showTip(lines, e.clientX, e.clientY)); // touch screens
      lane.setAttribute("aria-label", lines.join(" "));
      lane.tabIndex = 0;
      lane.append(label, track);
      box.append(lane);
    });
    // Time ticks under the lanes: clock times at round intervals.
    const axis = document.createElement("div");
    axis.className = "lane axis";
    const left = document.createElement("div");
    left.className = "lane-label muted";
    const ticks = document.createElement("div");
    ticks.className = "lane-track axis-track";
    const step = niceStep(span, Math.max(2, Math.floor(ticks.clientWidth || box.clientWidth * 0.7) / 110));
    // Whole seconds: clock times at round moments; shorter: seconds after the first start.
    const relative = step < 1;
    left.textContent = relative ? "from " + clock(begin) : "span " + duration(span);
    const first = relative ? begin : Math.ceil(begin / step) * step;
    for (let k = 0, t = first; t <= end + 1e-9 && k < 40; k++, t = first + k * step) {
      const tick = document.createElement("span");
      tick.className = "tick";
      tick.style.left = at(t).toFixed(3) + "%";
      tick.textContent = relative ? "+" + (t - begin).toFixed(1) + " s" : clock(t);
      ticks.append(tick);
    }
    axis.append(left, ticks);
    box.append(axis);
  }

  let loadingRequests = false;
  async function loadRequests() {
    if (loadingRequests) return;
    loadingRequests = true;
    try {
      const response = await fetch("/dashboard/requests/", { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (response.ok) {
        requests = (await response.json()).requests;
        drawTable(requests);
        drawTimeline(requests);
      }
    } finally {
      loadingRequests = false;
    }
  }

  // --- the window picker ---------------------------------------------------------------------

  function pickWindow(seconds) {
    windowS = seconds;
    localStorage.setItem(WINDOW_KEY, String(seconds));
    document.querySelectorAll(".window-picker button").forEach((b) =>
      b.setAttribute("aria-pressed", String(Number(b.dataset.window) === seconds)));
    sample();
    drawTimeline(requests);
  }
  document.querySelectorAll(".window-picker button").forEach((b) =>
    b.addEventListener("click", () => pickWindow(Number(b.dataset.window))));

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

  pickWindow(windowS);
  drawTable(requests);
  connect();
  setInterval(sample, INTERVAL_MS);
  setInterval(() => drawTimeline(requests), 5000); // the window slides on
  setInterval(loadRequests, 15000); // requests served by another worker, or missed changes
})();
