/* The chat page: one WebSocket to /ws/chat/, answers streamed token by token.
   Frames are documented in dashboard/consumers.py. An answer belongs to its conversation, not
   to this page: after a reload or a lost connection the page attaches to it again. */
(function () {
  "use strict";

  const data = JSON.parse(document.getElementById("chat-data").textContent);
  const F = window.ChatFigures;
  const $ = (id) => document.getElementById(id);
  const els = {
    messages: $("messages"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
    status: $("status"), model: $("model"), system: $("system-prompt"), title: $("chat-title"),
    list: $("conversation-list"), hint: $("empty-hint"), composer: $("composer"),
    counter: $("counter"), jump: $("jump"), rename: $("rename"), renameForm: $("rename-form"),
    renameInput: $("rename-input"), renameCancel: $("rename-cancel"),
    chat: $("chat"), attachTools: $("attach-tools"), attachInput: $("attach-input"),
    cameraInput: $("camera-input"), attachments: $("attachments"), dropHint: $("drop-hint"),
  };

  let conversationId = data.conversation ? data.conversation.id : null;
  let contextStart = data.context_start || null; // the first message the model still reads
  let socket = null;
  let reconnectDelay = 500;
  let streaming = null; // the assistant message view being written
  let awaiting = null; // {content, kind} of a sent frame the server has not confirmed yet
  let follow = true; // the view follows the stream until the reader scrolls up
  let views = []; // message views of the branch on show, in page order
  let statusFrame = null;
  let statusSince = 0;
  let statusTimer = null;
  let pending = []; // the composer's pictures: {name, state: "uploading" | "ready", id, url, width, height}

  // --- message views ---------------------------------------------------------------------------

  function button(text, className, onClick, title) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link " + className;
    b.textContent = text;
    if (title) b.title = title;
    b.addEventListener("click", onClick);
    return b;
  }

  function createView(message) {
    const root = document.createElement("article");
    root.className = "msg msg-" + message.role;
    root.dataset.id = message.id || "";
    const thinking = document.createElement("details");
    thinking.className = "thinking";
    thinking.hidden = true;
    const thinkingSummary = document.createElement("summary");
    const thinkingBody = document.createElement("div");
    thinkingBody.className = "thinking-body";
    thinking.append(thinkingSummary, thinkingBody);
    const body = document.createElement("div");
    body.className = "msg-body";
    const meta = document.createElement("div");
    meta.className = "msg-meta";
    const gallery = document.createElement("div");
    gallery.className = "msg-images";
    root.append(thinking, gallery, body, meta);
    message.thinking = message.thinking || "";
    message.images = message.images || [];
    const view = { root, body, meta, gallery, thinking, thinkingSummary, thinkingBody, message, renderQueued: false };
    renderGallery(view);
    renderBody(view);
    renderMeta(view);
    return view;
  }

  function renderThinking(view) {
    const { message } = view;
    view.thinking.hidden = !message.thinking;
    if (!message.thinking) return;
    view.thinkingBody.textContent = message.thinking; // the model's reasoning, as plain text
    const spent = (message.figures || {}).thinking_s;
    if (message.state === "streaming" && !message.content) {
      view.thinkingSummary.textContent = "Thinking…";
    } else {
      view.thinkingSummary.textContent = spent ? "Thought for " + Math.max(1, Math.round(spent)) + " s" : "Thoughts";
    }
  }

  // A question's pictures: thumbnails that open the picture whole (its owner's only).
  function renderGallery(view) {
    const shown = view.message.images;
    view.gallery.hidden = !shown.length;
    view.gallery.replaceChildren(...shown.map((image, i) => {
      const link = document.createElement("a");
      link.className = "msg-image";
      link.href = image.url;
      link.target = "_blank";
      link.rel = "noopener";
      link.append(thumbnail(image, "Image " + (i + 1) + " of " + shown.length));
      return link;
    }));
  }

  function thumbnail(image, alt) {
    const img = document.createElement("img");
    img.src = image.url;
    img.alt = alt;
    img.loading = "lazy";
    img.decoding = "async";
    if (image.width && image.height) { img.width = image.width; img.height = image.height; }
    return img;
  }

  function renderBody(view) {
    const { message } = view;
    renderThinking(view);
    if (message.role !== "assistant") {
      view.body.textContent = message.content; // the user's own words, shown as typed
      return;
    }
    const live = message.state === "streaming";
    // While it streams, what the pacer has let through (streamed below); then all of it.
    const shown = live && view.shown !== undefined ? message.content.slice(0, view.shown) : message.content;
    window.Markdown.renderInto(view.body, shown);
    view.body.querySelectorAll("pre").forEach((pre) => {
      const code = pre.querySelector("code");
      // Highlighting a growing block on every token would cost more than it shows.
      if (code && !live && window.hljs) window.hljs.highlightElement(code);
      pre.append(copyButton(() => (code || pre).textContent, "copy-code", "Copy code"));
    });
    if (live) {
      const caret = document.createElement("span");
      caret.className = "caret";
      caret.setAttribute("aria-hidden", "true");
      (view.body.lastElementChild || view.body).append(caret);
    }
  }

  function queueRender(view) {
    if (view.renderQueued) return;
    view.renderQueued = true;
    requestAnimationFrame(() => {
      view.renderQueued = false;
      renderBody(view);
      followStream();
    });
  }

  /* Streamed text reaches the reader through a pacer (chat_pacer.js): what arrived in a burst,
     or before a longer step, flows out over about the usual gap between tokens. `view.shown`
     counts the characters of the answer on show; undefined: all of them. */
  function streamed(view, text) {
    const now = performance.now();
    if (view.shown === undefined) {
      view.shown = view.message.content.length; // all that came before is on show already
      view.pacer = window.ChatPacer.create();
    }
    view.message.content += text;
    view.pacer.arrived(now, view.message.content.length - view.shown);
    if (!view.pacing) {
      view.pacing = true;
      requestAnimationFrame((t) => pace(view, t));
    }
  }

  function pace(view, t) {
    view.pacing = false;
    if (view.shown === undefined) return; // the answer ended or was replaced meanwhile
    const content = view.message.content;
    const count = view.pacer.reveal(t, content.length - view.shown);
    if (count > 0) {
      view.shown = Math.min(content.length, window.ChatPacer.cut(content, view.shown + count));
      renderBody(view);
      followStream();
    }
    if (view.shown < content.length) {
      view.pacing = true;
      requestAnimationFrame((next) => pace(view, next));
    }
  }

  function showAll(view) {
    view.shown = undefined; // from now on the whole text: a snapshot, the end, an error
    view.pacer = null;
  }

  // --- copy --------------------------------------------------------------------------------------

  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    // Plain http on the LAN is no secure context: the old way still works there.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    if (!ok) throw new Error("copy refused");
  }

  function copyButton(getText, className, label) {
    const b = button(label, "copy " + className, async () => {
      try {
        await copyText(getText());
        b.textContent = "Copied";
        b.dataset.copied = "true";
      } catch (err) {
        b.textContent = "Copy failed";
      }
      setTimeout(() => { b.textContent = label; delete b.dataset.copied; }, 1500);
    });
    return b;
  }

  // --- the line under a message ---------------------------------------------------------------

  function note(kind, text) {
    const p = document.createElement("p");
    p.className = "note note-" + kind;
    p.textContent = text;
    return p;
  }

  function chipsFor(view) {
    const chips = F.figureChips(view.message.figures);
    if (!chips.length) return null;
    const row = document.createElement("div");
    row.className = "chips figures";
    const explain = document.createElement("p");
    explain.className = "explain";
    explain.hidden = true;
    chips.forEach((c) => {
      const item = document.createElement("button");
      item.type = "button";
      item.className = "chip";
      item.setAttribute("aria-expanded", "false");
      const name = document.createElement("b");
      name.textContent = c.label;
      item.append(name, " " + c.value);
      item.addEventListener("click", () => {
        const open = item.getAttribute("aria-expanded") === "true";
        row.querySelectorAll(".chip").forEach((other) => other.setAttribute("aria-expanded", "false"));
        explain.hidden = open;
        if (!open) {
          item.setAttribute("aria-expanded", "true");
          explain.textContent = c.explain;
        }
      });
      row.append(item);
    });
    const box = document.createElement("div");
    box.className = "figures-box";
    box.append(row, explain);
    return box;
  }

  function versionsNav(view) {
    const ids = view.message.versions || [];
    const index = ids.indexOf(view.message.id);
    if (ids.length < 2 || index < 0) return null;
    const nav = document.createElement("span");
    nav.className = "versions";
    const label = document.createElement("span");
    label.textContent = index + 1 + "/" + ids.length;
    const prev = button("‹", "version-prev", () => switchTo(ids[index - 1]), "Previous version");
    const next = button("›", "version-next", () => switchTo(ids[index + 1]), "Next version");
    prev.disabled = index === 0 || !!streaming;
    next.disabled = index === ids.length - 1 || !!streaming;
    nav.append(prev, label, next);
    return nav;
  }

  function canContinue(message) {
    const f = message.figures || {};
    return !!message.content && (message.state === "stopped" || message.state === "failed" ||
      f.finish_reason === "length");
  }

  function renderMeta(view) {
    const { message, meta } = view;
    meta.replaceChildren();
    const actions = document.createElement("div");
    actions.className = "actions";
    const nav = versionsNav(view);
    if (message.role === "user") {
      if (nav) actions.append(nav);
      if (!streaming && message.id) actions.append(button("Edit", "edit", () => startEdit(view), "Edit and resend"));
      if (actions.childElementCount) meta.append(actions);
      return;
    }
    if (message.state === "streaming") return;
    if (message.state === "stopped") {
      meta.append(note("stopped", "Stopped (" + (message.error || "stopped") + "). The answer so far is kept."));
    } else if (message.state === "failed") {
      meta.append(note("failed", "Failed: " + (message.error || "the model could not answer") +
        (message.content ? " The answer so far is kept." : "")));
    } else if ((message.figures || {}).finish_reason === "length") {
      meta.append(note("length", "Cut off at the answer length limit."));
    }
    if (message.model) {
      const who = document.createElement("span");
      who.className = "model-name";
      who.textContent = message.model;
      meta.append(who);
    }
    const chips = chipsFor(view);
    if (chips) meta.append(chips);
    if (nav) actions.append(nav);
    if (message.content) actions.append(copyButton(() => message.content, "copy-answer", "Copy"));
    if (isLast(view) && !streaming) {
      if (canContinue(message)) actions.append(button("Continue", "continue", continueAnswer, "Let the model write on"));
      actions.append(button("↻ Regenerate", "regenerate", regenerate, "A new answer; this one stays as a version"));
    }
    if (actions.childElementCount) meta.append(actions);
  }

  function isLast(view) {
    return views[views.length - 1] === view;
  }

  function addView(message) {
    const view = createView(message);
    views.push(view);
    els.messages.append(view.root);
    els.hint.hidden = true;
    return view;
  }

  function refreshMeta() {
    views.forEach(renderMeta);
    placeLeftOut();
  }

  function showBranch(messages, start) {
    views.forEach((v) => v.root.remove());
    views = [];
    contextStart = start || null;
    messages.forEach((m) => addView(m));
    els.hint.hidden = views.length > 0;
    refreshMeta();
    updateCounter();
  }

  function truncateFrom(id) {
    const index = views.findIndex((v) => String(v.message.id) === String(id));
    if (index < 0) return;
    views.slice(index).forEach((v) => v.root.remove());
    views = views.slice(0, index);
  }

  // The marker above the first message the model still reads, when older ones were left out.
  function placeLeftOut() {
    const old = els.messages.querySelector(".left-out");
    if (old) old.remove();
    if (!contextStart) return;
    const first = views.find((v) => String(v.message.id) === String(contextStart));
    if (!first) return;
    const count = views.indexOf(first);
    const marker = document.createElement("p");
    marker.className = "left-out";
    marker.textContent = "The conversation outgrew the model's context: the " + count + " message" +
      (count === 1 ? "" : "s") + " above " + (count === 1 ? "is" : "are") +
      " no longer sent to the model (a system prompt still is).";
    els.messages.insertBefore(marker, first.root);
  }

  // --- following the stream ------------------------------------------------------------------

  function atBottom() {
    const m = els.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 48;
  }

  function scrollToEnd() {
    els.messages.scrollTop = els.messages.scrollHeight;
    follow = true;
    els.jump.hidden = true;
  }

  function followStream() {
    if (follow) scrollToEnd();
    else els.jump.hidden = false;
  }

  els.messages.addEventListener("scroll", () => {
    follow = atBottom();
    if (follow) els.jump.hidden = true;
  }, { passive: true });
  els.jump.addEventListener("click", scrollToEnd);

  // --- the status line and the composer ---------------------------------------------------------

  function setBusy(busy) {
    els.send.hidden = busy;
    els.stop.hidden = !busy;
    els.stop.disabled = false;
  }

  function setStatus(text, kind) {
    stopStatusClock();
    els.status.textContent = text || "";
    els.status.className = "status" + (kind ? " status-" + kind : "");
  }

  function stopStatusClock() {
    if (statusTimer) clearInterval(statusTimer);
    statusTimer = null;
  }

  // Waiting states tick in seconds, so a long load reads as progress, not as a hang.
  function showEngineStatus(frame) {
    const sameWait = statusFrame && frame && statusFrame.phase === frame.phase;
    statusFrame = frame;
    if (!sameWait) statusSince = Date.now();
    const draw = () => {
      let text;
      const waited = Math.round((Date.now() - statusSince) / 1000);
      if (!frame) {
        text = "Starting…" + (waited >= 2 ? " (the model may be loading) " + waited + " s" : "");
      } else {
        text = F.statusText(frame);
        if (frame.phase === "loading" || (frame.phase === "waiting" && frame.type === "phase") ||
          (frame.phase === "prefilling" && frame.type === "phase")) {
          if (waited >= 1) text += " (" + waited + " s)";
        }
      }
      els.status.textContent = text;
    };
    stopStatusClock();
    els.status.className = "status";
    draw();
    if (!frame || frame.phase !== "decoding") statusTimer = setInterval(draw, 1000);
  }

  function chosenContext() {
    return (data.contexts || {})[els.model.value] || null;
  }

  // Characters per token, from what this conversation's answers measured (3 when none did).
  function charsPerToken() {
    let chars = 0, tokens = 0;
    views.forEach((v) => {
      const t = (v.message.figures || {}).answer_tokens || (v.message.figures || {}).output_tokens;
      if (v.message.role === "assistant" && t) { chars += v.message.content.length; tokens += t; }
    });
    return tokens >= 32 ? Math.min(6, Math.max(1.5, chars / tokens)) : 3;
  }

  /* The composer's token counter. The appliance counts what a send would read now (the system
     prompt, the turns the window keeps, this message, through the model's template) with the
     model's own tokenizer, a moment after the typing stops: "412 / 8,192 tokens". It counts
     only on a model that is loaded (counting never loads one); until a count is in, and when
     there is none, the counter shows an estimate marked "≈": the last count plus the text
     typed since, or what earlier answers measured. */
  const COUNT_AFTER_MS = 400;
  let countSeq = 0; // numbers the asks: only the latest one's reply is shown
  let countAsked = null; // what the latest ask was for
  let counted = null; // the latest reply, with what it was for; tokens null: not counted
  let countTimer = null;

  function composerState() {
    return { conversation: conversationId, content: els.prompt.value,
      model: els.model.value || null, system: els.system.value };
  }

  function sameAsk(a, b, withContent) {
    return Boolean(a && b) && a.conversation === b.conversation && a.model === b.model &&
      a.system === b.system && (!withContent || a.content === b.content);
  }

  function askCount() {
    clearTimeout(countTimer);
    countTimer = setTimeout(() => {
      if (streaming || !socket || socket.readyState !== WebSocket.OPEN) return;
      const state = composerState();
      if (state.content.length > data.max_content_chars) return;
      countSeq += 1;
      countAsked = Object.assign({ seq: countSeq }, state);
      socket.send(JSON.stringify({ type: "count", seq: countSeq, conversation: state.conversation,
        content: state.content, model: state.model, system_prompt: state.system }));
    }, COUNT_AFTER_MS);
  }

  function onCount(frame) {
    if (!countAsked || frame.seq !== countAsked.seq) return; // an older ask's
    counted = Object.assign({}, countAsked, frame);
    drawCounter();
  }

  // The composer's pictures are not in a count (an image's tokens are the projector's to say):
  // each adds what the appliance reckons an image costs.
  function estimate(text) {
    const ratio = charsPerToken();
    const pictures = pending.length * (data.image_tokens || 0);
    if (counted && counted.tokens !== null && sameAsk(counted, composerState(), false)) {
      return Math.max(0, counted.tokens + Math.ceil((text.length - counted.content.length) / ratio)) + pictures;
    }
    let base = 0;
    let i = views.length - 1;
    for (; i >= 0; i--) {
      const f = views[i].message.figures || {};
      if (views[i].message.role === "assistant" && f.prompt_tokens) { base = f.prompt_tokens + (f.output_tokens || 0); break; }
    }
    if (i < 0) base = Math.ceil(((els.system.value || "").length) / ratio);
    views.slice(i + 1).forEach((v) => {
      base += Math.ceil(v.message.content.length / ratio) + 8 + v.message.images.length * (data.image_tokens || 0);
    });
    return base + (text ? Math.ceil(text.length / ratio) + 8 : 0) + pictures;
  }

  function updateCounter() {
    drawCounter();
    askCount();
  }

  function drawCounter() {
    const text = els.prompt.value;
    const limit = data.max_content_chars;
    els.counter.title = "";
    if (text.length > limit) {
      els.counter.textContent = "This message has " + F.number(text.length) + " characters; the most is " +
        F.number(limit) + ". Shorten it or send it in parts (nothing was cut).";
      els.counter.className = "counter counter-over";
      els.send.disabled = true;
      return;
    }
    els.send.disabled = false;
    const state = composerState();
    const thisText = counted && sameAsk(counted, state, true);
    const exact = thisText && counted.tokens !== null && !pending.length ? counted : null;
    const ctx = (exact && exact.context) || chosenContext();
    if (!ctx) { els.counter.textContent = ""; els.counter.className = "counter"; return; }
    const total = exact ? exact.tokens : estimate(text);
    let words = (exact ? "" : "≈ ") + F.number(total) + " / " + F.number(ctx) + " tokens";
    let kind = "";
    if (total >= ctx) {
      words += ": too long for the model's context; shorten it";
      kind = "over";
    } else if (exact && exact.left_out) {
      words += ": " + F.number(exact.left_out) + " earlier message" +
        (exact.left_out === 1 ? " is" : "s are") + " left out to make room";
      kind = "near";
    } else if (total > ctx * 0.75) {
      words += ": older turns will be left out to make room";
      kind = "near";
    }
    els.counter.textContent = words;
    els.counter.className = "counter" + (kind ? " counter-" + kind : "");
    els.counter.title = exact ? "counted by the model's tokenizer" :
      thisText ? "estimated: the model is not loaded, and counting never loads it" :
      "estimated until the model's tokenizer has counted it";
  }

  function showConversation(frame) {
    conversationId = frame.id;
    els.title.textContent = frame.title;
    els.rename.hidden = false;
    document.title = frame.title + " · Home-lab AI";
    const url = "/c/" + frame.id + "/";
    if (location.pathname !== url) history.replaceState(null, "", url);
    let link = els.list.querySelector('a[data-id="' + frame.id + '"]');
    if (!link) {
      const item = document.createElement("li");
      link = document.createElement("a");
      link.href = url;
      link.dataset.id = frame.id;
      link.textContent = frame.title;
      item.append(link);
      const empty = $("no-conversations");
      if (empty) empty.remove();
    }
    els.list.prepend(link.parentElement); // the most recent first, as on reload
    els.list.querySelectorAll("a").forEach((a) => a.removeAttribute("aria-current"));
    link.setAttribute("aria-current", "page");
  }

  // --- the socket ------------------------------------------------------------------------------

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/chat/");
    socket.addEventListener("open", () => {
      reconnectDelay = 500;
      if (!streaming) setStatus("");
      updateCounter(); // counting needs the socket
      // A reload (or a lost connection) mid-answer: pick the answer up where it is now.
      if (conversationId) sendFrame({ type: "attach", conversation: conversationId });
    });
    socket.addEventListener("message", (event) => handle(JSON.parse(event.data)));
    socket.addEventListener("close", (event) => {
      if (event.code === 4401) {
        setStatus("You are logged out. Reload the page to log in again.", "error");
        return;
      }
      if (event.code === 4429) return; // the "too many chats" error frame says why
      // The answer goes on on the server; the next socket attaches to it.
      awaiting = null;
      setStatus("Connection lost; reconnecting…", "error");
      setTimeout(connect, reconnectDelay);
      reconnectDelay = Math.min(reconnectDelay * 2, 10000);
    });
  }

  function sendFrame(frame) {
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      setStatus("Not connected yet; try again in a moment.", "error");
      return false;
    }
    socket.send(JSON.stringify(frame));
    return true;
  }

  function handle(frame) {
    switch (frame.type) {
      case "conversation": return onConversation(frame);
      case "snapshot": return onSnapshot(frame);
      case "phase":
      case "progress":
        if (streaming) showEngineStatus(frame);
        return;
      case "thinking":
        if (streaming) {
          streaming.message.thinking += frame.text;
          queueRender(streaming);
        }
        return;
      case "token":
        if (streaming) {
          if (statusFrame && statusFrame.phase !== "decoding") showEngineStatus({ type: "phase", phase: "decoding" });
          streamed(streaming, frame.text);
        }
        return;
      case "done": return onDone(frame);
      case "error": return onError(frame);
      case "attached": return onAttached(frame);
      case "branch":
        if (frame.id === conversationId) showBranch(frame.messages, frame.context_start);
        return;
      case "renamed": return onRenamed(frame);
      case "count": return onCount(frame);
    }
  }

  function onConversation(frame) {
    showConversation(frame);
    contextStart = frame.context_start || null;
    if (frame.truncate_from) truncateFrom(frame.truncate_from);
    const existing = views.find((v) => String(v.message.id) === String(frame.message_id));
    if (existing && (frame.kind === "continue" || frame.attached)) {
      streaming = existing; // writes on in place
    } else {
      if (frame.replaced_message_id) {
        // The old answer stays as a version; the new one takes its place on the page.
        const old = views.find((v) => String(v.message.id) === String(frame.replaced_message_id));
        if (old) { old.root.remove(); views = views.filter((v) => v !== old); }
      }
      if (awaiting !== null && frame.user_message_id) {
        const siblings = awaiting.versions || [];
        addView({ id: frame.user_message_id, role: "user", content: awaiting.content,
          images: awaiting.images || [],
          versions: siblings.length ? siblings.concat([frame.user_message_id]) : [] });
        if (awaiting.fromComposer) {
          els.prompt.value = "";
          pending = []; // sent: they are the question's now
          renderPending();
        }
      }
      const versions = frame.replaced_message_id ? versionIdsOf(frame.replaced_message_id).concat([frame.message_id]) : [];
      streaming = addView({ id: frame.message_id, role: "assistant", content: "", state: "streaming",
        figures: {}, model: frame.model, versions });
    }
    awaiting = null;
    streaming.message.state = "streaming";
    streaming.message.model = frame.model;
    renderBody(streaming);
    setBusy(true);
    refreshMeta();
    showEngineStatus(null);
    scrollToEnd();
    updateCounter();
  }

  let replacedVersions = {}; // message id -> its versions, remembered when its view goes
  function versionIdsOf(id) {
    return replacedVersions[id] || [id];
  }

  function onSnapshot(frame) {
    if (!streaming || String(streaming.message.id) !== String(frame.message_id)) return;
    showAll(streaming);
    streaming.message.content = frame.text;
    if (frame.thinking !== undefined) streaming.message.thinking = frame.thinking || "";
    renderBody(streaming);
    showEngineStatus(frame.status || null);
    scrollToEnd();
  }

  function onAttached(frame) {
    // Nothing runs (any more): show the conversation as it was saved.
    if (frame.id !== conversationId || !frame.messages) return;
    if (streaming) {
      streaming = null;
      statusFrame = null;
      setBusy(false);
      setStatus("");
    }
    showBranch(frame.messages, frame.context_start);
  }

  function finishStreaming() {
    const view = streaming;
    els.composer.dataset.turns = String(Number(els.composer.dataset.turns || 0) + 1); // for tests
    streaming = null;
    setBusy(false);
    statusFrame = null;
    if (view) renderBody(view);
    refreshMeta();
    followStream();
    updateCounter();
  }

  function applyFinal(frame, state) {
    showAll(streaming);
    const m = streaming.message;
    m.state = state;
    m.error = frame.error || frame.message || "";
    m.figures = frame.figures || {};
    if (typeof frame.text === "string") m.content = frame.text;
    if (typeof frame.thinking === "string") m.thinking = frame.thinking;
  }

  function onDone(frame) {
    if (!streaming || String(streaming.message.id) !== String(frame.message_id)) return;
    applyFinal(frame, frame.state);
    setStatus("");
    finishStreaming();
  }

  function onError(frame) {
    if (frame.message_id && streaming && String(streaming.message.id) === String(frame.message_id)) {
      applyFinal(frame, "failed");
      setStatus("");
      finishStreaming();
      return;
    }
    if (awaiting && awaiting.onRefused) awaiting.onRefused();
    awaiting = null;
    setStatus(frame.message, "error");
  }

  function onRenamed(frame) {
    if (frame.id !== conversationId) return;
    els.title.textContent = frame.title;
    document.title = frame.title + " · Home-lab AI";
    const link = els.list.querySelector('a[data-id="' + frame.id + '"]');
    if (link) link.textContent = frame.title;
  }

  // --- pictures ----------------------------------------------------------------------------------

  /* Attaching pictures, for a model that takes them: the file picker, the phone's camera, a paste
     or a drop. Each picture is uploaded at once on its own (POST /chat/images/, which answers its
     id), shown as a thumbnail with a remove button, and the send frame names the ids in the
     order they were attached. The bounds are checked here and again by the appliance. */
  const csrfToken = (els.composer.querySelector("input[name=csrfmiddlewaretoken]") || {}).value || "";

  function takesImages() {
    return (data.vision_models || []).includes(els.model.value);
  }

  function megabytes(bytes) {
    return (bytes / 1048576).toFixed(bytes < 10485760 ? 1 : 0) + " MB";
  }

  function errorText(body) {
    const error = body && body.error;
    return typeof error === "string" ? error : (error && error.message) || "";
  }

  // Why a file cannot be attached now, or "" when it can. The appliance reads the bytes to tell
  // a picture it takes (JPEG, PNG, GIF, BMP) from anything else; only what is plainly not one is
  // refused here.
  function refusalFor(file, count) {
    const name = file.name || "The pasted image";
    if (!takesImages()) return (els.model.value || "This model") + " does not take images.";
    if (file.type && !file.type.startsWith("image/")) return name + " is not a picture.";
    if (file.type === "image/webp") return name + ": WebP images are not supported; send JPEG, PNG, GIF or BMP.";
    if (file.size > data.max_image_bytes) {
      return name + " is " + megabytes(file.size) + "; an image may be at most " + megabytes(data.max_image_bytes) + ".";
    }
    if (count >= data.max_images) return "A message may have at most " + data.max_images + " images.";
    return "";
  }

  function attachFiles(files) {
    const refused = [];
    Array.from(files).forEach((file) => {
      const why = refusalFor(file, pending.length);
      if (why) refused.push(why);
      else upload(file);
    });
    setStatus(refused.join(" "), refused.length ? "error" : "");
  }

  async function upload(file) {
    const item = { name: file.name || "pasted image", state: "uploading" };
    pending.push(item);
    renderPending();
    try {
      const response = await fetch("/chat/images/", {
        method: "POST", body: file, credentials: "same-origin",
        headers: { "Content-Type": file.type || "application/octet-stream", "X-CSRFToken": csrfToken },
      });
      const body = await response.json().catch(() => null);
      if (!response.ok || !body || !body.image) {
        throw new Error(errorText(body) || "the upload failed (HTTP " + response.status + ")");
      }
      if (!pending.includes(item)) { discard(body.image.id); return; } // removed meanwhile
      Object.assign(item, body.image, { state: "ready" });
    } catch (err) {
      pending = pending.filter((p) => p !== item);
      setStatus(item.name + " was not attached: " + err.message, "error");
    }
    renderPending();
  }

  function discard(id) {
    fetch("/chat/images/" + id + "/", { method: "DELETE", credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken } }).catch(() => {}); // one never sent goes in a day anyway
  }

  function removePending(item) {
    pending = pending.filter((p) => p !== item);
    if (item.id) discard(item.id);
    renderPending();
  }

  // Thumbnails with a remove button each: the composer's attachments, or those an edit keeps.
  function thumbnails(items, onRemove) {
    return items.map((item, i) => {
      const box = document.createElement("div");
      box.className = "attachment" + (item.state === "uploading" ? " uploading" : "");
      if (item.url) box.append(thumbnail(item, "Attached image " + (i + 1)));
      else box.append(Object.assign(document.createElement("span"), { className: "attachment-wait", textContent: "Uploading…" }));
      const remove = button("×", "remove-image", () => onRemove(item), "Remove this image");
      remove.setAttribute("aria-label", "Remove image " + (i + 1));
      box.append(remove);
      return box;
    });
  }

  function renderPending() {
    els.attachTools.hidden = !takesImages();
    els.attachments.hidden = !pending.length;
    const list = thumbnails(pending, removePending);
    if (pending.length && !takesImages()) {
      list.push(note("images", (els.model.value || "This model") + " does not take images: remove them, or choose a model that does."));
    }
    els.attachments.replaceChildren(...list);
    drawCounter();
  }

  // What stops a send with these attachments now ("" when nothing does).
  function attachmentsBlock() {
    if (!pending.length) return "";
    if (!takesImages()) return (els.model.value || "This model") + " does not take images: remove them, or choose a model that does.";
    if (pending.some((p) => p.state !== "ready")) return "Wait a moment: the images are still uploading.";
    return "";
  }

  els.attachInput.addEventListener("change", () => { attachFiles(els.attachInput.files); els.attachInput.value = ""; });
  els.cameraInput.addEventListener("change", () => { attachFiles(els.cameraInput.files); els.cameraInput.value = ""; });
  els.prompt.addEventListener("paste", (event) => {
    const clip = event.clipboardData;
    const files = clip ? Array.from(clip.files).filter((f) => !f.type || f.type.startsWith("image/")) : [];
    if (!files.length) return;
    if (!clip.getData("text/plain")) event.preventDefault(); // a picture alone: nothing to type
    attachFiles(files);
  });

  function carriesFiles(event) {
    return event.dataTransfer && Array.from(event.dataTransfer.types || []).includes("Files");
  }
  let dragDepth = 0;
  els.chat.addEventListener("dragenter", (event) => {
    if (!carriesFiles(event)) return;
    dragDepth += 1;
    els.dropHint.textContent = takesImages() ? "Drop images to attach them" :
      (els.model.value || "This model") + " does not take images";
    els.dropHint.hidden = false;
  });
  els.chat.addEventListener("dragleave", () => {
    dragDepth = Math.max(0, dragDepth - 1);
    if (!dragDepth) els.dropHint.hidden = true;
  });
  els.chat.addEventListener("drop", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth = 0;
    els.dropHint.hidden = true;
    attachFiles(event.dataTransfer.files);
  });
  // A file dropped anywhere else must not make the browser leave the chat to show it.
  ["dragover", "drop"].forEach((type) => window.addEventListener(type, (event) => {
    if (carriesFiles(event)) event.preventDefault();
  }));

  // --- actions -------------------------------------------------------------------------------

  function idle() {
    return !streaming && awaiting === null;
  }

  function submit(event) {
    event.preventDefault();
    const content = els.prompt.value;
    if ((!content.trim() && !pending.length) || !idle() || content.length > data.max_content_chars) return;
    const blocked = attachmentsBlock();
    if (blocked) { setStatus(blocked, "error"); return; }
    const attached = pending.map((p) => ({ id: p.id, url: p.url, width: p.width, height: p.height }));
    const frame = {
      type: "send", conversation: conversationId, content: content,
      model: els.model.value || null, system_prompt: els.system.value,
    };
    if (attached.length) frame.images = attached.map((p) => p.id);
    if (sendFrame(frame)) {
      awaiting = { content: content, fromComposer: true, images: attached };
      follow = true;
      setStatus("Sending…");
    }
  }

  function startEdit(view) {
    if (!idle()) return;
    const editor = document.createElement("form");
    editor.className = "editor";
    const area = document.createElement("textarea");
    area.value = view.message.content;
    area.rows = Math.min(10, Math.max(2, view.message.content.split("\n").length));
    const save = document.createElement("button");
    save.type = "submit";
    save.className = "primary";
    save.textContent = "Send";
    const restore = () => { editor.remove(); view.body.hidden = false; view.gallery.hidden = !view.message.images.length; };
    const cancel = button("Cancel", "cancel-edit", () => { restore(); renderMeta(view); });
    // The question's pictures go with the edit unless removed here.
    let kept = view.message.images.slice();
    const keptBox = document.createElement("div");
    keptBox.className = "attachments editor-images";
    const drawKept = () => {
      keptBox.hidden = !kept.length;
      keptBox.replaceChildren(...thumbnails(kept, (item) => { kept = kept.filter((k) => k !== item); drawKept(); }));
    };
    drawKept();
    editor.append(keptBox, area, save, cancel);
    editor.addEventListener("submit", (event) => {
      event.preventDefault();
      const content = area.value;
      if ((!content.trim() && !kept.length) || !idle()) return;
      if (content.length > data.max_content_chars) { setStatus("That message is too long to send.", "error"); return; }
      const frame = { type: "edit", conversation: conversationId, message: view.message.id, content };
      if (view.message.images.length) frame.images = kept.map((k) => k.id);
      const sent = sendFrame(frame);
      if (sent) {
        const versions = (view.message.versions && view.message.versions.length) ? view.message.versions : [view.message.id];
        awaiting = { content, versions, images: kept, onRefused: restore };
        setStatus("Sending…");
      }
    });
    area.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); editor.requestSubmit(); }
      if (event.key === "Escape") cancel.click();
    });
    view.body.hidden = true;
    view.gallery.hidden = true;
    view.meta.replaceChildren();
    view.root.insertBefore(editor, view.meta);
    area.focus();
  }

  function regenerate() {
    if (!idle() || !conversationId) return;
    const last = views[views.length - 1];
    if (last && last.message.role === "assistant") {
      replacedVersions[last.message.id] = (last.message.versions && last.message.versions.length) ? last.message.versions : [last.message.id];
    }
    sendFrame({ type: "regenerate", conversation: conversationId });
  }

  function continueAnswer() {
    if (!idle() || !conversationId) return;
    sendFrame({ type: "continue", conversation: conversationId });
  }

  function switchTo(id) {
    if (!idle() || !conversationId || !id) return;
    sendFrame({ type: "switch", conversation: conversationId, message: id });
  }

  function stop() {
    if (!streaming) return;
    els.stop.disabled = true;
    sendFrame({ type: "stop" });
    setStatus("Stopping…");
  }

  function startRename() {
    els.renameInput.value = els.title.textContent;
    els.title.hidden = true;
    els.renameForm.hidden = false;
    els.renameInput.focus();
    els.renameInput.select();
  }

  function endRename() {
    els.title.hidden = false;
    els.renameForm.hidden = true;
  }

  els.rename.addEventListener("click", startRename);
  els.renameCancel.addEventListener("click", endRename);
  els.renameForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const title = els.renameInput.value.trim();
    if (title && conversationId) sendFrame({ type: "rename", conversation: conversationId, title });
    endRename();
  });
  els.renameInput.addEventListener("keydown", (event) => { if (event.key === "Escape") endRename(); });

  els.composer.addEventListener("submit", submit);
  els.stop.addEventListener("click", stop);
  els.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      els.composer.requestSubmit();
    }
  });
  els.prompt.addEventListener("input", updateCounter);
  els.system.addEventListener("input", updateCounter);
  els.model.addEventListener("change", () => { renderPending(); updateCounter(); });
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!confirm(form.dataset.confirm)) event.preventDefault();
    });
  });

  // On a phone the conversation list starts folded, leaving the screen to the chat.
  if (window.matchMedia("(max-width: 760px)").matches) document.querySelector(".conversations").open = false;

  showBranch(data.messages, data.context_start);
  renderPending();
  // An answer still being written when the page loaded: show it as such until attached.
  const last = views[views.length - 1];
  if (last && last.message.state === "streaming") {
    streaming = last;
    setBusy(true);
    showEngineStatus(null);
  }
  scrollToEnd();
  connect();
})();
