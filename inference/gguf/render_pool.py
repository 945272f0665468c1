"""Chat templates rendered in a few separate processes with real limits.

The sandbox in chat_template.py counts steps and checks a deadline, but it cannot interrupt one
long filter call (sorting a 4-million-element list) or stop one call from allocating gigabytes
(stringifying a deeply nested list). So the web process never renders a template itself:

- a small pool of render processes (fresh interpreters, started lazily) runs render_chat, the
  same sandboxed environment, one request at a time;
- each process limits itself at start: address space (RLIMIT_AS), CPU time per render
  (RLIMIT_CPU, a backstop) and no core files;
- while it waits, the parent reads the process's CPU time: a render still running after
  IDLE_AFTER_CPU_SECONDS of CPU is moved to the lowest priority (nice 19, SCHED_IDLE, its
  autogroup at nice 19), so that it only gets CPU that nobody else wants, and one past
  CPU_SECONDS_PER_RENDER is killed (real templates need a few milliseconds; the constants say
  what was measured); a render moved there hands its place in the pool to the next request
  (SPARE_PROCESSES such renders at most), so that hostile ones hold the pool no longer either;
- the parent waits at most MAX_RENDER_SECONDS (plus a little) for an answer and then kills the
  process; a process that dies, is killed, grew large or was moved to the lowest priority is
  replaced on the next render (a killed one is reaped in the background);
- a render that breaks a limit fails that request with a ChatTemplateError;
- async code waits in a dedicated small thread pool (render_executor()), never the event
  loop's default one.

Requests and replies are dataclasses, sent as length-prefixed JSON over the worker's stdin and
stdout (JSON, not pickle: the parent never unpickles what a hostile template produced).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from inference.gguf.chat_template import MAX_RENDER_SECONDS, ChatTemplateError

POOL_SIZE = 2
MEMORY_LIMIT_BYTES = 512 * 1024 * 1024  # address space of one render process
RETIRE_RSS_BYTES = 256 * 1024 * 1024  # a process that peaked above this is replaced
# CPU time per render, request and reply included. Measured on the 2-core x86 dev box (compile +
# render of one request in a fresh process): 50-turn conversations with 10 tools take 2-10 ms
# with the starter model's and the tests' templates, and at most 55-80 ms with the heaviest of
# 29 real ones (gpt-oss, functionary 3.2, Seed-OSS: mostly the compile, which a process does
# once per template); 200 turns take up to 150 ms (Command R7B's template is quadratic in tool
# calls). 1 s is over 10x the 50-turn worst and leaves 2x for the 200-turn one on a slower
# core (a Raspberry Pi 5's).
CPU_SECONDS_PER_RENDER = 1.0
# A render still running after this much CPU moves to the lowest priority. Not from the start:
# a model answering uses every core, and two busy threads on two cores leave a SCHED_IDLE
# process 0.1 % of a core (nice 19: 0.7 %; measured), so a 5 ms render would take seconds and a
# fresh process would not start in time. Above the cold render (compile included) of the
# heaviest real template with room for a slower core, because a process that was moved there
# is replaced after its render, and the next render in the new one compiles again: 0.15 s is
# 2.5x the heaviest real cold render measured (gpt-oss, 59 ms; bench/template_cpu.py), and it
# kept another app's TTFT beside three hostile chats within 3x + 0.3 s (0.25 s did not: 4.7x).
IDLE_AFTER_CPU_SECONDS = 0.15
CPU_POLL_SECONDS = 0.02  # how often the parent reads a running render's CPU time
SPARE_PROCESSES = POOL_SIZE  # lowered renders that may run on beside a full pool (memory bound)
CPU_BACKSTOP_SECONDS = int(MAX_RENDER_SECONDS) + 2  # RLIMIT_CPU, should the parent be gone
KILL_GRACE_SECONDS = 0.5  # the sandbox's own deadline gets to speak first
START_SECONDS = 30.0  # a fresh interpreter importing jinja2, on a busy machine
ACQUIRE_SECONDS = 30.0  # waiting for a free render process
MAX_FRAME_BYTES = 64 * 1024 * 1024
EXECUTOR_THREADS = 4

_ROOT = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct(">I")


class RenderPoolError(RuntimeError):
    """A render process could not be started: a fault of this machine, not of the template."""


@dataclass(frozen=True, slots=True)
class RenderRequest:
    template: str | None
    messages: list[dict[str, Any]]
    bos_token: str = ""
    eos_token: str = ""
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True, slots=True)
class RenderReply:
    text: str | None = None
    error: str | None = None  # a ChatTemplateError's message
    retire: bool = False  # the process grew large: replace it

    @classmethod
    def from_json(cls, data: Any) -> RenderReply:
        if not isinstance(data, dict):
            raise ValueError("a reply is an object")
        text, error, retire = data.get("text"), data.get("error"), data.get("retire", False)
        if not (isinstance(text, str) ^ isinstance(error, str)) or not isinstance(retire, bool):
            raise ValueError("a reply has exactly one of text and error")
        return cls(text, error, retire)


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """What one render may take, enforced by the parent (the rest the process sets itself)."""

    wall_seconds: float = MAX_RENDER_SECONDS + KILL_GRACE_SECONDS
    cpu_seconds: float = CPU_SECONDS_PER_RENDER
    idle_after_cpu_seconds: float = IDLE_AFTER_CPU_SECONDS


class _WorkerFailed(Exception):
    """The render process broke a limit, died, or said something unreadable."""


# 1. Framing.


def _encode(obj: Any) -> bytes:
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# 2. The render process.


def _apply_limits() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _cpu_backstop() -> None:
    """Let this render use CPU_BACKSTOP_SECONDS more seconds of CPU, then SIGXCPU."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = spent + CPU_BACKSTOP_SECONDS
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _peak_rss_bytes() -> int:
    """The most memory this process has held. On Linux VmHWM, which starts afresh at exec:
    ru_maxrss keeps the parent's peak across fork and exec, so a web process over
    RETIRE_RSS_BYTES would have its render processes replaced after every render."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:  # not Linux
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def _worker_main() -> None:
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, not into the replies
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a dev server: the parent decides
    _apply_limits()
    from inference.gguf.chat_template import render_chat

    render_chat(None, [{"role": "user", "content": "warm up"}])
    replies.write(_encode({"ready": True}))
    replies.flush()
    while True:
        header = _read_exact(requests, _HEADER.size)
        if header is None:
            return
        body = _read_exact(requests, _HEADER.unpack(header)[0])
        if body is None:
            return
        _cpu_backstop()
        try:
            request = RenderRequest(**json.loads(body))
            reply = RenderReply(text=render_chat(**asdict(request)))
        except ChatTemplateError as e:
            reply = RenderReply(error=str(e))
        except MemoryError:
            reply = RenderReply(error="the chat template ran out of memory")
        except Exception as e:  # a malformed request: say so rather than die
            reply = RenderReply(error=f"the render request was malformed: {type(e).__name__}")
        retire = _peak_rss_bytes() > RETIRE_RSS_BYTES
        try:
            frame = _encode({**asdict(reply), "retire": retire})
        except MemoryError:
            frame = _encode(asdict(RenderReply(error="the chat template ran out of memory")))
            retire = True
        replies.write(frame)
        replies.flush()
        if retire:
            return


def _lower_priority(pid: int) -> None:
    """Let process `pid` run only on CPU time that nobody else wants, for the rest of its life
    (an unprivileged process cannot raise it again). Each step where the system has it:

    1. nice 19 (all that macOS has);
    2. SCHED_IDLE: a waking normal task preempts it at once;
    3. its autogroup's nice 19. Where processes sit in the root cgroup (a server started from
       a shell, many VMs), Linux schedules each session as one group, and nice and SCHED_IDLE
       only rank tasks within it; the render process is alone in its session, so without this
       it still gets a whole session's share (measured: four SCHED_IDLE busy loops in their own
       sessions took a third of another process's CPU; with this, nothing).

    The render process has one thread, whose id is the process id, the one these calls change.
    A step that fails (the process has just ended: the read sees that) is skipped."""
    steps = [lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)]
    if hasattr(os, "sched_setscheduler"):
        steps.append(lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))
    steps.append(lambda: Path(f"/proc/{pid}/autogroup").write_text("19"))
    for step in steps:
        try:
            step()
        except OSError:
            pass


class _CpuWatch:
    """A running render's CPU time, read by the parent between waits for the reply.

    The parent rather than the render process enforces the CPU cap: RLIMIT_CPU counts whole
    seconds of the process's life (a soft limit of used + 1 s allows anywhere from 1 to 2 s), a
    timer in the child (setitimer) could not also lower its priority partway (it cannot change
    its own while stuck in one long C call, and the parent must do that anyway), and reading
    /proc/<pid>/stat every CPU_POLL_SECONDS costs nothing next to a render that runs that long.
    The reading is in clock ticks (10 ms), so the cap holds to about 30 ms.
    """

    def __init__(
        self, worker: _Worker, limits: RenderLimits, on_lowered: Callable[[], None]
    ) -> None:
        self.worker = worker
        self.limits = limits
        self.on_lowered = on_lowered
        self.process = psutil.Process(worker.proc.pid)
        self.start = self._cpu()  # the process is idle, waiting for this request

    def _cpu(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def check(self) -> None:
        try:
            used = self._cpu() - self.start
        except psutil.Error:  # it has just ended: the read sees that
            return
        if used > self.limits.cpu_seconds:
            raise _WorkerFailed(
                f"the chat template used more than {self.limits.cpu_seconds:g} s of CPU time "
                "(real chat templates need a few milliseconds), so it was stopped"
            )
        if used > self.limits.idle_after_cpu_seconds and not self.worker.lowered:
            _lower_priority(self.worker.proc.pid)
            self.worker.lowered = True
            self.on_lowered()


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-s", "-m", "inference.gguf.render_pool", "--worker"],
            cwd=_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the parent only; an autogroup of its own
        )
        self.lowered = False  # moved to the lowest priority: replace it after this render
        try:
            ready = self._read_reply(time.monotonic() + START_SECONDS)
        except _WorkerFailed as e:
            self.kill()
            raise RenderPoolError(f"the chat template renderer did not start: {e}") from None
        if ready != {"ready": True}:
            self.kill()
            raise RenderPoolError("the chat template renderer did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the process and reap it in the background: its exit runs at its own priority,
        so one at the lowest can take seconds to end on a busy machine, and the request that
        waits for its error need not wait for that."""
        if self.proc.poll() is None:
            self.proc.kill()
            threading.Thread(target=self.proc.wait, name="render-reaper", daemon=True).start()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def call(
        self, request: RenderRequest, limits: RenderLimits, on_lowered: Callable[[], None]
    ) -> RenderReply:
        deadline = time.monotonic() + limits.wall_seconds
        try:
            frame = _encode(asdict(request))
        except (TypeError, ValueError) as e:
            raise ChatTemplateError(f"the conversation is not plain JSON data: {e}") from None
        try:
            watch = _CpuWatch(self, limits, on_lowered)
            self.proc.stdin.write(frame)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (OSError, psutil.Error):
            raise _WorkerFailed(self._death()) from None
        data = self._read_reply(deadline, watch)
        try:
            return RenderReply.from_json(data)
        except ValueError as e:
            raise _WorkerFailed(f"the render process answered nonsense: {e}") from None

    def _read_reply(self, deadline: float, watch: _CpuWatch | None = None) -> Any:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        header = self._read(fd, _HEADER.size, deadline, watch)
        size = _HEADER.unpack(header)[0]
        if size > MAX_FRAME_BYTES:
            raise _WorkerFailed("the render process answered too much")
        body = self._read(fd, size, deadline, watch)
        try:
            return json.loads(body)
        except ValueError:
            raise _WorkerFailed("the render process answered nonsense") from None

    def _read(self, fd: int, n: int, deadline: float, watch: _CpuWatch | None) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _WorkerFailed(f"the chat template ran longer than {MAX_RENDER_SECONDS} s")
            wait = left if watch is None else min(left, CPU_POLL_SECONDS)
            readable, _, _ = select.select([fd], [], [], wait)
            if not readable:
                if watch is not None:
                    watch.check()
                continue
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise _WorkerFailed(self._death())
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "the render process stopped answering"
        if code == -signal.SIGXCPU:
            return f"the chat template used more than {CPU_BACKSTOP_SECONDS} s of CPU time"
        if code == -signal.SIGKILL:
            return "the chat template's render process was killed (out of memory?)"
        return f"the chat template's render process died (exit status {code})"


