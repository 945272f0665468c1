"""The LAN API: a folder per dialect over one answer pipeline.

- pipeline: a parsed body's Ask → a running Answer (model, prompt, constraints, request, run),
  and the one consumer of its events; run: the generation itself (the client's stream, the
  stream cap per key, the stored record); templating: the prompt step; answer_parser, tools,
  logprobs: reading an answer; figures: an answer's figures in each dialect's words (`timings`,
  the one place for a per-answer figure); embedding: the embedding steps two dialects share;
- rules (what every dialect's body means: formats, thinking, priority, sampling) over bodies
  (strict models, bounded field types, parse_body);
- openai/, responses/, anthropic/, ollama/: each dialect's bodies (schemas: `ask()` maps a body
  onto the pipeline) and its endpoints and Writer (views); llama_server/: its tokenizer
  endpoints, /props, and /completion and /infill over one home of their sampling fields and
  answer;
- auth (keys, scopes, api_endpoint: the one declaration the gate reads), errors (a refusal's
  HTTP status, each dialect's error shape), ratelimit, streaming (SSE and NDJSON), metrics,
  openapi, urls.
"""
