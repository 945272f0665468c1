"""The chat page's pictures on disk: stored owner-only with their sha256, kind, size and pixel
size, shared by a question's versions, and removed with their message, conversation or user."""

import hashlib
import stat
import struct
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from dashboard.chat import ChatRefused, images
from dashboard.models import ChatImage, Conversation, Message
from inference.engine.generation import MAX_IMAGES
from tests.inference.projector_gguf import picture

pytestmark = pytest.mark.django_db(transaction=True)  # files go once a delete commits


def _question(user, text="What is this?") -> Message:
    conversation = Conversation.objects.create(user=user, title="Pictures")
    return Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)


def _sent(user, data: bytes, message: Message | None = None) -> ChatImage:
    image = images.store(user, data)
    images.attach([image], message or _question(user))
    image.refresh_from_db()
    return image


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- storing -------------------------------------------------------------------------------------


def test_a_picture_is_stored_owner_only_with_its_digest_kind_size_and_pixel_size(member):
    data = picture(40, 30, kind="png")
    image = images.store(member, data)

    assert (image.sha256, image.kind, image.size_bytes) == (
        hashlib.sha256(data).hexdigest(), "png", len(data))  # fmt: skip
    assert (image.width, image.height) == (40, 30)
    assert image.message is None  # waiting to be sent
    path = images.path_of(image)
    assert path.read_bytes() == data
    assert path.name == f"{image.sha256}.png"
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    assert _mode(images.images_dir()) == 0o700


def test_a_bmp_tells_its_pixel_size_too(member):
    image = images.store(member, picture(17, 9, kind="bmp"))
    assert (image.kind, image.width, image.height) == ("bmp", 17, 9)


def test_the_pixel_size_of_a_jpeg_and_a_gif_is_read_from_their_headers():
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 480, 640, 1) + b"\x01\x11\x00"
    assert images.pixel_size(b"\xff\xd8" + app0 + sof0 + b"\xff\xd9", "jpeg") == (640, 480)
    assert images.pixel_size(b"GIF89a" + struct.pack("<HH", 320, 200) + b"\x00" * 8,
                             "gif") == (320, 200)  # fmt: skip
    assert images.pixel_size(b"\xff\xd8\xff", "jpeg") is None  # cut short: no size, no error


@pytest.mark.parametrize(
    ("data", "said"),
    [(b"%PDF-1.7 not a picture", "not a JPEG, PNG, GIF or BMP"),
     (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WEBP images are not supported"),
     (b"", "empty")],
)  # fmt: skip
def test_what_is_no_picture_the_runner_reads_is_refused_and_nothing_is_kept(member, data, said):
    with pytest.raises(ChatRefused) as refused:
        images.store(member, data)
    assert said in refused.value.message
    assert not ChatImage.objects.exists()


def test_a_picture_over_the_cap_is_refused(member, monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(ChatRefused) as refused:
        images.store(member, picture(64, 48))
    assert refused.value.code == "too_large"


def test_one_person_may_have_only_so_many_pictures_waiting(member, monkeypatch):
    monkeypatch.setattr(images, "MAX_WAITING", 2)
    images.store(member, picture(seed=1))
    images.store(member, picture(seed=2))
    with pytest.raises(ChatRefused) as refused:
        images.store(member, picture(seed=3))
    assert refused.value.code == "too_many"


def test_an_attachment_never_sent_is_removed_after_a_day(member):
    stale = images.store(member, picture(seed=1))
    ChatImage.objects.filter(pk=stale.pk).update(
        created_at=timezone.now() - timedelta(hours=images.WAITING_HOURS + 1)
    )
    fresh = images.store(member, picture(seed=2))  # each upload sweeps

    assert list(ChatImage.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert not images.path_of(stale).exists()
    assert images.path_of(fresh).exists()


# --- sending -----------------------------------------------------------------------------------


def test_a_question_gets_its_pictures_in_the_order_they_were_attached(member):
    first, second = images.store(member, picture(seed=1)), images.store(member, picture(seed=2))
    question = _question(member)
    images.attach(images.chosen(member, [second.pk, first.pk], None), question)
    assert [i.pk for i in question.images.all()] == [second.pk, first.pk]


def test_someone_elses_picture_or_one_already_sent_cannot_be_chosen(member, outsider):
    theirs = images.store(outsider, picture(seed=1))
    with pytest.raises(ChatRefused):
        images.chosen(member, [theirs.pk], None)
    sent = _sent(member, picture(seed=2))
    with pytest.raises(ChatRefused):
        images.chosen(member, [sent.pk], None)  # in another conversation: not this one's


def test_at_most_max_images_can_be_chosen(member):
    with pytest.raises(ChatRefused) as refused:
        images.chosen(member, list(range(1, MAX_IMAGES + 2)), None)
    assert refused.value.code == "too_many"


def test_a_loaded_picture_is_checked_against_its_digest(member):
    image = _sent(member, picture(seed=1))
    assert images.load(image).data == images.path_of(image).read_bytes()
    images.path_of(image).write_bytes(picture(seed=9))
    with pytest.raises(ChatRefused) as refused:
        images.load(image)
    assert refused.value.code == "image_gone"


# --- deleting ----------------------------------------------------------------------------------


def test_deleting_the_message_removes_its_picture_from_the_disk(member):
    image = _sent(member, picture(seed=1))
    path = images.path_of(image)
    image.message.delete()
    assert not ChatImage.objects.exists()
    assert not path.exists()


def test_deleting_the_conversation_removes_its_pictures(member):
    question = _question(member)
    kept = [_sent(member, picture(seed=s), question) for s in (1, 2)]
    paths = [images.path_of(i) for i in kept]
    question.conversation.delete()
    assert not any(p.exists() for p in paths)


def test_deleting_the_person_removes_their_pictures_and_their_directory(member):
    _sent(member, picture(seed=1))
    images.store(member, picture(seed=2))  # waiting, too
    directory = images.owner_dir(member.pk)
    assert directory.is_dir()
    member.delete()
    assert not ChatImage.objects.exists()
    assert not directory.exists()


def test_a_file_shared_by_two_versions_of_a_question_stays_until_the_last_goes(member):
    image = _sent(member, picture(seed=1))
    edited = Message.objects.create(conversation=image.message.conversation,
                                    role=Message.Role.USER, content="And now?")  # fmt: skip
    images.attach([image], edited)  # an edit keeps the question's picture
    copy = edited.images.get()
    assert copy.pk != image.pk and images.path_of(copy) == images.path_of(image)

    image.message.delete()
    assert images.path_of(copy).exists()
    edited.delete()
    assert not images.path_of(copy).exists()


def test_a_delete_rolled_back_keeps_the_file(member):
    image = _sent(member, picture(seed=1))
    with pytest.raises(RuntimeError), transaction.atomic():
        image.message.delete()
        raise RuntimeError("rolled back")
    assert ChatImage.objects.filter(pk=image.pk).exists()
    assert images.path_of(image).exists()


def test_another_persons_copy_of_the_same_picture_is_a_file_of_their_own(member, outsider):
    data = picture(seed=1)
    mine, theirs = _sent(member, data), _sent(outsider, data)
    assert images.path_of(mine) != images.path_of(theirs)
    mine.message.conversation.delete()
    assert images.path_of(theirs).read_bytes() == data
