"""Raw llama.cpp baselines, written directly against llama-cpp-python with no engine around them.

Each function uses a fresh context on an already loaded model, the same thread count as the
engine, and greedy sampling, so what it measures is llama.cpp itself.
"""

import time

import llama_cpp as ll


def new_context(model, *, n_ctx: int, n_batch: int, n_seq: int, threads: int):
    params = ll.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = min(512, n_batch)
    params.n_seq_max = n_seq
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_AUTO  # as the engine's runner
    ctx = ll.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("could not create a raw context")
    return ctx


def _fill(batch, entries) -> None:
    """entries: (token, pos, seq_id, wants_logits)."""
    for i, (token, pos, seq, logits) in enumerate(entries):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits
    batch.n_tokens = len(entries)


def batched_decode(model, prompts: list[list[int]], steps: int, threads: int) -> float:
    """Prefill each prompt as its own sequence, then decode `steps` tokens for all of them in one
    batch per step. Returns aggregate decode tokens/s (steps × sequences / decode time)."""
    n = len(prompts)
    ctx = new_context(model, n_ctx=4096, n_batch=512, n_seq=n, threads=threads)
    batch = ll.llama_batch_init(512, 0, 1)
    samplers = []
    try:
        for _ in prompts:
            chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
            samplers.append(chain)
        last = []
        for seq, prompt in enumerate(prompts):
            _fill(batch, [(t, p, seq, p == len(prompt) - 1) for p, t in enumerate(prompt)])
            if ll.llama_decode(ctx, batch) != 0:
                raise RuntimeError("raw prefill failed")
            last.append(ll.llama_sampler_sample(samplers[seq], ctx, len(prompt) - 1))
        positions = [len(p) for p in prompts]
        started = time.perf_counter()
        for _ in range(steps):
            _fill(batch, [(last[s], positions[s], s, True) for s in range(n)])
            if ll.llama_decode(ctx, batch) != 0:
                raise RuntimeError("raw decode failed")
            for s in range(n):
                last[s] = ll.llama_sampler_sample(samplers[s], ctx, s)
                positions[s] += 1
        elapsed = time.perf_counter() - started
        return n * steps / elapsed
    finally:
        for chain in samplers:
            ll.llama_sampler_free(chain)
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
