"""The pull job: a model name in, a registered model out, as Ollama's pull does it.

1. Pulling manifest: the name is resolved to a plan (inference.catalog.pulling.sources).
2. Pulling the layers: the small ones are read with the plan; the GGUF goes to a hidden
   partial file named by its digest (`.pull-<sha256>.part`), through inference.catalog.downloads
   (streamed, hashed as it arrives, retried with a Range request after a dropped connection).
   One pull at a time holds a partial file (a lock), so two pulls of the same blob never write
   it together; the second waits and then finds the first one's model.
3. Verifying sha256 digest: the whole file's sha256 must be the layer's digest; a file that is
   not is removed and nothing is registered.
4. Writing manifest: installed and registered like every GGUF (inference.catalog.importing
   install_file: the validating reader first), under the pulled name (a PulledName), with the
   params and system layers as its default sampling and system prompt.
5. A vision projector the source has for the model (a Hugging Face repository's mmproj, as
   llama-server's -hf fetches it) is fetched the same way, verified, checked against the model
   and registered with it (inference.catalog.projectors): the name then means the model with
   it. One that fails is left out, with the reason in the job's message: the model answers text.

A pull that the network interrupted for good keeps its partial file, so the next pull of the
same blob resumes where it stopped (as Ollama's does); a wrong file, a cancelled job and
everything else leave nothing. A blob the registry has already (a model with that sha256,
pulled under another name or imported some other way) is not downloaded again: the name is
added to that model, as Ollama's names share a blob, and its settings stay as they are. The
job runs on its own: a client that stops following it over the API does not stop it, and a
second pull of the name follows the same job.

Memory: a model whose weights exceed this machine's RAM and free GPU memory together is refused
before its download starts; one that only does not fit in the memory free now is registered,
with that said in the job's message (as the model's page says it), since unloading another
model or a smaller context makes room.
"""

import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from inference import storable
from inference.catalog.blobs import projector_with
from inference.catalog.fetching import (
    ATTEMPTS,
    BACKOFF_S,
    RETRIED,
    DownloadError,
    fetch_with_retries,
)
from inference.catalog.importing import (
    STALE_JOB_S,
    AlreadyRegistered,
    ImportRefused,
    free_path,
    install_file,
    models_dir,
    safe_filename,
    unique_name,
)
from inference.catalog.netguard import AddressRefused, DownloadPolicy, redact_text
from inference.catalog.projectors import register_projector, with_projector
from inference.catalog.pulling.names import InvalidName, parse
from inference.catalog.pulling.sources import Blob, Plan, PullError, plan_pull, pull_policy
from inference.catalog.specs import kept_slots
from inference.engine.params import DEFAULTABLE, usable_defaults
from inference.gguf import GGUFError, read_gguf
from inference.gguf.projector import check_projector
from inference.jobs.progress import JobCancelled, JobProgress
from inference.models import Job, LLMModel, Projector, PulledName
from inference.planning.memory import InsufficientMemory, check_fits
from inference.planning.preflight import available_memory, estimate_for_settings, gguf_info

log = logging.getLogger(__name__)

# The phases in the order Ollama reports them; Job.detail["phase"] is one of them.
PHASES = ("manifest", "layers", "verifying", "writing", "done")
# Ollama parameters that map onto the engine's sampling defaults as they are. Left out on
# purpose: num_ctx (the model's context is its settings' and the memory check's), num_predict,
# seed (a fixed seed for every answer), and anything the engine does not have.
PULLED_FIELDS = tuple(name for name in DEFAULTABLE if name not in ("seed", "max_tokens"))
MAX_SYSTEM_CHARS = 32_000
LOCK_NOTE_S = 60.0  # how often a pull waiting for another one says so (keeps its row fresh)


