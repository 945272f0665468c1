"""Benchmark: fill in the middle (issue 31), the appliance against llama-server on the same code
model.

    python bench/infill.py --llama-server PATH [--sides appliance,llama-server]
                           [--only answers,latency] [--cases plain,special_text,...]
                           [--threads 2] [--rounds 10]

The code model is the starter model with FIM token ids in its header (tests/code_model.py),
written at bench time into a temporary directory. Each side is a server started fresh in
processes of its own (bench/servers.py): llama-server with -np 4, -c 4 × --ctx and -b/-ub 512;
the appliance in embedded mode with the code model imported into its data directory and set to
the same context per sequence and batch (the /infill layout cuts by both). The client is this
process.

Measured:
  answers  temperature 0, /infill's `content` and `tokens_evaluated` (the prompt's tokens) for
           a prefix and suffix without and with the current line's `prompt`, the same with
           input_extra (three files' chunks), a prefix and suffix longer than the layout
           keeps, and code (prefix, suffix, a chunk and its file name) that spells control
           tokens, plain characters on both servers, with a `prompt` that spells one too,
           parsed on both; each read cold (a server started for it). On the appliance also
           Ollama's /api/generate and OpenAI's /v1/completions with `suffix` against
           llama-server's /infill without input_extra (with the no_prompt case).
  latency  a short FIM request (n_predict 8, a new keystroke each time) alone, then while
           chats stream long answers one after another (another app's, interactive too): the
           FIM request's latency p50 and max at the client.
           Figures on a shared, loaded box are noisy.

It prints a line per measurement and last ONE JSON line.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import QUESTION, Target, chat  # noqa: E402
from bench.servers import Appliance, LlamaServer, Server, require  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402
from tests.code_model import write_code_model  # noqa: E402

SIDES = ("appliance", "llama-server")
CODER = "smollm2-coder"
PREFIX = ("import math\n\n\ndef area(radius):\n    \"\"\"The area of a circle.\"\"\"\n"
          "    return math.pi * radius ** 2\n\n\ndef circumference(radius):\n")  # fmt: skip
SUFFIX = "\n\n\nprint(area(2), circumference(2))\n"
EXTRA = [
    {"filename": "geometry/shapes.py", "text": "class Circle:\n    def __init__(self, r):\n"
                                                "        self.r = r\n"},
    {"filename": "geometry/units.py", "text": "CM_PER_INCH = 2.54\n\n\ndef to_cm(inches):\n"
                                               "    return inches * CM_PER_INCH\n"},
    {"filename": "README.md", "text": "# geometry\n\nAreas and lengths of shapes.\n"},
]  # fmt: skip
CASES = {
    "no_prompt": {"input_prefix": PREFIX, "input_suffix": SUFFIX},  # as Ollama's and OpenAI's
    "plain": {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    "},
    "extra": {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    ",
              "input_extra": EXTRA},
    "long_prefix": {"input_prefix": "x = 0\n" * 400 + PREFIX, "input_suffix": SUFFIX * 40},
    # SmolLM2's end of text and the code model's FIM tokens (tests/code_model.py), spelled.
    "special_text": {"input_prefix": "# <|endoftext|> <issue_start>\n" + PREFIX,
                     "input_suffix": SUFFIX + "# <issue_comment><|endoftext|>\n",
                     "prompt": "    <|endoftext|>",
                     "input_extra": [{"filename": "<file_sep>.py",
                                      "text": "TOKENS = '<issue_closed><|endoftext|>'\n"}]},
}  # fmt: skip
GREEDY = {"temperature": 0, "n_predict": 32}


def log(message: str) -> None:
    print(message, flush=True)


def make(side: str, model: Path, args) -> Server:
    if side == "appliance":
        settings = (f"from inference.models import LLMModel; LLMModel.objects.filter("
                    f"name={CODER!r}).update(n_ctx={args.ctx}, n_batch=512, n_ubatch=512, "
                    f"parallel=4, keep_alive='-1')")  # fmt: skip
        return Appliance(args.threads, model=CODER, extra_setup=(
            ("import_model", str(model), "--name", CODER), ("shell", "-c", settings)))
    return LlamaServer(args.llama_server, str(model), args.threads, 4, args.ctx,
                       ("-b", "512", "-ub", "512"))  # fmt: skip


def client() -> httpx.AsyncClient:
    # A connection per request: llama-server closes kept-alive connections early.
    return httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10),
                             limits=httpx.Limits(max_keepalive_connections=0))  # fmt: skip


async def infill(http: httpx.AsyncClient, target: Target, body: dict) -> dict:
    response = await http.post(f"{target.url}/infill", headers=target.headers["person"],
                               json={"model": target.model, **body})  # fmt: skip
    if response.status_code != 200:
        raise RuntimeError(f"/infill: HTTP {response.status_code}: {response.text[:300]}")
    return response.json()


def cold(side: str, model: Path, args, ask) -> dict:
    """`ask(http, target)`'s result on a server started fresh for it: an answer read cold, as
    a prompt that shares even a few cached tokens with an earlier one is prefilled from another
    position, and its greedy answer may differ by a near tie (on either server)."""
    async def asking() -> dict:
        async with client() as http:
            return await ask(http, target)

    server = make(side, model, args)
    try:
        server.setup()
        target = server.start()
        return asyncio.run(asking())
    finally:
        server.close()


def answers(side: str, model: Path, args) -> dict:
    out = {}
    for case in args.cases:
        body = CASES[case]
        reply = cold(side, model, args, lambda http, target, body=body:
                     infill(http, target, {**body, **GREEDY}))  # fmt: skip
        out[case] = {"content": reply["content"], "prompt_tokens": reply["tokens_evaluated"]}
        log(f"  {side} {case}: {reply['tokens_evaluated']} prompt tokens, "
            f"{reply['content'][:60]!r}")  # fmt: skip
    if side == "appliance" and "no_prompt" in args.cases:
        out["suffix"] = {dialect: cold(side, model, args, lambda http, target, d=dialect:
                                       suffix_answer(http, target, d))
                         for dialect in ("ollama", "openai")}  # fmt: skip
        log(f"  appliance suffix: {out['suffix']}")
    return out


async def suffix_answer(http: httpx.AsyncClient, target: Target, dialect: str) -> dict:
    """Ollama's or OpenAI's `suffix` on the appliance (laid out as /infill without extra)."""
    headers = target.headers["person"]
    if dialect == "ollama":
        reply = (await http.post(f"{target.url}/api/generate", headers=headers, json={
            "model": target.model, "prompt": PREFIX, "suffix": SUFFIX, "raw": True,
            "stream": False, "options": {"temperature": 0,
                                         "num_predict": GREEDY["n_predict"]}})).json()
        return {"content": reply.get("response"), "prompt_tokens": reply["prompt_eval_count"]}
    reply = (await http.post(f"{target.url}/v1/completions", headers=headers, json={
        "model": target.model, "prompt": PREFIX, "suffix": SUFFIX, "temperature": 0,
        "max_tokens": GREEDY["n_predict"]})).json()
    return {"content": reply["choices"][0]["text"],
            "prompt_tokens": reply["usage"]["prompt_tokens"]}


async def fim_latencies(target: Target, rounds: int, salt: int) -> list[float]:
    """`rounds` short FIM requests one after another, each a new keystroke on the same file."""
    times = []
    async with client() as http:
        for i in range(rounds):
            started = time.perf_counter()
            await infill(http, target, {"input_prefix": PREFIX + f"    r{salt + i}",
                                        "input_suffix": SUFFIX, "n_predict": 8,
                                        "temperature": 0})  # fmt: skip
            times.append(time.perf_counter() - started)
    return times


async def chats(http: httpx.AsyncClient, target: Target, tokens: list[float]) -> None:
    """Chats one after another for as long as it is let, each arrival of text noted in
    `tokens`: a person's long answers, the model's own ends included."""
    n = 7
    while True:
        answer = await chat(http, target, "app", QUESTION.format(n=n), 400,
                            on_token=tokens.append)  # fmt: skip
        if answer.error:
            raise RuntimeError(f"chat: {answer.error}")
        n += 1


async def beside_chat(target: Target, rounds: int) -> dict:
    alone = await fim_latencies(target, rounds, salt=0)
    tokens: list[float] = []
    async with client() as http:
        streaming = asyncio.create_task(chats(http, target, tokens))
        while not tokens:  # the chat is decoding
            if streaming.done():
                streaming.result()  # its error
            await asyncio.sleep(0.05)
        beside = await fim_latencies(target, rounds, salt=1000)
        still = not streaming.done()
        streaming.cancel()
        try:
            await streaming
        except asyncio.CancelledError:
            pass
    return {"alone_p50_s": statistics.median(alone), "alone_max_s": max(alone),
            "beside_chat_p50_s": statistics.median(beside), "beside_chat_max_s": max(beside),
            "chat_ran_throughout": still}  # fmt: skip


def run_side(side: str, model: Path, args) -> dict:
    server = make(side, model, args)
    try:
        server.setup()
        target = server.start()
        row = {"latency": asyncio.run(beside_chat(target, args.rounds))}
        lat = row["latency"]
        log(f"  {side} FIM latency: alone p50 {lat['alone_p50_s'] * 1000:.0f} ms, max "
            f"{lat['alone_max_s'] * 1000:.0f} ms; beside a streaming chat p50 "
            f"{lat['beside_chat_p50_s'] * 1000:.0f} ms, max {lat['beside_chat_max_s'] * 1000:.0f}"
            f" ms (chat still streaming at the end: {lat['chat_ran_throughout']})")  # fmt: skip
        return row
    finally:
        server.close()


def summarize(rows: dict) -> dict:
    out: dict = {}
    for side, row in rows.items():
        key = side.replace("-", "_")
        for name, value in row.get("latency", {}).items():
            out[f"{key}_{name}"] = value
    if set(SIDES) <= set(rows) and all("answers" in row for row in rows.values()):
        ours, theirs = rows["appliance"]["answers"], rows["llama-server"]["answers"]
        for case in [case for case in CASES if case in ours and case in theirs]:
            out[f"{case}_answer_equal"] = ours[case]["content"] == theirs[case]["content"]
            out[f"{case}_prompt_tokens_equal"] = (ours[case]["prompt_tokens"]
                                                  == theirs[case]["prompt_tokens"])  # fmt: skip
        bare = theirs.get("no_prompt")
        for dialect, reply in ours.get("suffix", {}).items():
            out[f"{dialect}_suffix_answer_equal"] = reply["content"] == bare["content"]
            out[f"{dialect}_suffix_prompt_tokens_equal"] = (reply["prompt_tokens"]
                                                            == bare["prompt_tokens"])  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="the llama-server binary")
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096, help="context per sequence")
    parser.add_argument("--rounds", type=int, default=10, help="FIM requests per measurement")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--only", default="answers,latency")
    parser.add_argument("--cases", default=",".join(CASES), help="the answers' cases")
    args = parser.parse_args()
    args.cases = [s for s in args.cases.split(",") if s]
    if unknown := set(args.cases) - CASES.keys():
        parser.error(f"unknown cases: {', '.join(sorted(unknown))} (known: {', '.join(CASES)})")
    args.only = [s for s in args.only.split(",") if s]
    args.sides = [s for s in args.sides.split(",") if s]
    require(args.model, args.llama_server, args.sides)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-infill-") as tmp:
        model = write_code_model(Path(args.model), Path(tmp) / "smollm2-coder.gguf")
        for side in args.sides:
            rows[side] = {}
            if "answers" in args.only:
                rows[side]["answers"] = answers(side, model, args)
            if "latency" in args.only:
                rows[side].update(run_side(side, model, args))
    results = summarize(rows)
    for key, value in results.items():
        log(f"  {key}: {value}")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                      for k, v in results.items()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
