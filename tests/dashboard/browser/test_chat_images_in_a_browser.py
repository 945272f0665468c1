"""Pictures on the chat page, in Debian's chromium against a live appliance, on a desktop and a
phone: attached by the file picker, a paste and a drop, shown as thumbnails with a remove button,
sent, and shown in the conversation (and again after a reload); offered only for a model that
takes images, and a file the appliance cannot read is refused with a clear message."""

import base64

import pytest
from playwright.sync_api import expect

from inference.catalog.starter import starter_model_path
from tests.dashboard.browser.conftest import log_in
from tests.inference.projector_gguf import picture, write_projector

pytestmark = [pytest.mark.browser, pytest.mark.model]

ANSWER_MS = 180_000
VISION = "smollm2-vision"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
SIZES = [pytest.param(DESKTOP, id="desktop"), pytest.param(PHONE, id="phone")]

# A paste or a drop as the browser delivers one: a File in the event's DataTransfer.
DELIVER = """([kind, target, data]) => {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], kind + ".png", { type: "image/png" }));
  const element = document.getElementById(target);
  const how = { bubbles: true, cancelable: true };
  if (kind === "paste") {
    element.dispatchEvent(new ClipboardEvent("paste", { ...how, clipboardData: transfer }));
  } else {
    element.dispatchEvent(new DragEvent("dragenter", { ...how, dataTransfer: transfer }));
    element.dispatchEvent(new DragEvent("drop", { ...how, dataTransfer: transfer }));
  }
}"""


@pytest.fixture(scope="module")
def vision_model(live_appliance, tmp_path_factory) -> str:
    """The starter with a tiny random projector, registered as the household would
    (import_model --mmproj, issue 29 §1)."""
    starter = starter_model_path()
    projector = write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-starter.gguf", starter)
    try:
        live_appliance.manage("import_model", str(starter), "--mmproj", str(projector),
                              "--name", VISION)  # fmt: skip
    except RuntimeError as exc:
        if "--mmproj" in str(exc):
            pytest.skip("import_model takes no --mmproj yet: vision models are issue 29 §1")
        raise
    live_appliance.shell("from inference.models import LLMModel; LLMModel.objects.filter("
                         f"name={VISION!r}).update(default_params={{'max_tokens': 16}})")
    return VISION


def _png(seed: int) -> dict:
    return {"name": f"picture-{seed}.png", "mimeType": "image/png", "buffer": picture(seed=seed)}


def _b64(seed: int) -> str:
    return base64.b64encode(picture(seed=seed)).decode()


ARRIVED = "els => els.length > 0 && els.every((e) => e.complete && e.naturalWidth > 0)"


def _loaded(locator) -> bool:
    """Every image under `locator` has arrived from the appliance (the owner's view)."""
    return locator.evaluate_all(ARRIVED)


@pytest.mark.parametrize("size", SIZES)
def test_pictures_are_attached_shown_sent_and_kept_in_the_conversation(
    browser, live_appliance, vision_model, artifacts, size
):
    phone = size is PHONE
    name = "phone" if phone else "desktop"
    context = browser.new_context(viewport=size, is_mobile=phone, has_touch=phone)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, live_appliance, "alice", "pw-alice-123")

    # A model that takes no images is offered no attaching; a vision model is.
    expect(page.locator("#attach-tools")).to_be_hidden()
    page.select_option("#model", vision_model)
    expect(page.locator("#attach")).to_be_visible()
    camera = page.locator("#camera")  # a phone goes straight to its camera
    if phone:
        expect(camera).to_be_visible()
    else:
        expect(camera).to_be_hidden()
    assert page.locator("#camera-input").get_attribute("capture") == "environment"
    assert page.locator("#attach-input").get_attribute("accept") == "image/*"

    # 1. The file picker, 2. a paste, 3. a drop (desktop): a thumbnail each, with its remove button.
    pending = page.locator("#attachments .attachment img")
    page.set_input_files("#attach-input", files=[_png(1)])
    expect(pending).to_have_count(1)
    page.evaluate(DELIVER, ["paste", "prompt", _b64(2)])
    expect(pending).to_have_count(2)
    if not phone:
        page.evaluate(DELIVER, ["drop", "chat", _b64(3)])
        expect(pending).to_have_count(3)
        page.locator("#attachments .remove-image").last.click()  # changed my mind
        expect(pending).to_have_count(2)
    expect(page.locator("#attachments .remove-image")).to_have_count(2)
    page.wait_for_function("() => [...document.querySelectorAll('#attachments img')]"
                           ".every((e) => e.complete && e.naturalWidth > 0)")  # fmt: skip

    # A file the runner cannot read is refused with a clear message, and nothing else changes.
    page.set_input_files("#attach-input", files=[{
        "name": "photo.webp", "mimeType": "image/webp", "buffer": b"RIFF\0\0\0\0WEBPVP8 ",
    }])  # fmt: skip
    expect(page.locator("#status")).to_contain_text("WebP images are not supported")
    expect(pending).to_have_count(2)

    page.fill("#prompt", "What is in these pictures?")
    page.screenshot(path=str(artifacts / f"chat-images-{name}-composer.png"))

    page.click("#send")
    question = page.locator(".msg-user").last
    expect(question.locator(".msg-images img")).to_have_count(2, timeout=30_000)
    expect(page.locator("#attachments")).to_be_hidden()
    expect(page.locator("#send")).to_be_visible(timeout=ANSWER_MS)  # the turn has ended
    page.wait_for_function("() => [...document.querySelectorAll('.msg-user .msg-images img')]"
                           ".every((e) => e.complete && e.naturalWidth > 0)")  # fmt: skip
    page.screenshot(path=str(artifacts / f"chat-images-{name}-sent.png"))

    # Stored with the conversation: a reload shows them again, in the order attached.
    page.reload()
    shown = page.locator(".msg-user .msg-images img")
    expect(shown).to_have_count(2)
    page.wait_for_function("() => [...document.querySelectorAll('.msg-user .msg-images img')]"
                           ".every((e) => e.complete && e.naturalWidth > 0)")  # fmt: skip
    assert _loaded(shown)
    assert shown.first.get_attribute("width") == "64"  # the pixel size read from the header

    # An edit keeps the question's pictures unless removed: remove one, send the new version.
    if not phone:
        page.locator(".msg-user .edit").last.click()
        editor = page.locator(".editor")
        expect(editor.locator(".attachment img")).to_have_count(2)
        editor.locator(".remove-image").first.click()
        expect(editor.locator(".attachment img")).to_have_count(1)
        editor.locator("textarea").fill("And this one alone?")
        page.screenshot(path=str(artifacts / "chat-images-desktop-edit.png"))
        editor.locator("button[type=submit]").click()
        edited = page.locator(".msg-user").last
        expect(edited.locator(".msg-body")).to_have_text("And this one alone?", timeout=30_000)
        expect(edited.locator(".msg-images img")).to_have_count(1)
        expect(page.locator("#send")).to_be_visible(timeout=ANSWER_MS)
        page.reload()
        expect(page.locator(".msg-user").last.locator(".msg-images img")).to_have_count(1)
    context.close()
    assert errors == []
