"""The field's shared formats kvobs writes (and reads): Mooncake replay rows."""
