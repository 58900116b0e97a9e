"""The engine's `kvobs` commands: `serve`, `generate`, `whatif` (registered through the `kvobs.commands` entry
points in pyproject.toml). Building their parsers imports no torch; `run` imports the engine."""
