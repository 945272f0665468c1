"""ChatRefused: how every step of a chat turn says no to a frame, changing nothing.

A module of its own so that the lower chat modules (dashboard.chat_prompt,
dashboard.running_answers) can raise it without importing dashboard.chat, which imports them.
"""


class ChatRefused(Exception):
    """A frame asked for something this user may not or cannot do; nothing was changed."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
