/* The chat page: one WebSocket to /ws/chat/, answers streamed token by token.
   Frames are documented in dashboard/consumers.py. */
(function () {
  "use strict";

  const data = JSON.parse(document.getElementById("chat-data").textContent);
  const $ = (id) => document.getElementById(id);
  const els = {
    messages: $("messages"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
    status: $("status"), model: $("model"), system: $("system-prompt"), title: $("chat-title"),
    list: $("conversation-list"), hint: $("empty-hint"), composer: $("composer"),
  };

  let conversationId = data.conversation ? data.conversation.id : null;
  let socket = null;
  let reconnectDelay = 500;
  let streaming = null; // the assistant message view being written
  let awaiting = null; // the content of a sent message the server has not confirmed yet
  const views = []; // message views in page order

  const PHASES = {
    waiting: "Waiting for a free slot…",
    prefilling: "Reading the prompt…",
    decoding: "Writing…",
  };

  // --- numbers ---------------------------------------------------------------------------------

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    return value < 1 ? Math.round(value * 1000) + " ms" : value.toFixed(2) + " s";
  }

  function rate(value) {
    if (value === null || value === undefined) return "–";
    return (value >= 100 ? Math.round(value) : value.toFixed(1)) + " tok/s";
  }

  // --- message views -------------------------------------------------------------------------

  function chip(label, value, title) {
    const item = document.createElement("span");
    item.className = "chip";
    item.title = title;
    const name = document.createElement("b");
    name.textContent = label;
    item.append(name, " " + value);
    return item;
  }

  function createView(message) {
    const root = document.createElement("article");
    root.className = "msg msg-" + message.role;
    root.dataset.id = message.id || "";
    const body = document.createElement("div");
    body.className = "msg-body";
    const meta = document.createElement("div");
    meta.className = "msg-meta";
    root.append(body, meta);
    const view = { root, body, meta, message, renderQueued: false };
    renderBody(view);
    renderMeta(view);
    return view;
  }

  function renderBody(view) {
    const { message } = view;
    if (message.role === "assistant") {
      window.Markdown.renderInto(view.body, message.content);
      if (message.state === "streaming") {
        const caret = document.createElement("span");
        caret.className = "caret";
        caret.setAttribute("aria-hidden", "true");
        (view.body.lastElementChild || view.body).append(caret);
      }
    } else {
      view.body.textContent = message.content; // the user's own words, shown as typed
    }
  }

  function queueRender(view) {
    if (view.renderQueued) return;
    view.renderQueued = true;
    requestAnimationFrame(() => {
      view.renderQueued = false;
      renderBody(view);
      scrollToEnd();
    });
  }

  function renderMeta(view) {
    const { message, meta } = view;
    meta.replaceChildren();
    if (message.role !== "assistant") return;
    const f = message.figures || {};
    if (message.state === "streaming") return;
    if (message.state === "stopped") {
      meta.append(note("stopped", "Stopped (" + (message.error || "stopped") + "). The answer so far is kept."));
    } else if (message.state === "failed") {
      meta.append(note("failed", "Failed: " + (message.error || "the model could not answer") +
        (message.content ? " The answer so far is kept." : "")));
    } else if (f.finish_reason === "length") {
      meta.append(note("length", "Cut off at the answer length limit."));
    }
    if (f.ttft !== undefined || f.output_tokens !== undefined) {
      const chips = document.createElement("div");
      chips.className = "chips figures";
      chips.append(
        chip("TTFT", seconds(f.ttft), "Time to first token: accepted → first token (queue + load + prompt reading)"),
        chip("prompt", rate(f.prompt_tps), "Prompt processing speed (prefill): new prompt tokens / prefill time"),
        chip("decode", rate(f.decode_tps), "Generation speed (decode): one token after another"),
        chip("tokens", (f.prompt_tokens ?? "–") + " in · " + (f.cached_tokens ?? "–") + " cached · " +
          (f.output_tokens ?? "–") + " out", "Prompt tokens, of which reused from the prefix cache, and output tokens"),
      );
      meta.append(chips);
    }
    if (isLast(view) && !streaming && message.content !== undefined) {
      const again = document.createElement("button");
      again.type = "button";
      again.className = "link regenerate";
      again.textContent = "↻ Regenerate";
      again.addEventListener("click", regenerate);
      meta.append(again);
    }
  }

  function note(kind, text) {
    const p = document.createElement("p");
    p.className = "note note-" + kind;
    p.textContent = text;
    return p;
  }

  function isLast(view) {
    return views[views.length - 1] === view;
  }

  function addView(message) {
    const view = createView(message);
    views.push(view);
    els.messages.append(view.root);
    els.hint.hidden = true;
    refreshLastMeta();
    return view;
  }

  function removeView(id) {
    const index = views.findIndex((v) => String(v.message.id) === String(id));
    if (index < 0) return;
    views[index].root.remove();
    views.splice(index, 1);
  }

  function refreshLastMeta() {
    views.forEach((v, i) => { if (i >= views.length - 2) renderMeta(v); });
  }

  function scrollToEnd() {
    els.messages.scrollTop = els.messages.scrollHeight;
  }

  // --- state of the page ----------------------------------------------------------------------

  function setBusy(busy) {
    els.send.hidden = busy;
    els.stop.hidden = !busy;
    els.stop.disabled = false;
  }

  function setStatus(text, kind) {
    els.status.textContent = text || "";
    els.status.className = "status" + (kind ? " status-" + kind : "");
  }

  function showConversation(frame) {
    const isNew = conversationId !== frame.id;
    conversationId = frame.id;
    els.title.textContent = frame.title;
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
    return isNew;
  }

  // --- the socket ------------------------------------------------------------------------------

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/chat/");
    socket.addEventListener("open", () => {
      reconnectDelay = 500;
      if (!streaming) setStatus("");
    });
    socket.addEventListener("message", (event) => handle(JSON.parse(event.data)));
    socket.addEventListener("close", (event) => {
      if (event.code === 4401) {
        setStatus("You are logged out. Reload the page to log in again.", "error");
        return;
      }
      if (streaming) {
        streaming.message.state = "stopped";
        streaming.message.error = "the connection was lost";
        finishStreaming();
      }
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
      case "phase": return setStatus(PHASES[frame.phase] || "");
      case "token":
        if (streaming) {
          streaming.message.content += frame.text;
          queueRender(streaming);
        }
        return;
      case "done": return onDone(frame);
      case "error": return onError(frame);
    }
  }

  function onConversation(frame) {
    showConversation(frame);
    if (frame.replaced_message_id) removeView(frame.replaced_message_id);
    if (awaiting !== null && frame.user_message_id) {
      addView({ id: frame.user_message_id, role: "user", content: awaiting });
      els.prompt.value = "";
    }
    awaiting = null;
    streaming = addView({ id: frame.message_id, role: "assistant", content: "", state: "streaming", figures: {} });
    setBusy(true);
    setStatus("Sent…");
    scrollToEnd();
  }

  function finishStreaming() {
    const view = streaming;
    streaming = null;
    setBusy(false);
    if (view) {
      renderBody(view);
      refreshLastMeta();
    }
    scrollToEnd();
  }

  function onDone(frame) {
    if (!streaming || String(streaming.message.id) !== String(frame.message_id)) return;
    streaming.message.state = frame.state;
    streaming.message.error = frame.error;
    streaming.message.figures = frame.figures || {};
    setStatus("");
    finishStreaming();
  }

  function onError(frame) {
    if (frame.message_id && streaming && String(streaming.message.id) === String(frame.message_id)) {
      streaming.message.state = "failed";
      streaming.message.error = frame.message;
      streaming.message.figures = frame.figures || {};
      setStatus("");
      finishStreaming();
      return;
    }
    awaiting = null;
    setStatus(frame.message, "error");
  }

  // --- actions -------------------------------------------------------------------------------

  function submit(event) {
    event.preventDefault();
    const content = els.prompt.value;
    if (!content.trim() || streaming || awaiting !== null) return;
    const frame = {
      type: "send",
      conversation: conversationId,
      content: content,
      model: els.model.value || null,
      system_prompt: els.system.value,
    };
    if (sendFrame(frame)) {
      awaiting = content;
      setStatus("Sending…");
    }
  }

  function regenerate() {
    if (streaming || !conversationId) return;
    sendFrame({ type: "regenerate", conversation: conversationId });
  }

  function stop() {
    if (!streaming) return;
    els.stop.disabled = true;
    sendFrame({ type: "stop" });
    setStatus("Stopping…");
  }

  els.composer.addEventListener("submit", submit);
  els.stop.addEventListener("click", stop);
  els.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      els.composer.requestSubmit();
    }
  });
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!confirm(form.dataset.confirm)) event.preventDefault();
    });
  });

  // On a phone the conversation list starts folded, leaving the screen to the chat.
  if (window.matchMedia("(max-width: 760px)").matches) document.querySelector(".conversations").open = false;

  data.messages.forEach((message) => addView(message));
  scrollToEnd();
  connect();
})();
