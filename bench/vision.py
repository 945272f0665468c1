"""Benchmark: the image path (issue 29), the appliance against llama-server --mmproj on the same
model and projector.

    python bench/vision.py --llama-server PATH [--only answers,cache,bad,stall]
                           [--sides appliance,llama-server] [--rounds 2] [--duration 60]
                           [--threads 2] [--quick]

Both servers run the starter model with a projector written at bench time into a temporary
directory (never committed): the tiny one of tests/inference/projector_gguf.py (112 px, 64 image
tokens) for answers, cache and bad; a ViT-B-sized one (224 px, patch 16: 196 image tokens; 12
blocks of width 768, 12 heads, FF 3072, of which the llava graph runs 11; f16 matrices, about
170 MB) for stall. Each side is a server started fresh in processes of its own
(bench/servers.py): llama-server with `--mmproj`, -np 4 and its defaults; the appliance in
embedded mode with its defaults, the projector registered in its data directory before it starts
(`manage.py import_model LM.gguf --mmproj PROJ.gguf --name NAME`) and every request asking for
that entry. Images go as OpenAI chat `image_url` parts with `data:` URLs (PNG pictures, noise
over a gradient: distinct seeds, distinct pictures). The client is this process.

Scenarios:
  answers  temperature 0, the text and the prompt token count of (a) one image after text and
           (b) two images before text, each read cold: a server started fresh for each request
           (the appliance on a data directory of its own, so no tier holds a prefix).
  cache    a conversation's second turn (the same image again, a new question): the share of its
           prompt tokens the server reused (`timings.cache_n`); and a first turn with the same
           image and another question, for comparison.
  bad      a corrupt image, an internet URL (never fetched: the appliance must refuse it; to
           llama-server, which fetches http(s) URLs, the benchmark sends one on a closed local
           port instead) and a 30 MB image: each one's status, and whether the next good request
           is answered.
  stall    3 clients each send a new camera frame as soon as their last is answered, through
           the ViT-B-sized encoder, while a person's streamed text chats run one after another,
           the last starting within --duration seconds: the person's ITL p50/p99/max at the
           client, and the frames answered per minute in the same window (from the first chat's
           start to the last one's end). Every round; the sides' order swapped each round.

It prints a line per measurement, the goals met or not (issue 29, "Done when"), and last ONE
JSON line.
"""

import argparse
import asyncio
import base64
import json
import select
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import QUESTION, Target, chat, p  # noqa: E402
from bench.servers import Appliance, LlamaServer, Server, free_port, require  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402
from tests.inference.projector_gguf import picture, write_projector  # noqa: E402

SCENARIOS = ("answers", "cache", "bad", "stall")
SIDES = ("appliance", "llama-server")
ENTRIES = {"tiny": "smollm2-135m-vision-tiny", "vitb": "smollm2-135m-vision-vitb"}
# A ViT-B/16 at 224 px: 196 image tokens. The file holds ViT-B's 12 blocks; the llava graph
# stops one before the last (write_projector's `blocks` counts those run). mm.0 maps to the
# starter's width, as LLaVA's does to its model's.
VITB = {"image_size": 224, "patch_size": 16, "embed": 768, "heads": 12, "ff": 3072,
        "blocks": 11, "hidden": 576, "f16": True}  # fmt: skip
CASES = {  # name: (the request's content parts, as ("text", words) or ("image", seed))
    "one_image_after_text": (("text", "What is in this picture? Answer in one sentence."),
                             ("image", 21)),
    "two_images_before_text": (("image", 22), ("image", 23),
                               ("text", "How do these two pictures differ?")),
}  # fmt: skip
FRAME_PROMPT = "This is a frame from the driveway camera. Describe what you see in one sentence."
BIG_IMAGE_BYTES = 30 << 20
GOALS = [  # (what, figure, op, goal): issue 29, "Done when"; the appliance's figures
    ("one image after text: answer and prompt tokens equal llama-server's",
     "answers_one_image_after_text_match", "==", True),
    ("two images before text: answer and prompt tokens equal llama-server's",
     "answers_two_images_before_text_match", "==", True),
    ("second turn, same image: share of prompt tokens cached", "second_turn_cached_share",
     ">=", 0.8),
    ("corrupt image, internet URL, 30 MB image: each a 4xx, the next good request answered",
     "bad_input_refused_and_next_answered", "==", True),
    ("person's ITL p99 while 3 clients send frames (s)", "person_itl_p99_s", "<=", 0.150),
    ("frames answered per minute, over llama-server's", "frames_ratio", ">=", 0.8),
]  # fmt: skip


