"""Uploads stream straight into MODELS_DIR, so the finished file moves into place with one rename.

Django's TemporaryFileUploadHandler writes to the system's temp directory, which is often
another filesystem (a tmpfs in RAM, or the SD card of a Pi) than the models disk: moving a
multi-GB file from there is a second full copy, and a tmpfs may not even hold it. This handler
writes each uploaded file to a hidden partial file (`.upload-*.part`) next to the models and
removes every partial file that the view did not move into place, whatever happened to the
request (refused, invalid, cut off).
"""

import os
import tempfile
from pathlib import Path

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from inference.catalog.importing import models_dir


class PartialUpload(UploadedFile):
    """An uploaded file that already lies on disk in MODELS_DIR."""

    def __init__(self, path: Path, name: str, content_type: str, size: int, charset: str | None):
        super().__init__(open(path, "rb"), name, content_type, size, charset)
        self.path = path

    def temporary_file_path(self) -> str:
        return str(self.path)


class ModelsDirUploadHandler(FileUploadHandler):
    def __init__(self, request=None):
        super().__init__(request)
        self.paths: list[Path] = []
        self.uploads: list[PartialUpload] = []
        self._file = None

    def new_file(self, *args, **kwargs) -> None:
        super().new_file(*args, **kwargs)
        fd, path = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=models_dir())
        self._file = os.fdopen(fd, "wb")
        self.paths.append(Path(path))

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self._file.write(raw_data)
        return None  # consumed: no later handler sees it

    def file_complete(self, file_size: int) -> PartialUpload:
        self._file.close()
        self._file = None
        upload = PartialUpload(
            self.paths[-1], self.file_name, self.content_type, file_size, self.charset
        )
        self.uploads.append(upload)
        return upload

    def upload_interrupted(self) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Remove every partial file that is still here (the accepted one was renamed away)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        for upload in self.uploads:
            upload.close()
        for path in self.paths:
            path.unlink(missing_ok=True)
