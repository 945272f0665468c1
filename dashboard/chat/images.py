"""The chat page's pictures on disk: stored with the conversation, read back for a turn's prompt
and for the owner's thumbnails, and removed with what they belong to.

1. Upload (`store`): the page sends each picture on its own (POST /chat/images/, at most
   MAX_IMAGE_BYTES: appliance.gate refuses a larger body from its headers). Its kind is sniffed
   (inference.engine.media.Image: not a picture, or a WebP, is refused); its pixel size is read
   from the header only, never decoded (the runner decodes). The bytes go to
   DATA_DIR/chat-images/<user id>/<sha256>.<kind> (directories 0700, files 0600, as warm
   memory's: a household's pictures are as private as its text), and a ChatImage without a
   message records it: an attachment waiting to be sent.
2. Send (`chosen`, `attach`): a question names its images by id; each becomes the message's, in
   that order. An edit's version of a question gets its own records of the same files.
3. A turn (`load`): the bytes are read back as an Image, checked against their sha256.
4. Deleting a message, a conversation or a user deletes its records (cascades), and each record
   deleted removes its file once the transaction commits, unless another record of the same
   owner still names it (the versions of a question share one). Waiting attachments nobody sent
   go after WAITING_HOURS (swept at each upload).

A file and the records that name it are changed under one lock per owner's directory, so a
delete never removes a file that an upload of the same picture has just recorded again.
"""

import fcntl
import os
import shutil
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.db.models.signals import post_delete
from django.urls import reverse
from django.utils import timezone

from dashboard.chat import ChatRefused
from dashboard.models import ChatImage, Conversation, Message
from inference.engine.generation import MAX_IMAGES
from inference.engine.media import Image
from inference.engine.refusals import Refused

MAX_IMAGE_BYTES = 20 << 20  # a phone's full-size photo fits; the projector downscales it anyway
MAX_WAITING = MAX_IMAGES  # attachments one person may have uploaded and not sent yet
WAITING_HOURS = 24  # an attachment never sent is removed after this long
DIRECTORY = "chat-images"
LOCK_NAME = ".lock"

_local_locks: dict[int, threading.Lock] = {}  # flock is per process; threads need their own
_local_locks_guard = threading.Lock()


def images_dir() -> Path:
    return Path(settings.DATA_DIR) / DIRECTORY


def owner_dir(user_id: int) -> Path:
    return images_dir() / str(int(user_id))


def path_of(image: ChatImage) -> Path:
    return owner_dir(image.user_id) / f"{image.sha256}.{image.kind}"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)  # one made before, or under a permissive umask