def log(message: str) -> None:
    print(message, flush=True)


# --- what is sent ------------------------------------------------------------------------------


def image_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def frame(seed: int, size: tuple[int, int]) -> str:
    """A camera frame (a data URL) no other seed gives."""
    return image_url(picture(size[0], size[1], seed=seed))


def content(parts: tuple, image_size: tuple[int, int] = (160, 120)) -> list[dict]:
    """OpenAI content parts in the given order: text as it is, an image from its seed."""
    return [{"type": "text", "text": value} if kind == "text" else
            {"type": "image_url", "image_url": {"url": frame(value, image_size)}}
            for kind, value in parts]  # fmt: skip


def corrupt_image() -> str:
    """A PNG signature, then bytes that are no PNG."""
    noise = np.random.default_rng(5).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return image_url(b"\x89PNG\r\n\x1a\n" + noise)


def big_image(size: int = BIG_IMAGE_BYTES) -> str:
    """A well-formed 24-bit BMP of at least `size` bytes (so only its size is wrong with it):
    a square of stripes, its rows a multiple of 4 bytes wide as BMP wants."""
    side = (int((size / 3) ** 0.5) + 4) // 4 * 4
    row = (np.arange(side * 3, dtype=np.uint32) // 48 * 37 % 256).astype(np.uint8).tobytes()
    pixels = row * side
    info = struct.pack("<IiiHHIIiiII", 40, side, side, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    header = struct.pack("<2sIHHI", b"BM", 14 + len(info) + len(pixels), 0, 0, 14 + len(info))
    return image_url(header + info + pixels, "bmp")


def chat_body(target: Target, messages: list[dict], max_tokens: int, stream: bool = False
              ) -> dict:  # fmt: skip
    return {"model": target.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}  # fmt: skip


def http() -> httpx.AsyncClient:
    # A connection per request: llama-server's HTTP library closes a kept-alive connection
    # after a few requests or seconds, and a request sent on one it has just closed fails.
    return httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10),
                             limits=httpx.Limits(max_keepalive_connections=0))  # fmt: skip


async def complete(client: httpx.AsyncClient, target: Target, caller: str,
                   messages: list[dict], max_tokens: int) -> dict:  # fmt: skip
    """One answer, not streamed: its status, text, prompt tokens and cached tokens."""
    response = await client.post(f"{target.url}/v1/chat/completions",
                                 json=chat_body(target, messages, max_tokens),
                                 headers=target.headers[caller])  # fmt: skip
    if response.status_code != 200:
        return {"status": response.status_code, "error": response.text[:300]}
    body = response.json()
    usage, timings = body.get("usage") or {}, body.get("timings") or {}
    cached = timings.get("cache_n")
    if cached is None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"status": 200, "text": body["choices"][0]["message"].get("content") or "",
            "prompt_tokens": int(usage.get("prompt_tokens") or 0), "cached": int(cached)}


