"""OpenAI's Responses API: /v1/responses (stateless); its events and final object (events)."""
