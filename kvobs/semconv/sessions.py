"""How a request names its agent session, and how long a session lives: the header and the horizons that engine,
collector and SDK share."""

from __future__ import annotations

# The agent session an LLM request belongs to (HTTP header names are case-insensitive).
SESSION_ID_HEADER = "X-Session-ID"

# A session idle this long after its last request has ended (`--session-end-after-s` of `kvobs serve` and
# `kvobs collect`): what it loses after that is lost after its end, never in a tool pause.
SESSION_END_AFTER_S = 300.0

# The collector forgets a session's state after this long without a KV event (`kvobs collect --session-idle-s`):
# well past its end, so no pause is cut short; bounds memory however many sessions a fleet has seen.
SESSION_IDLE_S = 3600.0
