"""Runner-process sides: the product's path. The model runs in a RunnerProcess child (a fresh
interpreter that owns llama.cpp); this client process never imports llama_cpp."""

import statistics
import sys
import time

from bench.measure import client_decode, client_side, client_ttfts
from inference.engine.runner_config import RunnerConfig
from inference.serving.runner_process import RunnerProcess


def start_runner(name: str, args: dict) -> RunnerProcess:
    return RunnerProcess(name, RunnerConfig(**args["config"]), itl_target=args["itl_target"],
                         max_queue=64).start()  # fmt: skip


def no_llama_here(result: dict) -> dict:
    if "llama_cpp" in sys.modules:
        raise RuntimeError("a runner-process client imported llama_cpp")
    return result


def side_ipc_runner(args: dict) -> dict:
    """The IPC comparison's runner-process side: the same requests as ipc_engine."""
    proc = start_runner("smol", args)
    try:
        result = client_side(proc, args)
    finally:
        proc.shutdown()
    return no_llama_here(result)


def side_second_model(args: dict) -> dict:
    """Model 1's decode tok/s alone, then with a second runner on the same GGUF (another name)
    loaded and idle, interleaved over rounds: alone, second started, with, second stopped, ...
    Model 1's runner stays up throughout, as it would while someone loads another model."""
    tokens = args["tokens"]
    first = start_runner("smol", args)
    rounds = []
    try:
        client_ttfts(first, [tokens["warm"]], max_tokens=4)
        for r in range(args["rounds"]):
            row = {}
            alone = [client_decode(first, tokens[f"alone{r}_{i}"], args["decode_steps"])
                     for i in range(args["decode_requests"])]  # fmt: skip
            second = start_runner("smol-second", args)
            try:
                time.sleep(args["settle_s"])  # its load-time warm-up is over; now it idles
                both = [client_decode(first, tokens[f"with{r}_{i}"], args["decode_steps"])
                        for i in range(args["decode_requests"])]  # fmt: skip
                row["second_alive"] = second.alive and not second.busy
                row["second_pid"] = second.pid
            finally:
                second.shutdown()
            for name, rows in (("alone", alone), ("with", both)):
                row[f"{name}_tps"] = statistics.median([d["server_tps"] for d in rows])
                row[f"{name}_client_tps"] = statistics.median([d["client_tps"] for d in rows])
                row[f"{name}_ended_early"] = any(
                    d["tokens"] < args["decode_steps"] + 1 for d in rows)
            rounds.append(row)
    finally:
        first.shutdown()
    return no_llama_here({"first_pid": first.pid, "rounds": rounds})
