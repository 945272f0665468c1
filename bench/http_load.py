"""Load that home apps put on an OpenAI-compatible server, measured as its clients see it.

Server-agnostic: the same scenarios run against the appliance and against llama-server, through
`/v1/chat/completions` with `stream: true`, each answer timed at the client (TTFT: the request
sent → the first chunk with text; ITL: the gaps between chunks with text). No llama_cpp and no
appliance import here: this is a client.

Scenarios (each returns a plain dict of figures):
- `alone`: a person's short chats, one after another, with the box otherwise idle.
- `flood`: another app keeps `flood` document summaries running (each one that ends replaced at
  once, as an app working through a folder does); after `settle_s` the person's chats run one
  after another with a pause between; the flood's output tok/s is counted over the same window.
- `mixed`: `clients` clients on one key for `duration_s`, each sending its own seeded sequence
  of short chats, medium prompts and documents back to back.
- `clients`: `clients` clients on one key for `duration_s`, each sending back to back questions
  of 5-95 words for answers of 8-96 tokens, with a person's chats beside them if asked.

Output tokens are the servers' own counts (usage), not chunks: a step that keeps a draft sends
its tokens in one chunk, and counting chunks would make speculation look slower than it is.
"""

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx

from bench.prompts import prompt_text

QUESTION = "In two sentences, why does a household keep its own small server? (question {n})"


def document(salt: int, words: int) -> str:
    """A document of about `words` words, different from every other salt's from its first
    word (so no prefix cache helps one document with another's)."""
    text = prompt_text(words * 2, salt).split()[:words]
    return "Summarize this document in one paragraph.\n\n" + " ".join(text)


@dataclass
class Answer:
    sent: float
    first: float | None = None
    token_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None  # the server's own count, when it reports usage
    complete: bool = False  # the stream ended as the server ended it (not cut off, no error)
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    def gaps(self, start: float = 0.0, end: float = float("inf")) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False) if a >= start and b <= end]


class Target:
    """One server under test: its base URL, the model name it answers to, and headers per
    caller ("person", "app", "app_background", "mixed")."""

    def __init__(self, url: str, model: str, headers: dict[str, dict[str, str]]):
        self.url = url
        self.model = model
        self.headers = headers


