"""Pictures decoded in a process of their own, so a decoder crash costs one answer, not a runner.

A picture's bytes are the least trusted input the runner reads, and stb_image (which libmtmd
decodes with) is C. The runner therefore never decodes one itself: it hands the bytes to a small
child process that it owns, `python -m inference.engine.picture_decoder`, which decodes them
with the very decoder llama-server uses (libmtmd's mtmd_helper_bitmap_init_from_buf, so the
pixels, and the answers, are the same) and sends back the width, the height and the RGB bytes.
The runner builds its bitmap from those (projector.py). If the child dies on a picture (a
segfault on hostile bytes) or takes longer than DECODE_TIMEOUT_S, that picture's request gets
a clear "invalid" refusal, a new child is started, and every other stream of the runner goes on.

1. One picture at a time: the runner's encoder thread is the only caller, and a lock keeps it so.
2. The child says READY once it has imported its decoder; a picture's time starts after that.
   Request: an 8-byte length, then the bytes. Reply: TAKEN once it has read them all, then a
   `_REPLY` header (status, width, height), then width x height x 3 bytes of RGB when the
   status is DECODED.
3. The runner unpickles nothing from the child: a child subverted by a hostile picture can only
   say a size and send pixels, and a size beyond the pixel limit (vision.MAX_PIXELS, which the
   runner checked the header against before decoding) ends that child.
4. A child that dies before it says TAKEN (killed while idle, perhaps dying as the picture was
   sent) is replaced and the picture sent again: only a death while a picture is in its hands
   is that picture's fault.

libmtmd's helper takes a projector context, but reads it only for audio (which no accepted
picture kind is: inference.engine.media sniffs JPEG, PNG, GIF and BMP) and for video (which
fails first, as projector.py explains, for want of ffmpeg): the child loads no model and no
projector, only libmtmd. Like runner.py and projector.py, this is runner-process code: the web
process never imports it.
"""

import argparse
import ctypes
import importlib
import logging
import os
import resource
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp.mtmd_cpp as mt

from inference.engine.vision import ENCODER_NICE, MAX_PIXELS

DECODE_TIMEOUT_S = 30.0  # stb_image decodes a 50-megapixel picture in a few seconds
START_TIMEOUT_S = 120.0  # a fresh interpreter importing libmtmd on a busy box; not a picture's
MAX_INPUT_BYTES = 1 << 30  # beyond any body the web side accepts
PROJECT_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<Q")
_REPLY = struct.Struct("<BII")  # status, width, height
DECODED, UNREADABLE = 1, 2
READY, TAKEN = b"R", b"T"
# stb_image reads JPEG, PNG, GIF and BMP. Bytes it cannot read would fall through to libmtmd's
# video path, which launches ffprobe: pointed at a directory that has none, a corrupt picture
# is refused without starting a program.
_NO_FFMPEG = b"/nonexistent/ffmpeg-is-not-used-for-images"


@dataclass(slots=True, frozen=True)
class DecodedPicture:
    """A decoded picture: width x height pixels, 3 bytes (R, G, B) each, row by row."""

    width: int
    height: int
    rgb: bytes

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1 or len(self.rgb) != self.width * self.height * 3:
            raise ValueError(f"{len(self.rgb)} bytes are not {self.width} x {self.height} RGB")


class DecoderFailed(RuntimeError):
    """The decoder process died or ran out of time on a picture: the picture is unreadable."""


def decode_with_libmtmd(data: bytes) -> DecodedPicture | None:
    """The picture llama-server's decoder (libmtmd's helper: stb_image) reads from `data`, or
    None where it reads none. Runs in the decoder process only."""
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    opt = mt.mtmd_helper_init_opt_default()
    opt.video_params.ffmpeg_bin_dir = _NO_FFMPEG
    bitmap = mt.mtmd_helper_bitmap_init_from_buf(None, buffer, len(data), False, opt)
    if not bitmap:
        return None
    try:
        width, height = mt.mtmd_bitmap_get_nx(bitmap), mt.mtmd_bitmap_get_ny(bitmap)
        size = mt.mtmd_bitmap_get_n_bytes(bitmap)
        rgb = ctypes.string_at(mt.mtmd_bitmap_get_data(bitmap), size)
    finally:
        mt.mtmd_bitmap_free(bitmap)
    return DecodedPicture(width, height, rgb)


