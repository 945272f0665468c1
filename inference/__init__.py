"""Models, the engine (inference.engine, no Django), the worker, jobs, GGUF reading, telemetry."""