class PullProgress(JobProgress):
    """Job progress that also keeps Job.detail current: the phase and every layer's bytes,
    which the API turns into Ollama's progress lines."""

    def __init__(self, job_id: int, detail: dict):
        super().__init__(job_id)
        self.detail = {**detail, "phase": PHASES[0], "layers": []}
        self.blob: Blob | None = None

    def _write(self, **fields) -> None:
        super()._write(detail=self.detail, **fields)  # every write carries the numbers

    def phase(self, phase: str, message: str) -> None:
        self.detail["phase"] = phase
        self.note(message)

    def layer(self, digest: str, total: int | None, completed: int, label: str = "") -> None:
        for row in self.detail["layers"]:
            if row["digest"] == digest and row["label"] == label:
                row.update(total=total, completed=completed)
                return
        self.detail["layers"].append(
            {"digest": digest, "label": label, "total": total, "completed": completed}
        )

    def update(self, done: int, total: int | None, verb: str = "") -> None:
        """The model blob's bytes, as inference.catalog.fetching.fetch reports them."""
        blob = self.blob
        if blob is not None:
            self.layer(blob.digest, blob.size or total, done, label=_label(blob))
        super().update(done, blob.size if blob and blob.size else total, verb)

    def fail(self, message: str, status: int = 500) -> None:
        self.detail["error_status"] = status
        Job.objects.filter(pk=self.job_id).exclude(state=Job.State.CANCELLED).update(
            **storable.values(Job, message=message[:2000], detail=self.detail),
            state=Job.State.FAILED, updated_at=timezone.now(),
        )  # fmt: skip


def _label(blob: Blob) -> str:
    """What a layer without a digest (a Hugging Face file without one) is called."""
    return "" if blob.digest else blob.filename


def active_pull(name: str) -> Job | None:
    """The pull of `name` under way (recently heard from), if any."""
    cutoff = timezone.now() - timedelta(seconds=STALE_JOB_S)
    return Job.objects.filter(
        kind=Job.Kind.PULL, source__iexact=name, updated_at__gte=cutoff,
        state__in=[Job.State.PENDING, Job.State.RUNNING],
    ).first()  # fmt: skip


def partial_path(blob: Blob) -> Path:
    key = blob.digest.removeprefix("sha256:") or hashlib.sha256(blob.url.encode()).hexdigest()
    return models_dir() / f".pull-{key}.part"


