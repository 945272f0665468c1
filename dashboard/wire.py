"""An answer's TTFT as a client sees it: request accepted → its first output on the wire.

The README ("The figures") defines TTFT as "request accepted → first output token sent". The
engine stamps when it releases the answer's first text, in the runner process; what a client
waits for after that happens on the web side: the runner's event crossing into this process
(its reader thread, then the event loop), the answer parser holding back text that may open a
<tool_call>, the chunk or frame being written. So the figure an answer reports is stamped here,
when the first chunk or frame that carries output (content, thinking or tool calls) has been
handed to the transport:

- every dialect's stream stamps after `yield` returns (dashboard.api.pipeline.stream, after
  the first chunk written once the answer has output): Django's ASGI handler resumes the
  generator only once uvicorn's `send` has written the chunk to the socket;
- the chat page stamps after the socket's `send_json` of its first token or thinking frame.

An answer nothing was streamed for (stream: false, or a chat answer whose socket had gone)
keeps the engine's figure. Measured on the starter model on 2 cores (issue 15): from the
engine's stamp to the chunk on the socket takes 0.5 ms, up to 4 ms (a scheduler tick) while
llama.cpp's threads hold both cores; what is left to the client is its own wake-up, under 1 ms
on an idle box and 3-10 ms on a loaded one.
"""

import time
from dataclasses import dataclass


@dataclass(slots=True)
class FirstOutput:
    at: float | None = None  # time.perf_counter() when the first output was handed over

    def sent(self) -> None:
        """A chunk or frame carrying output has been written; only the first one counts."""
        if self.at is None:
            self.at = time.perf_counter()

    def figures(self, figures: dict, accepted_perf: float) -> dict:
        """`figures` (an answer's, from the engine) with its TTFT measured at the wire."""
        if self.at is None or not figures:
            return figures
        return {**figures, "ttft": max(0.0, self.at - accepted_perf)}