# 3. The pool.


class RenderPool:
    """`size` render processes, each started on first use and replaced after a failure, and
    up to SPARE_PROCESSES lowered ones that gave their place to the next request."""

    def __init__(self, size: int = POOL_SIZE, limits: RenderLimits | None = None) -> None:
        self.size = size
        self.limits = RenderLimits() if limits is None else limits
        self._slots: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(size):
            self._slots.put(None)
        self._spares = threading.Semaphore(SPARE_PROCESSES)
        self._closed = False

    def render(self, request: RenderRequest) -> str:
        """The rendered prompt; ChatTemplateError when the template fails or breaks a limit."""
        if self._closed:
            raise RenderPoolError("the render pool is closed")
        try:
            worker = self._slots.get(timeout=ACQUIRE_SECONDS)
        except queue.Empty:
            raise RenderPoolError("every chat template renderer is busy") from None
        handed_on = False  # this render, lowered, gave its place to the next request

        def hand_on() -> None:
            nonlocal handed_on
            if not self._closed and self._spares.acquire(blocking=False):
                self._slots.put(None)
                handed_on = True

        try:
            if worker is not None and not worker.alive():
                worker.kill()
                worker = None
            if worker is None:
                worker = _Worker()
            try:
                reply = worker.call(request, self.limits, hand_on)
            except _WorkerFailed as e:
                worker.kill()
                worker = None
                raise ChatTemplateError(str(e)) from None
            if reply.retire or worker.lowered:
                worker.kill()
                worker = None
        finally:
            if (self._closed or handed_on) and worker is not None:
                worker.kill()
                worker = None
            if handed_on:
                self._spares.release()
            else:
                self._slots.put(worker)
        if reply.error is not None:
            raise ChatTemplateError(reply.error)
        return reply.text  # type: ignore[return-value]

    def close(self) -> None:
        """Kill the idle render processes; busy ones are killed when their render returns."""
        self._closed = True
        while True:
            try:
                worker = self._slots.get_nowait()
            except queue.Empty:
                return
            if worker is not None:
                worker.kill()


_lock = threading.Lock()
_pool: RenderPool | None = None
_pool_pid = 0
_executor: ThreadPoolExecutor | None = None


def default_pool() -> RenderPool:
    """The process-wide pool (a new one after a fork: pipes are not shared across processes)."""
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool, _pool_pid = RenderPool(), os.getpid()
        return _pool


def render_executor() -> ThreadPoolExecutor:
    """Threads for async code to wait on renders in, so that the loop's default pool is free."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="chat-template")
        return _executor


def render_chat_isolated(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """render_chat, in a render process of the default pool (blocks up to ~5 s)."""
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"the chat template is a {type(template).__name__}, not text")
    request = RenderRequest(template, messages, bos_token, eos_token, add_generation_prompt, tools,
                            enable_thinking, reasoning_effort)  # fmt: skip
    return default_pool().render(request)


@atexit.register
def _close_default_pool() -> None:
    if _pool is not None and _pool_pid == os.getpid():
        _pool.close()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker_main()
