"""The OpenAI-compatible engine server (`kvobs serve`): see `launcher.EngineServer`."""
