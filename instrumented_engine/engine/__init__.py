"""The engine proper: scheduler, block manager, model runner and the KV events they emit (no server)."""
