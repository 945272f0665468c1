"""A restart comes back warm: the host records what it has loaded (not what a stop unloads),
and the next start loads those models again by itself."""

import json

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.warm_start import LoadedRecord, reload_previous
from tests.inference.engine.fakes import FakeRunner, engines_on


def spec(name: str) -> ModelSpec:
    return ModelSpec(name, RunnerConfig(model_path=f"/models/{name}.gguf", ctx_per_seq=256),
                     keep_alive=300.0, sha256="ab" * 32)  # fmt: skip


def host(record: LoadedRecord, started: list | None = None) -> EngineHost:
    def start(spec):
        if started is not None:
            started.append(spec.name)
        return engines_on(lambda config: FakeRunner())(spec)

    made = EngineHost(start, max_loaded=2)
    made.on_change = record.write
    return made


def test_loads_and_asked_for_unloads_are_recorded_but_a_stop_is_not(tmp_path):
    record = LoadedRecord(tmp_path / "loaded.json")
    first = host(record)
    first.load(spec("a"))
    first.load(spec("b"))
    assert [s.name for s in record.read()] == ["a", "b"]
    first.unload("a")
    assert [s.name for s in record.read()] == ["b"]
    first.shutdown()  # the appliance stops: what was loaded stays recorded
    assert [s.name for s in record.read()] == ["b"]
    assert record.read()[0] == spec("b")


def test_the_next_start_loads_the_recorded_models_again(tmp_path):
    record = LoadedRecord(tmp_path / "loaded.json")
    before = host(record)
    before.load(spec("a"))
    before.shutdown()
    started: list[str] = []
    after = host(record, started)
    reload_previous(after, record).join(10)
    assert started == ["a"] and after.get("a") is not None
    after.shutdown()


def test_a_recorded_model_that_no_longer_loads_is_skipped_with_a_log_line(tmp_path, caplog):
    record = LoadedRecord(tmp_path / "loaded.json")
    record.write([spec("gone"), spec("here")])

    def start(spec):
        if spec.name == "gone":
            raise FileNotFoundError("/models/gone.gguf")
        return engines_on(lambda config: FakeRunner())(spec)

    after = EngineHost(start, max_loaded=2)
    reload_previous(after, record).join(10)
    assert after.get("here") is not None and after.get("gone") is None
    assert "gone was loaded before the restart but did not load now" in caplog.text
    after.shutdown()


def test_a_record_that_is_not_one_loads_nothing(tmp_path):
    path = tmp_path / "loaded.json"
    for text in ("not json", json.dumps({"a": 1}), json.dumps([{"name": "x"}])):
        path.write_text(text)
        assert LoadedRecord(path).read() == []
