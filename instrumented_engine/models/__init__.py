"""The model: its config and weights read from GGUF, its tokenizer and chat template, and the Llama architecture."""