def pull_model(
    job_id: int,
    *,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_S,
    policy: DownloadPolicy | None = None,
) -> LLMModel | None:
    """Run a pull job to the end: the registered model, or None (failed or cancelled; the
    job's row says which and why, and detail["error_status"] the HTTP status for it).
    Idempotent: a finished job is left alone."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    if job.state not in (Job.State.PENDING, Job.State.RUNNING):
        return job.model
    progress = PullProgress(job_id, {"insecure": bool((job.detail or {}).get("insecure"))})
    try:
        progress.start("pulling manifest")
        name = parse(job.source)
        policy = policy or pull_policy()
        plan = plan_pull(name, insecure=progress.detail["insecure"], policy=policy)
        progress.phase("layers", f"pulling {name.display} from {plan.source}")
        for digest, size in plan.layers:
            progress.layer(digest, size, size)
        progress.blob = plan.blob
        part = partial_path(plan.blob)
        with _holding(part, progress) as hold:
            model, installed = _pulled_already(plan), False
            if model is None:
                _refuse_if_never_fits(plan)
                try:
                    model, installed = _download(plan, part, progress, attempts, backoff, policy)
                except DownloadError as exc:
                    # Given up after retries: the partial file stays for the next pull.
                    hold.keep = isinstance(exc.__cause__, RETRIED)
                    raise
            else:
                progress.update(plan.blob.size or 0, plan.blob.size, "already here:")
                progress.phase("verifying", "verifying sha256 digest")
                progress.phase("writing", "writing manifest")
            model, left_out = _with_projector(model, plan, progress, attempts, backoff, policy)
            _adopt(model, plan, installed=installed)
        note = "; ".join(filter(None, [left_out, _fit_note(model)]))
        progress.detail["phase"] = "done"
        progress.detail["note"] = note
        progress.finish(f"pulled {name.display} as {model.name}" + (f"; {note}" if note else ""),
                        model=model)  # fmt: skip
        return model
    except JobCancelled:
        log.info("pull %s cancelled", job_id)
        return None
    except (InvalidName, PullError, ImportRefused) as exc:
        progress.fail(str(exc), getattr(exc, "status", 400))
    except DownloadError as exc:
        progress.fail(_describe(exc), 502)
    except GGUFError as exc:
        progress.fail(f"the pulled file is not a GGUF the appliance can load: {exc}", 502)
    except (AddressRefused, ValueError, OSError, *RETRIED) as exc:
        progress.fail(_describe(exc), 502)
    except Exception as exc:  # a time limit or a bug: still a failed job, never "running"
        progress.fail(f"the pull stopped: {_describe(exc)}", 500)
        raise
    log.warning("pull %s of %s failed: %s", job_id, job.source, progress.detail)
    return None


def _describe(exc: Exception) -> str:
    return redact_text(str(exc) or type(exc).__name__)


class Hold:
    """The partial file held; `keep` it when the job ends (for the next pull to resume)."""

    keep = False


@contextmanager
def _holding(part: Path, progress: PullProgress) -> Iterator[Hold]:
    """The partial file's lock, waited for while another pull holds it. On the way out, still
    holding it, the partial file is removed (installed means renamed away already) unless
    kept: so a pull never removes the file that another one is writing."""
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        said = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - said > LOCK_NOTE_S:
                    progress.note("waiting for another pull of the same file")
                    said = time.monotonic()
                time.sleep(0.5)
                progress.check()
        hold = Hold()
        try:
            yield hold
        finally:
            if not hold.keep:
                part.unlink(missing_ok=True)
    finally:
        os.close(fd)  # and with it the lock


def _pulled_already(plan: Plan) -> LLMModel | None:
    """The listed model with this digest whose file is still there (the one holding the name
    first), or None."""
    if not plan.blob.digest:
        return None
    same = LLMModel.objects.filter(sha256=plan.blob.digest.removeprefix("sha256:"))
    named = same.filter(pulled_names__name__iexact=plan.name.display)
    for model in [*named, *same]:
        if os.path.isfile(model.file_path):
            return model
    return None


def _refuse_if_never_fits(plan: Plan) -> None:
    size = plan.blob.size
    if not size:
        return
    try:
        import psutil

        ram = int(psutil.virtual_memory().total)
    except Exception:  # no psutil or no /proc: nothing to check against
        return
    gpu = available_memory().gpu_bytes or 0
    if size > ram + gpu:
        gib = 1 << 30
        raise PullError(
            f"{plan.name.display} is {size / gib:.1f} GiB of weights, more than this machine's "
            f"RAM ({ram / gib:.1f} GiB) and free GPU memory ({gpu / gib:.1f} GiB) together: "
            "it could never be loaded",
            status=400,
        )


def _download(plan: Plan, part: Path, progress: PullProgress, attempts: int, backoff: float,
              policy: DownloadPolicy) -> tuple[LLMModel, bool]:  # fmt: skip
    """(the model, whether this pull installed it: False when its bytes were registered
    already, which a source without a digest only shows once downloaded)."""
    blob = plan.blob
    digest = fetch_with_retries(blob.url, part, progress, attempts, backoff, policy)
    progress.phase("verifying", "verifying sha256 digest")
    if blob.digest and f"sha256:{digest}" != blob.digest:
        part.unlink(missing_ok=True)
        raise PullError(
            f"the downloaded file's digest sha256:{digest} is not the layer's {blob.digest}; "
            "the file was removed",
            status=502,
        )
    progress.check()
    progress.phase("writing", "writing manifest")
    try:
        model = install_file(
            part, safe_filename(blob.filename), source=LLMModel.Source.PULL,
            name=unique_name(plan.name.slug), sha256=digest,
        )  # fmt: skip
    except AlreadyRegistered as exc:  # the copy was removed; the name goes to the original
        return exc.model, False
    return model, True


def _with_projector(model: LLMModel, plan: Plan, progress: PullProgress, attempts: int,
                    backoff: float, policy: DownloadPolicy) -> tuple[LLMModel, str]:  # fmt: skip
    """Step 5: (the entry of the model with the plan's projector, or `model` itself when there
    is none or it was left out; why it was left out, or "")."""
    blob = plan.projector
    if blob is None:
        return model, ""
    try:
        projector = projector_with(blob.digest) if blob.digest else None
        if projector is None:
            projector = _fetch_projector(blob, model, progress, attempts, backoff, policy)
        else:
            progress.layer(blob.digest, blob.size, blob.size or 0)
        return with_projector(model, projector), ""
    except (GGUFError, ImportRefused, PullError) as exc:
        log.warning("pull of %s: the projector %s is left out: %s", plan.name.display,
                    blob.filename, exc)  # fmt: skip
        return model, f"its vision projector {blob.filename} is left out: {exc}"
    finally:
        progress.blob = plan.blob


def _fetch_projector(blob: Blob, model: LLMModel, progress: PullProgress, attempts: int,
                     backoff: float, policy: DownloadPolicy) -> Projector:  # fmt: skip
    progress.blob = blob
    part = partial_path(blob)
    with _holding(part, progress) as hold:
        try:
            digest = fetch_with_retries(blob.url, part, progress, attempts, backoff, policy)
        except DownloadError as exc:
            hold.keep = isinstance(exc.__cause__, RETRIED)
            raise PullError(_describe(exc)) from None
        if blob.digest and f"sha256:{digest}" != blob.digest:
            raise PullError(f"the downloaded file's digest sha256:{digest} is not the "
                            f"listed {blob.digest}; the file was removed")  # fmt: skip
        check_projector(read_gguf(part), model.embedding_length)  # before it is installed
        target = free_path(safe_filename(blob.filename))
        os.replace(part, target)
        try:
            return register_projector(target, source=LLMModel.Source.PULL,
                                      n_embd=model.embedding_length, sha256=digest)  # fmt: skip
        except BaseException:
            target.unlink(missing_ok=True)
            raise


def _adopt(model: LLMModel, plan: Plan, *, installed: bool) -> None:
    """Give the model the pulled name (moved from an older model that had it: a tag moved
    on); a model this pull installed also gets the params, system and license layers."""
    display = plan.name.display
    with transaction.atomic():
        held = PulledName.objects.select_for_update().filter(name__iexact=display).first()
        if held is None:
            PulledName.objects.create(name=display, model=model)
        else:
            held.name, held.model = display, model
            held.save()
        if not installed:
            return
        model.system_prompt = plan.system[:MAX_SYSTEM_CHARS]
        model.default_params = sampling_defaults(plan.params)
        if plan.license:
            model.license = plan.license[:200]
        model.save(update_fields=["system_prompt", "default_params", "license"])


def sampling_defaults(params: dict) -> dict:
    """The params layer's values the engine takes as they are, each one checked; the rest is
    left out (logged): a seed, which would give every answer of the model the same dice."""
    kept = usable_defaults(params, PULLED_FIELDS)
    for key in sorted(set(params) - set(kept)):
        log.info("the params layer's %s=%r is not used", key, params[key])
    return kept


def _fit_note(model: LLMModel) -> str:
    """Empty when the model fits in the memory free now, else what it needs."""
    try:
        info = gguf_info(model.file_path)
    except GGUFError:
        return ""
    found = estimate_for_settings(
        info, ctx_per_seq=model.n_ctx, parallel=model.parallel, kv_type=model.kv_type,
        n_gpu_layers=model.n_gpu_layers, n_batch=model.n_batch, n_ubatch=model.n_ubatch,
        cache_slots=kept_slots(model.parallel),
        mmproj_path=model.projector.file_path if model.projector_id else "",
    )  # fmt: skip
    if found is None:
        return ""
    try:
        check_fits(found, available_memory())
    except InsufficientMemory as exc:
        return f"with its settings it does not fit in the memory free now: it {exc}"
    return ""
