"""The chat page's turns, from a browser's frame to a saved answer:

- turns: preparing a turn (send, edit, regenerate, Continue), versions, renames;
- turn_request: what a turn's prompt holds and the request built from it (the steps the API's
  answer pipeline takes too: inference.text.prompting, inference.catalog.specs.request_for);
- window: which turns of a long chat the model still reads;
- running: the answers that run on when their socket goes away, and saving them;
- counting: the composer's token count, on a loaded model;
- images: the pictures attached to questions, on disk, the owner's only.

ChatRefused, how every step of a turn says no to a frame, lives here, beside them all.
"""


class ChatRefused(Exception):
    """A frame asked for something this user may not or cannot do; nothing was changed."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
