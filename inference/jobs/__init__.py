"""Job plumbing: background jobs on queue "jobs" (tasks: the Celery tasks and how to start
them), running one as a task or on a thread (dispatch), a job's progress and cancellation on its
row (progress), and failures in plain words for a job row or a page (plain)."""
