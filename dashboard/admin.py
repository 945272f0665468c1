"""Django admin for conversations and API keys. A key's hash is read-only and its raw value is
never stored: keys are created where they can be shown once (the API keys page)."""

from django.contrib import admin

from dashboard.models import ApiKey, Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("role", "state", "content", "error", "created_at")
    readonly_fields = ("created_at",)
    extra = 0


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "user", "model_name", "updated_at")
    list_filter = ("model_name",)
    search_fields = ("title", "user__username")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "conversation", "role", "state", "created_at")
    list_filter = ("role", "state")
    readonly_fields = ("figures", "request_id", "created_at")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "scope", "priority", "household", "revoked", "created_at",
                    "last_used_at")  # fmt: skip
    list_filter = ("scope", "priority", "revoked")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # a key made here could never be shown to anyone

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset) -> None:
        # One save per key, not an update(): saving sends the signal that forgets what the
        # box keeps for the key (dashboard.forgetting).
        keys = list(queryset.filter(revoked=False))
        for key in keys:
            key.revoked = True
            key.save(update_fields=["revoked"])
        self.message_user(request, f"{len(keys)} key(s) revoked.")
