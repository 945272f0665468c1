"""Benchmark: reranking (issue 31), the appliance against llama-server --reranking on the same
reranker file.

    python bench/rerank.py --llama-server PATH [--documents 32] [--rounds 5] [--parallel 1]
                           [--sides appliance,llama-server] [--threads 2]

The reranker is the starter model with pooling type rank in its header (tests.rerankers), written
at bench time into a temporary directory. Each side is a server started in processes of its own
(bench/servers.py): llama-server with `--reranking`, `-np --parallel` and its defaults; the
appliance in embedded mode with the reranker imported into its data directory (`manage.py
import_model PATH --name NAME`) and every request asking for it. The client is this process.

Measured, the sides taking turns round by round (the order swapped each round):
  answers  one /v1/rerank request of --documents documents (Cohere's body) and the same as TEI's
           (`texts`): whether the order of the indices is the same on both sides, and the
           largest score difference.
  speed    documents per second: --documents documents in one request, the wall time at the
           client, the median over --rounds rounds (after one warm-up request per side).

The starter-made reranker has no classifier head, so llama.cpp's pooled row is the hidden state
(576 floats) where a real reranker's is its n_cls_out scores: llama-server reads the score of the
n-th sequence of a batch at offset n, which for this file is only right for a batch's first
sequence. So scores are compared with llama-server at -np 1 (one pair per decode, as the
appliance runs them), and a larger --parallel measures llama-server's speed only.

It prints a line per measurement, the goals met or not (issue 31, "Done when": the same order,
scores within 0.01), and last ONE JSON line.
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import Target  # noqa: E402
from bench.servers import Appliance, LlamaServer, Server, require  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402
from tests.rerankers import write_reranker  # noqa: E402

SIDES = ("appliance", "llama-server")
ENTRY = "smollm2-135m-reranker"
QUERY = "How do I keep the greenhouse warm at night in winter?"
WORDS = ("greenhouse heater night winter frost tomato seedlings insulation bubble wrap compost "
         "thermal mass water barrels vent fan solar panel battery garage router firmware update "
         "kitchen lights sunset schedule garden hose pipe freeze cover fleece temperature sensor "
         "thermostat humidity soil roof glass door draught candle paraffin electric mat").split()
SCORE_TOLERANCE = 0.01


def log(message: str) -> None:
    print(message, flush=True)


def documents(count: int, seed: int = 31) -> list[str]:
    """`count` documents of 20 to 80 words drawn from WORDS: distinct, some about the query."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))).capitalize() + "."
            for _ in range(count)]  # fmt: skip


def make(side: str, path: Path, args) -> Server:
    if side == "appliance":
        return Appliance(args.threads, model=ENTRY,
                         extra_setup=(("import_model", str(path), "--name", ENTRY),))  # fmt: skip
    return LlamaServer(args.llama_server, str(path), args.threads, args.parallel, args.ctx,
                       ("--reranking",))  # fmt: skip


def rerank(target: Target, body: dict, path: str = "/v1/rerank") -> tuple[object, float]:
    started = time.perf_counter()
    answer = httpx.post(target.url + path, json={"model": target.model, **body},
                        headers=target.headers["app"], timeout=600)  # fmt: skip
    seconds = time.perf_counter() - started
    if answer.status_code != 200:
        raise RuntimeError(f"{path} answered {answer.status_code}: {answer.text[:500]}")
    return answer.json(), seconds


def ranked(answer) -> list[tuple[int, float]]:
    """(index, score) best first, from Cohere's object or TEI's array."""
    rows = answer["results"] if isinstance(answer, dict) else answer
    return [(r["index"], r.get("relevance_score", r.get("score"))) for r in rows]


def compare(ours: list[tuple[int, float]], theirs: list[tuple[int, float]]) -> dict:
    mine, other = dict(ours), dict(theirs)
    return {"same_order": [i for i, _ in ours] == [i for i, _ in theirs],
            "max_score_difference": max(abs(mine[i] - other[i]) for i in mine)}  # fmt: skip


def measure(server: Server, docs: list[str]) -> dict:
    target = server.start()
    try:
        rerank(target, {"query": QUERY, "documents": docs[:2]})  # warm-up: load, first decode
        cohere, seconds = rerank(target, {"query": QUERY, "documents": docs})
        tei, _ = rerank(target, {"query": QUERY, "texts": docs}, "/rerank")
        return {"cohere": ranked(cohere), "tei": ranked(tei), "seconds": seconds,
                "prompt_tokens": cohere["usage"]["prompt_tokens"]}  # fmt: skip
    finally:
        server.stop()


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", help="the llama-server binary")
    parser.add_argument("--model", default=str(starter_model_path() or ""),
                        help="the GGUF made into a reranker (default: the starter)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1, help="llama-server's -np")
    parser.add_argument("--ctx", type=int, default=2048, help="context per sequence")
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sides", default=",".join(SIDES))
    args = parser.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if unknown := set(args.sides) - set(SIDES):
        parser.error(f"unknown sides: {', '.join(sorted(unknown))}")
    return args


def main() -> None:
    args = options()
    require(args.model, args.llama_server, args.sides)
    docs = documents(args.documents)
    rows: dict[str, list[dict]] = {side: [] for side in args.sides}
    with tempfile.TemporaryDirectory(prefix="bench-rerank-") as tmp:
        path = write_reranker(Path(args.model), Path(tmp) / "reranker.gguf")
        servers = {side: make(side, path, args) for side in args.sides}
        try:
            for server in servers.values():
                server.setup()
            for r in range(args.rounds):
                order = list(servers.items())
                order = order[r % len(order):] + order[:r % len(order)]
                for side, server in order:
                    row = measure(server, docs)
                    rows[side].append(row)
                    log(f"  round {r} {side}: {args.documents} documents in "
                        f"{row['seconds']:.2f} s = {args.documents / row['seconds']:.1f}/s "
                        f"({row['prompt_tokens']} tokens)")  # fmt: skip
        finally:
            for server in servers.values():
                server.close()
    results: dict = {"documents": args.documents, "rounds": args.rounds,
                     "llama_server_parallel": args.parallel}  # fmt: skip
    for side, side_rows in rows.items():
        key = side.replace("-", "_")
        results[f"docs_per_second_{key}"] = args.documents / statistics.median(
            row["seconds"] for row in side_rows)
        results[f"prompt_tokens_{key}"] = side_rows[0]["prompt_tokens"]
    if len(rows) == 2:
        ours, theirs = rows["appliance"][0], rows["llama-server"][0]
        for shape in ("cohere", "tei"):
            for name, value in compare(ours[shape], theirs[shape]).items():
                results[f"{shape}_{name}"] = value
        results["docs_per_second_ratio"] = (results["docs_per_second_appliance"]
                                            / results["docs_per_second_llama_server"])  # fmt: skip
        results["same_prompt_tokens"] = ours["prompt_tokens"] == theirs["prompt_tokens"]
        met = (results["cohere_same_order"] and results["tei_same_order"]
               and results["cohere_max_score_difference"] <= SCORE_TOLERANCE)  # fmt: skip
        verdict = "met" if met else "NOT met"
        if args.parallel > 1:  # the module's docstring: not comparable on this file
            verdict = f"not measured at -np {args.parallel} (use --parallel 1)"
        log(f"goal: llama-server's order, scores within {SCORE_TOLERANCE}: {verdict} "
            f"(largest difference {results['cohere_max_score_difference']:.2e})")  # fmt: skip
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v
                      for k, v in results.items()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