def post_raw(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str]:
    """POST `body` as a client that reads an early answer: the body goes in pieces, and as soon
    as the server has answered (a 413 from the headers alone) the rest is not sent. Returns the
    status (None when no answer came) and the answer's first bytes."""
    parts = urlsplit(url)
    head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()  # fmt: skip
    received = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=600) as sock:
        try:
            sock.sendall(head)
            view = memoryview(body)
            for start in range(0, len(body), 1 << 18):
                if select.select([sock], [], [], 0)[0]:
                    break  # it has answered already
                sock.sendall(view[start:start + (1 << 18)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed before the whole body arrived: its answer is read below
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    line = received.split(b"\r\n", 1)[0].split()
    status = int(line[1]) if len(line) > 1 and line[1].isdigit() else None
    return status, received.partition(b"\r\n\r\n")[2][:300].decode(errors="replace")


# --- answers, cache, bad -------------------------------------------------------------------------


def make(side: str, projector: Path, entry: str, args) -> Server:
    """A fresh server of `side` with `projector` beside the model (the appliance: registered as
    `entry` in a data directory of its own)."""
    if side == "appliance":
        return Appliance(args.threads, model=entry, extra_setup=(
            ("import_model", args.model, "--mmproj", str(projector), "--name", entry),))
    return LlamaServer(args.llama_server, args.model, args.threads, args.parallel, args.ctx,
                       ("--mmproj", str(projector)))  # fmt: skip


def fresh(side: str, projector: Path, entry: str, args):
    server = make(side, projector, entry, args)
    try:
        server.setup()
        return server, server.start()
    except BaseException:
        server.close()  # its data directory or logs go with it
        raise


async def ask_once(target: Target, messages: list[dict], max_tokens: int) -> dict:
    async with http() as client:
        return await complete(client, target, "app", messages, max_tokens)


def answers(side: str, projector: Path, args) -> dict:
    """Each case read cold: a server of its own."""
    out = {}
    for case, parts in CASES.items():
        server, target = fresh(side, projector, ENTRIES["tiny"], args)
        try:
            messages = [{"role": "user", "content": content(parts)}]
            reply = asyncio.run(ask_once(target, messages, args.answer_tokens))
        finally:
            server.close()
        if reply["status"] != 200:
            raise RuntimeError(f"{side} {case}: HTTP {reply['status']}: {reply['error']}")
        out[case] = reply
        log(f"  {side} {case.replace('_', ' ')} (cold): {reply['prompt_tokens']} prompt tokens, "
            f"{reply['text'][:80]!r}")  # fmt: skip
    return out


async def cache_turns(target: Target, answer_tokens: int) -> dict:
    first = [{"role": "user", "content": content((("image", 31),
                                                   ("text", "What is in this picture?")))}]
    async with http() as client:
        one = await complete(client, target, "app", first, answer_tokens)
        if one["status"] != 200:
            raise RuntimeError(f"the first turn: HTTP {one['status']}: {one['error']}")
        second = [*first, {"role": "assistant", "content": one["text"]},
                  {"role": "user", "content": "What colour is it mostly?"}]  # fmt: skip
        two = await complete(client, target, "app", second, answer_tokens)
        again = [{"role": "user", "content": content((("image", 31),
                                                       ("text", "Is it day or night?")))}]
        other = await complete(client, target, "app", again, answer_tokens)
    for reply in (two, other):
        if reply["status"] != 200:
            raise RuntimeError(f"HTTP {reply['status']}: {reply['error']}")
    return {"second_turn": two, "new_question": other}


def bad_input(target: Target, other_url: str) -> dict:
    """Each bad request's status, then whether a good one is answered after it."""
    url = f"{target.url}/v1/chat/completions"
    headers = target.headers["app"]
    good = [{"role": "user", "content": content((("text", "What is this?"), ("image", 41)))}]
    out = {}
    for kind, image in (("corrupt", corrupt_image()), ("url", other_url), ("big", big_image())):
        messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                 {"type": "image_url",
                                                  "image_url": {"url": image}}]}]  # fmt: skip
        body = json.dumps(chat_body(target, messages, 8)).encode()
        status, said = post_raw(url, body, headers)
        after, _ = post_raw(url, json.dumps(chat_body(target, good, 8)).encode(), headers)
        out[kind] = {"status": status, "said": said, "next_status": after,
                     "bytes": len(body)}  # fmt: skip
    return out


