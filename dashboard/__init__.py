"""Chat and dashboard pages, WebSocket consumers, the LAN API (OpenAI, Ollama, /metrics), auth."""
