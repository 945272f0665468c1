"""The GPU check (issue 24): on a machine with an NVIDIA GPU, CUDA's compiler and no network,
install from .gpu-carry/ (bench/gpu/prepare.py), build for that card, measure, write ONE JSON.

    python3 bench/gpu/check.py [--carry .gpu-carry] [--out DIR] [--budget-s 570]
    python3 bench/gpu/check.py --cpu [--build] [--llama-bin DIR]     # the same steps on a CPU

Steps, each timed and recorded in the JSON as it ends (a step that fails or would outrun the
budget is recorded as such, and the JSON is always written):
 1. machine: the card (nvidia-smi), nvcc, Python.
 2. install: the carried wheels into a folder of their own, first on PYTHONPATH (build.py).
 3. build: llama.cpp from llama-cpp-python's trimmed source for this card's architecture only:
    the libraries the engine loads, llama-bench, llama-batched-bench and llama-server, one
    compile (build.py); then whether llama_cpp offloads (llama_supports_gpu_offload).
 4. model: the check's model, the starter's tokenizer on a 1.7B-class llama (model.py).
 5. llama_bench: pp512 and tg128 of that build.
 6. engine: the engine's prefill (a 512-token prompt) and single-stream decode (128 tokens)
    and four streams batched, each in a fresh process (bench/side.py: engine_basic), and raw
    llama-cpp-python's loops on the same prompts (raw_basic); each against llama-bench.
 7. batched: llama-batched-bench, 4 sequences of 32 prompt and 128 generated tokens: llama.cpp's
    own batched decode, which the engine's four streams are held to.
 8. stall: stream A decoding while B's 8,000-token prompt is read, on the engine (engine_stall,
    chunked prefill, the default ITL target) and on llama-server of the same build, with B's
    time to first token alone (server_stall.py).
 9. appliance: served end to end (appliance_check.py): the estimate, one chat answer, /metrics'
    GPU series, /healthz and the dashboard's panels read back from its socket, the estimate
    against NVML's count for the runner process.
10. goals: the issue's goals, each met or not, from the figures above.

--cpu runs the same steps on this machine with a tiny model and small sizes: this virtualenv's
llama_cpp (or, with --build, one built from the carried source for the CPU) and the tools in
--llama-bin (or the ones --build made); steps without a tool are recorded as skipped.

Standard library only until the install step: on the GPU machine nothing else is there yet.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu import build  # noqa: E402
from tools.llama_build import card_architectures, choose  # noqa: E402

ITL_TARGET_S = 0.13  # the appliance's default (ITL_TARGET_MS)
SIZES = {
    "gpu": dict(shape="gpu", prefill_tokens=512, decode_steps=128, batch4_steps=128,
                requests=3, b_tokens=8000, a_tokens=24, a_warm_tokens=8, ctx_per_seq=16384,
                bench_prompt=512, bench_gen=128, bench_reps=3),
    "cpu": dict(shape="tiny", prefill_tokens=128, decode_steps=32, batch4_steps=32,
                requests=1, b_tokens=600, a_tokens=24, a_warm_tokens=8, ctx_per_seq=2048,
                bench_prompt=128, bench_gen=32, bench_reps=1),
}  # fmt: skip
GOALS = [  # (name, figure, "<=" or ">=", goal): issue 24's, on the GPU
    ("engine decode vs llama-bench tg", "decode_ratio", ">=", 0.95),
    ("engine prefill vs llama-bench pp", "prefill_ratio", ">=", 0.95),
    ("four streams vs llama.cpp's batched decode", "batch4_ratio", ">=", 0.90),
    ("A's longest gap while B is read (s)", "engine_a_itl_max_s", "<=", ITL_TARGET_S),
    ("B's TTFT with A / alone", "engine_b_ttft_ratio", "<=", 1.2),
    ("the estimate within 10 % of NVML", "estimate_error_vs_nvml", "<=", 0.10),
    ("the whole check (s)", "check_seconds", "<=", 600),
]  # fmt: skip


class Check:
    """The JSON being written, one step at a time."""

    def __init__(self, out: Path, budget_s: float, mode: str):
        self.out = out
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.result: dict = {"check": "issue 24: the box with a GPU", "mode": mode,
                             "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "steps": {},
                             "figures": {}}  # fmt: skip
        self.write()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def step(self, name: str, needs_s: float, run, *args, **kwargs):
        """Run one step if `needs_s` seconds are left; record its result, time and error."""
        if self.left() < needs_s:
            self.result["steps"][name] = {"ok": False, "skipped": f"{self.left():.0f} s left, "
                                          f"it needs about {needs_s:.0f}"}  # fmt: skip
            self.write()
            return None
        print(f"[{time.monotonic() - self.started:5.0f} s] {name}", flush=True)
        started = time.perf_counter()
        record: dict = {"ok": True}
        value = None
        try:
            value = run(*args, **kwargs)
            if isinstance(value, dict):
                record.update(value)
        except Exception as exc:  # noqa: BLE001 - the check goes on and says what failed
            record.update(ok=False, error=f"{type(exc).__name__}: {exc}",
                          trace=traceback.format_exc()[-2000:])  # fmt: skip
            value = None
        record["seconds"] = round(time.perf_counter() - started, 1)
        self.result["steps"][name] = record
        self.write()
        return value

    def skip(self, name: str, why: str) -> None:
        self.result["steps"][name] = {"ok": False, "skipped": why}
        self.write()

    def write(self) -> None:
        self.result["check_seconds"] = round(time.monotonic() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "gpu-check.json"
        path.write_text(json.dumps(self.result, indent=1, default=str) + "\n")


# --- the steps ---------------------------------------------------------------------------------


def machine() -> dict:
    def answer(*command: str) -> str | None:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    architectures, card = card_architectures(dict(os.environ))
    wanted = choose({k: v for k, v in os.environ.items() if k != "LLAMA_GPU"})
    return {"card": card, "architectures": architectures,
            "make_install_builds": {"backend": wanted.backend, "cmake_args": wanted.cmake_args,
                                    "reason": wanted.reason},
            "nvidia_smi": answer("nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                 "memory.used,compute_cap", "--format=csv,noheader"),
            "nvcc": (answer("nvcc", "--version") or "").splitlines()[-1:],
            "python": platform.python_version(), "cpus": os.cpu_count()}  # fmt: skip


def run_side(name: str, args: dict, env: dict, timeout: float) -> dict:
    """One bench side in a fresh process (bench/side.py), as `make bench` runs them."""
    from bench.side import RESULT_MARK

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(args, f)
    done = subprocess.run([sys.executable, "-m", "bench.side", name, f"@{f.name}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    os.unlink(f.name)
    marked = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not marked:
        raise RuntimeError(f"side {name} failed:\n{(done.stdout + done.stderr)[-2500:]}")
    return json.loads(marked[-1][len(RESULT_MARK) :])


def llama_bench(binary: Path, model: Path, sizes: dict, threads: int) -> dict:
    done = subprocess.run(
        [str(binary), "-m", str(model), "-p", str(sizes["bench_prompt"]),
         "-n", str(sizes["bench_gen"]), "-ngl", "99", "-fa", "1", "-t", str(threads),
         "-r", str(sizes["bench_reps"]), "-o", "json"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    pp = next(r for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return {"pp_tps": pp["avg_ts"], "tg_tps": tg["avg_ts"], "pp_tokens": pp["n_prompt"],
            "tg_tokens": tg["n_gen"], "backends": pp.get("backends"),
            "gpu_info": pp.get("gpu_info"), "build_commit": pp.get("build_commit")}  # fmt: skip


def batched_bench(binary: Path, model: Path, sizes: dict, threads: int) -> dict:
    done = subprocess.run(
        [str(binary), "-m", str(model), "-c", "8192", "-b", "2048", "-ub", "512", "-npp", "32",
         "-ntg", str(sizes["batch4_steps"]), "-npl", "1,4", "-ngl", "99", "-fa", "on",
         "-t", str(threads), "--output-format", "jsonl"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()
            if line.startswith("{") and "speed_tg" in line]  # fmt: skip
    by_streams = {row["pl"]: row for row in rows}
    return {"tg_tps_1": by_streams[1]["speed_tg"], "tg_tps_4": by_streams[4]["speed_tg"]}


def server_stall_step(binary: Path, model: Path, sizes: dict, threads: int) -> dict:
    from bench.gpu.server_stall import server_stall
    from bench.servers import LlamaServer

    server = LlamaServer(str(binary), str(model), threads, parallel=2,
                         ctx_per_seq=sizes["ctx_per_seq"],
                         extra=("-ngl", "99", "-fa", "on", "-b", "2048", "-ub", "512"))  # fmt: skip
    target = server.start()
    try:
        return server_stall(target.url, {
            "b_tokens": sizes["b_tokens"], "a_tokens": sizes["a_tokens"],
            "a_warm_tokens": sizes["a_warm_tokens"], "salt": 800,
            "a_max_tokens": sizes["ctx_per_seq"] - sizes["a_tokens"] - 1,
        })  # fmt: skip
    finally:
        server.close()


def goals(figures: dict) -> list[dict]:
    verdicts = []
    for name, key, op, goal in GOALS:
        value = figures.get(key)
        met = None if value is None else (value >= goal if op == ">=" else value <= goal)
        verdicts.append({"goal": name, "figure": key, "value": value, "target": f"{op} {goal}",
                         "met": met})  # fmt: skip
    return verdicts


# --- the whole ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--carry", type=Path, default=ROOT / ".gpu-carry")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gpu-check")
    parser.add_argument("--budget-s", type=float, default=570.0)
    parser.add_argument("--cpu", action="store_true", help="the dry run on a CPU")
    parser.add_argument("--build", action="store_true", help="with --cpu: build from the carry")
    parser.add_argument("--llama-bin", type=Path, help="with --cpu: prebuilt llama.cpp tools")
    args = parser.parse_args()
    mode = "cpu" if args.cpu else "gpu"
    sizes = SIZES[mode]
    work: Path = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    check = Check(args.out, args.budget_s, mode)
    figures = check.result["figures"]
    threads = os.cpu_count() or 1
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    site = work / "site"

    check.step("machine", 0, machine)
    if mode == "gpu" or args.build:
        if mode == "gpu":
            check.step("install", 30, build.install_wheels, args.carry / "wheels", site,
                       work / "install.log")  # fmt: skip
        built = check.step("build", 120, build_all, args, site, work, mode, check)
        if built is None:  # nothing to measure: say why, with the build's log
            return finish(check, work, args.out)
        bin_dir = Path(built["bin"])
        if built.get("cublas_from_pip"):  # the toolkit had none: the libraries find pip's
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                filter(None, [built["cublas_from_pip"], env.get("LD_LIBRARY_PATH")]))
            os.environ["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"]
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")])
        sys.path.insert(0, str(site))
    else:
        bin_dir = args.llama_bin
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    model = work / f"check-{sizes['shape']}.gguf"
    check.step("model", 20, make_model, args.carry / "starter-skeleton.gguf", model, sizes)

    def tool(name: str) -> Path | None:
        path = bin_dir / name if bin_dir else None
        return path if path is not None and path.exists() else None

    # The engine as the fit loads it on a GPU (every layer, a 2048-token batch, f16 KV, flash
    # attention), with make bench's slots: 4 running and 4 cached for the basic figures (one of
    # the 8 is kept for a person's first request, so four streams run together), 2 for the
    # stall scenario, as llama-server gets them (-np 2).
    config = {"model_path": str(model), "ctx_per_seq": 2048, "parallel": 4, "cache_slots": 4,
              "n_batch": 2048, "n_ubatch": 512, "n_gpu_layers": -1, "n_threads": threads,
              "flash_attn": True, "kv_type": "f16", "use_extra_bufts": True}  # fmt: skip
    stall_config = dict(config, ctx_per_seq=sizes["ctx_per_seq"], parallel=2, cache_slots=0)
    check.result["config"] = {"engine": config, "stall": stall_config,
                              "itl_target_s": ITL_TARGET_S, "sizes": sizes}  # fmt: skip
    if tool("llama-bench"):
        bench = check.step("llama_bench", 30, llama_bench, tool("llama-bench"), model, sizes,
                           threads)  # fmt: skip
        figures["llama_bench"] = bench
    else:
        check.skip("llama_bench", "no llama-bench built")
    basic_args = {"config": config, "itl_target": ITL_TARGET_S,
                  "prefill_tokens": sizes["prefill_tokens"], "decode_steps": sizes["decode_steps"],
                  "batch4_steps": sizes["batch4_steps"],
                  "prefill_salts": [100 + i for i in range(sizes["requests"])],
                  "decode_salts": [300 + i for i in range(sizes["requests"])],
                  "batch4_salts": [500 + 10 * i
                                   for i in range(max(1, sizes["requests"] - 1))]}  # fmt: skip
    engine = check.step("engine", 40, run_side, "engine_basic", basic_args, env, 300)
    figures["engine"] = engine
    figures["raw"] = check.step("raw", 40, run_side, "raw_basic", basic_args, env, 300)
    if tool("llama-batched-bench"):
        figures["batched"] = check.step("batched", 30, batched_bench, tool("llama-batched-bench"),
                                        model, sizes, threads)  # fmt: skip
    else:
        check.skip("batched", "no llama-batched-bench built")
    stall_args = {"config": stall_config, "itl_target": ITL_TARGET_S, "b_tokens": sizes["b_tokens"],
                  "a_tokens": sizes["a_tokens"], "a_warm_tokens": sizes["a_warm_tokens"],
                  "chunked": True, "salt": 800, "warm": True}  # fmt: skip
    figures["engine_stall"] = check.step("engine_stall", 40, run_side, "engine_stall", stall_args,
                                         env, 300)  # fmt: skip
    if tool("llama-server"):
        server = tool("llama-server")
        figures["server_stall"] = check.step("server_stall", 40, server_stall_step, server,
                                             model, sizes, threads)  # fmt: skip
    else:
        check.skip("server_stall", "no llama-server built")
    from bench.gpu.appliance_check import end_to_end

    figures["appliance"] = check.step("appliance", 60, end_to_end, model, work, env)
    figures.update(ratios(figures))
    return finish(check, work, args.out)


def finish(check: Check, work: Path, out: Path) -> int:
    """The goals, the logs' ends beside the JSON, and a line per goal."""
    check.result["figures"]["check_seconds"] = round(time.monotonic() - check.started, 1)
    check.result["goals"] = goals(check.result["figures"])
    check.write()
    for log in ("install.log", "build.log", "appliance/serve.log"):
        path = work / log
        if path.exists():
            (out / path.name).write_text(path.read_text(errors="replace")[-200_000:])
    for row in check.result["goals"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[row["met"]]
        print(f"  {row['goal']}: {row['value']} ({row['target']}): {verdict}")
    return 0 if all(step.get("ok") for step in check.result["steps"].values()) else 1


def build_all(args, site: Path, work: Path, mode: str, check: Check) -> dict:
    """Steps 3's parts: unpack, build (for the card's architecture on a GPU), assemble."""
    sources = sorted(args.carry.glob("llama_cpp_python-*-trimmed.tar.gz"))
    if not sources:
        raise RuntimeError(f"no trimmed llama-cpp-python source in {args.carry}: run prepare.py")
    source = build.unpack(sources[-1], work / "src")
    architectures = None
    if mode == "gpu":
        architectures, card = card_architectures(dict(os.environ))
        if architectures is None:
            raise RuntimeError(f"no card to build for: {card}")
    made = build.build_llama(source, work / "build", work / "build.log",
                             cuda_architectures=architectures,
                             timeout=max(60.0, check.left() - 200))  # fmt: skip
    build.assemble_llama_cpp(source, Path(made["bin"]), site)
    python_path = os.pathsep.join([str(site), str(ROOT)])
    made["gpu_offload"] = build.gpu_offload(python_path, made.get("cublas_from_pip"))
    made["architectures"] = architectures
    return made


def make_model(skeleton: Path, dest: Path, sizes: dict) -> dict:
    from bench.gpu.model import synthesize

    return synthesize(skeleton, dest, sizes["shape"])


def ratios(figures: dict) -> dict:
    """The goals' figures, where the steps they come from ran."""
    found: dict = {}
    engine, bench = figures.get("engine"), figures.get("llama_bench")
    if engine and bench:
        found["decode_ratio"] = round(engine["decode_tps"] / bench["tg_tps"], 4)
        found["prefill_ratio"] = round(engine["prefill_tps"] / bench["pp_tps"], 4)
    batched = figures.get("batched")
    if engine and batched:
        found["batch4_ratio"] = round(engine["batch4_tps"] / batched["tg_tps_4"], 4)
    raw = figures.get("raw")
    if engine and raw:
        found["engine_over_raw"] = {key: round(engine[f"{key}_tps"] / raw[f"{key}_tps"], 4)
                                    for key in ("prefill", "decode", "batch4")}  # fmt: skip
    stall = figures.get("engine_stall")
    if stall:
        found["engine_a_itl_max_s"] = stall["a_itl_max_s"]
        found["engine_b_ttft_ratio"] = round(stall["b_ttft_with_a_s"] / stall["b_ttft_alone_s"], 4)
    server = figures.get("server_stall")
    if server:
        found["server_a_itl_max_s"] = server["a_itl_max_s"]
        found["server_b_ttft_ratio"] = round(server["b_ttft_with_a_s"] / server["b_ttft_alone_s"],
                                             4)  # fmt: skip
    memory = (figures.get("appliance") or {}).get("memory_check") or {}
    if memory.get("nvml_runner_bytes"):
        nvml = memory["nvml_runner_bytes"]
        found["estimate_error_vs_nvml"] = round(abs(memory["estimate_gpu_bytes"] - nvml) / nvml, 4)
    return found


if __name__ == "__main__":
    sys.exit(main())