async def chat(client: httpx.AsyncClient, target: Target, caller: str, content: str,
               max_tokens: int, answers: list | None = None) -> Answer:  # fmt: skip
    """One streamed chat completion, greedy: each chunk with text is timed (a chunk may carry
    several tokens where a step kept a draft: `tokens_within` counts them). With `answers`, the
    answer is added to it when sent, so a load that is cut off still counts what it got."""
    body = {"model": target.model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    answer = Answer(time.perf_counter())
    if answers is not None:
        answers.append(answer)
    try:
        async with client.stream("POST", f"{target.url}/v1/chat/completions", json=body,
                                 headers=target.headers[caller]) as response:  # fmt: skip
            if response.status_code != 200:
                answer.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return answer
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    answer.error = str(chunk["error"])[:200]
                    continue
                if chunk.get("usage"):
                    answer.completion_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if answer.first is None:
                            answer.first = now
                        answer.token_times.append(now)
        answer.complete = answer.error is None
    except httpx.HTTPError as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    return answer


def tokens_within(answers: list[Answer], start: float, end: float) -> float:
    """Output tokens sent between `start` and `end`: each answer's own count (the server's
    usage) spread evenly over its chunks, so a chunk that carries several tokens (a step that
    kept a draft sends them at once, on either server) counts them all. An answer cut off
    before its usage came counts at the tokens per chunk of the answers that ended."""
    ended = [a for a in answers if a.completion_tokens and a.token_times]
    chunks = sum(len(a.token_times) for a in ended)
    usual = sum(a.completion_tokens for a in ended) / chunks if chunks else 1.0
    total = 0.0
    for answer in answers:
        if not answer.token_times:
            continue
        inside = sum(start <= t <= end for t in answer.token_times)
        if answer.completion_tokens:
            total += inside * answer.completion_tokens / len(answer.token_times)
        else:
            total += inside * usual
    return total


def window_figures(answers: list[Answer], started: float, deadline: float) -> dict:
    """A load's figures over its window: answers that ended in it, output tok/s, TTFT p50 of
    the first tokens inside it, ITL p99 of the gaps inside it, errors."""
    done = [a for a in answers if a.complete and a.token_times
            and a.token_times[-1] <= deadline]  # fmt: skip
    ttfts = [a.ttft for a in answers if a.first is not None and a.first <= deadline]
    return {"requests_done": len(done),
            "output_tps": tokens_within(answers, started, deadline) / (deadline - started),
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
            "itl_p99_s": p([g for a in answers for g in a.gaps(started, deadline)], 0.99),
            "errors": sum(a.error is not None for a in answers)}  # fmt: skip


def p(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _client() -> httpx.AsyncClient:
    # A connection per request: llama-server's HTTP library closes a kept-alive connection
    # after a few requests or seconds, and a request sent on one it has just closed fails.
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    return httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits)


async def alone(target: Target, *, persons: int, person_out: int, salt: int) -> dict:
    async with _client() as client:
        answers = [await chat(client, target, "person", QUESTION.format(n=salt + i), person_out)
                   for i in range(persons)]  # fmt: skip
    _check(answers, "the person's chats")
    return {"ttft_p50_s": statistics.median(a.ttft for a in answers),
            "itl_p99_s": p([g for a in answers for g in a.gaps()], 0.99)}  # fmt: skip


async def flood(target: Target, *, app: str, streams: int, doc_words: int, doc_out: int,
                persons: int, person_out: int, settle_s: float, gap_s: float,
                salt: int) -> dict:  # fmt: skip
    flood_answers: list[Answer] = []
    errors: list[str] = []
    salts = iter(range(salt + 1000, salt + 1_000_000))
    stop = asyncio.Event()

    async def keep_one_going(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            answer = await chat(client, target, app, document(next(salts), doc_words), doc_out,
                                answers=flood_answers)  # fmt: skip
            if answer.error and not stop.is_set():
                errors.append(answer.error)
                await asyncio.sleep(1)

    async with _client() as client:
        workers = [asyncio.create_task(keep_one_going(client)) for _ in range(streams)]
        await asyncio.sleep(settle_s)
        started = time.perf_counter()
        during = []
        for i in range(persons):
            during.append(await chat(client, target, "person",
                                     QUESTION.format(n=salt + 500 + i), person_out))  # fmt: skip
            await asyncio.sleep(gap_s)
        ended = time.perf_counter()
        stop.set()
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    _check(during, "the person's chats during the flood")
    ttfts = [a.ttft for a in during]
    produced = tokens_within(flood_answers, started, ended)
    return {"ttft_p50_s": statistics.median(ttfts), "ttft_max_s": max(ttfts),
            "itl_p99_s": p([g for a in during for g in a.gaps()], 0.99),
            "flood_output_tps": produced / (ended - started), "flood_errors": len(errors),
            "first_flood_error": errors[0] if errors else None}  # fmt: skip


MIXED_KINDS = (  # (weight, words of prompt or 0 for a short question, max_tokens)
    (3, 0, 64), (2, 250, 128), (1, 600, 128),
)


async def mixed(target: Target, *, clients: int, duration_s: float, salt: int) -> dict:
    """Each client sends its own seeded sequence of requests for `duration_s`; an answer counts
    as done when it ends inside the window; tokens are counted inside it."""
    answers: list[Answer] = []

    async def one_client(client: httpx.AsyncClient, index: int, deadline: float) -> None:
        rng = random.Random(salt * 100 + index)
        weights = [w for w, _, _ in MIXED_KINDS]
        n = 0
        while time.perf_counter() < deadline:
            _, words, out = rng.choices(MIXED_KINDS, weights)[0]
            n += 1
            seed = salt * 10_000 + index * 1000 + n
            content = document(seed, words) if words else QUESTION.format(n=seed)
            await chat(client, target, "mixed", content, out, answers=answers)

    async with _client() as client:
        started = time.perf_counter()
        deadline = started + duration_s
        tasks = [asyncio.create_task(one_client(client, i, deadline)) for i in range(clients)]
        await asyncio.sleep(duration_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return window_figures(answers, started, deadline)


def _check(answers: list[Answer], what: str) -> None:
    failed = [a.error for a in answers if a.error or a.first is None]
    if failed:
        raise RuntimeError(f"{what} failed: {failed[0] or 'no text'}")


CLIENT_WORDS = (5, 95)  # a client's prompt, in words (issue 32's load)
CLIENT_OUT = (8, 96)  # its max_tokens


async def clients(target: Target, *, clients: int, duration_s: float, salt: int,
                  persons: int = 0, person_out: int = 32, gap_s: float = 1.0,
                  settle_s: float = 0.0) -> dict:  # fmt: skip
    """`clients` clients on one key ("mixed") for `duration_s`, each sending back to back its
    own seeded requests: a question of 5-95 words, an answer of at most 8-96 tokens. With
    `persons`, a person's short chats run one after another beside them (after `settle_s`, a
    `gap_s` pause between): their TTFT and ITL are the person's figures."""
    answers: list[Answer] = []

    async def one_client(client: httpx.AsyncClient, index: int, deadline: float) -> None:
        rng = random.Random(salt * 100 + index)
        n = 0
        while time.perf_counter() < deadline:
            n += 1
            seed = salt * 10_000 + index * 1000 + n
            words = rng.randint(*CLIENT_WORDS)
            content = "Answer briefly. " + " ".join(prompt_text(words * 2, seed).split()[:words])
            await chat(client, target, "mixed", content, rng.randint(*CLIENT_OUT),
                       answers=answers)  # fmt: skip

    async def the_person(client: httpx.AsyncClient, deadline: float) -> list[Answer]:
        await asyncio.sleep(settle_s)
        chats = []
        for i in range(persons):
            if time.perf_counter() >= deadline:
                break
            chats.append(await chat(client, target, "person", QUESTION.format(n=salt + 700 + i),
                                    person_out))  # fmt: skip
            await asyncio.sleep(gap_s)
        return chats

    async with _client() as client:
        started = time.perf_counter()
        deadline = started + duration_s
        tasks = [asyncio.create_task(one_client(client, i, deadline)) for i in range(clients)]
        person = asyncio.create_task(the_person(client, deadline)) if persons else None
        await asyncio.sleep(duration_s)
        during = await person if person is not None else []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    result = window_figures(answers, started, deadline)
    if persons:
        _check(during, "the person's chats beside the clients")
        result["person_ttft_p50_s"] = statistics.median(a.ttft for a in during)
        result["person_itl_p99_s"] = p([g for a in during for g in a.gaps()], 0.99)
    return result
