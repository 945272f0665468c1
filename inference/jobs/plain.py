"""Failures in plain words: what a page or a job row tells a person, with the technical detail
kept beside it (the pages fold it into a <details>).

One convention for stored text (a job's message, a skipped file's reason): the first line is
the sentence for people, any lines after it the technical detail. `message()` writes it,
`split()` reads it back, so a job row needs no second column.
"""

from dataclasses import dataclass

from inference.gguf import GGUFError


@dataclass(frozen=True, slots=True)
class Explained:
    sentence: str  # for people: what is wrong, and what to do when that is not obvious
    detail: str  # the technical message, "" when the sentence says it all


def explain(exc: BaseException) -> Explained:
    """A failure in plain words. The appliance's own refusals (ImportRefused, InsufficientMemory,
    ModelBusy, a download's DownloadError) are worded for people already and pass as they are;
    the GGUF reader's carry offsets and byte strings, so they get their kind's sentence."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, GGUFError):
        return Explained(exc.plain, text)
    if isinstance(exc, OSError):
        reason = exc.strerror or text
        return Explained(f"the file could not be read or written: {reason.lower()}", text)
    return Explained(text, "")


def message(exc: BaseException, prefix: str = "") -> str:
    """The stored form: "<prefix><sentence>" on the first line, the detail after it."""
    said = explain(exc)
    first = f"{prefix}{said.sentence}"
    return f"{first}\n{said.detail}" if said.detail and said.detail != said.sentence else first


def split(text: str) -> Explained:
    """A stored message back as its sentence and its detail."""
    sentence, _, detail = (text or "").partition("\n")
    return Explained(sentence, detail.strip())
