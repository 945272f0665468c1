"""The runner's picture decoder process (inference.engine.picture_decoder), for real: a child
process that decodes with libmtmd's own decoder, killed for real by the decoders in
picture_decoders.py. A picture that kills or hangs it fails alone; the next one is read."""

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from inference.engine.picture_decoder import DecoderFailed, PictureDecoder, decode_with_libmtmd
from tests.inference.engine import picture_decoders
from tests.inference.engine.picture_decoders import POISON, wait_until_the_pipe_holds
from tests.inference.projector_gguf import picture

pytestmark = pytest.mark.model  # it loads llama.cpp's libmtmd


@pytest.fixture
def decoders():
    """Start PictureDecoders; close them afterwards."""
    started: list[PictureDecoder] = []

    def start(decode=decode_with_libmtmd, **kwargs) -> PictureDecoder:
        decoder = PictureDecoder(decode, **kwargs).start()
        started.append(decoder)
        return decoder

    yield start
    for decoder in started:
        decoder.close()


def test_a_picture_decoded_in_the_decoder_process_has_the_pixels_llama_servers_decoder_reads(
    decoders,
):
    decoder = decoders()
    png, bmp = picture(64, 48, seed=5), picture(64, 48, seed=5, kind="bmp")
    decoded = decoder.decode(png)
    assert (decoded.width, decoded.height) == (64, 48)
    assert decoded == decode_with_libmtmd(png)  # the same decoder, in this process
    assert decoder.decode(bmp) == decoded  # the same pixels, another format
    assert decoder.decode(picture(64, 48, seed=6)) != decoded


def test_a_picture_the_decoder_cannot_read_is_none_and_the_decoder_lives_on(decoders):
    decoder = decoders()
    pid = decoder.pid
    assert decoder.decode(b"\x89PNG\r\n\x1a\n" + b"\x13" * 64) is None
    assert decoder.decode(picture(seed=7)).width == 64
    assert decoder.pid == pid and decoder.restarts == 0


def test_a_decoder_that_dies_on_a_picture_fails_that_picture_and_is_started_again(decoders):
    decoder = decoders(picture_decoders.aborts_on_poison)
    pid = decoder.pid
    with pytest.raises(DecoderFailed, match="died on the picture"):
        decoder.decode(picture(seed=8) + POISON)
    assert decoder.restarts == 1 and decoder.pid != pid
    assert decoder.decode(picture(seed=8)).width == 64
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_decoder_that_hangs_on_a_picture_is_given_up_after_its_timeout(decoders):
    decoder = decoders(picture_decoders.hangs_on_poison, timeout=2.0)
    pid = decoder.pid
    with pytest.raises(DecoderFailed, match="ran out of time"):
        decoder.decode(picture(seed=9) + POISON)
    assert decoder.restarts == 1 and decoder.pid != pid
    assert decoder.decode(picture(seed=9)).width == 64
    assert not psutil.pid_exists(pid)


def test_a_decoder_that_claims_more_pixels_than_a_picture_may_have_is_not_believed(decoders):
    decoder = decoders(picture_decoders.claims_too_many_pixels_on_poison)
    with pytest.raises(DecoderFailed, match="100000 x 100000"):
        decoder.decode(picture(seed=10) + POISON)
    assert decoder.restarts == 1
    assert decoder.decode(picture(seed=10)).width == 64


def test_a_decoder_killed_while_idle_is_replaced_without_failing_the_next_picture(decoders):
    decoder = decoders()
    assert decoder.decode(picture(seed=11)).width == 64
    pid = decoder.pid
    os.kill(pid, signal.SIGKILL)
    process = psutil.Process(pid)
    for _ in range(1000):  # until the kernel has ended it (it stays a zombie until reaped)
        if process.status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.01)
    assert decoder.decode(picture(seed=11)).width == 64
    assert decoder.restarts == 1 and decoder.pid != pid


def test_a_decoder_killed_before_it_read_a_picture_is_replaced_and_the_picture_decoded(decoders):
    """Frozen with a picture waiting for it and then killed, the decoder never had the picture
    in its hands: that is not the picture's fault, so the next decoder reads it."""
    decoder = decoders()
    assert decoder.decode(picture(seed=12)).width == 64  # it is started, waiting for pictures
    waiting = picture(seed=13)
    process = psutil.Process(decoder.pid)
    process.send_signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            decoded = pool.submit(decoder.decode, waiting)
            wait_until_the_pipe_holds(process, 0, 8 + len(waiting))  # its length, its bytes
            process.send_signal(signal.SIGKILL)
            assert decoded.result().width == 64
    finally:
        if process.is_running():
            process.send_signal(signal.SIGKILL)
    assert decoder.restarts == 1 and decoder.pid != process.pid
