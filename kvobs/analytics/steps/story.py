"""One agent step's story, in time order: what the agent did, what its requests went through, and what happened to
its session's cached blocks from the tool pause before it to its end, with who took them.

    story = step_story(store, "coder-1-0001", 2)
    story = step_story(store, "coder-1-0001", 2, read=SessionRead(steps, requests, verdicts))  # reads shared
    story.step          # the step's verdict, typed (`StepVerdict`): .record (status, causes, parts), .facts, .decided
    story.timeline      # lane, phase, start, end: the step, the tool pause and its tool calls, each request's phases
    story.events        # ts, source, kind, blocks, tokens, request_id, what: everything above and the KV record
    story.misses        # misses no cache size would change (a prompt that changes near its start, a reply without
                        # its cached tokens), each with its fix

The requests are the attribution's own (`attribution.step_requests`: by caller span, else the step's session or
trace within its time), so the story and the verdict never disagree about which requests were the step's. The tool
pause starts when the previous step's last request finished (its end, without requests) and ends when this step's
first request arrived. A lost block's taker is the request the engine evicted it for (`request_id` on an `evicted`
row) and that request's session; vLLM's `removed` events do not name one, and the story says so.

A page that has read and attributed the step's session already (the Sessions page's session detail) gives those
reads (`SessionRead`): the story then reads only its own stretch of KV events, and its verdict is the session's row
(the attribution of the whole session, which the story's own, over the KV events of its stretch, equals:
`tests/analytics/test_step_story.py`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvobs.analytics.cache import (
    BY_REQUEST,
    RATE_WINDOW_S,
    PrefillRates,
    connector_words,
    lookups_of,
    reply_without_details,
    request_routing,
    session_changing_start,
    short_start_words,
    tied_events,
    with_sessions,
)
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps, step_requests
from kvobs.analytics.steps.facts import KVRecord
from kvobs.analytics.steps.latency_parts import RequestTimes, request_intervals
from kvobs.analytics.steps.pauses import pause_before
from kvobs.analytics.steps.step_verdict import StepVerdict
from kvobs.analytics.steps.verdicts import DECIDED, verdict_records, with_decided
from kvobs.semconv.spans import BlockTie, KVEventKind, StepStatus
from kvobs.store.interface import Store

K = KVEventKind
TIMELINE = ["lane", "phase", "start", "end", "what"]
EVENTS = ["ts", "source", "kind", "blocks", "tokens", "request_id", "by_session", "what"]
TIMING_KINDS = (K.PREEMPTED.value, K.HIT.value)  # when a request was preempted and re-admitted
CONNECTOR_SLACK_S = 1.0  # a connector's process keeps its own clock: its lookups read this far past the requests
TAKERS_BEFORE_S = 600.0  # a block's taker is named from the requests that arrived from this long before the story


@dataclass(frozen=True)
class SessionRead:
    """A session's reads and attribution: its `steps` (`reads.steps(session_id=...)`), the `requests` that arrived
    from `RATE_WINDOW_S` before its first step's start to its last step's end, and `verdicts`, `attribute_steps`'
    row of each of its steps over those requests and the session's KV events."""

    steps: pd.DataFrame
    requests: pd.DataFrame
    verdicts: pd.DataFrame


@dataclass(frozen=True)
class StepStory:
    step: StepVerdict  # the step's verdict, typed: its record, its facts, whether a keeper decided it
    requests: pd.DataFrame
    pause: tuple[float, float] | None
    timeline: pd.DataFrame
    events: pd.DataFrame
    misses: tuple[str, ...] = ()  # misses that are not the cache's, named with their fix

    @property
    def span(self) -> tuple[float, float]:
        """The story's time range: the start of the pause (else the step) to the last thing that happened."""
        times = pd.concat([self.timeline["start"], self.timeline["end"], self.events["ts"]]).dropna()
        return float(times.min()), float(times.max())


def step_story(store: Store, session_id: str, step_index: int, *, read: SessionRead | None = None) -> StepStory | None:
    """The story of step `step_index` of `session_id`; None when the store has no such step. `read`: the session's
    reads and verdicts, where the caller has them (none read again)."""
    steps = (read.steps if read is not None else store.reads.steps(session_id=session_id)).sort_values("step_index")
    steps = steps.reset_index(drop=True)
    position = steps.index[steps["step_index"] == step_index]
    if position.empty:
        return None
    i = int(position[0])
    first, last = float(steps["started_at"].min()), _end(steps)
    read_from = first - RATE_WINDOW_S  # requests from before: the prefill rate's window
    reqs = read.requests if read is not None else store.reads.requests(read_from, last)
    sent = step_requests(reqs, steps)
    # The KV events this step's verdict and story can involve: from the start of the step before it (its tool pause
    # begins when that step's requests end, never earlier) to its end; not the session's whole history.
    low = float(steps["started_at"].iloc[max(i - 1, 0)])
    high = _end(steps.iloc[i : i + 2]) if i + 1 < len(steps) else last
    session_kv = store.reads.kv_events(low, high, session_id=session_id)
    resets = store.reads.kv_events(low, high, kinds=[K.CLEARED.value])
    if read is not None:
        attributed = read.verdicts
    else:
        # every step's preemptions and re-admissions (one row a request): the parts of the session's typical step
        timing = store.reads.kv_events(kinds=TIMING_KINDS, session_id=session_id)
        timing = timing[(timing["ts"] < low) | (timing["ts"] > high)]  # outside the stretch read above
        attributed = attribute_steps(
            steps,
            reqs,
            pd.concat([session_kv[session_kv["kind"].isin(ATTRIBUTION_KINDS)], timing, resets]),
            rates=PrefillRates.from_store(store, read_from, last, requests=reqs),
            routing=_session_routing(store, session_id, reqs, steps, first, last),
        )
        attributed = with_decided(attributed, store.reads.step_verdicts(session_id=session_id))  # as decided
    step = steps.iloc[i]
    verdict = _verdict(attributed[attributed["step_index"] == step_index])
    mine = sent[i]
    pause = pause_before(steps.iloc[i - 1], sent[i - 1], step, mine) if i > 0 else None
    step_end = float(step["ended_at"]) if pd.notna(step["ended_at"]) else _end(mine)
    start = pause[0] if pause else float(step["started_at"])
    own_ids = pd.concat([r["request_id"] for r in sent]) if sent else pd.Series(dtype=object)
    tied = tied_events(store, session_id, start, step_end, own_ids)  # what its requests did without the header
    kv = pd.concat(
        [
            session_kv[(session_kv["ts"] > start) & (session_kv["ts"] <= step_end)],
            resets[(resets["ts"] > start) & (resets["ts"] <= step_end)],
            tied,
        ]
    )
    near_from, near_to = start - TAKERS_BEFORE_S, step_end
    if near_from >= read_from and near_to <= last:  # within the requests read above: no second read
        nearby = reqs[(reqs["arrival_ts"] >= near_from) & (reqs["arrival_ts"] <= near_to)]
    else:
        nearby = store.reads.requests(near_from, near_to)
    takers = nearby.set_index("request_id")["session_id"].to_dict()
    timeline = _timeline(step, pause, mine, pd.concat([session_kv, tied]))
    parts = [_lifecycle(step, pause, mine), _kv_rows(kv, session_id, takers), _connector_rows(store, mine, start)]
    events = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    events = events.astype({"ts": float}).sort_values(["ts", "source"], kind="stable").reset_index(drop=True)
    misses = _misses(store, session_id, step, i, with_sessions(reqs, steps), kv)
    return StepStory(verdict, mine.reset_index(drop=True), pause, timeline, events[EVENTS], misses)


def _verdict(row: pd.DataFrame) -> StepVerdict:
    """The step's verdict, typed, from its row of the session's attributed frame: the keeper's record where it decided
    the step, else the record the page worked out now."""
    decided = bool((row["verdict"] == DECIDED).iloc[0]) if "verdict" in row else False
    at = float(row["decided_at"].iloc[0]) if decided and "decided_at" in row else time.time()
    return StepVerdict.of_record(verdict_records(row, decided_at=at)[0], decided=decided)


def _misses(store: Store, session_id: str, step, i: int, reqs: pd.DataFrame, kv: pd.DataFrame) -> tuple[str, ...]:
    """What the step and its session show that no cache size would change (`changing_starts`, `token_details`); `kv`:
    the step's own KV rows (a chain it began as another had, for less than a block)."""
    found = [reply_without_details(step.to_dict()), short_start_words(kv)]
    if i > 0:
        start = session_changing_start(store, session_id, reqs)
        found.append(start.words if start is not None else None)
    return tuple(words for words in found if words)


def _session_routing(store: Store, session_id: str, reqs, steps, first: float, last: float) -> pd.DataFrame:
    """The routing losses of the session's requests over its whole span, as its session's detail reads them (a
    replay over the step's stretch alone misses what the other replica stored before it)."""
    mine = with_sessions(reqs, steps)
    return request_routing(store, mine[mine["session_id"] == session_id], steps, first, last)


def _end(frame: pd.DataFrame) -> float:
    ends = pd.concat([frame[c] for c in ("ended_at", "finished_ts", "started_at", "arrival_ts") if c in frame])
    return float(ends.max()) if ends.notna().any() else float("inf")


def _short(request_id) -> str:
    text = str(request_id)
    return text if len(text) <= 14 else text[:6] + "…" + text[-6:]


def tool_calls(step) -> list[dict]:
    """The tool calls recorded in the pause before a step (a step made of an agent's spans): name, start, end,
    status, error_type; [] when none were recorded."""
    tools = step.get("tools") if hasattr(step, "get") else None
    return json.loads(tools) if isinstance(tools, str) and tools else []


def _tool_what(tool: dict) -> str:
    failed = f", failed: {tool['error_type']}" if tool.get("status") == StepStatus.ERROR.value else ""
    return f"tool {tool['name']} ran {tool['end'] - tool['start']:.2f} s{failed}"


def _timeline(step, pause, requests: pd.DataFrame, kv: pd.DataFrame) -> pd.DataFrame:
    status = step["status"] if pd.isna(step["error_type"]) else f"{step['status']} ({step['error_type']})"
    rows = [("agent step", "step", step["started_at"], step["ended_at"], f"step {step['step_index']}: {status}")]
    if pause:
        rows.append(("tool pause", "tool pause", pause[0], pause[1], f"tool pause of {pause[1] - pause[0]:.2f} s"))
    for tool in tool_calls(step):
        rows.append((f"tool {tool['name']}", "tool", tool["start"], tool["end"], _tool_what(tool)))
    step_end = float(step["ended_at"]) if pd.notna(step["ended_at"]) else float("nan")
    record = KVRecord.from_events(kv) if not kv.empty else None
    for n, r in enumerate(requests.itertuples(index=False), 1):
        lane = f"request {n} ({_short(r.request_id)})"
        times = _times(r, record)
        end = times.finished if times.finished == times.finished else step_end
        for label, begin, until in _drawn(request_intervals(times, end)[0]):
            if begin == begin and until == until and until > begin:
                phase = PHASE_OF.get(label, label)
                rows.append((lane, phase, begin, until, f"{PHASE_WORDS.get(phase, phase)} {until - begin:.3f} s"))
    return pd.DataFrame(rows, columns=TIMELINE).astype({"start": float, "end": float})


PHASE_OF = {"preempted": "preemption"}  # a latency part's label -> the timeline's phase
PHASE_WORDS = {"preemption": "preempted: waiting to be re-admitted, then recomputing,"}


def _times(r, record: KVRecord | None) -> RequestTimes:
    """A request row as `latency_parts` reads it, with the engine's preemptions and re-admissions of it."""

    def value(x) -> float:
        return float(x) if x is not None and pd.notna(x) else float("nan")

    rid = r.request_id
    preempted = record.preempted.get(rid, []) if record is not None else []
    readmitted = record.readmitted.get(rid, []) if record is not None else []
    return RequestTimes(
        rid,
        arrival=value(r.arrival_ts),
        queue=value(r.queue_s),
        first_token=value(r.first_token_ts),
        finished=value(r.finished_ts),
        prompt=value(r.prompt_tokens),
        cached=value(r.cached_tokens),
        completion=value(r.completion_tokens),
        num_preemptions=int(r.num_preemptions or 0),
        preempted=preempted,
        readmitted=readmitted,
    )


def _drawn(intervals: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """A request's intervals as drawn: its decode cut where a preemption interrupted it (one phase at a time)."""
    cuts = sorted((lo, hi) for label, lo, hi in intervals if label == "preempted")
    out = [i for i in intervals if i[0] != "decode"]
    for _, lo, hi in (i for i in intervals if i[0] == "decode"):
        at = lo
        for cut_lo, cut_hi in cuts:
            if cut_hi <= at or cut_lo >= hi:
                continue
            out.append(("decode", at, max(at, cut_lo)))
            at = max(at, cut_hi)
        out.append(("decode", at, hi))
    return out


def _lifecycle(step, pause, requests: pd.DataFrame) -> pd.DataFrame:
    rows = []
    if pause:
        rows.append((pause[0], "step", "pause", "tool pause began (the previous step's last request finished)"))
        rows.append((pause[1], "step", "pause", "tool pause ended"))
    rows.extend((tool["start"], "step", "tool", _tool_what(tool)) for tool in tool_calls(step))
    rows.append((step["started_at"], "step", "step", f"agent step {step['step_index']} started"))
    if pd.notna(step["ended_at"]):
        error = "" if pd.isna(step["error_type"]) else f": {step['error_type']}"
        ended = f"agent step {step['step_index']} ended {step['status']}{error}"
        rows.append((step["ended_at"], "step", "step", ended))
    for r in requests.itertuples(index=False):
        rid = r.request_id
        cached = "" if pd.isna(r.cached_tokens) else f", {int(r.cached_tokens)} of them cached"
        prompt = "" if pd.isna(r.prompt_tokens) else f" ({int(r.prompt_tokens)} prompt tokens{cached})"
        rows.append((r.arrival_ts, "request", "arrived", f"request {rid} arrived{prompt}"))
        if pd.notna(r.queue_s):
            rows.append((r.arrival_ts + r.queue_s, "request", "scheduled", f"scheduled after {r.queue_s:.3f} s queued"))
        if pd.notna(r.first_token_ts):
            rows.append((r.first_token_ts, "request", "first token", "first token"))
        if pd.notna(r.finished_ts):
            out = "" if pd.isna(r.completion_tokens) else f", {int(r.completion_tokens)} tokens out"
            reason = r.finish_reason if isinstance(r.finish_reason, str) else ""
            detail = f" ({(reason + out).lstrip(', ')})" if reason or out else ""
            rows.append((r.finished_ts, "request", "finished", f"request {rid} finished{detail}"))
    frame = pd.DataFrame(rows, columns=["ts", "source", "kind", "what"])
    return frame.assign(blocks=np.nan, tokens=np.nan, request_id=None, by_session=None)


def _connector_rows(store: Store, requests: pd.DataFrame, start: float) -> pd.DataFrame:
    """What a KV connector's own spans said of the step's requests (LMCache's lookups, loads and stores)."""
    if requests.empty:
        return pd.DataFrame(columns=EVENTS)
    end = _end(requests)
    lookups = lookups_of(requests, store.reads.connector_lookups(start - CONNECTOR_SLACK_S, end + CONNECTOR_SLACK_S))
    rows = [
        (r["started_at"], "connector", "lookup", np.nan, r["hit_tokens"], r["request_id"], None, connector_words(r))
        for _, r in lookups.iterrows()
    ]
    return pd.DataFrame(rows, columns=EVENTS)


def _kv_rows(kv: pd.DataFrame, session_id: str, takers: dict) -> pd.DataFrame:
    """One row per (ts, kind, reason, request), counting blocks: a block's own rows (a hash) once per distinct block
    however many owners recorded it; an event without a hash (a hit, an allocation, a preemption, a reset) by the
    blocks it covers (`num_blocks`; unknown, NaN, on rows stored before that column existed)."""
    if kv.empty:
        return pd.DataFrame(columns=EVENTS)
    keys = ["ms", "kind", "why", "key", "tie"]
    frame = pd.DataFrame(
        {
            "ms": (kv["ts"].astype(float) * 1000).round().to_numpy(),
            "kind": kv["kind"].astype(object).to_numpy(),
            "why": kv["reason"].astype(object).fillna("").to_numpy(),
            "key": kv["request_id"].astype(object).fillna("").to_numpy(),
            "tie": (kv["tie"] if "tie" in kv else pd.Series(None, index=kv.index)).astype(object).fillna("").to_numpy(),
            "ts": kv["ts"].astype(float).to_numpy(),
            "block_hash": kv["block_hash"].to_numpy(dtype=object),
            "num_tokens": pd.to_numeric(kv["num_tokens"], errors="coerce").to_numpy(dtype=float),
            "num_blocks": pd.to_numeric(kv["num_blocks"], errors="coerce").to_numpy(dtype=float)
            if "num_blocks" in kv
            else np.nan,
        }
    )
    out = _counted(frame, keys).reset_index()
    rids = [rid or None for rid in out["key"]]
    taken = [takers.get(rid) if rid else None for rid in rids]
    what = [
        _kv_text(kind, why, num, tok, rid, taker, session_id) + TIED_WORDS.get(tie, "")
        for kind, why, num, tok, rid, taker, tie in zip(
            out["kind"], out["why"], out["blocks"], out["tokens"], rids, taken, out["tie"]
        )
    ]
    return pd.DataFrame(
        {
            "ts": out["ts"].astype(float),
            "source": "kv",
            "kind": out["kind"],
            "blocks": out["blocks"].astype(float),
            "tokens": out["tokens"].astype(float),
            "request_id": rids,
            "by_session": taken,
            "what": what,
        },
        columns=EVENTS,
    )


# how an event that named no session was found to be this session's (`tied_events`)
TIED_WORDS = {
    BlockTie.INFERENCE.value: "; named no session: tied to this session by inference (its depth, its time, the chain)",
    BY_REQUEST: "; named no session: its request is this session's (joined to the step)",
}


def _counted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Each group of rows (by `keys`, in order of appearance): its first `ts`, its `blocks` (distinct hashes for block
    rows, `num_blocks` for the others; unknown, NaN, when one of them does not say) and `tokens` (NaN where no row of
    the group has any)."""
    groups = frame.groupby(keys, sort=False)
    out = groups.agg(ts=("ts", "min"), known_tokens=("num_tokens", "count"))
    own = frame["block_hash"].notna().to_numpy()
    per_block = frame[own].drop_duplicates([*keys, "block_hash"]).groupby(keys, sort=False)
    blocks = per_block.size().reindex(out.index, fill_value=0).astype(float)
    tokens = per_block["num_tokens"].sum().reindex(out.index, fill_value=0.0)
    if (~own).any():
        covering = frame[~own].groupby(keys, sort=False)
        counted = covering["num_blocks"].sum().reindex(out.index, fill_value=0.0)
        unknown = (covering.size() > covering["num_blocks"].count()).reindex(out.index, fill_value=False)
        blocks = (blocks + counted).where(~unknown.astype(bool), np.nan)
        tokens = tokens + covering["num_tokens"].sum().reindex(out.index, fill_value=0.0)
    out["blocks"], out["tokens"] = blocks, tokens.where(out["known_tokens"] > 0, np.nan)
    return out.drop(columns="known_tokens")


def _kv_text(kind: str, why: str, num: float, tokens: float, rid, taker, session_id: str) -> str:
    reason = f" ({why})" if why else ""
    if num != num:  # NaN: an event stored before events said how many blocks they cover
        blocks = f"blocks ({int(tokens)} tokens)" if tokens == tokens else "blocks"
    else:
        blocks = f"{int(num)} block" if num == 1 else f"{int(num)} blocks"
        if tokens == tokens and kind in (K.HIT.value, K.ALLOCATED.value, K.CLEARED.value):
            blocks += f" ({int(tokens)} tokens)"
    if kind == K.EVICTED.value:
        who = "this session's own" if taker == session_id else f"session {taker}'s" if taker else "another"
        return f"{blocks} it had cached evicted{reason} to make room for {who} request {rid}"
    if kind == K.REMOVED.value:
        return f"{blocks} it had cached removed by vLLM (vLLM does not say which request needed the room)"
    if kind == K.INVALIDATED.value:
        return f"{blocks} it had cached invalidated{reason}"
    if kind == K.CLEARED.value:
        return f"the whole prefix cache was reset{reason}: {blocks} dropped"
    if kind == K.PREEMPTED.value:
        lost = f"{int(tokens)} computed tokens" if tokens == tokens else "its computed tokens"
        return f"request {rid} preempted{reason}: {blocks} freed, {lost} to recompute"
    if kind == K.HIT.value:
        return f"{blocks} found in the cache{reason} by request {rid}"
    if kind == K.STORED.value:
        return f"{blocks} stored in the prefix cache"
    if kind == K.ALLOCATED.value:
        return f"{blocks} allocated for request {rid}"
    return f"{blocks} {kind}{reason}"
