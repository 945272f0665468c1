/* The chat's words for numbers: an answer's figures as chips that explain themselves when
   tapped (no hover-only tooltips: a phone cannot hover), and the status line's text for the
   engine's phase and progress frames. Figures are defined in the README's "The figures" table. */
(function () {
  "use strict";

  // Under this many computed prompt tokens a rate says nothing: "58 of 59 cached" instead.
  const MIN_COMPUTED_FOR_RATE = 32;

  const number = (value) => (value === null || value === undefined ? "–" : Number(value).toLocaleString("en"));

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    return value < 1 ? Math.round(value * 1000) + " ms" : value.toFixed(2) + " s";
  }

  function rate(value) {
    if (value === null || value === undefined) return "–";
    return (value >= 100 ? Math.round(value) : value.toFixed(1)) + " tok/s";
  }

  function ttftExplanation(f) {
    const parts = [];
    if (f.queue_time) parts.push("waiting " + seconds(f.queue_time));
    if (f.load_time) parts.push("loading the model " + seconds(f.load_time));
    if (f.prefill_time !== undefined && f.prefill_time !== null) parts.push("reading the prompt " + seconds(f.prefill_time));
    return "Time to first token: from sending the message to the first word of the answer" +
      (parts.length ? " (" + parts.join(", ") + ")." : ".");
  }

  // Where an answer's cached tokens came from (warm memory: the engine's cached_by_tier).
  const TIERS = [
    ["resident", "resident", "were still in the model's memory from an earlier turn (in its sequence slot)"],
    ["ram", "RAM", "had been kept in RAM after an earlier turn left the model's memory, and were restored"],
    ["disk", "disk", "had been kept on disk after an earlier turn left the model's memory, and were read back and restored"],
  ];

  /* The cache chip: how many prompt tokens were reused, from which tier, and what restoring
     them took ("430 · RAM, restored in 2 ms"); null when nothing was cached or the answer
     predates the tiers. */
  function cacheChip(f) {
    const byTier = f.cached_by_tier;
    if (!f.cached_tokens || !byTier || typeof byTier !== "object") return null;
    const found = TIERS.filter(([key]) => byTier[key] > 0);
    if (!found.length) return null;
    const restored = f.restore_time > 0 ? seconds(f.restore_time) : null;
    const where = found.map(([key, name]) => (found.length > 1 ? number(byTier[key]) + " " : "") + name).join(" + ");
    return {
      label: "cached",
      value: number(f.cached_tokens) + " · " + where + (restored ? ", restored in " + restored : ""),
      explain: "The first " + number(f.cached_tokens) + " prompt tokens were not read again: they " +
        found.map(([, , words]) => words).join("; others ") + (restored ? " in " + restored : "") +
        ". Only the rest of the prompt was read.",
    };
  }

  /* The speculation chip ("48 drafted, 47 kept"); null when nothing was drafted. */
  function speculationChip(f) {
    if (!f.drafted) return null;
    const kept = f.draft_accepted || 0;
    return {
      label: "speculation",
      value: number(f.drafted) + " drafted, " + number(kept) + " kept",
      explain: "Speculative decoding: " + number(f.drafted) + " tokens were guessed ahead from the text so far and " +
        "checked by the model in the same steps as its own; " + number(kept) + " were the tokens it would have " +
        "written anyway and were kept, so the answer is the same, written in fewer steps.",
    };
  }

  /* The image chip ("encode 180 ms · 64 image tokens"); null for an answer without images. */
  function imageChip(f) {
    if (!f.image_tokens) return null;
    const encoded = f.images_encoded || 0, cached = f.images_cached || 0;
    const read = [encoded ? number(encoded) + " encoded" : null, cached ? number(cached) + " from the image cache" : null]
      .filter(Boolean).join(", ");
    return {
      label: "images",
      value: "encode " + seconds(f.encode_time) + " · " + number(f.image_tokens) + " image tokens",
      explain: "Reading the pictures is a phase of its own, before the prompt: " + seconds(f.encode_time) +
        " to turn them into " + number(f.image_tokens) + " image tokens of the prompt" +
        (read ? " (" + read + ")" : "") + ". A picture seen before comes from the cache and is not encoded again.",
    };
  }

  /* [{label, value, explain}] for an answer's figures; [] when it has none. */
  function figureChips(f) {
    if (!f || (f.ttft === undefined && f.output_tokens === undefined)) return [];
    const chips = [{ label: "TTFT", value: seconds(f.ttft), explain: ttftExplanation(f) }];
    const prompt = f.prompt_tokens, cached = f.cached_tokens || 0;
    const computed = prompt === undefined || prompt === null ? null : prompt - cached;
    if (computed !== null && computed < MIN_COMPUTED_FOR_RATE && cached > 0) {
      chips.push({
        label: "prompt", value: number(cached) + " of " + number(prompt) + " cached",
        explain: "Almost all of the prompt was already in the model's memory from the turn before " +
          "(the prefix cache), so only " + number(computed) + " new tokens were read: too few for a " +
          "meaningful reading speed.",
      });
    } else {
      chips.push({
        label: "prompt", value: rate(f.prompt_tps),
        explain: "Prompt reading speed (prefill): the " + number(computed) + " prompt tokens that were " +
          "not cached, over the time it took to read them. Reading is done in parallel and is much " +
          "faster than writing.",
      });
    }
    chips.push({
      label: "decode", value: rate(f.decode_tps),
      explain: "Writing speed (decode): tokens of the answer per second after the first one. Each " +
        "token depends on the one before, so this is slower than reading the prompt.",
    });
    chips.push({
      label: "tokens",
      value: number(prompt) + " in · " + number(f.cached_tokens) + " cached · " + number(f.output_tokens) + " out",
      explain: "Prompt tokens (the conversation as the model read it), of which reused from the prefix " +
        "cache, and tokens written in this answer" +
        (f.answer_tokens ? " (" + number(f.answer_tokens) + " in the whole answer, with its continuations)." : "."),
    });
    return chips.concat([imageChip(f), cacheChip(f), speculationChip(f)].filter(Boolean));
  }

  const PHASES = {
    loading: "Loading model…",
    waiting: "Waiting for a free slot…",
    prefilling: "Reading the prompt…",
    decoding: "Writing…",
  };

  /* The status line for a phase or progress frame ("" for none). */
  function statusText(frame) {
    if (!frame) return "";
    if (frame.type === "progress" && frame.phase === "waiting" && typeof frame.ahead === "number") {
      return frame.ahead > 0 ? "Waiting: " + number(frame.ahead) + " ahead of you" : "Waiting: you are next";
    }
    if (frame.type === "progress" && frame.phase === "prefilling" && typeof frame.total === "number") {
      return "Reading the prompt: " + number(frame.done) + " / " + number(frame.total) + " tokens" +
        (frame.cached ? " (" + number(frame.cached) + " cached)" : "");
    }
    return PHASES[frame.phase] || "";
  }

  window.ChatFigures = { figureChips, statusText, seconds, number };
})();
