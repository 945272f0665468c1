"""Conversations and their messages, and the LAN API's per-app keys."""

import hashlib
import secrets

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=200, default="New chat")
    model_name = models.CharField(max_length=100, blank=True)
    system_prompt = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title


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
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.COMPLETE)
    error = models.TextField(blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    figures = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


class ApiKey(models.Model):
    """A home app's key: shown once at creation, stored only as a SHA-256 hash."""

    class Scope(models.TextChoices):
        """Each scope includes the ones before it: chat < manage < admin."""

        CHAT = "chat", "chat: generate and list models"
        MANAGE = "manage", "manage: also load, unload and keep models loaded"
        ADMIN = "admin", "admin: also delete models"

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=12)  # shown in lists so keys can be told apart
    key_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.CHAT)
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
        cls, name: str, scope: str = Scope.CHAT, household: str = ""
    ) -> tuple["ApiKey", str]:
        """Create a key; returns the record and the raw key, which is never stored."""
        raw = "hla-" + secrets.token_urlsafe(32)
        key = cls.objects.create(name=name, prefix=raw[:10], key_hash=cls.hash(raw), scope=scope,
                                 household=household)  # fmt: skip
        return key, raw
