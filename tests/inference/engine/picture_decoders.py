"""Picture decoders that a decoder process under test runs instead of the real one
(PictureDecoder(decode=NAME)). They run in the decoder process, so a fault here ends that
process for real, as a native fault in stb_image on hostile bytes would. Each reads pictures as
the real decoder does, except a picture that ends with POISON."""

import fcntl
import os
import termios
import time
from types import SimpleNamespace

import psutil

from inference.engine.picture_decoder import decode_with_libmtmd

# Bytes after a PNG's last chunk: the picture still has a readable header, and stb_image would
# read it, but these decoders treat it as the hostile picture.
POISON = b"this picture kills the decoder"


def aborts_on_poison(data: bytes):
    if data.endswith(POISON):
        os.abort()  # SIGABRT: what a C library's assertion or a detected heap smash does
    return decode_with_libmtmd(data)


def hangs_on_poison(data: bytes):
    if data.endswith(POISON):
        time.sleep(3600)
    return decode_with_libmtmd(data)


def claims_too_many_pixels_on_poison(data: bytes):
    """A decoder subverted by its picture: it says a size no picture may have."""
    if data.endswith(POISON):
        return SimpleNamespace(width=100_000, height=100_000, rgb=b"")
    return decode_with_libmtmd(data)


def wait_until_the_pipe_holds(process: psutil.Process, fd: int, n: int) -> None:
    """Wait until `n` bytes wait unread in the pipe that is `process`'s descriptor `fd` (a
    frozen decoder's picture, handed over and not read)."""
    for _ in range(6000):
        pipe = os.open(f"/proc/{process.pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
        try:
            held = int.from_bytes(fcntl.ioctl(pipe, termios.FIONREAD, b"\0" * 4), "little")
        finally:
            os.close(pipe)
        if held == n:
            return
        time.sleep(0.01)
    raise AssertionError(f"the pipe never held the {n} bytes")
