"""llama-server's tokenizer endpoints: /tokenize, /detokenize, /apply-template."""