def tiny_suite(side: str, projector: Path, args, only: list[str]) -> dict:
    results: dict = {}
    if "answers" in only:
        results["answers"] = answers(side, projector, args)
    if not {"cache", "bad"} & set(only):
        return results
    server, target = fresh(side, projector, ENTRIES["tiny"], args)
    try:
        if "cache" in only:
            turns = asyncio.run(cache_turns(target, args.answer_tokens))
            results["cache"] = turns
            for what, reply in turns.items():
                share = reply["cached"] / reply["prompt_tokens"] if reply["prompt_tokens"] else 0
                log(f"  {side} {what.replace('_', ' ')}: {reply['cached']} of "
                    f"{reply['prompt_tokens']} prompt tokens cached ({share:.1%})")  # fmt: skip
        if "bad" in only:
            # llama-server fetches http(s) image URLs: it gets one that cannot leave this box.
            other = ("http://example.com/x.jpg" if side == "appliance" else
                     f"http://127.0.0.1:{free_port()}/x.jpg")  # fmt: skip
            results["bad"] = bad_input(target, other)
            for kind, row in results["bad"].items():
                log(f"  {side} bad input {kind} ({row['bytes'] / 1e6:.1f} MB body): HTTP "
                    f"{row['status']} {row['said'][:100]!r}; the next good request: HTTP "
                    f"{row['next_status']}")  # fmt: skip
    finally:
        server.close()
    return results


# --- stall ---------------------------------------------------------------------------------------


class Frames:
    """Distinct camera frames: a pool made before the window (so making one costs the client's
    clock nothing while it times tokens), then more in a thread if the pool runs out."""

    def __init__(self, salt: int, size: tuple[int, int], ahead: int):
        self.salt, self.size = salt, size
        self.pool = deque(frame(salt + n, size) for n in range(ahead))
        self.made = ahead
        self.ran_out = 0

    async def next(self) -> str:
        if self.pool:
            return self.pool.popleft()
        self.made += 1
        self.ran_out += 1
        return await asyncio.to_thread(frame, self.salt + self.made, self.size)


