"""A request's state, token ids and the timestamps every figure is computed from.

Times are `time.perf_counter()` seconds in the engine's process. The figure definitions are
the README's ("The figures"): queue time, load time, prefill time, prompt tok/s, TTFT, ITL,
decode tok/s.
"""

from dataclasses import dataclass, field
from enum import IntEnum

from inference.engine.params import SamplingParams
from inference.engine.stats import distribution
from inference.engine.tiers.entries import TIERS
from inference.engine.vision import EncodeFigures, ImageSpan


class Status(IntEnum):
    """Ordered: a request only moves forward through these."""

    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    FINISHED = 3
    CANCELLED = 4
    FAILED = 5

    @property
    def done(self) -> bool:
        return self >= Status.FINISHED


@dataclass(slots=True, eq=False)
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    accepted_at: float
    cache_key: str | None = None  # a conversation id: its KV prefix is kept for its next turn
    # Whose KV this request may reuse and learn about (an app's key, a user): None is one
    # partition too. Reuse across partitions would tell B, through its cached-token count,
    # how far its prompt matches A's conversation.
    cache_partition: str | None = None
    load_time: float = 0.0  # model load charged to this request by whoever loaded it
    priority: str = "interactive"  # GenerationRequest.priority: a person reads it, or an app
    share: str | None = None  # GenerationRequest.share: whose turn it takes in admission
    max_new_tokens: int = 0  # max_tokens clamped to what the context can hold; set on admission

    status: Status = Status.WAITING
    seq_id: int | None = None
    cached_tokens: int = 0
    # Where the cached tokens came from (tiers.entries.TIERS: a resident slot, the RAM tier, the
    # disk tier), and the seconds restoring them took (the disk read included).
    cached_tier: str | None = None
    restore_time: float = 0.0
    fetching: bool = False  # waiting now for its kept prefix to come from disk
    fetched: bool = False  # it waited for one: its cached tokens come from the disk tier
    lookup_ids: object = None  # the prompt as the tiers compare it (numpy), made once
    speculation: object = None  # its speculation.policy.Stream while it decodes
    drafted: int = 0  # draft tokens verified for it (llama-server's draft_n)
    draft_accepted: int = 0  # of those, kept (draft_n_accepted)
    # Tokens whose KV is in the context: the prompt (cached part included), then fed-back outputs.
    num_computed: int = 0
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    queue_ahead: int | None = None  # the queue position last reported to the submitter
    # Running but left out of the last step because interactive work came first (its KV stays;
    # it resumes where it was), and the scheduler's time of the last step that gave it tokens.
    paused: bool = False
    scheduled_at: float | None = None

    admitted_at: float | None = None
    prefill_started_at: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each output token was sent
    # When its first text was sent: a token can carry part of a character, or text that may
    # begin a stop string, and then nothing is sent until a later token completes it.
    first_text_at: float | None = None
    finished_at: float | None = None
    prefill_chunks: list[tuple[float, float, int]] = field(default_factory=list)
    # Its images (inference.engine.vision): their spans in prompt_ids, with their embeddings,
    # once the encoder has read them; None for a text prompt. And what reading them took.
    media: list[ImageSpan] | None = None
    encode: EncodeFigures = field(default_factory=EncodeFigures)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def remaining_prompt(self) -> int:
        return max(0, self.prompt_len - self.num_computed)

    @property
    def kv_tokens(self) -> list[int]:
        """The token ids whose KV this sequence holds (the last sampled token is not fed yet)."""
        return (self.prompt_ids + self.output_ids)[: self.num_computed]

    # --- figures -------------------------------------------------------------------------

    @property
    def cached_by_tier(self) -> dict[str, int]:
        """The cached tokens by where they came from; they add up to `cached_tokens`."""
        counts = dict.fromkeys(TIERS, 0)
        if self.cached_tokens and self.cached_tier in counts:
            counts[self.cached_tier] = self.cached_tokens
        return counts

    @property
    def queue_time(self) -> float | None:
        if self.admitted_at is None:
            return None
        # Reading its images is a phase of its own, before it queues (vision.Encoder).
        encoding = self.encode.seconds if self.encode.ended else 0.0
        return max(0.0, self.admitted_at - self.accepted_at - self.load_time - encoding)

    @property
    def prefill_time(self) -> float | None:
        if self.prefill_started_at is None or not self.token_times:
            return None
        return self.token_times[0] - self.prefill_started_at

    @property
    def prompt_tps(self) -> float | None:
        prefill = self.prefill_time
        if not prefill:
            return None
        return (self.prompt_len - self.cached_tokens) / prefill

    @property
    def ttft(self) -> float | None:
        """Accepted → first output sent: the first text; without any, the first token."""
        first = self.first_text_at or (self.token_times[0] if self.token_times else None)
        return None if first is None else first - self.accepted_at

    @property
    def itls(self) -> list[float]:
        times = self.token_times
        return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]

    @property
    def decode_tps(self) -> float | None:
        times = self.token_times
        if len(times) < 2 or times[-1] <= times[0]:
            return None
        return (len(times) - 1) / (times[-1] - times[0])

    def figures(self) -> dict:
        """Every per-request figure, in seconds and tokens, plus a phase timeline.

        The timeline's offsets are seconds since the request was accepted, so the dashboard can
        draw queue → load → prefill chunks → decode and show where a prefill overlapped a stream.
        """
        start = self.accepted_at
        end = self.finished_at or (self.token_times[-1] if self.token_times else start)
        timeline: list[dict] = []
        if self.load_time:
            timeline.append({"phase": "load", "start": 0.0, "end": self.load_time})
        encode = self.encode
        if encode.ended:
            timeline.append({"phase": "encode", "start": encode.started - start,
                             "end": encode.ended - start,
                             "tokens": encode.image_tokens})  # fmt: skip
        if self.admitted_at is not None:
            queued = max(self.load_time, encode.ended - start if encode.ended else 0.0)
            timeline.append({"phase": "queue", "start": queued, "end": self.admitted_at - start})
        for chunk_start, chunk_end, tokens in self.prefill_chunks:
            timeline.append(
                {
                    "phase": "prefill",
                    "start": chunk_start - start,
                    "end": chunk_end - start,
                    "tokens": tokens,
                }
            )
        if self.token_times:
            timeline.append(
                {"phase": "decode", "start": self.token_times[0] - start, "end": end - start}
            )
        return {
            "queue_time": self.queue_time,
            "load_time": self.load_time,
            "prompt_tokens": self.prompt_len,
            # The image phase: seconds reading its images (decoding the pictures, encoding the
            # ones the cache did not have), their tokens (part of prompt_tokens), how many the
            # projector encoded and how many came from the cache.
            "encode_time": encode.seconds if encode.ended else None,
            "image_tokens": encode.image_tokens,
            "images_encoded": encode.encoded,
            "images_cached": encode.cached,
            "cached_tokens": self.cached_tokens,
            "cached_by_tier": self.cached_by_tier,
            "restore_time": self.restore_time,
            "drafted": self.drafted,
            "draft_accepted": self.draft_accepted,
            "output_tokens": len(self.output_ids),
            "prefill_time": self.prefill_time,
            "prompt_tps": self.prompt_tps,
            "ttft": self.ttft,
            "itl": distribution(self.itls),
            "decode_tps": self.decode_tps,
            "total_time": end - start,
            "finish_reason": self.finish_reason,
            "timeline": timeline,
        }
