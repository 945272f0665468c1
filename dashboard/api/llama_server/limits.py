"""llama-server's limits on an answer that the route applies as it reads the text
(tools/server/server-context.cpp, `process_token`), for /infill and /completion alike:

1. n_indent: once the answer has a new line, each later line must start with at least n_indent
   spaces or tabs; the first that does not ends the answer, cut where its text begins.
2. t_max_predict_ms: a token with a new line, more than t_max_predict_ms after the first token,
   ends the answer (after that token): an editor's suggestion stops at a line end in time.

Both end it with llama-server's stop_type "limit"; the route then closes the run, which frees
its sequence within one engine step. (t_max_prompt_ms, the wait for the first token, and
n_predict 0 are dashboard.api.llama_server.answer's: they need no text.)
"""

from dashboard.api.llama_server.sampling import Limits


class Stopping:
    """The text so far of one answer, and whether a limit ended it."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.text = ""
        self.has_new_line = False
        self.stopped = False  # a limit ended it
        self._last_nl_pos = 0
        self._first_token_at: float | None = None

    def feed(self, piece: str, now: float) -> str:
        """Takes a token's text (at `now`, perf_counter seconds); returns the text to send,
        which is less than `piece` where rule 1 cut it."""
        if self._first_token_at is None:
            self._first_token_at = now
        before = len(self.text)
        self.text += piece
        if self.has_new_line and self.limits.n_indent > 0:
            if self._last_nl_pos > 0:
                pos = self._last_nl_pos
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos < len(self.text) and pos - self._last_nl_pos < self.limits.n_indent:
                    self.stopped = True
                    self.text = self.text[:pos]  # rule 1: the short line's text is cut
            found = self.text.find("\n", self._last_nl_pos)
            if found != -1:
                self._last_nl_pos = found + 1
        if "\n" in piece:
            self.has_new_line = True
            predict_s = self.limits.predict_s
            if predict_s is not None and now - self._first_token_at > predict_s:
                self.stopped = True  # rule 2
        return self.text[before:]
