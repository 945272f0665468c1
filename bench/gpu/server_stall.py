"""The stall scenario against llama-server, as bench/engine_side.py's stall_once runs it on the
engine: stream A decodes; after A's 8th token a fresh prompt B of `b_tokens` arrives; A's
longest gap between two tokens while B waits for its first, B's time to first token with A, and
B's alone. The same token ids (bench/prompts.py, tokenized by llama-server's /tokenize on the
same GGUF), greedy, no prompt cache; timed at the client, on llama-server's /completion stream
(one event per token).
"""

import json
import statistics
import threading
import time

import httpx

from bench.prompts import make_tokens


class Stream:
    """One streamed /completion in a thread: the arrival time of each token."""

    def __init__(self, url: str, prompt: list[int], n_predict: int, on_token=None):
        self.times: list[float] = []
        self.error: str | None = None
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.sent = 0.0
        self._on_token = on_token
        body = {"prompt": prompt, "n_predict": n_predict, "stream": True, "cache_prompt": False,
                "temperature": 0.0, "top_k": 1, "ignore_eos": True}  # fmt: skip
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)

    def start(self) -> "Stream":
        self._thread.start()
        return self

    def _run(self, url: str, body: dict) -> None:
        try:
            self.sent = time.perf_counter()
            with httpx.stream("POST", url + "/completion", json=body, timeout=600) as answer:
                answer.raise_for_status()
                for line in answer.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("content") or chunk.get("tokens"):
                        self.times.append(time.perf_counter())
                        if self._on_token is not None:
                            self._on_token(len(self.times))
                    if chunk.get("stop") or self.stop.is_set():
                        break  # closing the connection ends the slot's generation
        except Exception as exc:  # noqa: BLE001 - reported with the result
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.finished.set()

    def wait(self, timeout: float = 600) -> "Stream":
        if not self.finished.wait(timeout):
            raise RuntimeError("llama-server did not answer in time")
        if self.error:
            raise RuntimeError(self.error)
        return self


def tokenizer(url: str):
    def tokenize(text: str, add_special: bool = True) -> list[int]:
        answer = httpx.post(url + "/tokenize", json={"content": text, "add_special": add_special},
                            timeout=60)  # fmt: skip
        answer.raise_for_status()
        return answer.json()["tokens"]

    return tokenize


def stall_once(url: str, args: dict, salt: int) -> dict:
    tokenize = tokenizer(url)
    b_prompt = make_tokens(tokenize, args["b_tokens"], salt)
    a_prompt = make_tokens(tokenize, args["a_tokens"], salt + 2)
    b_due = threading.Event()
    a = Stream(url, a_prompt, args["a_max_tokens"],
               on_token=lambda n: n == args["a_warm_tokens"] and b_due.set()).start()  # fmt: skip
    if not b_due.wait(120):
        raise RuntimeError(f"stream A did not start: {a.error}")
    b = Stream(url, b_prompt, 2).start().wait()
    b_first = b.times[0]
    a_running = not a.finished.is_set()
    a.stop.set()
    a.finished.wait(60)
    gaps = [later - earlier for earlier, later in zip(a.times, a.times[1:], strict=False)
            if later >= b.sent and earlier <= b_first]  # fmt: skip
    alone = Stream(url, make_tokens(tokenize, args["b_tokens"], salt + 3), 2).start().wait()
    return {"a_itl_max_s": max(gaps) if gaps else 0.0,
            "a_itl_p50_s": statistics.median(gaps) if gaps else 0.0, "a_gaps": len(gaps),
            "b_ttft_with_a_s": b_first - b.sent, "b_ttft_alone_s": alone.times[0] - alone.sent,
            "a_ran_throughout": a_running}  # fmt: skip


def server_stall(url: str, args: dict) -> dict:
    """Once unmeasured (llama-server's first long prompt sets up its buffers), then measured,
    as the engine's side does it."""
    stall_once(url, args, args["salt"] + 50)
    return stall_once(url, args, args["salt"])
