import numpy as np
import pytest

from inference.engine.tiers.entries import KvEntry, KvLayout


@pytest.fixture
def layout() -> KvLayout:
    return KvLayout(model="ab" * 32, file_size=1000, file_mtime_ns=1, ctx_per_seq=256,
                    kv_type="f16", flash_attn=True, n_gpu_layers=-1, state_format="fake 1")


def entry(tokens, partition="apikey:1", key="conv-1", n_bytes=None, entry_id=None) -> KvEntry:
    ids = np.asarray(tokens, dtype=np.int32)
    size = n_bytes if n_bytes is not None else 4 * len(ids)
    return KvEntry(entry_id or f"e{abs(hash((tuple(tokens), partition))) % 10**12}", partition,
                   key, ids, size, data=bytearray(b"k" * size))
