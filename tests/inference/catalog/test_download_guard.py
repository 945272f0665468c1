"""The download guard with the real policy: loopback, link-local, multicast, unspecified and the
appliance's own Redis and database are refused before a byte goes there, redirects included;
private LAN ranges are allowed unless DOWNLOAD_ALLOW_PRIVATE is false; and a URL's credentials
are used for the request but shown nowhere. Only loopback is ever connected to: every other
address is judged by the classification alone."""

import base64
import ipaddress
import logging
import socket
from dataclasses import replace

import pytest
from django.urls import reverse

from inference.catalog import netguard
from inference.catalog.downloads import download_model, part_path
from inference.catalog.netguard import (
    DownloadPolicy,
    own_services,
    redact_text,
    redact_url,
    refusal,
)
from inference.models import Job

LOOPBACK = ipaddress.ip_address("127.0.0.1")


def new_job(url: str) -> Job:
    return Job.objects.create(kind=Job.Kind.DOWNLOAD, source=url)


def refused(address: str, port: int = 80, policy: DownloadPolicy | None = None) -> str | None:
    return refusal(ipaddress.ip_address(address), port, policy or netguard.settings_policy())


@pytest.fixture
def listener():
    """A port on loopback that nobody must connect to: it accepts nothing itself, so any
    connection, even one that sent no byte, waits in its queue to be seen."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


def connections(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


@pytest.mark.django_db
def test_a_download_to_loopback_is_refused_before_it_connects(models_dir, listener):
    port = listener.getsockname()[1]
    job = new_job(f"http://127.0.0.1:{port}/m.gguf")

    assert download_model(job.id) is None

    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert job.message == (
        "the download address 127.0.0.1 is a loopback address (this machine); "
        "downloads may only reach other machines"
    )
    assert connections(listener) == 0
    assert not part_path(job.id).exists()


@pytest.mark.django_db
def test_a_name_that_resolves_to_loopback_is_refused_naming_both(models_dir, listener):
    port = listener.getsockname()[1]
    job = new_job(f"http://localhost:{port}/m.gguf")
    assert download_model(job.id) is None
    job.refresh_from_db()
    assert job.message.startswith("the download address localhost (")
    assert "is a loopback address" in job.message
    assert connections(listener) == 0


@pytest.mark.django_db
def test_a_redirect_to_loopback_is_refused_before_it_connects(models_dir, model_server, listener):
    port = listener.getsockname()[1]
    model_server.redirects["tiny.gguf"] = f"http://127.0.0.1:{port}/"
    job = new_job(model_server.url("tiny.gguf"))

    assert download_model(job.id) is None

    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert job.message == (
        f"the server at {model_server.url('tiny.gguf')} redirected the download to "
        f"http://127.0.0.1:{port}/, but the download address 127.0.0.1 is a loopback address "
        "(this machine); downloads may only reach other machines"
    )
    assert connections(listener) == 0
    assert model_server.requests == [("tiny.gguf", None)]  # and a refusal is not retried


@pytest.mark.django_db
def test_an_allowed_redirect_is_followed_to_the_file(models_dir, model_server):
    model_server.redirects["latest.gguf"] = "/tiny.gguf"
    job = new_job(model_server.url("latest.gguf"))
    model = download_model(job.id)
    assert model is not None, Job.objects.get(pk=job.pk).message
    assert model.name == "latest"  # named after the URL asked for, not where it led
    assert [path for path, _ in model_server.requests] == ["latest.gguf", "tiny.gguf"]


@pytest.mark.django_db
def test_redirects_end_after_a_few_hops(models_dir, model_server):
    model_server.redirects["loop.gguf"] = "/loop.gguf"
    job = new_job(model_server.url("loop.gguf"))
    assert download_model(job.id) is None
    job.refresh_from_db()
    assert job.message == "the server redirected the download more than 5 times"
    assert len(model_server.requests) == 6


@pytest.mark.django_db
def test_a_redirect_to_another_scheme_is_refused(models_dir, model_server):
    model_server.redirects["tiny.gguf"] = "file:///etc/passwd"
    job = new_job(model_server.url("tiny.gguf"))
    assert download_model(job.id) is None
    job.refresh_from_db()
    assert job.message.startswith(f"the server at {model_server.url('tiny.gguf')} redirected "
                                  "the download to file:")  # fmt: skip
    assert job.message.endswith(": only http:// and https:// URLs can be downloaded")
    assert model_server.requests == [("tiny.gguf", None)]


@pytest.mark.django_db
def test_the_name_is_resolved_once_and_the_checked_address_connected_to(
    models_dir, model_server, monkeypatch, caplog
):
    """No second lookup can answer differently (DNS rebinding): the request goes to the
    address that was checked, and the server still sees the name it was asked by."""
    caplog.set_level(logging.INFO, logger="httpx")
    answers = [[LOOPBACK]]  # one answer; a second lookup would fail the test
    monkeypatch.setattr(netguard, "lookup", lambda host, port: answers.pop())
    job = new_job(f"http://localhost:{model_server.port}/tiny.gguf")

    assert download_model(job.id) is not None, Job.objects.get(pk=job.pk).message
    assert answers == []
    assert f"GET http://127.0.0.1:{model_server.port}/tiny.gguf " in caplog.text  # httpx's line
    assert model_server.headers[0]["host"] == f"localhost:{model_server.port}"


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"),
    ("100.100.100.200", "cloud metadata"), ("169.254.1.1", "link-local"),
    ("fe80::1", "link-local"),
    ("224.0.0.251", "multicast"), ("239.255.255.250", "multicast"), ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("0.1.2.3", "unspecified"),
])  # fmt: skip
def test_addresses_of_this_machine_and_of_no_one_server_are_refused(address, why, settings):
    assert why in refused(address)
    settings.DOWNLOAD_ALLOW_PRIVATE = False
    assert why in refused(address)


PRIVATE = ["10.0.0.5", "172.16.3.4", "172.31.255.255", "192.168.1.20", "fd12:3456::1",
           "100.64.1.2"]  # fmt: skip
PUBLIC = ["172.32.0.1", "93.184.215.14", "2606:4700::1"]


def test_private_lan_addresses_are_allowed_by_default(settings):
    assert settings.DOWNLOAD_ALLOW_PRIVATE is True
    for address in PRIVATE + PUBLIC:
        assert refused(address) is None, address


def test_private_lan_addresses_are_refused_when_the_setting_says_so(settings):
    settings.DOWNLOAD_ALLOW_PRIVATE = False
    for address in PRIVATE:
        assert refused(address) == (
            "is a private LAN address, and DOWNLOAD_ALLOW_PRIVATE is false"
        ), address
    for address in PUBLIC:
        assert refused(address) is None, address


def test_the_appliances_redis_and_database_ports_are_refused(settings):
    settings.REDIS_URL = "redis://10.0.0.7:6380/0"
    assert refused("10.0.0.7", 6380) == (
        "is the appliance's own Redis (port 6380); downloads never go there"
    )
    assert refused("10.0.0.7", 8080) is None  # the same machine's file server is fine

    services = own_services("redis://10.0.0.7", {"ENGINE": "django.db.backends.postgresql",
                                                 "HOST": "10.0.0.8", "PORT": ""})  # fmt: skip
    policy = DownloadPolicy(services=services)
    assert "own Redis (port 6379)" in refused("10.0.0.7", 6379, policy)
    assert "own database (port 5432)" in refused("10.0.0.8", 5432, policy)
    # A Unix socket, SQLite and a Unix-socket Redis have no address to refuse.
    assert own_services("unix:///run/redis.sock", {"ENGINE": "django.db.backends.postgresql",
                                                   "HOST": "/run/postgresql"}) == ()  # fmt: skip
    assert own_services("", {"ENGINE": "django.db.backends.sqlite3", "NAME": "x"}) == ()


@pytest.mark.django_db
def test_the_redis_port_is_refused_even_where_loopback_is_trusted(models_dir, listener, settings):
    port = listener.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    policy = replace(netguard.settings_policy(), trusted=frozenset({(LOOPBACK, port)}))
    job = new_job(f"http://127.0.0.1:{port}/")

    assert download_model(job.id, policy=policy) is None

    job.refresh_from_db()
    assert job.message == ("the download address 127.0.0.1 is the appliance's own Redis "
                           f"(port {port}); downloads never go there")  # fmt: skip
    assert connections(listener) == 0


SECRETS = ("s3cret-pw", "t0ken-value")


@pytest.mark.django_db
def test_credentials_are_sent_but_never_shown_on_the_job_page_or_logged(
    models_dir, model_server, client, member, caplog
):
    caplog.set_level(logging.INFO)
    url = f"http://alice:s3cret-pw@127.0.0.1:{model_server.port}/tiny.gguf?token=t0ken-value"
    job = new_job(url)

    assert download_model(job.id) is not None, Job.objects.get(pk=job.pk).message

    basic = base64.b64encode(b"alice:s3cret-pw").decode()
    assert model_server.headers[0]["authorization"] == f"Basic {basic}"
    client.force_login(member)
    page = client.get(reverse("models")).content.decode()
    answer = client.get(reverse("model-job", args=[job.id])).json()
    shown = f"http://***@127.0.0.1:{model_server.port}/tiny.gguf?token=***"
    assert shown in page and answer["source"] == shown
    assert "httpx" in {record.name for record in caplog.records}  # its request line, redacted
    for secret in SECRETS:
        assert secret not in page and secret not in str(answer) and secret not in caplog.text


@pytest.mark.django_db
def test_credentials_stay_out_of_a_failed_jobs_message_and_the_log(
    models_dir, model_server, listener, caplog
):
    caplog.set_level(logging.INFO)
    port = listener.getsockname()[1]
    model_server.redirects["tiny.gguf"] = f"http://bob:s3cret-pw@127.0.0.1:{port}/?sig=t0ken-value"
    job = new_job(f"http://alice:s3cret-pw@127.0.0.1:{model_server.port}/tiny.gguf")

    assert download_model(job.id) is None

    job.refresh_from_db()
    assert f"redirected the download to http://***@127.0.0.1:{port}/?sig=***, but" in job.message
    assert f"download {job.id} from http://***@127.0.0.1:" in caplog.text
    for secret in SECRETS:
        assert secret not in job.message and secret not in caplog.text


def test_redaction_takes_out_userinfo_and_query_values_and_leaves_the_rest():
    assert redact_url("https://u:p@ss@nas.local:8443/m/a.gguf?X-Amz-Signature=abc&v=2#f") == (
        "https://***@nas.local:8443/m/a.gguf?X-Amz-Signature=***&v=***"
    )
    assert redact_url("http://nas.local/m.gguf") == "http://nas.local/m.gguf"
    assert redact_url("/data/models/a.gguf") == "/data/models/a.gguf"  # a hash job's source
    assert redact_text("GET http://k@h/x failed; http://h/y?t=1 too") == (
        "GET http://***@h/x failed; http://h/y?t=*** too"
    )
