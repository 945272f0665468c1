"""Ollama's dialect: chat and generate, the catalog's shapes (views, shapes), embeddings (embed),
making models (create) and pulling them (pull)."""