async def stall(target: Target, *, clients: int, duration_s: float, settle_s: float,
                frames: Frames, frame_tokens: int, person_tokens: int, gap_s: float,
                salt: int) -> dict:  # fmt: skip
    answered: list[float] = []  # when each frame's answer arrived
    errors: list[str] = []
    stop = asyncio.Event()

    async def camera(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            url = await frames.next()
            messages = [{"role": "user", "content": [
                {"type": "text", "text": FRAME_PROMPT},
                {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip
            try:
                reply = await complete(client, target, "app", messages, frame_tokens)
            except httpx.HTTPError as exc:
                reply = {"status": None, "error": f"{type(exc).__name__}: {exc}"}
            if reply["status"] == 200:
                answered.append(time.perf_counter())
            elif not stop.is_set():
                errors.append(f"HTTP {reply['status']}: {reply['error'][:200]}")
                await asyncio.sleep(1)

    async with http() as client:
        # Warm: the model loaded, the encoder's and the decoder's kernels run once.
        await chat(client, target, "person", QUESTION.format(n=salt), 4)
        warm = await complete(client, target, "app", [{"role": "user", "content": [
            {"type": "text", "text": FRAME_PROMPT},
            {"type": "image_url", "image_url": {"url": frame(salt, frames.size)}}]}], 4)
        if warm["status"] != 200:
            raise RuntimeError(f"the warm-up frame: HTTP {warm['status']}: {warm['error']}")
        cameras = [asyncio.create_task(camera(client)) for _ in range(clients)]
        await asyncio.sleep(settle_s)
        started = time.perf_counter()
        chats = []
        while time.perf_counter() - started < duration_s:
            chats.append(await chat(client, target, "person",
                                    QUESTION.format(n=salt + 1 + len(chats)), person_tokens))
            await asyncio.sleep(gap_s)
        ended = time.perf_counter()
        stop.set()
        for task in cameras:
            task.cancel()
        await asyncio.gather(*cameras, return_exceptions=True)
    failed = [a.error for a in chats if a.error]
    if failed:
        raise RuntimeError(f"the person's chats failed: {failed[0]}")
    gaps = [g for a in chats for g in a.gaps()]
    frames_done = sum(started <= t <= ended for t in answered)
    return {"person_itl_p50_s": p(gaps, 0.5), "person_itl_p99_s": p(gaps, 0.99),
            "person_itl_max_s": max(gaps) if gaps else None,
            "person_ttft_p50_s": statistics.median(a.ttft or 0.0 for a in chats),
            "person_chats": len(chats), "person_gaps": len(gaps),
            "frames_answered": frames_done, "window_s": ended - started,
            "frames_per_minute": 60 * frames_done / (ended - started),
            "frame_errors": len(errors), "first_frame_error": errors[0] if errors else None,
            "frames_made_late": frames.ran_out}  # fmt: skip


def measure_stall(server: Server, args, salt: int) -> dict:
    target = server.start()
    try:
        frames = Frames(salt + 1000, args.frame_size, args.frames_ahead)
        return asyncio.run(stall(target, clients=args.clients, duration_s=args.duration,
                                 settle_s=args.settle, frames=frames,
                                 frame_tokens=args.frame_tokens,
                                 person_tokens=args.person_tokens, gap_s=0.3,
                                 salt=salt))  # fmt: skip
    finally:
        server.stop()


# --- the summary ---------------------------------------------------------------------------------


def summarize(rows: dict) -> dict:
    """The figures from each side's rows: `rows[side]` holds "answers", "cache", "bad" (from
    tiny_suite) and "stall" (a list, one per round). The appliance's figures are bare, llama-
    server's end in `_llama_server`; comparisons need both sides."""
    results: dict = {}
    for side in SIDES:
        row = rows.get(side)
        if not row:
            continue
        tag = "" if side == "appliance" else "_llama_server"
        for case, reply in (row.get("answers") or {}).items():
            results[f"answers_{case}_text{tag}"] = reply["text"]
            results[f"answers_{case}_prompt_tokens{tag}"] = reply["prompt_tokens"]
        for what, reply in (row.get("cache") or {}).items():
            if reply["prompt_tokens"]:
                results[f"{what}_cached_share{tag}"] = reply["cached"] / reply["prompt_tokens"]
        bad = row.get("bad") or {}
        for kind, found in bad.items():
            results[f"bad_{kind}_status{tag}"] = found["status"]
            results[f"bad_{kind}_next_status{tag}"] = found["next_status"]
        if bad:
            results[f"bad_input_refused_and_next_answered{tag}"] = all(
                found["status"] is not None and 400 <= found["status"] < 500
                and found["next_status"] == 200 for found in bad.values())  # fmt: skip
        stalls = row.get("stall") or []
        for key in ("person_itl_p50_s", "person_itl_p99_s", "person_itl_max_s",
                    "person_ttft_p50_s", "frames_per_minute"):  # fmt: skip
            values = [s[key] for s in stalls if s.get(key) is not None]
            if values:
                results[f"{key}{tag}"] = statistics.median(values)
        if stalls:
            results[f"frame_errors{tag}"] = sum(s["frame_errors"] for s in stalls)
    for case in CASES:
        texts = [results.get(f"answers_{case}_{k}") for k in ("text", "text_llama_server")]
        counts = [results.get(f"answers_{case}_{k}")
                  for k in ("prompt_tokens", "prompt_tokens_llama_server")]  # fmt: skip
        if None not in texts and None not in counts:
            results[f"answers_{case}_match"] = texts[0] == texts[1] and counts[0] == counts[1]
    if results.get("frames_per_minute_llama_server") and "frames_per_minute" in results:
        results["frames_ratio"] = (results["frames_per_minute"]
                                   / results["frames_per_minute_llama_server"])  # fmt: skip
    return results


def goals(results: dict) -> list[dict]:
    """Each goal with its figure and whether it was met (None: not measured in this run)."""
    verdicts = []
    for what, key, op, goal in GOALS:
        value = results.get(key)
        if value is None:
            met = None
        elif op == "==":
            met = value == goal
        else:
            met = value >= goal if op == ">=" else value <= goal
        verdicts.append({"goal": what, "figure": key, "value": value, "target": f"{op} {goal}",
                         "met": met})  # fmt: skip
    return verdicts


# --- the orchestration ---------------------------------------------------------------------------


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="the llama-server binary")
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4, help="llama-server's -np")
    parser.add_argument("--ctx", type=int, default=4096, help="context per sequence")
    parser.add_argument("--rounds", type=int, default=2, help="of stall")
    parser.add_argument("--duration", type=float, default=60.0, help="stall's window, seconds")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds the cameras run before the window opens")
    parser.add_argument("--clients", type=int, default=3, help="cameras")
    parser.add_argument("--frame-size", default="320x240", help="camera frames, WxH pixels")
    parser.add_argument("--frames-ahead", type=int, default=240,
                        help="camera frames made before the window")
    parser.add_argument("--frame-tokens", type=int, default=24, help="max_tokens per frame")
    parser.add_argument("--person-tokens", type=int, default=64, help="max_tokens per chat")
    parser.add_argument("--answer-tokens", type=int, default=32,
                        help="max_tokens for answers and cache")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: one round, a 15 s window, fewer frames made ahead")
    args = parser.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    args.sides = [s for s in args.sides.split(",") if s]
    if unknown := (set(args.only) - set(SCENARIOS)) | (set(args.sides) - set(SIDES)):
        parser.error(f"unknown scenarios or sides: {', '.join(sorted(unknown))}")
    width, _, height = args.frame_size.partition("x")
    args.frame_size = (int(width), int(height))
    if args.quick:
        args.rounds, args.duration, args.settle = 1, 15.0, 3.0
        args.frames_ahead = min(args.frames_ahead, 40)
    return args


def main() -> None:
    args = options()
    require(args.model, args.llama_server, args.sides)
    started = time.perf_counter()
    rows: dict = {side: {} for side in args.sides}
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        tiny = write_projector(Path(tmp) / "mmproj-tiny.gguf", Path(args.model))
        if {"answers", "cache", "bad"} & set(args.only):
            for side in args.sides:
                rows[side].update(tiny_suite(side, tiny, args, args.only))
        if "stall" in args.only:
            vitb = write_projector(Path(tmp) / "mmproj-vitb.gguf", Path(args.model), **VITB)
            log(f"  the ViT-B-sized projector: {vitb.stat().st_size / 1e6:.0f} MB")
            servers = {side: make(side, vitb, ENTRIES["vitb"], args) for side in args.sides}
            try:
                for server in servers.values():
                    server.setup()
                for r in range(args.rounds):
                    order = list(servers.items())
                    order = order[r % len(order):] + order[:r % len(order)]
                    for side, server in order:
                        row = measure_stall(server, args, salt=100_000 * (r + 1))
                        rows[side].setdefault("stall", []).append(row)
                        log(f"  round {r} {side}: the person's ITL p50 "
                            f"{1000 * (row['person_itl_p50_s'] or 0):.0f} ms, p99 "
                            f"{1000 * (row['person_itl_p99_s'] or 0):.0f} ms, max "
                            f"{1000 * (row['person_itl_max_s'] or 0):.0f} ms "
                            f"({row['person_gaps']} gaps in {row['person_chats']} chats; TTFT "
                            f"p50 {row['person_ttft_p50_s']:.2f} s); frames answered "
                            f"{row['frames_answered']} in {row['window_s']:.0f} s = "
                            f"{row['frames_per_minute']:.1f}/min ({row['frame_errors']} errors"
                            f"{': ' + row['first_frame_error'] if row['first_frame_error'] else ''}"
                            f"; {row['frames_made_late']} frames made in the window)")  # fmt: skip
            finally:
                for server in servers.values():
                    server.close()
    results = summarize(rows)
    log(f"goals ({time.perf_counter() - started:.0f} s in all):")
    for verdict in goals(results):
        value = verdict["value"]
        shown = f"{value:.3f}" if isinstance(value, float) else value
        state = {True: "met", False: "NOT met", None: "not measured"}[verdict["met"]]
        log(f"  {verdict['goal']}: {shown} (goal {verdict['target']}): {state}")
    for key in ("person_itl_p99_s_llama_server", "second_turn_cached_share_llama_server",
                "bad_input_refused_and_next_answered_llama_server"):  # fmt: skip
        if key in results:
            log(f"  llama-server for comparison: {key} {results[key]}")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                      for k, v in results.items()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
