// The models page: live "ollama ps" table, loads under way, memory, job progress (polled from
// /models/status/), and uploads over XHR with a progress bar. Plain DOM, no framework; text
// from the server always goes in through textContent.
(function () {
  "use strict";

  var live = document.getElementById("live");
  if (!live) return;
  var statusUrl = live.dataset.statusUrl;
  var POLL_MS = 2000;

  function mib(n) {
    if (n === null || n === undefined) return "?";
    if (Math.abs(n) >= 1 << 30) return (n / (1 << 30)).toFixed(1) + " GiB";
    if (Math.abs(n) >= 1 << 20) return Math.round(n / (1 << 20)) + " MiB";
    return Math.round(n / 1024) + " KiB";
  }

  function countdown(seconds) {
    if (seconds === null || seconds === undefined) return "forever";
    var s = Math.max(0, Math.floor(seconds));
    if (s >= 3600) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    if (s >= 60) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return s + "s";
  }

  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function csrfToken() {
    var input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function renderLoaded(rows) {
    var body = document.getElementById("loaded-rows");
    body.replaceChildren();
    if (!rows.length) {
      var empty = document.createElement("tr");
      cell(empty, "Nothing is loaded; a model loads on its first request or with its Load button.", "muted").colSpan = 6;
      body.appendChild(empty);
    }
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      var link = document.createElement("a");
      link.href = encodeURIComponent(r.name) + "/";
      link.textContent = r.name;
      cell(tr, "").appendChild(link);
      cell(tr, mib(r.size_bytes), "num");
      cell(tr, r.busy ? "busy" : countdown(r.expires_in));
      cell(tr, r.busy ? "answering" : "idle");
      cell(tr, (r.load_seconds || 0).toFixed(1) + " s", "num");
      cell(tr, r.worker || "");
      body.appendChild(tr);
    });
    var names = {};
    rows.forEach(function (r) { names[r.name] = true; });
    document.querySelectorAll("#registry-table tr[data-model]").forEach(function (tr) {
      var target = tr.querySelector(".loaded-cell");
      target.replaceChildren();
      if (names[tr.dataset.model]) {
        var badge = document.createElement("span");
        badge.className = "badge on";
        badge.textContent = "loaded";
        target.appendChild(badge);
      }
    });
  }

  function renderMemory(m) {
    var line = document.getElementById("memory-line");
    if (!m) { line.textContent = "No inference worker is reporting."; return; }
    var text = "RAM: " + mib(m.ram_free) + " free of " + mib(m.ram_total);
    if (m.gpu_total) text += " · GPU: " + mib(m.gpu_free) + " free of " + mib(m.gpu_total);
    line.textContent = text + " · the inference worker holds " + mib(m.worker_bytes);
  }

  // The technical detail of a failure, folded under its plain sentence.
  function details(text) {
    var box = document.createElement("details");
    box.className = "detail";
    var summary = document.createElement("summary");
    summary.textContent = "details";
    var code = document.createElement("code");
    code.textContent = text;
    box.append(summary, code);
    return box;
  }

  // A plain POST form, as the server renders it: it works the same with or without this script.
  function jobButton(id, action, label, cls) {
    var form = document.createElement("form");
    form.method = "post";
    form.action = "jobs/" + id + "/" + action + "/";
    var token = document.createElement("input");
    token.type = "hidden";
    token.name = "csrfmiddlewaretoken";
    token.value = csrfToken();
    var button = document.createElement("button");
    button.type = "submit";
    button.className = cls;
    button.textContent = label;
    form.append(token, button);
    return form;
  }

  function renderJobs(jobs) {
    var body = document.getElementById("job-rows");
    var staff = body.dataset.staff === "1";
    // Rows are redrawn every poll: keep open the details someone opened.
    var open = {};
    body.querySelectorAll("tr[data-job] details[open]").forEach(function (d) {
      open[d.closest("tr").dataset.job] = true;
    });
    body.replaceChildren();
    jobs.forEach(function (j) {
      var tr = document.createElement("tr");
      cell(tr, String(j.id));
      cell(tr, j.kind);
      cell(tr, j.source.length > 80 ? j.source.slice(0, 79) + "…" : j.source, "small");
      cell(tr, j.state, "job-state");
      var bar = document.createElement("progress");
      bar.max = 1;
      bar.value = j.progress;
      cell(tr, "").appendChild(bar);
      var msg = cell(tr, j.message, "small job-message");
      if (j.state === "done" && j.model_url) {
        msg.appendChild(document.createTextNode(" · "));
        var link = document.createElement("a");
        link.href = j.model_url;
        link.textContent = j.model;
        msg.appendChild(link);
      }
      tr.dataset.job = String(j.id);
      if (j.detail) {
        var folded = details(j.detail);
        folded.open = !!open[j.id];
        msg.append(" ", folded);
      }
      var actions = cell(tr, "", "job-actions");
      if (staff) {
        if (j.can_cancel) actions.appendChild(jobButton(j.id, "cancel", "Cancel", "link danger"));
        if (j.can_retry) actions.appendChild(jobButton(j.id, "retry", "Retry", "link"));
        if (j.can_dismiss) actions.appendChild(jobButton(j.id, "dismiss", "Dismiss", "link"));
      }
      body.appendChild(tr);
    });
    if (!jobs.length) {
      var empty = document.createElement("tr");
      cell(empty, "No jobs yet.", "muted").colSpan = 7;
      body.appendChild(empty);
    }
  }

  function poll() {
    if (document.hidden) { setTimeout(poll, POLL_MS); return; }
    fetch(statusUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (s) {
        var note = document.getElementById("loading-note");
        note.hidden = !s.loading.length;
        document.getElementById("loading-names").textContent = s.loading.join(", ");
        renderLoaded(s.loaded);
        renderMemory(s.memory);
        renderJobs(s.jobs);
      })
      .catch(function () { /* the next poll tries again */ })
      .finally(function () { setTimeout(poll, POLL_MS); });
  }
  setTimeout(poll, POLL_MS);

  // Upload: XHR so the browser reports the bytes sent; the server streams them to disk.
  var form = document.getElementById("upload-form");
  if (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var bar = document.getElementById("upload-progress");
      var status = document.getElementById("upload-status");
      var button = form.querySelector("button[type=submit]");
      var xhr = new XMLHttpRequest();
      xhr.open("POST", form.action);
      xhr.setRequestHeader("Accept", "application/json");
      xhr.setRequestHeader("X-CSRFToken", csrfToken());
      xhr.upload.addEventListener("progress", function (e) {
        if (!e.lengthComputable) return;
        bar.value = e.loaded / e.total;
        status.textContent = "sent " + mib(e.loaded) + " of " + mib(e.total);
      });
      xhr.addEventListener("load", function () {
        var answer = {};
        try { answer = JSON.parse(xhr.responseText); } catch (e) { /* not JSON */ }
        if (xhr.status === 201 && answer.url) { window.location.href = answer.url; return; }
        status.replaceChildren("Refused: " + (answer.error || "HTTP " + xhr.status));
        if (answer.existing_url) {
          var existing = document.createElement("a");
          existing.href = answer.existing_url;
          existing.textContent = "open " + answer.existing;
          status.append(" · ", existing);
        }
        if (answer.detail) status.append(" ", details(answer.detail));
        button.disabled = false;
      });
      xhr.addEventListener("error", function () {
        status.textContent = "The upload failed (connection lost).";
        button.disabled = false;
      });
      button.disabled = true;
      bar.hidden = false;
      bar.value = 0;
      status.textContent = "uploading…";
      xhr.send(new FormData(form));
    });
  }
})();
