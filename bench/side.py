"""Run one bench side in this fresh process and print its result as the last line of stdout.

    python -m bench.side NAME JSON_ARGS        (JSON_ARGS: a JSON object, or @FILE holding one)

Only the module that NAME needs is imported: a raw side imports llama_cpp and no engine, an
engine side one engine configuration, and a runner-process side no llama_cpp at all.
"""

import importlib
import json
import logging
import sys
import traceback

RESULT_MARK = "BENCH-RESULT "

SIDES = {
    "tokenize": "bench.raw:side_tokenize",
    "raw_basic": "bench.raw:side_raw_basic",
    "raw_frontier": "bench.raw:side_raw_frontier",
    "raw_step_cost": "bench.raw:side_raw_step_cost",
    "raw_id_runs": "bench.raw:side_raw_id_runs",
    "engine_basic": "bench.engine_side:side_engine_basic",
    "engine_stall": "bench.engine_side:side_engine_stall",
    "engine_prefix": "bench.engine_side:side_engine_prefix",
    "engine_flood": "bench.engine_side:side_engine_flood",
    "engine_flood_alone": "bench.engine_side:side_engine_flood_alone",
    "raw_flood": "bench.raw:side_raw_flood",
    "ipc_engine": "bench.engine_side:side_ipc_engine",
    "ipc_runner": "bench.runner_side:side_ipc_runner",
    "second_model": "bench.runner_side:side_second_model",
    "warm_restore": "bench.warm_side:side_warm_restore",
    "warm_load": "bench.warm_side:side_warm_load",
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in SIDES:
        print(f"usage: python -m bench.side {{{','.join(SIDES)}}} JSON_ARGS", file=sys.stderr)
        return 2
    raw = argv[2]
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as f:
            raw = f.read()
    args = json.loads(raw)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    module, _, function = SIDES[argv[1]].partition(":")
    try:
        result = getattr(importlib.import_module(module), function)(args)
    except Exception:  # noqa: BLE001 - the orchestrator reports it and carries on
        traceback.print_exc()
        return 1
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