class PictureDecoder:
    """The runner's decoder process: started at once, restarted whenever it dies.

    `decode` is the function the child runs on each picture's bytes (a module-level function,
    named to the child by module and name); the real one by default."""

    def __init__(self, decode: Callable[[bytes], DecodedPicture | None] = decode_with_libmtmd,
                 *, max_pixels: int = MAX_PIXELS, timeout: float = DECODE_TIMEOUT_S):  # fmt: skip
        self.target = f"{decode.__module__}:{decode.__qualname__}"
        self.max_pixels = max_pixels
        self.timeout = timeout
        self.restarts = 0  # children replaced after a death or a timeout
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._ready = False
        self._closed = False

    def start(self) -> "PictureDecoder":
        with self._lock:
            self._spawn()
        return self

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    def decode(self, data: bytes) -> DecodedPicture | None:
        """The decoded picture, None where the decoder reads none (corrupt, or of a kind it does
        not take); DecoderFailed where the decoder died on it or ran out of time."""
        with self._lock:
            if self._closed:
                raise DecoderFailed("the picture decoder is closed")
            try:
                try:
                    deadline = self._hand_over(data)
                except BrokenPipeError:  # it died before it had this picture: not its fault
                    self._replace()
                    deadline = self._hand_over(data)
                return self._receive(deadline)
            except BrokenPipeError as exc:
                self._replace()
                why = f"the picture decoder did not take the picture ({exc})"
                raise DecoderFailed(why) from exc
            except DecoderFailed:
                self._replace()
                raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop()

    # --- the child ---------------------------------------------------------------------------

    def _spawn(self) -> None:
        env = dict(os.environ)
        paths = [str(PROJECT_ROOT), env.get("PYTHONPATH")]  # it imports the runner's own code
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        command = [sys.executable, "-m", "inference.engine.picture_decoder", self.target]
        self._child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=env, cwd=str(PROJECT_ROOT))  # fmt: skip
        os.set_blocking(self._child.stdin.fileno(), False)  # a hung child never blocks a write
        self._ready = False

    def _replace(self) -> None:
        child = self._child
        self._stop()
        self.restarts += 1
        if child is not None:
            log.warning("the picture decoder (pid %d) ended with status %s; starting another",
                        child.pid, child.returncode)  # fmt: skip
        self._spawn()

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        child.kill()  # it holds nothing worth a graceful end
        child.wait()
        child.stdin.close()
        child.stdout.close()

    def _hand_over(self, data: bytes) -> float:
        """Give the child the picture (once it is ready); the deadline of its answer."""
        if self._child is None or self._child.poll() is not None:
            raise BrokenPipeError("it is not running")
        if not self._ready:
            try:
                said = _read_exact(self._child.stdout.fileno(), len(READY),
                                   time.monotonic() + START_TIMEOUT_S)  # fmt: skip
            except DecoderFailed:
                said = b""
            if said != READY:
                raise BrokenPipeError("it did not start")
            self._ready = True
        deadline = time.monotonic() + self.timeout
        _write_all(self._child.stdin.fileno(), _LENGTH.pack(len(data)) + data, deadline)
        try:
            said = _read_exact(self._child.stdout.fileno(), len(TAKEN), deadline)
        except DecoderFailed as exc:
            raise BrokenPipeError(f"it did not read the picture: {exc}") from exc
        if said != TAKEN:
            raise BrokenPipeError("it answered out of turn")
        return deadline

    def _receive(self, deadline: float) -> DecodedPicture | None:
        fd = self._child.stdout.fileno()
        status, width, height = _REPLY.unpack(_read_exact(fd, _REPLY.size, deadline))
        if status == UNREADABLE:
            return None
        if status != DECODED or not width or not height or width * height > self.max_pixels:
            raise DecoderFailed(f"the picture decoder answered a {width} x {height} picture "
                                f"(status {status}), beyond what it may")  # fmt: skip
        return DecodedPicture(width, height, _read_exact(fd, width * height * 3, deadline))


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            raise DecoderFailed("the picture decoder did not take the picture in time")
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    parts, left = [], n
    while left:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise DecoderFailed("the picture decoder ran out of time on the picture")
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            raise DecoderFailed("the picture decoder died on the picture")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


# --- in the child --------------------------------------------------------------------------------


def _serve(decode: Callable[[bytes], DecodedPicture | None], requests, replies) -> None:
    replies.write(READY)
    replies.flush()
    while True:
        header = requests.read(_LENGTH.size)
        if len(header) < _LENGTH.size:
            return  # the runner is gone (or closed us): nothing more will come
        (length,) = _LENGTH.unpack(header)
        if length > MAX_INPUT_BYTES:
            sys.exit("picture decoder: a picture beyond any body the appliance accepts")
        data = requests.read(length)
        if len(data) < length:
            return
        replies.write(TAKEN)
        replies.flush()
        picture = decode(data)
        if picture is None:
            replies.write(_REPLY.pack(UNREADABLE, 0, 0))
        else:
            replies.write(_REPLY.pack(DECODED, picture.width, picture.height) + picture.rgb)
        replies.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("decode", help="module:function that decodes a picture's bytes")
    args = parser.parse_args(argv)
    # The replies own the real stdout; whatever else writes to fd 1 (a library's print) goes to
    # stderr instead of into a reply.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        os.nice(ENCODER_NICE)  # below the steps, as the encoder thread is
    except OSError:
        pass
    # A crash here is expected now and then (that is why it is a process): no core file of it
    # in the project's directory.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    module, _, name = args.decode.partition(":")
    decode = getattr(importlib.import_module(module), name)
    _serve(decode, sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
