"""vLLM's wire dialects, shared by the engine (which speaks them) and the collectors (which read them)."""
