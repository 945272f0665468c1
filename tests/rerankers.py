"""A reranker for the tests, and llama.cpp's own scores to hold ours to.

The reranker is the starter model with `llama.pooling_type` = 4 (rank) in its header, written
with the gguf package (gguf-new-metadata's copy), optionally with a `rerank` chat template. Its
scores mean nothing, but llama.cpp computes them deterministically. `reference_scores` runs
llama.cpp in a separate process, with rank pooling, on llama-server's layout built there from
the vocabulary's own calls (tools/server's format_prompt_rerank), one pair per decode.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = r"""
import json, sys
import llama_cpp.llama_cpp as ll

path, query, documents = json.loads(sys.stdin.read())
ll.llama_backend_init()
model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
vocab = ll.llama_model_get_vocab(model)
params = ll.llama_context_default_params()
params.n_ctx = params.n_batch = params.n_ubatch = 2048
params.embeddings = True
params.pooling_type = ll.LLAMA_POOLING_TYPE_RANK
params.n_threads = params.n_threads_batch = 2
ctx = ll.llama_init_from_model(model, params)

def tokens(text, parse_special):
    data = text.encode()
    buffer = (ll.llama_token * (len(data) + 16))()
    n = ll.llama_tokenize(vocab, data, len(data), buffer, len(data) + 16, False, parse_special)
    return list(buffer[:n])

template = ll.llama_model_chat_template(model, b"rerank")
eos = ll.llama_vocab_eos(vocab)
if eos == -1:
    eos = ll.llama_vocab_sep(vocab)
batch = ll.llama_batch_init(2048, 0, 1)
out = []
for document in documents:
    if template is not None:
        text = template.decode().replace("{query}", query).replace("{document}", document)
        ids = tokens(text, True)
    else:
        ids = [ll.llama_vocab_bos(vocab)] if ll.llama_vocab_get_add_bos(vocab) else []
        ids += tokens(query, False)
        ids += [eos] if ll.llama_vocab_get_add_eos(vocab) else []
        ids += [ll.llama_vocab_sep(vocab)] if ll.llama_vocab_get_add_sep(vocab) else []
        ids += tokens(document, False)
        ids += [eos] if ll.llama_vocab_get_add_eos(vocab) else []
    for i, token in enumerate(ids):
        batch.token[i] = token; batch.pos[i] = i; batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0; batch.logits[i] = 1
    batch.n_tokens = len(ids)
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    assert ll.llama_decode(ctx, batch) == 0
    out.append({"score": ll.llama_get_embeddings_seq(ctx, 0)[0], "tokens": len(ids)})
print(json.dumps(out))
"""


def write_reranker(source: Path, target: Path, rerank_template: str | None = None) -> Path:
    """A copy of `source` whose header says pooling type rank (and has `rerank_template`)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(source), "r")
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), arch=arch, endianess=reader.endianess)
    new = {f"{arch}.pooling_type": MetadataDetails(gguf.GGUFValueType.UINT32, 4)}
    if rerank_template is not None:
        new["tokenizer.chat_template.rerank"] = MetadataDetails(
            gguf.GGUFValueType.STRING, rerank_template
        )
    copy_with_new_metadata(reader, writer, new, [])
    return target


def reference_scores(path: Path, query: str, documents: list[str]) -> list[dict]:
    """llama.cpp's score and token count of each pair, computed in a separate process."""
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE], input=json.dumps([str(path), query, documents]),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def reranker_path(starter_path, tmp_path_factory) -> Path:
    return write_reranker(starter_path, tmp_path_factory.mktemp("reranker") / "reranker.gguf")


@pytest.fixture(scope="session")
def templated_reranker_path(starter_path, tmp_path_factory) -> Path:
    """A reranker whose GGUF has a `rerank` template (with special tokens in it)."""
    return write_reranker(starter_path, tmp_path_factory.mktemp("reranker") / "templated.gguf",
                          "<|im_start|>query\n{query}<|im_end|>\n<|im_start|>doc\n{document}"
                          "<|im_end|>")  # fmt: skip
