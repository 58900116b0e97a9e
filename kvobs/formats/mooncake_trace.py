"""A Mooncake trace read back as timed requests, for kvobs's what-if (`kvobs whatif --trace FILE`).

    trace = read_trace(lines)                                  # kvobs's own export: its rows say their times
    trace = read_trace(lines, ServiceRates(8000.0, 50.0))      # any Mooncake file: the times a model gives

A row is Mooncake's (`input_length`, `output_length`, `hash_ids`, `timestamp` in ms), AIPerf's multi-turn
(`session_id`, `delay`) or Dynamo's agentic (`request_id`, `wait_for`, `delay`, `tool_wait_ms`): a row with a
`timestamp` arrives then; a row that waits (for the requests in `wait_for`, else for its session's previous request)
arrives `delay` plus `tool_wait_ms` after the last of them finished. A trace says when a request arrives, never how
long it ran: where a row carries kvobs's own fields (`kvobs.formats.mooncake.KVOBS`: its lookup, first token and
finish as recorded) they are taken as they are; otherwise the times come from `ServiceRates` (its prompt prefilled at
one rate, its reply decoded at another, whatever the cache held: a model, said as such), and a file that needs them
without them is refused, not guessed at.

A row that is not JSON or not of the format stops the read with its line number (`TraceError`): a replay of part of a
trace would answer for a trace nobody recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from kvobs.formats.mooncake import KVOBS


class TraceError(ValueError):
    """A trace that cannot be replayed as it is: the line and why."""


@dataclass(frozen=True)
class ServiceRates:
    """How long a request runs where its row does not say: its prompt at `prefill_tokens_per_s`, then its reply at
    `decode_tokens_per_s`."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True)
class TraceRequest:
    """One row, timed (seconds from the trace's start): its prefix lookup, first token and finish."""

    request_id: str
    session_id: str | None
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]  # its prompt's blocks, then its reply's where the row says them (kvobs's own)
    lookup_s: float
    first_token_s: float | None
    finished_s: float


@dataclass(frozen=True)
class Trace:
    requests: list[TraceRequest]
    recorded: int  # requests timed by their rows' own kvobs fields
    modeled: int  # ... by `ServiceRates`
    rates: ServiceRates | None


class _Times(msgspec.Struct):
    lookup_ms: float
    finished_ms: float
    first_token_ms: float | None = None
    output_hash_ids: list[int] = []


class _Row(msgspec.Struct, rename={"times": KVOBS}):
    input_length: int
    hash_ids: list[int]
    output_length: int = 0
    timestamp: float | None = None
    request_id: str | None = None
    session_id: str | None = None
    wait_for: list[str] | None = None
    delay: float = 0.0
    tool_wait_ms: float = 0.0
    times: _Times | None = None


_DECODE = msgspec.json.Decoder(_Row)


def read_trace(lines: Iterable[str], rates: ServiceRates | None = None) -> Trace:
    """The trace's rows in file order, timed.

    Raises:
        TraceError: a line that is not a row of the format; a row that waits for a request not before it, or neither
            has a `timestamp` nor waits for one; a row with no recorded times where `rates` is None.
    """
    requests: list[TraceRequest] = []
    finished: dict[str, float] = {}  # request id -> when it finished
    last_of: dict[str, str] = {}  # session -> its latest request
    recorded = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = _DECODE.decode(line)
        except msgspec.ValidationError as exc:
            raise TraceError(f"line {number}: {exc}") from None
        except msgspec.DecodeError:
            raise TraceError(f"line {number}: not JSON") from None
        if row.input_length < 0 or row.output_length < 0 or any(h < 0 for h in row.hash_ids):
            raise TraceError(f"line {number}: lengths and hash ids are never negative")
        request_id = row.request_id or f"line-{number}"
        if request_id in finished:
            raise TraceError(f"line {number}: request {request_id!r} appears twice")
        if row.times is not None:
            request = _recorded(row, request_id)
            recorded += 1
        elif rates is None:
            raise TraceError(
                f"line {number}: the row says when its request arrived, not how long it ran: give the prefill and "
                "decode rates to model it (--prefill-tokens-per-s, --decode-tokens-per-s)"
            )
        else:
            start = _arrival(row, number, finished, last_of)
            first = start + row.input_length / rates.prefill_tokens_per_s
            end = first + row.output_length / rates.decode_tokens_per_s
            request = TraceRequest(
                request_id, row.session_id, row.input_length, row.output_length, tuple(row.hash_ids), start, first, end
            )
        requests.append(request)
        finished[request_id] = request.finished_s
        if row.session_id is not None:
            last_of[row.session_id] = request_id
    return Trace(requests, recorded, len(requests) - recorded, rates if recorded < len(requests) else None)


def _recorded(row: _Row, request_id: str) -> TraceRequest:
    times = row.times
    assert times is not None
    first = None if times.first_token_ms is None else times.first_token_ms / 1000
    return TraceRequest(
        request_id,
        row.session_id,
        row.input_length,
        row.output_length,
        (*row.hash_ids, *times.output_hash_ids),
        times.lookup_ms / 1000,
        first,
        times.finished_ms / 1000,
    )


def _arrival(row: _Row, number: int, finished: dict[str, float], last_of: dict[str, str]) -> float:
    """When a row without recorded times arrives: at its `timestamp`, else after what it waits for."""
    if row.timestamp is not None:
        return row.timestamp / 1000
    waits = row.wait_for if row.wait_for is not None else [last_of[row.session_id]] if row.session_id in last_of else []
    missing = [w for w in waits if w not in finished]
    if missing or not waits:
        said = f"waits for {missing[0]!r}, which no line before it is" if missing else "has no timestamp"
        raise TraceError(f"line {number}: the row {said}, so when it arrives is not known")
    return max(finished[w] for w in waits) + (row.delay + row.tool_wait_ms) / 1000
