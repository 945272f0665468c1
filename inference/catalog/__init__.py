"""The catalog of models and their files, on the web side (it reads and writes the database):

- lookup: which registered model a name means; specs: what the engine gets for it (how to load
  it, a request for it, its keep-alive and context);
- importing: registering GGUF files (the models directory, packages, uploads, `import_model`),
  hashing them; projectors: vision projectors (mmproj) and pairing them with models;
  starter: the files installed packages carry;
- fetching, downloads, netguard: downloading a file from the LAN through the download guard;
  blobs, creating: Ollama's blobs and its /api/create (derived models, names);
  pulling: names from a remote registry (Ollama's, Hugging Face) for /api/pull;
- operations: what the pages and the API both do to a model: load, unload, delete, estimate.
"""
