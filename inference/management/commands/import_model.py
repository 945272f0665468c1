"""`python manage.py import_model PATH [--mmproj PROJ] [--name N]`: validate a GGUF file and
register it; with --mmproj, with that vision projector (checked against the model first), so
that it takes images. A file already registered gets the projector as an entry of its own
(inference.catalog.projectors.with_projector): one language model may serve several projectors.

A file inside MODELS_DIR is registered where it is; any other is copied in first (into a hidden
partial file, hashed on the way, then renamed into place), so the catalog never points at a
file that can move away under it. Exits non-zero with a clear message when it cannot.
"""

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from inference.catalog.importing import (
    CHUNK_BYTES,
    ImportRefused,
    check_name,
    free_path,
    inside_models_dir,
    install_file,
    models_dir,
    register_file,
    registered_copy,
    safe_filename,
)
from inference.catalog.projectors import register_projector, with_projector
from inference.gguf import GGUFError, read_gguf
from inference.gguf.projector import check_projector
from inference.models import LLMModel, Projector

MiB = 1 << 20


class Command(BaseCommand):
    help = "Validate a GGUF file and register it (copied into MODELS_DIR when it lives elsewhere)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("path", help="a .gguf file")
        parser.add_argument("--name", help="the model's name (default: from the file name)")
        parser.add_argument("--mmproj", help="a vision projector .gguf made for this model")

    def handle(self, *args, path: str, name: str | None, mmproj: str | None = None,
               **options) -> None:  # fmt: skip
        source = Path(path).expanduser()
        if not source.is_file():
            raise CommandError(f"no such file: {source}")
        try:
            info = read_gguf(source)
        except GGUFError as exc:
            raise CommandError(f"{source} is not a usable GGUF file: {exc}") from None
        projector_source = self.check_projector(mmproj, info) if mmproj else None

        existing = LLMModel.all_objects.filter(file_path=str(source.resolve()),
                                               base__isnull=True).first()  # fmt: skip
        # One entry per file: the same bytes under another path (a copy) are not a new model.
        copy_of = None
        if existing is None:
            copy_of, _ = registered_copy(source.resolve(), info.file_size)
        if projector_source is None and existing is not None:
            self.stdout.write(f"already registered as {existing.name}")
            return
        if projector_source is None and copy_of is not None:
            self.stdout.write(
                f"already registered as {copy_of.name} (the same file: its sha256 matches); "
                f"its page is /models/{copy_of.name}/"
            )
            return
        try:
            if name:
                check_name(name)
            projector = self.projector_in(projector_source) if projector_source else None
            if existing is not None or copy_of is not None:
                model = with_projector(existing or copy_of, projector, name=name)
            elif inside_models_dir(source):
                model = register_file(
                    source,
                    source=LLMModel.Source.IMPORT,
                    name=name,
                    progress=self.progress("hashing"),
                    projector=projector,
                )
            else:
                model = self.copy_and_register(source, name, projector)
        except ImportRefused as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot import {source}: {exc.strerror or exc}") from None
        with_images = f", takes images with {projector.file_name}" if projector else ""
        self.stdout.write(self.style.SUCCESS(
            f"registered {model.name}: {info.architecture or '?'} {model.quantization}, "
            f"{model.size_bytes / MiB:.1f} MiB, sha256 {model.sha256}{with_images}"
        ))  # fmt: skip

    def check_projector(self, mmproj: str, info) -> Path:
        """The --mmproj file, checked against the model before anything is copied."""
        projector = Path(mmproj).expanduser()
        if not projector.is_file():
            raise CommandError(f"no such file: {projector}")
        try:
            check_projector(read_gguf(projector), info.embedding_length)
        except GGUFError as exc:
            raise CommandError(f"{projector} is not a usable vision projector for "
                               f"{Path(info.path).name}: {exc}") from None  # fmt: skip
        return projector

    def projector_in(self, source: Path) -> Projector:
        """The projector registered in MODELS_DIR (copied in when it lives elsewhere)."""
        if inside_models_dir(source):
            return register_projector(source, source=LLMModel.Source.IMPORT, n_embd=None)
        partial, digest = self.copy_in(source)
        try:
            target = free_path(safe_filename(source.name))
            os.replace(partial, target)
            try:
                return register_projector(target, source=LLMModel.Source.IMPORT, n_embd=None,
                                          sha256=digest)  # fmt: skip
            except BaseException:
                target.unlink(missing_ok=True)  # no file without its record
                raise
        except GGUFError as exc:
            raise CommandError(f"the copy of {source} is not usable: {exc}") from None
        finally:
            partial.unlink(missing_ok=True)

    def copy_and_register(self, source: Path, name: str | None,
                          projector: Projector | None = None) -> LLMModel:  # fmt: skip
        """Copy into a hidden partial file in MODELS_DIR, hashing on the way, then install it:
        validated, renamed into place and registered with that hash."""
        partial, digest = self.copy_in(source)
        try:
            # The copy, not only the original, must be sound.
            model = install_file(partial, safe_filename(source.name), source=LLMModel.Source.IMPORT,
                                 name=name, sha256=digest, projector=projector)  # fmt: skip
        except GGUFError as exc:
            raise CommandError(f"the copy of {source} is not usable: {exc}") from None
        finally:
            partial.unlink(missing_ok=True)
        self.stdout.write(f"copied to {model.file_path}")
        return model

    def copy_in(self, source: Path) -> tuple[Path, str]:
        """(a hidden partial copy of `source` in MODELS_DIR, its sha256), hashed on the way."""
        fd, tmp = tempfile.mkstemp(prefix=".import-", suffix=".part", dir=models_dir())
        partial = Path(tmp)
        try:
            digest = hashlib.sha256()
            total = source.stat().st_size
            progress = self.progress("copying")
            done = 0
            with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
                while chunk := src.read(CHUNK_BYTES):
                    dst.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    progress(done, total)
                dst.flush()
                os.fsync(dst.fileno())
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return partial, digest.hexdigest()

    def progress(self, verb: str):
        """A progress line rewritten in place on a terminal, a few times a second."""
        last = [0.0]

        def show(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] < 0.2 and done != total:
                return
            last[0] = now
            percent = 100 * done / total if total else 100
            line = f"{verb}: {percent:3.0f}% ({done / MiB:.1f} of {total / MiB:.1f} MiB)"
            end = "\r" if sys.stdout.isatty() and done != total else "\n"
            self.stdout.write(line, ending=end)
            self.stdout.flush()

        return show
