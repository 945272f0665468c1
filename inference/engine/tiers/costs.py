"""Restore or recompute: what a kept prefix costs to bring back against reading it again; and
what a save costs the step it happens in.

A restore costs its whole entry's bytes (llama.cpp restores a sequence whole; the runner then
trims it to the shared prefix): `bytes / ram rate` from RAM, plus `bytes / disk rate` for a
read from disk. Reading the prefix again costs what the engine's own prompt steps cost per
token (budget.StepTimes at full batch). Both rates are measured on this box as restores and
reads happen (the median of the last few, so one slow read moves nothing); until then, priors
that are low for any machine seen (a restore at 2 GB/s, a disk at 200 MB/s), so the first
decisions lean to reading again only where that is clearly cheaper.
"""

import statistics
from collections import deque
from dataclasses import dataclass, field

RAM_PRIOR = 2e9  # bytes per second into the context (measured here: ~10 GB/s on a 2-core CPU)
DISK_PRIOR = 2e8  # bytes per second from the disk tier, checksum included
FIXED_S = 0.0005  # per restore: the call and the trim
# Restore only when it is clearly cheaper: a misjudged restore costs the prompt's reading on top.
MARGIN = 0.5


@dataclass(slots=True)
class _Rate:
    prior: float
    samples: deque = field(default_factory=lambda: deque(maxlen=9))

    def observe(self, n_bytes: int, seconds: float) -> None:
        if n_bytes >= 1 << 16 and seconds > 0:  # small ones measure the call, not the copy
            self.samples.append(n_bytes / seconds)

    @property
    def value(self) -> float:
        return statistics.median(self.samples) if self.samples else self.prior


@dataclass(slots=True)
class RestoreCosts:
    ram: _Rate = field(default_factory=lambda: _Rate(RAM_PRIOR))
    disk: _Rate = field(default_factory=lambda: _Rate(DISK_PRIOR))
    save: _Rate = field(default_factory=lambda: _Rate(RAM_PRIOR))
    # A saved state's bytes per token (the model's KV per token, and the state's headers):
    # measured at each save; until the first, what the entries found on disk say, or nothing.
    per_token: deque = field(default_factory=lambda: deque(maxlen=9))

    def save_seconds(self, n_tokens: int) -> float:
        """A save of a sequence holding n_tokens (llama_state_seq_get_data): what a step
        spends on it."""
        per_token = statistics.median(self.per_token) if self.per_token else 0.0
        return FIXED_S + n_tokens * per_token / self.save.value

    def observe_save(self, n_tokens: int, n_bytes: int, seconds: float | None) -> None:
        if n_tokens:
            self.per_token.append(n_bytes / n_tokens)
        if seconds is not None:
            self.save.observe(n_bytes, seconds)

    def restore_seconds(self, n_bytes: int) -> float:
        """Into the context from RAM: what a step spends on it."""
        return FIXED_S + n_bytes / self.ram.value

    def read_seconds(self, n_bytes: int) -> float:
        """From disk into RAM: the wait before a restore (on the disk thread, not in a step)."""
        return n_bytes / self.disk.value

    def pays(self, n_bytes: int, on_disk: bool, tokens_gained: int, seconds_per_token: float):
        """Whether restoring an entry of n_bytes beats reading `tokens_gained` tokens again."""
        cost = self.restore_seconds(n_bytes) + (self.read_seconds(n_bytes) if on_disk else 0.0)
        return cost < MARGIN * tokens_gained * seconds_per_token

    def observe_restore(self, n_bytes: int, seconds: float) -> None:
        self.ram.observe(n_bytes, seconds)

    def observe_read(self, n_bytes: int, seconds: float) -> None:
        self.disk.observe(n_bytes, seconds)

    def rates(self) -> dict:
        return {"restore_bytes_per_s": self.ram.value, "disk_bytes_per_s": self.disk.value,
                "save_bytes_per_s": self.save.value}  # fmt: skip
