"""How a request names its agent session, and how long a session lives: the header and the horizons that engine,
collector and SDK share."""

from __future__ import annotations

from dataclasses import dataclass

# The agent session an LLM request belongs to (HTTP header names are case-insensitive): vLLM's, and OpenCode's.
SESSION_ID_HEADER = "X-Session-ID"
# The session that started this one (a subagent's caller): OpenCode's, which the kvobs SDK sends too.
PARENT_SESSION_HEADER = "X-Parent-Session-ID"


@dataclass(frozen=True)
class SessionHeaders:
    """How one client names the session on each request: `session` the conversation; `agent` a subagent's own id
    within it (absent on the main agent's requests); `parent` the id of whoever started this one (an agent id of
    the same conversation where `agent` is given, else a session id)."""

    client: str
    session: str
    agent: str | None = None
    parent: str | None = None


# Every way a request names its session, first found wins: vLLM's header (OpenCode sends it, with its parent),
# Claude Code's (a subagent carries its agent id, and its parent agent's when a subagent started it), Codex's.
SESSION_HEADERS = (
    SessionHeaders("vllm", SESSION_ID_HEADER, parent=PARENT_SESSION_HEADER),
    SessionHeaders(
        "claude-code",
        "x-claude-code-session-id",
        agent="x-claude-code-agent-id",
        parent="x-claude-code-parent-agent-id",
    ),
    SessionHeaders("codex", "session-id"),
    SessionHeaders("dynamo", "x-dynamo-session-id", parent="x-dynamo-parent-session-id"),  # Dynamo 1.6's own
)
# Then the body, as vLLM reads it: the request's `session_id`, else `vllm_xargs.session_id`.
SESSION_BODY_FIELDS = (("session_id",), ("vllm_xargs", "session_id"))

# A session idle this long after its last request has ended (`--session-end-after-s` of `kvobs serve` and
# `kvobs collect`): what it loses after that is lost after its end, never in a tool pause.
SESSION_END_AFTER_S = 300.0

# The collector forgets a session's state after this long without a KV event (`kvobs collect --session-idle-s`):
# well past its end, so no pause is cut short; bounds memory however many sessions a fleet has seen.
SESSION_IDLE_S = 3600.0
