"""Fixtures of the web side's tests."""

from tests.dashboard import kept_prompts

# Kept prompts behind the inference client (a fake host, a real disk tier).
kept = kept_prompts.kept
