"""The KV-event stream: vLLM-format ZMQ batches subscribed to, attributed to sessions by hash chain, and stored;
its silence watched, and its losses turned into spans."""
