"""Logged-in clients, registered tiny models, and an inference client whose host runs fake
runners (so pages can load, unload and be busy without llama.cpp) behind the real preflight."""

from types import SimpleNamespace

import pytest
from django.contrib.messages import get_messages

from inference.catalog.importing import register_file
from inference.engine.host import EngineHost
from inference.planning.preflight import fit
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from tests.inference import conftest as shared
from tests.inference.engine.fakes import FakeRunner, engines_on

# The models directory, tiny GGUF files and the LAN server of the inference registry's tests.
models_dir = shared.models_dir
tiny_file = shared.tiny_file
outside_file = shared.outside_file
corrupt_file = shared.corrupt_file
model_server = shared.model_server


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.fixture
def member_client(client, member):
    client.force_login(member)
    return client


@pytest.fixture
def tiny_model(tiny_file):
    return register_file(tiny_file, source="scan")


@pytest.fixture
def fake_engine():
    """get_client() answers with a host of fake runners; the previous client comes back after."""
    runners: list[FakeRunner] = []

    def factory(config):
        runner = FakeRunner()
        runners.append(runner)
        return runner

    host = EngineHost(engines_on(factory, itl_target=0.05), max_loaded=2, preflight=fit)
    previous = client_module._client
    set_client(EmbeddedClient(host))
    yield SimpleNamespace(host=host, runners=runners)
    for runner in runners:
        if runner.gate is not None:
            runner.gate.set()
    set_client(previous)
    host.shutdown()


def flashes(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]