@contextmanager
def _owner_lock(user_id: int) -> Iterator[Path]:
    """The owner's directory, made if missing, held against other writers and deleters."""
    root, directory = images_dir(), owner_dir(user_id)
    _private_dir(root)
    _private_dir(directory)
    with _local_locks_guard:
        local = _local_locks.setdefault(int(user_id), threading.Lock())
    with local, open(directory / LOCK_NAME, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield directory


# --- 1. upload -----------------------------------------------------------------------------------


def pixel_size(data: bytes, kind: str) -> tuple[int, int] | None:
    """(width, height) from a picture's header, or None when the header does not say plainly.
    Reads a few bytes; a JPEG's frame header is found by walking its segments."""
    try:
        if kind == "png" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if kind == "gif":
            return struct.unpack("<HH", data[6:10])
        if kind == "bmp":
            (header,) = struct.unpack("<I", data[14:18])
            if header == 12:  # OS/2's BITMAPCOREHEADER
                return struct.unpack("<HH", data[18:22])
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)  # a negative height: rows stored top-down
        if kind == "jpeg":
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn; not DHT, JPG, DAC


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xDA)):  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def store(user, data: bytes) -> ChatImage:
    """Steps 1: record `data` as `user`'s attachment waiting to be sent. Raises ChatRefused for
    a file that is no picture the runner reads, one too large, or one too many waiting."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ChatRefused("too_large", f"an image may be at most {MAX_IMAGE_BYTES >> 20} MB")
    try:
        image = Image.from_bytes(data, field="image")
    except Refused as exc:
        raise ChatRefused("invalid", str(exc)) from None
    discard_stale()
    if ChatImage.objects.filter(user=user, message__isnull=True).count() >= MAX_WAITING:
        raise ChatRefused("too_many", f"{MAX_WAITING} images are waiting to be sent already; "
                          "send them or remove some first")  # fmt: skip
    width, height = pixel_size(data, image.kind) or (None, None)
    with _owner_lock(user.pk) as directory:
        final = directory / f"{image.digest}.{image.kind}"
        if not final.exists():
            temporary = directory / f".{image.digest}.{os.getpid()}.part"
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                with os.fdopen(descriptor, "wb") as out:
                    out.write(data)
                os.replace(temporary, final)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
        return ChatImage.objects.create(
            user=user, sha256=image.digest, kind=image.kind, size_bytes=len(data),
            width=width, height=height,
        )  # fmt: skip


def discard_stale() -> int:
    """Attachments nobody sent within WAITING_HOURS, deleted (their files follow, step 4)."""
    cutoff = timezone.now() - timedelta(hours=WAITING_HOURS)
    deleted, _ = ChatImage.objects.filter(message__isnull=True, created_at__lt=cutoff).delete()
    return deleted


# --- 2. send ---------------------------------------------------------------------------------


def chosen(user, ids: Sequence[int], conversation: Conversation | None) -> list[ChatImage]:
    """The images a question is sent with, in the order of `ids`: the user's attachments
    waiting to be sent, or images already in `conversation` (an edit keeps its question's).
    Anything else (another person's, a removed one) is refused, naming no owner."""
    if len(ids) > MAX_IMAGES:
        raise ChatRefused("too_many", f"a message may have at most {MAX_IMAGES} images")
    if not ids:
        return []
    mine = ChatImage.objects.filter(user=user, pk__in=ids)
    if conversation is not None:
        mine = mine.filter(Q(message__isnull=True) | Q(message__conversation=conversation))
    else:
        mine = mine.filter(message__isnull=True)
    found = {image.pk: image for image in mine}
    if any(pk not in found for pk in ids):
        raise ChatRefused("image_gone", "an attached image is no longer there; attach it again")
    return [found[pk] for pk in ids]


def attach(images: Sequence[ChatImage], message: Message) -> None:
    """Give `message` `images`, in order (inside the turn's transaction): a waiting one becomes
    the message's; one of another message (an edit's kept image) is recorded again for this
    one, naming the same file."""
    for position, image in enumerate(images):
        if image.message_id is None:
            taken = ChatImage.objects.filter(pk=image.pk, message__isnull=True).update(
                message=message, position=position
            )
            if not taken:  # sent meanwhile, from another window
                raise ChatRefused("image_gone", "an attached image was sent already; attach it "
                                  "again")  # fmt: skip
        else:
            ChatImage.objects.create(
                user_id=image.user_id, message=message, position=position, sha256=image.sha256,
                kind=image.kind, size_bytes=image.size_bytes, width=image.width,
                height=image.height,
            )  # fmt: skip


# --- 3. a turn -------------------------------------------------------------------------------


def load(image: ChatImage) -> Image:
    """The picture's bytes as the request's Image; refused when the file is gone or altered."""
    try:
        loaded = Image.from_bytes(path_of(image).read_bytes())
    except (OSError, Refused):
        loaded = None
    if loaded is None or loaded.digest != image.sha256:
        raise ChatRefused("image_gone", "an image of this conversation is missing from the "
                          "appliance's disk; edit that message to attach it again")  # fmt: skip
    return loaded


def as_page(image: ChatImage) -> dict:
    """An image as the page shows it (a thumbnail that opens the picture)."""
    return {"id": image.pk, "url": reverse("chat_image", args=[image.pk]),
            "width": image.width, "height": image.height}  # fmt: skip


# --- 4. deleting -------------------------------------------------------------------------------


def _forget_file(user_id: int, sha256: str, kind: str) -> None:
    directory = owner_dir(user_id)
    if not directory.is_dir():
        return
    with _owner_lock(user_id):
        if not ChatImage.objects.filter(user_id=user_id, sha256=sha256).exists():
            (directory / f"{sha256}.{kind}").unlink(missing_ok=True)
        gone = not get_user_model().objects.filter(pk=user_id).exists()
        if gone and not any(p.name != LOCK_NAME for p in directory.iterdir()):
            shutil.rmtree(directory, ignore_errors=True)  # a deleted person's: nothing left


def _deleted(sender, instance: ChatImage, **kwargs) -> None:
    # After the commit: a delete rolled back keeps its file.
    user_id, sha256, kind = instance.user_id, instance.sha256, instance.kind
    transaction.on_commit(lambda: _forget_file(user_id, sha256, kind))


def connect() -> None:
    post_delete.connect(_deleted, sender=ChatImage, dispatch_uid="chat-image-files")
