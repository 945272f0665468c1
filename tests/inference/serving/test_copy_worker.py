"""The worker's side of a copy, in this process: the download guard trusts the web box's address
and port for the transfer and nothing else; a transfer longer than the model's file stops at
once; a copied file joins the worker's model index without being hashed again; a copy under
way is one heard of lately."""

import hashlib
import ipaddress
import time

import pytest

from inference.catalog import netguard
from inference.catalog.fetching import DownloadError
from inference.serving.copies import COPY_TOKEN_TTL_S, CopyJob, CopyStatus
from inference.serving.copy_worker import CopyProgress, web_box_policy
from inference.serving.model_index import ModelIndex

LOOPBACK = ipaddress.ip_address("127.0.0.1")


def job(size: int = 100) -> CopyJob:
    url = "http://127.0.0.1:8123/models/files/" + "a" * 64 + "/"
    return CopyJob(model="tiny", sha256="a" * 64, size_bytes=size, filename="tiny.gguf",
                   url=url, token="t")  # fmt: skip


def test_the_web_box_is_trusted_at_its_own_port_only():
    policy = web_box_policy("http://127.0.0.1:8123/models/files/x/", netguard.DownloadPolicy())
    assert netguard.refusal(LOOPBACK, 8123, policy) is None
    assert "loopback" in netguard.refusal(LOOPBACK, 6379, policy)  # Redis's port: refused
    assert "loopback" in netguard.refusal(LOOPBACK, 8124, policy)
    link_local = ipaddress.ip_address("169.254.169.254")
    assert netguard.refusal(link_local, 80, policy) is not None  # the rest of the guard stands


def test_the_appliances_own_services_stay_refused_even_at_the_web_boxs_address():
    redis = netguard.Service("Redis", LOOPBACK, 8123)  # the web box's URL names Redis's port
    base = netguard.DownloadPolicy(services=(redis,))
    policy = web_box_policy("http://127.0.0.1:8123/", base)
    assert "own Redis" in netguard.refusal(LOOPBACK, 8123, policy)


class Statuses:
    """A stand-in for Redis that keeps what CopyProgress writes."""

    def __init__(self):
        self.written = []

    def pipeline(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def hset(self, key, field, value):
        self.written.append(value)

    def expire(self, key, ttl):
        pass

    def execute(self):
        pass


def test_more_bytes_than_the_model_has_stop_the_transfer_at_once():
    progress = CopyProgress(Statuses(), job(size=100), "inference@box")
    progress.update(100, 100)
    with pytest.raises(DownloadError, match="tiny has 100"):
        progress.update(101, None)
    with pytest.raises(DownloadError):
        progress.update(10, 5000)  # a Content-Length that is not the model's size


def test_a_copied_file_joins_the_index_without_being_hashed_again(tmp_path):
    index = ModelIndex([tmp_path])
    path = tmp_path / "copied.gguf"
    path.write_bytes(b"GGUF and some bytes")
    claimed = "b" * 64  # not the bytes' digest: proof that nothing hashed them

    index.add(path, claimed)

    assert index.path_for(claimed) == str(path.resolve())
    assert hashlib.sha256(path.read_bytes()).hexdigest() != claimed


def test_a_copy_is_under_way_while_it_is_heard_of():
    now = time.time()
    assert CopyStatus("w", "copying", 1, 2, "", now - 1).under_way(now)
    assert not CopyStatus("w", "copying", 1, 2, "", now - COPY_TOKEN_TTL_S - 1).under_way(now)
    assert not CopyStatus("w", "done", 2, 2, "", now).under_way(now)
