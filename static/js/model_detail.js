// A model's page: its sha256 while it is hashed, its loaded state, its runner process and loads
// under way, polled; the Load button says "loading…" while the server loads (the page reloads
// when it is done). The badge and the load-state line come from the same row of the same poll
// (worded by the server, dashboard/model_pages/views.py loaded_view), so they never disagree; when
// the model is loaded or unloaded elsewhere, the page is drawn again unless the settings form
// is being edited.
(function () {
  "use strict";

  var badge = document.getElementById("loaded-badge");
  if (!badge) return;
  var POLL_MS = 1500;
  var wasLoaded = badge.classList.contains("on");
  var editing = false;
  var settings = document.getElementById("settings-form");
  if (settings) settings.addEventListener("input", function () { editing = true; });
  // A form on its way (Load, Save and reload) must not be cut short by a redraw.
  document.addEventListener("submit", function () { editing = true; });

  function getJSON(url) {
    return fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); });
  }

  // The runner rows come worded by the server (dashboard/model_pages/views.py runner_view), the
  // same words the page was rendered with; this only places them, as text.
  function runnerTable(runner, many) {
    var table = document.createElement("table");
    var body = document.createElement("tbody");
    function line(label, value, cls) {
      var tr = document.createElement("tr");
      var th = document.createElement("th");
      th.textContent = label;
      var td = document.createElement("td");
      td.textContent = value;
      if (cls) td.className = cls;
      tr.append(th, td);
      body.append(tr);
    }
    line("State" + (many ? " on " + runner.worker : ""), runner.summary, runner.usable ? "" : "refusal");
    line("Restarts", String(runner.restarts));
    line("Last exit", runner.last_exit || "none");
    if (runner.wait) line("Back-off", runner.wait);
    table.append(body);
    return table;
  }

  function drawRunners(rows) {
    var box = document.getElementById("runners");
    if (!box) return;
    box.replaceChildren();
    if (!rows.length) {
      var empty = document.createElement("p");
      empty.className = "muted";
      empty.textContent = "No runner process yet: one starts when the model loads.";
      box.append(empty);
      return;
    }
    rows.forEach(function (runner) {
      box.append(runnerTable(runner, rows.length > 1));
      if (runner.note) {
        var note = document.createElement("p");
        note.className = "small";
        note.textContent = runner.note;
        box.append(note);
      }
    });
  }

  function pollStatus() {
    if (document.hidden) { setTimeout(pollStatus, POLL_MS); return; }
    getJSON(badge.dataset.statusUrl)
      .then(function (s) {
        var mine = s.loaded.filter(function (r) { return r.name === badge.dataset.name; })[0];
        badge.textContent = mine ? (mine.busy ? "loaded · answering" : "loaded") : "not loaded";
        badge.classList.toggle("on", !!mine);
        var line = document.getElementById("load-state");
        if (line) line.textContent = mine ? mine.summary : line.dataset.idle;
        if (!!mine !== wasLoaded && !editing) { window.location.reload(); return; }
        drawRunners((s.runners || {})[badge.dataset.name] || []);
        var note = document.getElementById("loading-note");
        note.hidden = !s.loading.length;
        document.getElementById("loading-names").textContent = s.loading.join(", ");
      })
      .catch(function () { /* try again at the next poll */ })
      .finally(function () { setTimeout(pollStatus, POLL_MS); });
  }
  setTimeout(pollStatus, POLL_MS);

  var hashing = document.getElementById("hash-progress");
  function pollHash() {
    getJSON(hashing.dataset.jobUrl)
      .then(function (job) {
        hashing.querySelector("progress").value = job.progress;
        hashing.querySelector(".job-message").textContent = job.message;
        if (job.state === "done" && job.sha256) {
          var code = document.createElement("code");
          code.textContent = job.sha256;
          document.getElementById("sha256").replaceChildren(code);
          return;
        }
        if (job.state === "failed" || job.state === "cancelled") return;
        setTimeout(pollHash, 1000);
      })
      .catch(function () { setTimeout(pollHash, 3000); });
  }
  if (hashing) pollHash();

  // The boxes (split mode): each copy's progress, polled while one runs; when a copy ends or
  // the boxes change, the page is drawn again (the server words every row).
  var boxes = document.getElementById("boxes");
  function pollBoxes() {
    var rows = boxes.querySelectorAll("[data-worker]");
    var running = [].some.call(rows, function (r) { return r.dataset.state === "queued" || r.dataset.state === "copying"; });
    if (!running) return; // nothing moves until a copy starts (its form reloads the page)
    getJSON(boxes.dataset.url)
      .then(function (answer) {
        var seen = [].map.call(rows, function (r) { return r.dataset.worker; }).join(",");
        var now = answer.boxes.map(function (b) { return b.worker; }).join(",");
        if (seen !== now) { if (!editing) window.location.reload(); return; }
        answer.boxes.forEach(function (box, i) {
          var row = rows[i];
          if (!box.copy) return;
          if (box.copy.finished && row.dataset.state !== box.copy.state && !editing) { window.location.reload(); return; }
          var bar = row.querySelector("progress");
          if (bar) bar.value = box.copy.fraction;
          var message = row.querySelector(".copy-message");
          if (message) message.textContent = box.copy.message;
        });
      })
      .catch(function () { /* try again at the next poll */ })
      .finally(function () { setTimeout(pollBoxes, 1000); });
  }
  if (boxes) pollBoxes();

  var loadForm = document.querySelector(".load-form");
  if (loadForm) {
    loadForm.addEventListener("submit", function () {
      document.querySelectorAll("#model-actions button").forEach(function (b) { b.disabled = true; });
      var note = document.getElementById("loading-note");
      note.hidden = false;
      document.getElementById("loading-names").textContent = badge.dataset.name;
    });
  }
})();
