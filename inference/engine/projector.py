"""A vision projector loaded beside a model with libmtmd (llama.cpp's tools/mtmd): runner-process
code, like runner.py, the only other module that calls llama.cpp.

It reads a prompt with images as llama-server does (each picture decoded by libmtmd's own decoder,
mtmd_helper_bitmap_init_from_buf, but in the runner's decoder process: picture_decoder.py;
mtmd_tokenize splits text and images into chunks) and encodes one image chunk at a time
(mtmd_encode_chunk). Everything here runs on the engine's encoder thread
(inference.engine.vision.Encoder), never on the step thread: libmtmd's context is that
thread's alone. The embeddings it returns are fed into llama_decode by the runner, on the step
thread, in chunks inside the step budget.
"""

import ctypes
import hashlib
import os

import llama_cpp as ll
import llama_cpp.mtmd_cpp as mt
import numpy as np

from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.picture_decoder import DecoderFailed, PictureDecoder
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.vision import ImageSpan, MediaPrompt, image_key, media_ids


def route_logs(callback) -> None:
    """libmtmd's log (one INFO line per image part) through the runner's llama.cpp callback."""
    mt.mtmd_helper_log_set(callback, ctypes.c_void_p(0))


class ProjectorError(RuntimeError):
    """libmtmd could not load the projector with this model."""


def projector_key(path: str, sha256: str = "") -> str:
    """The projector's identity in image keys (the encoder cache, the prompt cache's pseudo ids,
    the disk tier across restarts): its file's sha256 where the catalog knows it (the same
    file anywhere, under any name), else its file by name, size and modification time, read
    at load without hashing a file of hundreds of MB."""
    if sha256:
        return hashlib.sha256(f"mmproj sha256\n{sha256.lower()}".encode()).hexdigest()
    stat = os.stat(path)
    text = f"{os.path.realpath(path)}\n{stat.st_size}\n{stat.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()


