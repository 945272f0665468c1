"""llama.cpp's own image path, to compare the engine's answers with: libmtmd tokenizes a prompt
with its pictures and mtmd_helper_eval_chunks reads them into a fresh one-sequence context (text
and images at the positions libmtmd gives them, M-RoPE included), then greedy tokens follow."""

import ctypes

from inference.engine.media import Image


def llama_cpps_own_answer(runner, paths, prompt: str, media: list[Image], n: int) -> list[int]:
    """The greedy tokens llama.cpp's own image path gives: libmtmd tokenizes the prompt with
    its pictures and mtmd_helper_eval_chunks reads them into a fresh one-sequence context."""
    import llama_cpp as ll
    import llama_cpp.mtmd_cpp as mt

    params = mt.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.print_timings = False
    mctx = mt.mtmd_init_from_file(paths[1].encode(), runner.model, params)
    assert mctx
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = 1024
    cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = 2
    cparams.kv_unified = False
    cparams.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_AUTO
    ctx = ll.llama_init_from_model(runner.model, cparams)
    chunks = mt.mtmd_input_chunks_init()
    bitmaps = []
    try:
        for picture_ in media:
            data = (ctypes.c_uint8 * len(picture_.data)).from_buffer_copy(picture_.data)
            bitmaps.append(mt.mtmd_helper_bitmap_init_from_buf(mctx, data, len(picture_.data),
                                                               False))  # fmt: skip
        text = prompt.encode()
        inp = mt.mtmd_input_text(text, len(text), True, True)
        array = (mt.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        assert mt.mtmd_tokenize(mctx, chunks, ctypes.byref(inp), array, len(bitmaps)) == 0
        n_past = ll.llama_pos(0)
        assert mt.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, 512, True,
                                          ctypes.byref(n_past)) == 0  # fmt: skip
        sampler = ll.llama_sampler_init_greedy()
        batch = ll.llama_batch_init(1, 0, 1)
        out = []
        position = n_past.value
        for _ in range(n):
            token = ll.llama_sampler_sample(sampler, ctx, -1)
            if ll.llama_vocab_is_eog(runner.vocab, token):
                break
            out.append(token)
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, position, 1
            batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, 1, 1
            assert ll.llama_decode(ctx, batch) == 0
            position += 1
        ll.llama_batch_free(batch)
        ll.llama_sampler_free(sampler)
        return out
    finally:
        for bitmap in bitmaps:
            mt.mtmd_bitmap_free(bitmap)
        mt.mtmd_input_chunks_free(chunks)
        ll.llama_free(ctx)
        mt.mtmd_free(mctx)
