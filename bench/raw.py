"""Raw llama.cpp baselines, written directly against llama-cpp-python's low-level API with no
engine around them. Each runs as a bench side (`python -m bench.side raw_basic ...`), in a process
of its own that no engine shares, so its OpenMP threads have the cores to themselves.

Same kernels as the engine's runner: the same threads, flash attention "auto", the model loaded
with the same `use_extra_bufts`, one KV stream per sequence (`kv_unified = false`), the same
n_batch / n_ubatch, and greedy sampling through a sampler chain per sequence.
"""

import ctypes
import statistics
import time

import llama_cpp as ll

from bench.prompts import make_tokens

_backend_ready = False


@ll.llama_log_callback
def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == 4:  # errors only: llama.cpp prints thousands of info lines per load
        print(text.decode("utf-8", errors="replace").rstrip(), flush=True)


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        ll.llama_log_set(_quiet, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _backend_ready = True


class RawModel:
    def __init__(self, path: str, *, use_extra_bufts: bool = True, vocab_only: bool = False):
        _init_backend()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 999  # as the runner's default (-1: every layer a GPU build takes)
        params.use_extra_bufts = use_extra_bufts
        params.vocab_only = vocab_only
        self.model = ll.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """The runner's own call: llama_tokenize with special-token parsing."""
        data = text.encode("utf-8", errors="replace")
        capacity = len(data) + 16
        while True:
            buffer = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special, True)
            if n >= 0:
                return list(buffer[:n])
            capacity = -n

    def close(self) -> None:
        ll.llama_model_free(self.model)