class Projector:
    def __init__(self, path: str, model, *, n_threads: int, use_gpu: bool, flash_attn: bool,
                 n_embd: int, max_whole: int, sha256: str = "",
                 pictures: PictureDecoder | None = None):  # fmt: skip
        """`n_embd`: the model's input width (llama_model_n_embd_inp); `max_whole`: the most
        image tokens one llama_decode takes in one ubatch (an image the projector wants
        decoded with causal attention off must fit it); `sha256`: the file's digest where the
        catalog knows it (projector_key); `pictures`: the decoder process to read pictures
        with (a real one by default), the projector's to close."""
        if not os.path.isfile(path):
            raise ProjectorError(f"projector file not found: {path}")
        params = mt.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = True  # its compute buffers are sized at load, not in someone's answer
        params.flash_attn_type = (ll.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn
                                  else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)  # fmt: skip
        self.ctx = mt.mtmd_init_from_file(path.encode(), model, params)
        if not self.ctx:
            raise ProjectorError(f"libmtmd could not load the projector {path} with this model "
                                 "(see the log for why)")  # fmt: skip
        self.path = path
        self.key = projector_key(path, sha256)
        self.n_threads = n_threads
        self.use_gpu = use_gpu
        self.n_embd = n_embd
        self.max_whole = max_whole
        self.vision = bool(mt.mtmd_support_vision(self.ctx))
        self.mrope = bool(mt.mtmd_decode_use_mrope(self.ctx))
        marker = mt.mtmd_get_marker(self.ctx)
        self.marker = marker.decode() if marker else MEDIA_MARKER
        # With M-RoPE (Qwen2-VL and its kin: the language model's rope type) an image's rows
        # take 2-D positions, fewer than its tokens: each span carries them (ImageSpan.mrope)
        # and every KV position goes through vision.kv_position.
        self.problem = None
        if not self.vision:
            self.problem = "its projector has no vision encoder"
        self.image_tokens = self._fixed_image_tokens()
        self.pictures = None
        if not self.problem:
            self.pictures = (pictures or PictureDecoder()).start()

    def _fixed_image_tokens(self) -> int | None:
        """Image tokens per image where they do not depend on the picture's size (two pictures
        of different shapes give the same count), else None."""
        if self.problem:
            return None
        counts = set()
        for width, height in ((64, 48), (48, 96)):
            bitmap = mt.mtmd_bitmap_init(width, height, None)  # a placeholder: counts only
            try:
                chunks = self._tokenize(self.marker, [bitmap], add_special=False)
            except Refused:
                return None
            finally:
                mt.mtmd_bitmap_free(bitmap)
            try:
                counts.add(mt.mtmd_helper_get_n_tokens(chunks))
            finally:
                mt.mtmd_input_chunks_free(chunks)
        return counts.pop() if len(counts) == 1 else None

    # --- on the encoder thread ---------------------------------------------------------------

    def read(self, prompt: str, images: tuple[Image, ...], add_special: bool) -> MediaPrompt:
        """The prompt's chunks: its text tokens and each image's span of pseudo ids."""
        if self.problem:
            raise Refused(f"this model does not take images: {self.problem}",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        text = prompt.replace(MEDIA_MARKER, self.marker) if self.marker != MEDIA_MARKER else prompt
        bitmaps = []
        try:
            for n, image in enumerate(images, start=1):
                bitmaps.append(self._bitmap(image, n if len(images) > 1 else None))
            chunks = self._tokenize(text, bitmaps, add_special=add_special)
        finally:
            for bitmap in bitmaps:
                mt.mtmd_bitmap_free(bitmap)
        try:
            return self._spans(chunks, images)
        except BaseException:
            mt.mtmd_input_chunks_free(chunks)
            raise

    def _bitmap(self, image: Image, n: int | None):
        which = f"image {n}" if n else "the image"
        try:
            picture = self.pictures.decode(image.data)
        except DecoderFailed as exc:
            raise Refused(f"{which} could not be decoded: {exc} (it is unreadable)",
                          kind=RefusalKind.INVALID, field="images") from exc  # fmt: skip
        if picture is None:
            raise Refused(f"{which} could not be decoded: the {image.kind.upper()} data is "
                          "corrupt or of a kind the decoder does not read",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        pixels = (ctypes.c_uint8 * len(picture.rgb)).from_buffer_copy(picture.rgb)
        bitmap = mt.mtmd_bitmap_init(picture.width, picture.height, pixels)
        mt.mtmd_bitmap_set_id(bitmap, image.digest.encode())
        return bitmap

    def _tokenize(self, text: str, bitmaps: list, *, add_special: bool):
        data = text.encode("utf-8", errors="replace")
        chunks = mt.mtmd_input_chunks_init()
        inp = mt.mtmd_input_text(data, len(data), add_special, True)
        array = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
        if rc != 0:
            mt.mtmd_input_chunks_free(chunks)
            reason = {1: "the number of images does not match the prompt's media markers",
                      2: "an image could not be preprocessed"}.get(rc, f"error {rc}")  # fmt: skip
            raise Refused(f"the prompt with its images could not be read: {reason}",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        return chunks

    def _spans(self, chunks, images: tuple[Image, ...]) -> MediaPrompt:
        ids: list[int] = []
        spans: list[ImageSpan] = []
        digests = iter(image.digest for image in images)
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            kind = mt.mtmd_input_chunk_get_type(chunk)
            n = int(mt.mtmd_input_chunk_get_n_tokens(chunk))
            if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                size = ctypes.c_size_t()
                tokens = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(size))
                ids.extend(tokens[: size.value])
                continue
            if kind != mt.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise Refused("this model's projector reads audio, not images",
                              kind=RefusalKind.INVALID, field="images")  # fmt: skip
            n_pos = int(mt.mtmd_input_chunk_get_n_pos(chunk))
            if n_pos != n and not self.mrope:
                raise Refused("this projector's images take fewer positions than tokens, which "
                              "this engine does not feed", kind=RefusalKind.INVALID,
                              field="images")  # fmt: skip
            raw = mt.mtmd_input_chunk_get_id(chunk)
            digest = raw.decode() if raw else next(digests, "")
            mrope = self._mrope_positions(chunk, n) if self.mrope else None
            identity = digest
            if mrope is not None:  # the same picture is the same KV only where its rows sit alike
                layout = hashlib.sha256(mrope[0].tobytes() + mrope[1].tobytes()).hexdigest()
                identity = f"{digest}\n{layout}"
            key = image_key(self.key, identity)
            whole = bool(mt.mtmd_decode_use_non_causal(self.ctx, chunk))
            if whole and n > self.max_whole:
                raise Refused(f"an image here is {n} tokens, and this projector needs it read in "
                              f"one batch: load the model with a batch of at least {n}",
                              kind=RefusalKind.INVALID, field="images")  # fmt: skip
            spans.append(ImageSpan(len(ids), n, key, digest, whole, n_pos=n_pos, mrope=mrope))
            ids.extend(media_ids(key, n))
        return MediaPrompt(ids, spans, native=chunks)

    @staticmethod
    def _mrope_positions(chunk, n: int) -> tuple[np.ndarray, np.ndarray]:
        """An image chunk's M-RoPE row positions as ImageSpan.mrope keeps them: in llama.cpp's
        section order (t, y, x, z: mtmd-helper's set_position_mrope_2d), at a first position of
        0, and how much each moves per position (libmtmd's mtmd_image_tokens_get_decoder_pos,
        read at 0 and 1: a section that holds the image's number, not a position, does not)."""
        tokens = mt.mtmd_input_chunk_get_tokens_image(chunk)
        if not tokens:
            raise RuntimeError("libmtmd gave an image chunk without its image tokens")

        def at(base: int) -> np.ndarray:
            rows = np.empty((4, n), dtype=np.int32)
            for i in range(n):
                pos = mt.mtmd_image_tokens_get_decoder_pos(tokens, base, i)
                rows[:, i] = (pos.t, pos.y, pos.x, pos.z)
            return rows

        offsets = at(0)
        return offsets, at(1) - offsets

    def encode(self, prompt: MediaPrompt, index: int) -> np.ndarray:
        """The embeddings of the prompt's `index`th image: float32, n_tokens x n_embd."""
        span = prompt.spans[index]
        chunk = self._image_chunk(prompt.native, index)
        rc = mt.mtmd_encode_chunk(self.ctx, chunk)
        if rc != 0:
            raise RuntimeError(f"the projector failed to encode an image (error {rc})")
        pointer = mt.mtmd_get_output_embd(self.ctx)
        if not pointer:
            raise RuntimeError("the projector gave no embeddings")
        rows = np.ctypeslib.as_array(pointer, shape=(span.n_tokens * self.n_embd,))
        return rows.reshape(span.n_tokens, self.n_embd).copy()

    @staticmethod
    def _image_chunk(chunks, index: int):
        seen = -1
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            if mt.mtmd_input_chunk_get_type(chunk) != mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                seen += 1
                if seen == index:
                    return chunk
        raise IndexError(index)

    @staticmethod
    def free(prompt: MediaPrompt) -> None:
        if prompt.native is not None:
            mt.mtmd_input_chunks_free(prompt.native)
            prompt.native = None

    def info(self) -> dict:
        return {"path": self.path, "image_tokens": self.image_tokens, "threads": self.n_threads,
                "problem": self.problem}  # fmt: skip

    def close(self) -> None:
        if self.pictures is not None:
            self.pictures.close()
        if self.ctx:
            mt.mtmd_free(self.ctx)
            self.ctx = None
