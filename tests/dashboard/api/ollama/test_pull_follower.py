"""A pull job's rows as Ollama's progress lines: every phase said once and in order, even one
that no read of the row caught, and the end as success or an error with its status."""

from dashboard.api.ollama.pull import Follower
from inference.models import Job

DIGEST = "sha256:" + "ab" * 32


def row(state=Job.State.RUNNING, phase="layers", completed=None, total=100, **detail) -> Job:
    layers = [] if completed is None else [
        {"digest": DIGEST, "label": "", "total": total, "completed": completed}
    ]  # fmt: skip
    return Job(kind=Job.Kind.PULL, state=state, detail={"phase": phase, "layers": layers,
                                                        **detail})  # fmt: skip


def test_progress_is_said_once_per_change_and_phases_in_order():
    follower = Follower()

    first = follower.lines(row(phase="manifest"))
    during = follower.lines(row(completed=40)) + follower.lines(row(completed=40))
    end = follower.lines(row(state=Job.State.DONE, phase="done", completed=100))

    assert first == [{"status": "pulling manifest"}]
    assert during == [
        {"status": "pulling abababababab", "digest": DIGEST, "total": 100, "completed": 40}
    ]
    assert [line["status"] for line in end] == [
        "pulling abababababab", "verifying sha256 digest", "writing manifest", "success",
    ]  # fmt: skip
    assert end[0]["completed"] == 100


def test_a_job_that_failed_ends_with_an_error_line_and_its_status():
    follower = Follower()

    lines = follower.lines(row(state=Job.State.FAILED, phase="manifest", error_status=404))

    assert lines[0] == {"status": "pulling manifest"}
    assert "error" in lines[-1] and follower.status == 404


def test_a_cancelled_job_ends_with_an_error_line():
    follower = Follower()

    lines = follower.lines(row(state=Job.State.CANCELLED, completed=10))

    assert lines[-1] == {"error": "the pull was cancelled"} and follower.status == 409
