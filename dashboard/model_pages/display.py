"""Numbers and messages as the model pages show them (the templates only place them)."""

from django.utils.html import format_html

from inference.jobs.plain import split


def params_label(count: int | None) -> str:
    """135M, 7.2B: how model sizes are named."""
    if not count:
        return "?"
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= size:
            value = count / size
            return f"{value:.0f}{unit}" if value >= 100 else f"{value:.1f}{unit}".replace(".0", "")
    return str(count)


def bytes_label(count: int | None) -> str:
    """GiB with one decimal from 1 GiB, whole MiB below (as inference.planning.memory's
    messages), KiB for the tiny."""
    if count is None:
        return "?"
    if abs(count) >= 1 << 30:
        return f"{count / (1 << 30):.1f} GiB"
    if abs(count) >= 1 << 20:
        return f"{count / (1 << 20):.0f} MiB"
    return f"{count / 1024:.0f} KiB"


def seconds_label(seconds: float | None) -> str:
    """A keep-alive countdown: "forever", "4m 10s", "35s"."""
    if seconds is None:
        return "forever"
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"


def flash_text(text: str) -> str:
    """A stored message (inference.jobs.plain's form) as a flash: the sentence for people, the
    technical detail folded under it. Escaped here; safe for the template as a whole."""
    said = split(text)
    if not said.detail:
        return said.sentence
    return format_html(
        '{} <details class="detail"><summary>details</summary><code>{}</code></details>',
        said.sentence, said.detail,
    )  # fmt: skip
