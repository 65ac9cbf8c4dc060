"""Data: the token shard format, the distributed resumable loader, the GPT-2 tokenizer, and fineweb.py's preparation pipeline (prepare/)."""
