"""Several boxes in a real browser: a live split-mode appliance (`manage.py serve` with
REDIS_URL) and two real inference worker processes on loopback. The dashboard has a card per
worker; a model only the web box has shows "no copy" on both boxes of its page, and "Copy to"
one of them fetches it there with its progress on the page, after which that box has the file
and the other still does not."""

import re
import shutil

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import ADMIN_PASSWORD, log_in
from tests.dashboard.browser.test_dashboard_in_a_browser import SHOTS
from tests.inference.ggufs import tiny_gguf
from tests.live import LiveAppliance
from tests.split.fixtures import no_workers_left
from tests.split.workers import REDIS_URL, WorkerProcess, clean_split_redis

pytestmark = [pytest.mark.browser, pytest.mark.redis]

COPY_TIMEOUT_MS = 120_000  # a deadline on a shared 2-core box


@pytest.fixture(scope="module")
def two_boxes(tmp_path_factory):
    client = clean_split_redis()
    no_workers_left(client)
    workdir = tmp_path_factory.mktemp("boxes-workers")
    workers = [WorkerProcess(workdir).start() for _ in range(2)]
    try:
        for worker in workers:
            worker.wait_until_alive()
        yield workers
    finally:
        for worker in workers:
            worker.stop()


@pytest.fixture(scope="module")
def split_appliance(tmp_path_factory, two_boxes):
    appliance = LiveAppliance(
        tmp_path_factory.mktemp("appliance-split"),
        ADMIN_PASSWORD=ADMIN_PASSWORD, TELEMETRY_INTERVAL_S="0.5", REDIS_URL=REDIS_URL,
    )  # fmt: skip
    appliance.manage("migrate", "--verbosity", "0")
    appliance.manage("bootstrap")
    tiny = tiny_gguf(appliance.data_dir / "models" / "Only-Here.Q8_0.gguf")
    appliance.manage("import_model", str(tiny))
    appliance.start()
    try:
        yield appliance
    finally:
        appliance.stop()


def shot(page, artifacts, name: str, locator=None) -> None:
    (locator or page).screenshot(path=str(artifacts / name))
    if SHOTS.parent.exists():  # the helpers' review folder, when there is one
        SHOTS.mkdir(exist_ok=True)
        shutil.copy(artifacts / name, SHOTS / name)


def test_two_boxes_show_on_the_dashboard_and_a_model_is_copied_to_one(
    browser, split_appliance, two_boxes, artifacts
):
    first, second = sorted(two_boxes, key=lambda w: w.name)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    log_in(page, split_appliance, "admin", ADMIN_PASSWORD)

    # 1. The dashboard: a card per worker, each with its host and the starter model (packaged
    #    with every box) named from the registry.
    page.goto(split_appliance.url + "/dashboard/")
    cards = page.locator("#boxes .box")
    expect(cards).to_have_count(2, timeout=20_000)
    expect(cards.nth(0).locator("h3")).to_have_text(first.name)
    expect(cards.nth(1).locator("h3")).to_have_text(second.name)
    for i in range(2):
        expect(cards.nth(i)).to_contain_text("smollm2", timeout=20_000)
        expect(cards.nth(i)).not_to_contain_text("only-here")
    expect(page.locator("#boxes-summary")).to_contain_text("2 inference workers")
    shot(page, artifacts, "boxes-split-dashboard.png", page.locator(".boxes-card"))

    # 2. The model only the web box has: no copy on either box, a Copy button for each.
    page.goto(split_appliance.url + "/models/only-here-q8_0/")
    rows = page.locator("#boxes [data-worker]")
    expect(rows).to_have_count(2)
    for i in range(2):
        expect(rows.nth(i).locator(".box-has")).to_have_text("no copy")
    shot(page, artifacts, "boxes-model-before.png", page.locator("#boxes"))

    # 3. Copy it to the first box: the page follows the copy and shows the result.
    page.locator(f"#boxes [data-worker='{first.name}'] button").click()
    row = page.locator(f"#boxes [data-worker='{first.name}']")
    expect(row.locator(".copy-message")).to_have_text(
        re.compile(rf"copied to Only-Here\.Q8_0\.gguf on {re.escape(first.name)}"),
        timeout=COPY_TIMEOUT_MS,
    )
    # Its next announcement (at most a heartbeat later) lists the file.
    for _ in range(20):
        if row.locator(".box-has").inner_text() == "has the file":
            break
        page.wait_for_timeout(500)
        page.reload()
    expect(row.locator(".box-has")).to_have_text("has the file")
    expect(row.locator("button")).to_have_count(0)
    other = page.locator(f"#boxes [data-worker='{second.name}']")
    expect(other.locator(".box-has")).to_have_text("no copy")
    shot(page, artifacts, "boxes-model-after.png", page.locator("#boxes"))

    # 4. The dashboard names the file on the box that has it now, and the request history
    #    which box answered a request and why.
    split_appliance.shell(
        "from inference.history import record_request\n"
        f"record_request(request_id='r1', model_name='only-here-q8_0', source='openai', "
        f"client='house-app', figures={{'total_time': 0.5}}, outcome='stop', "
        f"route={{'worker': {first.name!r}, 'reason': 'conversation'}})\n"
    )
    page.goto(split_appliance.url + "/dashboard/")
    card = page.locator("#boxes .box", has=page.locator("h3", has_text=first.name))
    expect(card).to_contain_text("only-here-q8_0", timeout=20_000)
    answered = page.locator("#requests td.box-col").first
    expect(answered).to_have_text(f"{first.name} · conversation")
    expect(answered).to_have_attribute("title", re.compile("the KV of the earlier turns is there"))
    assert errors == []

    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    log_in(phone, split_appliance, "admin", ADMIN_PASSWORD)
    phone.goto(split_appliance.url + "/dashboard/")
    expect(phone.locator("#boxes .box")).to_have_count(2, timeout=20_000)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 391
    shot(phone, artifacts, "boxes-split-phone.png", phone.locator(".boxes-card"))
    phone.goto(split_appliance.url + "/models/only-here-q8_0/")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 391
    shot(phone, artifacts, "boxes-model-phone.png", phone.locator("#boxes"))
    phone.close()
    page.close()
