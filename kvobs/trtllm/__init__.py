"""TensorRT-LLM's KV-cache events: its server's JSON, read through kvobs's door (`kvobs.trtllm.normalize`)."""
