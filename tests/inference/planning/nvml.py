"""A fake pynvml: the calls inference.planning.machine makes, answered from recorded readings of
cards, so that fitting, the panels and /metrics can be tested on a box without a GPU.

The cards are what `nvidia-smi` reports on such boxes (totals as NVML gives them: an H200 shows
143771 MiB; a 12 GB RTX 3060 12288 MiB); what is used, and by whom, is each test's own.
"""

from dataclasses import dataclass, field

MiB = 1 << 20
GiB = 1 << 30


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own name
    pass


@dataclass
class Card:
    name: str
    total_bytes: int
    used_bytes: int = 0
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes (None: n/a)
    utilization: int | None = 0  # percent; None: not supported
    temperature_c: int | None = 35
    power_mw: int | None = 60_000
    power_limit_mw: int | None = 700_000

    def with_used(self, used_bytes: int, **changes) -> "Card":
        return Card(**{**self.__dict__, "used_bytes": used_bytes, **changes})


def h200(used_bytes: int = 4 * MiB, **changes) -> Card:
    """A single NVIDIA H200 as nvidia-smi showed it on the device machine (143771 MiB)."""
    return Card("NVIDIA H200", 143771 * MiB, used_bytes, power_limit_mw=700_000, **changes)


def rtx_3060(used_bytes: int = 310 * MiB, **changes) -> Card:
    """A desktop GeForce RTX 3060 12 GB with a desktop session holding ~300 MiB."""
    return Card("NVIDIA GeForce RTX 3060", 12288 * MiB, used_bytes, power_mw=18_000,
                power_limit_mw=170_000, **changes)  # fmt: skip


def laptop_4gb(used_bytes: int = 0, **changes) -> Card:
    """A 4 GB laptop GPU, which reports no power readings."""
    return Card("NVIDIA GeForce RTX 3050 Laptop GPU", 4096 * MiB, used_bytes, power_mw=None,
                power_limit_mw=None, **changes)  # fmt: skip


class _Memory:
    def __init__(self, card: Card):
        self.total = card.total_bytes
        self.used = card.used_bytes
        self.free = card.total_bytes - card.used_bytes


class _Process:
    def __init__(self, pid: int, used: int | None):
        self.pid = pid
        self.usedGpuMemory = used  # noqa: N815 - pynvml's attribute


class _Utilization:
    def __init__(self, gpu: int):
        self.gpu = gpu
        self.memory = 0


class FakeNVML:
    """The pynvml module of a box with these cards (install with `installed`)."""

    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError

    def __init__(self, *cards: Card):
        self.cards = list(cards)

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's names from here on
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Card:  # noqa: N802
        return self.cards[index]

    def nvmlDeviceGetName(self, card: Card) -> str:  # noqa: N802
        return card.name

    def nvmlDeviceGetMemoryInfo(self, card: Card) -> _Memory:  # noqa: N802
        return _Memory(card)

    def nvmlDeviceGetComputeRunningProcesses(self, card: Card) -> list[_Process]:  # noqa: N802
        return [_Process(pid, used) for pid, used in card.processes.items()]

    def nvmlDeviceGetUtilizationRates(self, card: Card) -> _Utilization:  # noqa: N802
        return _Utilization(_supported(card.utilization))

    def nvmlDeviceGetTemperature(self, card: Card, sensor: int) -> int:  # noqa: N802
        return _supported(card.temperature_c)

    def nvmlDeviceGetPowerUsage(self, card: Card) -> int:  # noqa: N802
        return _supported(card.power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, card: Card) -> int:  # noqa: N802
        return _supported(card.power_limit_mw)


def _supported(value):
    if value is None:
        raise NVMLError_NotSupported("Not Supported")
    return value


def installed(monkeypatch, *cards: Card) -> FakeNVML:
    """This box's NVML answers for `cards` (none: a box without a GPU or driver)."""
    from inference.planning import machine

    fake = FakeNVML(*cards) if cards else None
    monkeypatch.setattr(machine, "_nvml", lambda: fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake
