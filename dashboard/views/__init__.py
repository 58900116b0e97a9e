"""Dashboard pages: each module has TITLE and render(ctx)."""

from dashboard.views import alerts, kv_events, overview, pressure, sessions, step, whatif

PAGES = {
    "overview": overview,
    "pressure": pressure,
    "sessions": sessions,
    "step": step,
    "kv_events": kv_events,
    "alerts": alerts,
    "whatif": whatif,
}
