"""Mooncake Store's KV events: its master's ZMQ stream of pooled objects, read through kvobs's door
(`kvobs.mooncake_store.normalize`)."""
