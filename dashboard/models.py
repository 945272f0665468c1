"""Conversations and their messages, and the LAN API's per-app keys."""

import hashlib
import secrets

from django.conf import settings
from django.db import models


def person_partition(user_id: int) -> str:
    """A person's prefix-cache partition and fair-share share on the chat page: their
    conversations reuse, and learn about, their own KV only."""
    return f"user:{user_id}"


class Conversation(models.Model):
    """A person's chat. Its messages form a tree: editing a question or regenerating an answer
    adds a sibling (a version) instead of overwriting, and `leaf` marks the end of the branch
    on show. The branch from the root to the leaf is what the page shows and the model reads."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=200, default="New chat")
    model_name = models.CharField(max_length=100, blank=True)
    system_prompt = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The first message of the shown branch that the model still reads; older ones were left
    # out when the chat outgrew the context (dashboard.chat.window). None: all of them.
    context_start = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title

    def adopt_linear(self) -> None:
        """Give messages saved before versions existed (no parents, no leaf) a parent chain in
        their order, so the tree rules below apply to them too."""
        if self.leaf_id is not None:
            return
        previous = None
        for message in self.messages.all():
            if previous is not None and message.parent_id is None:
                message.parent = previous
                message.save(update_fields=["parent"])
            previous = message
        if previous is not None:
            self.leaf = previous
            self.save(update_fields=["leaf"])

    def path(self, messages: list["Message"] | None = None) -> list["Message"]:
        """The shown branch, root first (one query: all messages, then a walk up from the
        leaf). Without a leaf (saved before versions): every message, in order."""
        messages = list(self.messages.all()) if messages is None else messages
        if self.leaf_id is None:
            return messages
        by_id = {m.pk: m for m in messages}
        branch, node = [], by_id.get(self.leaf_id)
        while node is not None:
            branch.append(node)
            node = by_id.get(node.parent_id)
        return branch[::-1]


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class State(models.TextChoices):
        COMPLETE = "complete"
        STREAMING = "streaming"
        STOPPED = "stopped"
        FAILED = "failed"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    # The message this one follows; siblings (same parent, same role) are versions of a turn.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    thinking = models.TextField(blank=True)  # a thinking model's reasoning, shown folded
    model_name = models.CharField(max_length=100, blank=True)  # who wrote an answer
    state = models.CharField(max_length=10, choices=State.choices, default=State.COMPLETE)
    error = models.TextField(blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    figures = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


class ChatImage(models.Model):
    """A picture attached to a question on the chat page. Its bytes are a file of their own under
    the data directory, readable by the appliance's user only (dashboard.chat.images), named by
    their sha256: the versions of a question (an edit keeps its images) share one file, which
    goes when the last image naming it goes (with its message, conversation or user).

    An image without a message is an attachment waiting to be sent (uploaded, not yet sent)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_images"
    )
    message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.CASCADE, related_name="images"
    )
    position = models.PositiveSmallIntegerField(default=0)  # in the order they were attached
    sha256 = models.CharField(max_length=64)
    kind = models.CharField(max_length=8)  # inference.engine.media.KINDS: jpeg, png, gif, bmp
    size_bytes = models.PositiveIntegerField()
    # Read from the file's header (never decoded here); None when the header did not say.
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["position", "id"]
        indexes = [models.Index(fields=["user", "sha256"], name="chatimage_user_sha256")]


def versions(message: Message, messages: list[Message]) -> list[Message]:
    """The versions of `message`'s turn (itself included), oldest first."""
    return [m for m in messages if m.parent_id == message.parent_id and m.role == message.role]


def newest_leaf(message: Message, messages: list[Message]) -> Message:
    """The end of the newest branch under `message` (where flipping to a version lands)."""
    children: dict[int, list[Message]] = {}
    for m in messages:
        children.setdefault(m.parent_id, []).append(m)
    node = message
    while children.get(node.pk):
        node = max(children[node.pk], key=lambda m: (m.created_at, m.pk))
    return node


class ApiKey(models.Model):
    """A home app's key: shown once at creation, stored only as a SHA-256 hash."""

    class Scope(models.TextChoices):
        """Each scope includes the ones before it: chat < manage < admin."""

        CHAT = "chat", "chat: generate and list models"
        MANAGE = "manage", "manage: also load, unload and keep models loaded"
        ADMIN = "admin", "admin: also delete models"

    class Priority(models.TextChoices):
        """Who reads the key's answers (inference.engine.generation.PRIORITIES): a person, or
        an app working through a batch, which waits for people and is paused for them."""

        INTERACTIVE = "interactive", "interactive: a person reads the answers as they come"
        BACKGROUND = "background", "background: an app working through a batch; people first"

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=12)  # shown in lists so keys can be told apart
    key_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.CHAT)
    # The highest priority the key's requests run at; a request may ask for a lower one.
    priority = models.CharField(
        max_length=12, choices=Priority.choices, default=Priority.INTERACTIVE
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    # Keys with the same household name share one prefix-cache partition (their apps reuse one
    # another's KV, e.g. a long common system prompt); empty: the key is a partition of its own.
    household = models.CharField(
        max_length=40, blank=True,
        help_text="keys with the same household share their cached prompts (empty: none)",
    )  # fmt: skip

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def allows(self, scope: str) -> bool:
        """Whether this key's scope is `scope` or a wider one (an unknown scope allows nothing)."""
        order = self.Scope.values  # narrowest first
        if self.scope not in order or scope not in order:
            return False
        return order.index(self.scope) >= order.index(scope)

    @property
    def cache_partition(self) -> str:
        """Whose cached KV this key's requests may reuse and learn about."""
        return f"household:{self.household}" if self.household else f"apikey:{self.pk}"

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def create(
        cls, name: str, scope: str = Scope.CHAT, household: str = "",
        priority: str = Priority.INTERACTIVE,
    ) -> tuple["ApiKey", str]:  # fmt: skip
        """Create a key; returns the record and the raw key, which is never stored."""
        raw = "hla-" + secrets.token_urlsafe(32)
        key = cls.objects.create(name=name, prefix=raw[:10], key_hash=cls.hash(raw), scope=scope,
                                 household=household, priority=priority)  # fmt: skip
        return key, raw
