import pytest

from inference.engine.engine import Engine

from .fakes import FakeRunner


@pytest.fixture
def make_engine():
    """Start engines on fake runners; shut them down and check the fakes' KV rules afterwards."""
    engines: list[Engine] = []

    def make(fake: FakeRunner | None = None, **kwargs) -> tuple[Engine, FakeRunner]:
        fake = fake or FakeRunner()
        engine = Engine(fake, **kwargs).start()
        engines.append(engine)
        return engine, fake

    yield make
    for engine in engines:
        engine.shutdown(timeout=5)
        assert engine.runner.violations == []
