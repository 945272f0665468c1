"""What a kept prompt is: the KV state of one sequence, the token ids it holds, whose it is.

An entry is restored only into a context whose `KvLayout` has its key: the same model file (by
content and, against a file replaced under the same name, by size and modification time), the
same KV type, flash attention (which puts V transposed or not) and llama.cpp state format. The
context per sequence and the GPU offload may differ: a state holds cells, not their placement,
and an entry whose tokens fit the new context restores into it (llama.cpp checks the types,
layers and V layout again when the state is set, and a refusal there is a cold read). So a
reload with another context (the preflight, a client's num_ctx) or offload keeps its warm
memory: a layout's directory is named by its key alone.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np

TIERS = ("resident", "ram", "disk")  # where a request's cached tokens came from


# What a saved state's context must share with the one it is restored into (module doc).
KEY_FIELDS = ("model", "file_size", "file_mtime_ns", "kv_type", "flash_attn", "state_format")


@dataclass(slots=True, frozen=True)
class KvLayout:
    """What shapes a saved state: `key()` must match for it to be handed to llama.cpp, and its
    tokens must fit `ctx_per_seq`; `n_gpu_layers` is said in the header, for the record."""

    model: str  # the file's sha256, or "file:" + its path when not hashed yet
    file_size: int
    file_mtime_ns: int
    ctx_per_seq: int
    kv_type: str
    flash_attn: bool
    n_gpu_layers: int
    state_format: str  # llama-cpp-python's version and llama.cpp's state version

    def as_dict(self) -> dict:
        return asdict(self)

    def key(self) -> dict:
        return {name: getattr(self, name) for name in KEY_FIELDS}

    def restores(self, saved: dict) -> bool:
        """Whether a state saved with layout `saved` (a header's) may be handed to a context of
        this one (its tokens' count is checked against ctx_per_seq apart)."""
        return {name: saved.get(name) for name in KEY_FIELDS} == self.key()

    @property
    def digest(self) -> str:
        """A short name for this layout's key (its directory on disk)."""
        text = json.dumps(self.key(), sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:16]

    @property
    def model_key(self) -> str:
        return model_key(self.model)


def model_key(model: str) -> str:
    """A model's directory name: its sha256, or a hash of "file:<path>" before it has one."""
    if len(model) == 64 and all(c in "0123456789abcdef" for c in model):
        return model
    return "path-" + hashlib.sha256(model.encode()).hexdigest()[:32]


@dataclass(slots=True, eq=False)
class KvEntry:
    """One kept sequence. In RAM while `data` holds its state, on disk while `on_disk`; both
    at once after a spill that is kept in RAM, or a fetch from disk."""

    id: str
    partition: str | None  # whose it is (an app's key, a person): only they may reuse it
    cache_key: str | None  # its conversation, for the router and the figures
    tokens: np.ndarray  # int32: the token ids whose KV the state holds
    n_bytes: int  # the state's size
    last_used: int = 0  # the store's use counter: LRU order without clock reads
    data: bytearray | None = None
    on_disk: bool = False
    pending: str | None = None  # "write" or "read": the disk thread has it in hand
    dropped: bool = False  # forgotten or evicted while the disk thread had it
    restores: int = field(default=0)
    read_seconds: float = 0.0  # what its last read from disk took
    rereads: int = 0  # reads queued again behind writes that free the RAM it needs
    leaving: bool = False  # it leaves RAM once written (its write is queued or running)
    held: bool = False  # dropped while being written: the write job still holds its state
    unwritable: bool = False  # its write failed: it stays in RAM only

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def in_ram(self) -> bool:
        return self.data is not None

    @property
    def tier(self) -> str:
        return "ram" if self.data is not None else "disk"


def conversation_digest(cache_key: str) -> str:
    """A conversation's name as workers announce what they keep (split mode's router): short,
    and not the key itself."""
    return hashlib.sha256(cache_key.encode()).hexdigest()[:16]


def as_tokens(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading token ids `a` and `b` have in common."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    different = np.flatnonzero(a[:n] != b[:n])
    return int(different[0]) if different.size else n
