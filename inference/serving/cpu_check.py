"""Can this host run llama.cpp's extra weight buffer types? Remembered per host in the data dir.

`pip install llama-cpp-python` builds with -march=native, so on a Xeon that advertises AMX the
build uses AMX tiles; under some hypervisors those tiles fault, and the first matmul dies with
SIGSEGV. Loading with `use_extra_bufts = False` avoids the AMX and repack buffer types and runs
fine. The supervisor finds out by trying: a runner killed by a signal during its load (which
includes a warm-up decode) or before its first answer is retried once without them, and the
verdict is written here so that every later load on this host starts safe at once.

The verdict is keyed by a fingerprint of the host (CPU model and flags, kernel, the
llama-cpp-python build), so a data dir moved to another box, or a rebuilt library, is
checked anew.
"""

import hashlib
import json
import logging
import os
import platform
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "cpu-check.json"


@dataclass(slots=True, frozen=True)
class Verdict:
    extra_bufts: bool  # False: load every model with use_extra_bufts = False here
    reason: str
    model: str  # the model whose runner showed it
    at: float  # wall clock


def host_fingerprint() -> str:
    parts = [platform.machine(), platform.release()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            lines = cpuinfo.read().splitlines()
        for key in ("model name", "flags"):
            parts += sorted({line for line in lines if line.startswith(key)})
    except OSError:
        parts.append(platform.processor())
    try:
        parts.append(metadata.version("llama-cpp-python"))
    except metadata.PackageNotFoundError:
        parts.append("no llama-cpp-python")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class CpuCheck:
    """The verdicts file of one data dir."""

    def __init__(self, directory: str | os.PathLike[str] | None):
        self.path = Path(directory) / FILE_NAME if directory else None
        self.fingerprint = host_fingerprint()
        self._lock = threading.Lock()
        self._memory: Verdict | None = None  # without a data dir: for this process only

    def verdict(self) -> Verdict | None:
        if self.path is None:
            return self._memory
        try:
            data = json.loads(self.path.read_text()).get(self.fingerprint)
            return Verdict(**data) if isinstance(data, dict) else None
        except (OSError, ValueError, TypeError):
            return None

    def extra_bufts_allowed(self) -> bool:
        verdict = self.verdict()
        return verdict is None or verdict.extra_bufts

    def record_unsafe(self, model: str, reason: str) -> Verdict:
        verdict = Verdict(False, reason, model, time.time())
        log.warning(
            "this host cannot run llama.cpp's extra buffer types (AMX/repacking): the runner "
            "for %s %s; every model loads with use_extra_bufts = False from now on",
            model, reason,
        )  # fmt: skip
        with self._lock:
            self._memory = verdict
            if self.path is not None:
                self._write(verdict)
        return verdict

    def _write(self, verdict: Verdict) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        data[self.fingerprint] = asdict(verdict)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False) as tmp:
            json.dump(data, tmp, indent=1)
        os.replace(tmp.name, self.path)