class RawContext:
    """A llama.cpp context with `n_seq` sequences, each in its own KV stream, and a greedy
    sampler chain per sequence."""

    def __init__(self, model: RawModel, *, ctx_per_seq: int, n_seq: int, n_batch: int,
                 n_ubatch: int, threads: int, flash_attn: bool = True,
                 unified: bool = False):  # fmt: skip
        params = ll.llama_context_default_params()
        params.n_ctx = ctx_per_seq * n_seq
        params.n_batch = n_batch
        params.n_ubatch = min(n_ubatch, n_batch)
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = threads
        # As the engine's runner: one KV stream per sequence; `unified` for bench/step_cost.py,
        # which weighs the runner's choice against llama-server's default (-np auto).
        params.kv_unified = unified
        params.flash_attn_type = (
            ll.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.no_perf = True
        self.ctx = ll.llama_init_from_model(model.model, params)
        if not self.ctx:
            raise RuntimeError("could not create a raw context")
        self.memory = ll.llama_get_memory(self.ctx)
        self.n_batch = n_batch
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self.samplers = []
        for _ in range(n_seq):
            chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
            self.samplers.append(chain)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of entries (token, pos, seq_id, wants_logits)."""
        batch = self.batch
        token, pos, n_seq, seq, logits = (
            batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits)  # fmt: skip
        for i, (tok, p, s, want) in enumerate(entries):
            token[i] = tok
            pos[i] = p
            n_seq[i] = 1
            seq[i][0] = s
            logits[i] = want
        batch.n_tokens = len(entries)
        rc = ll.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"raw llama_decode returned {rc}")

    def sample(self, seq: int, index: int) -> int:
        return ll.llama_sampler_sample(self.samplers[seq], self.ctx, index)

    def prefill(self, seq: int, tokens: list[int], start: int = 0) -> int:
        """Prompt tokens in batches of n_batch; returns the first sampled token."""
        part: list[int] = []
        for offset in range(0, len(tokens), self.n_batch):
            part = tokens[offset : offset + self.n_batch]
            last = offset + len(part) == len(tokens)
            self.decode([(t, start + offset + i, seq, last and i == len(part) - 1)
                         for i, t in enumerate(part)])  # fmt: skip
        return self.sample(seq, len(part) - 1)

    def clear(self) -> None:
        ll.llama_memory_clear(self.memory, True)

    def warm_up(self, tokenize) -> None:
        """A prompt and a few decode steps, then forgotten (as the runner's warm_up)."""
        ids = make_tokens(tokenize, 64, salt=99_999)
        token = self.prefill(0, ids)
        for i in range(4):
            self.decode([(token, len(ids) + i, 0, True)])
            token = self.sample(0, 0)
        self.clear()

    def close(self) -> None:
        for chain in self.samplers:
            ll.llama_sampler_free(chain)
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ctx)


# --- the measurements ------------------------------------------------------------------------


def prefill_tps(ctx: RawContext, prompt: list[int]) -> float:
    """Prompt tok/s: the whole prompt in one llama_decode (n_batch ≥ its length), then the
    first token sampled, as the engine's prefill time ends with it."""
    ctx.clear()
    started = time.perf_counter()
    ctx.prefill(0, prompt)
    return len(prompt) / (time.perf_counter() - started)


def single_decode_tps(ctx: RawContext, prompt: list[int], steps: int) -> float:
    """One sequence: prefill, then `steps` one-token llama_decode calls, each sampled."""
    ctx.clear()
    token = ctx.prefill(0, prompt)
    position = len(prompt)
    started = time.perf_counter()
    for _ in range(steps):
        ctx.decode([(token, position, 0, True)])
        token = ctx.sample(0, 0)
        position += 1
    return steps / (time.perf_counter() - started)


def batched_decode(ctx: RawContext, prompts: list[list[int]], steps: int) -> float:
    """Prefill each prompt as its own sequence, then decode `steps` tokens for all of them in one
    batch per step. Returns aggregate decode tokens/s (steps × sequences / decode time)."""
    ctx.clear()
    n = len(prompts)
    last = [ctx.prefill(seq, prompt) for seq, prompt in enumerate(prompts)]
    positions = [len(p) for p in prompts]
    started = time.perf_counter()
    for _ in range(steps):
        ctx.decode([(last[s], positions[s], s, True) for s in range(n)])
        for s in range(n):
            last[s] = ctx.sample(s, s)
            positions[s] += 1
    return n * steps / (time.perf_counter() - started)


def stall_step(ctx: RawContext, a: dict, b_prompt: list[int], chunk: int) -> tuple[list, float]:
    """A (sequence 0) decodes one token per step while B's prompt (sequence 1) rides along in
    chunks of `chunk` tokens in the same llama_decode. Returns (every step's seconds, B's
    prefill time: its first chunk's start → its first token sampled)."""
    steps = []
    done = 0
    started = time.perf_counter()
    while done < len(b_prompt):
        part = b_prompt[done : done + chunk]
        last = done + len(part) == len(b_prompt)
        entries = [(a["token"], a["pos"], 0, True)]
        entries += [(t, done + i, 1, last and i == len(part) - 1) for i, t in enumerate(part)]
        step_start = time.perf_counter()
        ctx.decode(entries)
        a["token"] = ctx.sample(0, 0)
        a["pos"] += 1
        if last:
            ctx.sample(1, len(entries) - 1)
        steps.append(time.perf_counter() - step_start)
        done += len(part)
    return steps, time.perf_counter() - started


def start_a(ctx: RawContext, a_prompt: list[int], warm_tokens: int) -> dict:
    """A's prompt prefilled and `warm_tokens` decoded, as the engine's A when B arrives."""
    a = {"token": ctx.prefill(0, a_prompt), "pos": len(a_prompt)}
    for _ in range(warm_tokens):
        ctx.decode([(a["token"], a["pos"], 0, True)])
        a["token"] = ctx.sample(0, 0)
        a["pos"] += 1
    return a


def b_alone_seconds(ctx: RawContext, b_prompt: list[int]) -> float:
    """B alone at full batch: one llama_decode of the whole prompt (ubatches of n_ubatch)."""
    ctx.clear()
    started = time.perf_counter()
    ctx.prefill(1, b_prompt)
    return time.perf_counter() - started


# --- sides -------------------------------------------------------------------------------------


def _model(args: dict, **kwargs) -> RawModel:
    return RawModel(args["config"]["model_path"], use_extra_bufts=args["config"]["use_extra_bufts"],
                    **kwargs)  # fmt: skip


def _context(model: RawModel, cfg: dict, n_seq: int, n_batch: int | None = None,
             unified: bool = False) -> RawContext:  # fmt: skip
    return RawContext(model, ctx_per_seq=cfg["ctx_per_seq"], n_seq=n_seq,
                      n_batch=n_batch or cfg["n_batch"], n_ubatch=cfg["n_ubatch"],
                      threads=cfg["n_threads"], flash_attn=cfg["flash_attn"],
                      unified=unified)  # fmt: skip


def side_tokenize(args: dict) -> dict:
    """Token ids for prompts (name → [count, salt]), for sides that have no tokenizer (a
    RunnerProcess client never imports llama_cpp). Loads the vocabulary only."""
    model = RawModel(args["model_path"], vocab_only=True)
    return {name: make_tokens(model.tokenize, count, salt)
            for name, (count, salt) in args["specs"].items()}  # fmt: skip


def side_raw_basic(args: dict) -> dict:
    """Prefill, single-sequence decode and 4-sequence batched decode: the same prompts (the
    same salts) as the engine side of the same round."""
    cfg = args["config"]
    model = _model(args)
    tok = model.tokenize
    single = _context(model, cfg, n_seq=1)
    single.warm_up(tok)
    prefill = [prefill_tps(single, make_tokens(tok, args["prefill_tokens"], s))
               for s in args["prefill_salts"]]  # fmt: skip
    decode = [single_decode_tps(single, make_tokens(tok, 32, s), args["decode_steps"])
              for s in args["decode_salts"]]  # fmt: skip
    single.close()
    four = _context(model, cfg, n_seq=4)
    four.warm_up(tok)
    batch4 = [batched_decode(four, [make_tokens(tok, 32, s + i) for i in range(4)],
                             args["batch4_steps"]) for s in args["batch4_salts"]]  # fmt: skip
    four.close()
    return {"prefill_tps": statistics.median(prefill), "decode_tps": statistics.median(decode),
            "batch4_tps": statistics.median(batch4)}  # fmt: skip


def side_raw_frontier(args: dict) -> dict:
    """The stall scenario in raw llama.cpp, for each chunk size: A decodes one token per step
    while B's fresh prompt rides along in chunks of n in the same llama_decode; B alone is
    prefilled at full batch. Two sequences in their own KV streams, as the engine's stall
    configuration (n_seq_max = 2, kv_unified = false, the same n_batch / n_ubatch)."""
    cfg = args["config"]
    model = _model(args)
    tok = model.tokenize
    ctx = _context(model, cfg, n_seq=2)
    ctx.warm_up(tok)
    b_prompt = make_tokens(tok, args["b_tokens"], args["salt"])
    a_prompt = make_tokens(tok, args["a_tokens"], args["salt"] + 2)
    alone = [b_alone_seconds(ctx, b_prompt)]
    curve = []
    for chunk in args["chunks"]:
        ctx.clear()
        a = start_a(ctx, a_prompt, args["a_warm_tokens"])
        steps, b_seconds = stall_step(ctx, a, b_prompt, chunk)
        curve.append({"chunk": chunk, "step_ms": statistics.median(steps) * 1000,
                      "max_step_ms": max(steps) * 1000, "b_prefill_s": b_seconds})  # fmt: skip
    alone.append(b_alone_seconds(ctx, b_prompt))
    ctx.close()
    b_alone = statistics.mean(alone)
    for point in curve:
        point["b_ttft_ratio"] = point["b_prefill_s"] / b_alone
    return {"b_alone_s": b_alone, "curve": curve}


def continuous_batching(ctx: RawContext, prompts: list[list[int]], out: int, n_seq: int) -> dict:
    """The flood's requests through llama.cpp's own best batching, as llama-server does it with
    no latency target: each step one llama_decode carries one decode token for every running
    sequence and then as much prompt as fits n_batch; a request ends after `out` tokens (EOS
    ignored) and its sequence takes the next prompt. Returns output and prompt tok/s over the
    whole flood."""
    ctx.clear()
    queue = list(prompts)
    free = list(range(n_seq))
    prefilling: dict[int, dict] = {}  # seq -> {"ids", "done"}
    decoding: dict[int, dict] = {}  # seq -> {"token", "pos", "made"}
    output = 0
    started = time.perf_counter()
    while queue or prefilling or decoding:
        while free and queue:
            seq = free.pop(0)
            ll.llama_memory_seq_rm(ctx.memory, seq, 0, -1)
            prefilling[seq] = {"ids": queue.pop(0), "done": 0}
        entries = [(d["token"], d["pos"], seq, True) for seq, d in decoding.items()]
        owners = [("decode", seq) for seq in decoding]
        room = ctx.n_batch - len(entries)
        for seq, p in prefilling.items():
            if room <= 0:
                break
            part = p["ids"][p["done"] : p["done"] + room]
            last = p["done"] + len(part) == len(p["ids"])
            entries += [(t, p["done"] + i, seq, last and i == len(part) - 1)
                        for i, t in enumerate(part)]  # fmt: skip
            owners += [("prompt", seq)] * len(part)
            p["done"] += len(part)
            room -= len(part)
        ctx.decode(entries)
        for index, (kind, seq) in enumerate(owners):
            if not entries[index][3]:
                continue
            token = ctx.sample(seq, index)
            output += 1
            if kind == "prompt":
                ids = prefilling.pop(seq)["ids"]
                decoding[seq] = {"token": token, "pos": len(ids), "made": 1}
                continue
            d = decoding[seq]
            d["token"], d["pos"], d["made"] = token, d["pos"] + 1, d["made"] + 1
        for seq in [s for s, d in decoding.items() if d["made"] >= out]:
            del decoding[seq]
            free.append(seq)
    elapsed = time.perf_counter() - started
    return {"output_tps": output / elapsed, "prompt_tps": sum(map(len, prompts)) / elapsed,
            "seconds": elapsed, "output_tokens": output}  # fmt: skip


def side_raw_flood(args: dict) -> dict:
    """The flood alone (bench/engine_side.py's side_engine_flood_alone sends the same requests
    to the engine): `flood` documents of `flood_tokens` tokens, `flood_out` tokens each, with as
    many sequences as the engine has slots."""
    cfg = args["config"]
    model = _model(args)
    tok = model.tokenize
    n_seq = cfg["parallel"] + cfg["cache_slots"]
    ctx = _context(model, cfg, n_seq=n_seq)
    ctx.warm_up(tok)
    prompts = [make_tokens(tok, args["flood_tokens"], args["salt"] + i)
               for i in range(args["flood"])]  # fmt: skip
    result = continuous_batching(ctx, prompts, args["flood_out"], n_seq)
    ctx.close()
    return result


def mixed_step_ms(ctx: RawContext, decoders: list[dict], reader: int, chunk: list[int],
                  start: int, reps: int) -> float:
    """The median time of a step that decodes one token for each of `decoders` ({"seq",
    "pos", "token"}) and reads `chunk` of sequence `reader`'s prompt at `start`, as the
    runner writes a step (sequence-id order). Every repetition is the same step: what it added
    to the KV is removed after it, so contexts do not grow between sizes."""
    times = []
    for _ in range(reps):
        entries = [(d["token"], d["pos"], d["seq"], True) for d in decoders]
        entries += [(t, start + i, reader, False) for i, t in enumerate(chunk)]
        entries.sort(key=lambda e: e[2])
        started = time.perf_counter()
        ctx.decode(entries)
        for row, d in enumerate(sorted(decoders, key=lambda d: d["seq"])):
            ctx.sample(d["seq"], row)  # the decoders' ids come before the reader's
        times.append(time.perf_counter() - started)
        for d in decoders:
            ll.llama_memory_seq_rm(ctx.memory, d["seq"], d["pos"], -1)
        ll.llama_memory_seq_rm(ctx.memory, reader, start, -1)
    return statistics.median(times)


def side_raw_step_cost(args: dict) -> dict:
    """bench/step_cost.py: what a prompt token costs in a step beside `decoders` decoding
    sequences, by chunk size, against the same prompt read whole; the KV per sequence
    (the runner's) or unified (`unified`)."""
    cfg = args["config"]
    model = _model(args)
    tok = model.tokenize
    n = args["decoders"]
    ctx = _context(model, cfg, n_seq=n + 1, unified=args["unified"])
    ctx.warm_up(tok)
    decoders = []
    for seq in range(n):
        prompt = make_tokens(tok, args["context_tokens"], args["salt"] + seq)
        decoders.append({"seq": seq, "pos": len(prompt), "token": ctx.prefill(seq, prompt)})
    reader = n  # the sequence whose prompt is read: after the decoders' ids (mixed_step_ms)
    prompt = make_tokens(tok, args["context_tokens"] + max(args["whole"], *args["chunks"]),
                         args["salt"] + 99)  # fmt: skip
    start = args["context_tokens"]
    ctx.prefill(reader, prompt[:start])  # the prompt so far, read by earlier steps
    reps = args["reps"]
    steps = {c: mixed_step_ms(ctx, decoders, reader, prompt[start : start + c], start, reps)
             for c in (0, *args["chunks"])}  # fmt: skip
    whole = prompt[start : start + args["whole"]]
    alone = mixed_step_ms(ctx, [], reader, whole, start, reps)
    ctx.close()
    model.close()
    return {"step_ms": {str(c): s * 1000 for c, s in steps.items()},
            "whole_ms_per_token": alone * 1000 / len(whole)}


def ids_in_runs(count: int, runs: int) -> list[int]:
    """The sequence ids of `count` sequences in `runs` runs of consecutive ids, as equal as
    they can be, with one idle id between two runs (a slot that is free or kept)."""
    if not 1 <= runs <= count:
        raise ValueError(f"{count} sequences cannot make {runs} runs")
    ids, seq = [], 0
    for run in range(runs):
        for _ in range(count // runs + (run < count % runs)):
            ids.append(seq)
            seq += 1
        seq += 1  # the idle id before the next run
    return ids


def side_raw_id_runs(args: dict) -> dict:
    """bench/step_cost.py --runs: a decode-only step of `decoders` sequences (one KV stream
    each, every one `context_tokens` deep) whose ids make 1, 2, ... runs of consecutive ids:
    llama.cpp runs each run as a graph pass of its own (llama_batch_allocr::split_equal)."""
    cfg = args["config"]
    model = _model(args)
    n, most = args["decoders"], max(args["runs"])
    ctx = _context(model, cfg, n_seq=n + most - 1)
    ctx.warm_up(model.tokenize)
    decoders = {}
    for seq in range(n + most - 1):
        prompt = make_tokens(model.tokenize, args["context_tokens"], args["salt"] + seq)
        decoders[seq] = {"seq": seq, "pos": len(prompt), "token": ctx.prefill(seq, prompt)}
    steps = {}
    for runs in args["runs"]:
        chosen = [decoders[seq] for seq in ids_in_runs(n, runs)]
        first = chosen[0]  # no prompt is read: an empty chunk of the first decoder's
        steps[str(runs)] = 1000 * mixed_step_ms(ctx, chosen, first["seq"], [], first["pos"],
                                                args["reps"])  # fmt: skip
    ctx.close()
    model.close()
    return {"step_ms": steps}
