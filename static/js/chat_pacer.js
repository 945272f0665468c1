/* How fast the chat page shows a streamed answer: what has arrived, spread over the time until
   more is likely to come, so a reader sees it flow at the pace it is written rather than in
   bursts.

   Tokens do not arrive evenly. A step that keeps a speculative draft sends several at once; a
   step that also reads another request's prompt takes longer than one that only decodes (the
   ITL target bounds it: DESIGN.md). Shown as they come, both read as a jerk and a stall. Each
   arrival here goes into a backlog that animation frames drain evenly over the spread: the
   longest of the last RECENT gaps between arrivals, never more than MAX_SPREAD_MS. A burst
   flows out over the next gap, and a step as long as the recent longest shows as a steady flow
   rather than a stop, for a lag of about that gap. The first token (the TTFT) shows at the
   first frame, and the end of the answer shows everything (chat.js). Nothing here changes
   what is measured: the figures under an answer are the server's own. */
(function () {
  "use strict";

  const MAX_SPREAD_MS = 250; // the most an arrival is spread over (and so held back)
  const RECENT = 8; // the gaps between arrivals the spread is taken from
  const QUIET_MS = 1000; // a gap longer than this is a pause (a tool call, a stop), not a pace

  /* One answer's pace. `arrived(t, backlog)` when text arrived at time t (ms, as
     performance.now()), with `backlog` characters now not yet shown; `reveal(t, backlog)`, at
     an animation frame, how many of the `backlog` characters to show now. */
  function create() {
    const gaps = []; // the last RECENT gaps between arrivals, ms
    let last = null; // the last arrival
    let rate = Infinity; // characters a millisecond, set by the last arrival
    let since = null; // when what is due accrues from: the last frame or arrival
    let carry = 0; // a fraction of a character due, kept for the next frame

    function spread() {
      return gaps.length ? Math.min(MAX_SPREAD_MS, Math.max(...gaps)) : 0;
    }

    function arrived(t, backlog) {
      if (last !== null && t - last <= QUIET_MS) {
        gaps.push(t - last);
        if (gaps.length > RECENT) gaps.shift();
      }
      last = t;
      rate = spread() > 0 ? backlog / spread() : Infinity;
      if (since === null) since = t; // caught up: the flow starts with this arrival
    }

    function reveal(t, backlog) {
      if (backlog <= 0 || rate === Infinity) {
        since = null;
        carry = 0;
        return Math.max(0, backlog);
      }
      const due = carry + rate * Math.max(0, t - (since === null ? t : since));
      since = t;
      const count = Math.min(backlog, Math.floor(due));
      carry = count === backlog ? 0 : due - count;
      if (count === backlog) since = null;
      return count;
    }

    return { arrived, reveal, spread };
  }

  /* `count` characters of `text` from its start, moved on past a split surrogate pair (an
     emoji is never shown half). */
  function cut(text, count) {
    const code = text.charCodeAt(count - 1);
    return code >= 0xd800 && code <= 0xdbff ? count + 1 : count;
  }

  window.ChatPacer = { create, cut, MAX_SPREAD_MS };
})();
