"""TensorRT-LLM's KV-cache events -> kvobs's normalized block events (`kvobs.block_events`): its adapter at the door.

    adapter = TrtllmAdapter()
    decoded = adapter.decode(body, ts=time.time())   # the JSON `POST /kv_cache_events` answered -> Decoded

`trtllm-serve` answers `POST /kv_cache_events` with the events since the last call, a JSON list in the form of
`tensorrt_llm._utils.KVCacheEventSerializer`: each event has `event_id` (increasing), `window_size` (the attention
window of its block manager), `attention_dp_rank` where attention data parallelism runs, and `data` of `type`:

- `created` (`num_blocks_per_cache_level`): a new KV cache manager, its cache empty: `Cleared`;
- `stored` (`parent_hash`, `blocks`: each `block_hash`, its `tokens`, `cache_level`, `priority`): `Stored`, one per
  run of blocks on the same level, the block size the number of a block's tokens;
- `removed` (`block_hashes`): `Removed` from the level the block was last seen on;
- `updated` (`block_hash`, `cache_level` and `priority` as `{old_value, new_value}`): a move between levels is a
  `Removed` from the old level and a `Stored` on the new one (its parent and size as last seen; a block not seen
  since the adapter started moves as a `Placeholder`: a hash that reached the tier, no block of a cache); a change of
  priority alone is no block event.

Cache levels: 0 is the primary pool (the device cache: `GPU`, as vLLM names its own), 1 the secondary pool (host
memory: `CPU`); a deeper level is no tier kvobs knows (`UnknownTier`). The events carry no time: a batch's time is
when it was fetched. Each attention window's block manager is a KV-cache group of its own (`group_idx`, numbered as
first seen), as vLLM numbers a hybrid model's groups. What the adapter remembers of each block (level, parent, size)
is bounded (`MAX_TRACKED`, least recently seen forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from kvobs.block_events import Batch, Cleared, Decoded, Event, Placeholder, Removed, Stored, UnknownTier
from kvobs.semconv.attributes import MEDIUM_GPU, medium_name

MAX_TRACKED = 1_000_000  # blocks whose level, parent and size the adapter remembers
LEVELS = {0: MEDIUM_GPU, 1: medium_name("CPU")}  # cache level -> the tier as kvobs names it
SHAPE = "trtllm-json"


class _Token(msgspec.Struct):
    token_id: int


class _Block(msgspec.Struct):
    block_hash: int
    tokens: list[_Token] = []
    cache_level: int = 0


class _Created(msgspec.Struct, tag="created", tag_field="type"):
    num_blocks_per_cache_level: list[int] = []


class _Stored(msgspec.Struct, tag="stored", tag_field="type"):
    blocks: list[_Block]
    parent_hash: int | None = None


class _Removed(msgspec.Struct, tag="removed", tag_field="type"):
    block_hashes: list[int]


class _Diff(msgspec.Struct):
    new_value: int | None = None
    old_value: int | None = None


class _Updated(msgspec.Struct, tag="updated", tag_field="type"):
    block_hash: int
    cache_level: _Diff | None = None


class _Event(msgspec.Struct):
    event_id: int
    data: _Created | _Stored | _Removed | _Updated
    window_size: int | None = None
    attention_dp_rank: int | None = None


_KNOWN = {"created", "stored", "removed", "updated"}
_events = msgspec.json.Decoder(list[msgspec.Raw])
_event = msgspec.json.Decoder(_Event)
_type = msgspec.json.Decoder(dict)


class DecodeError(ValueError):
    """A body that is no JSON list of events."""


@dataclass
class _Seen:
    level: int
    parent: int | None
    block_size: int


class TrtllmAdapter:
    """One stream's adapter: it remembers each block's level, parent and size (a move names only the block) and each
    window's group, so it is made once per stream."""

    def __init__(self, max_tracked: int = MAX_TRACKED) -> None:
        self.max_tracked = max_tracked
        self.seen: OrderedDict[int, _Seen] = OrderedDict()
        self.groups: dict[int | None, int] = {}  # window size -> group index, as first seen
        self.last_event_id: int | None = None  # of the latest event decoded
        self.first_event_id: int | None = None  # of the first event the latest body held

    def decode(self, body: bytes, ts: float) -> Decoded:
        """Raises DecodeError on a body that is no JSON list; an event of an unknown type is counted (`unknown`), a
        malformed one dropped alone (`refused`)."""
        try:
            raws = _events.decode(body)
        except msgspec.DecodeError as exc:
            raise DecodeError(f"not a JSON list of KV-cache events: {exc}") from exc
        events: list[Event] = []
        unknown = refused = 0
        ranks: set[int | None] = set()
        self.first_event_id = None
        for raw in raws:
            try:
                event = _event.decode(raw)
            except msgspec.ValidationError:
                kind = _kind(raw)
                unknown += kind is not None and kind not in _KNOWN
                refused += kind is None or kind in _KNOWN
                continue
            self.last_event_id = event.event_id
            self.first_event_id = event.event_id if self.first_event_id is None else self.first_event_id
            ranks.add(event.attention_dp_rank)
            events.extend(self._normalize(event))
        rank = next(iter(ranks)) if len(ranks) == 1 else None
        return Decoded(Batch(ts, events, rank), unknown, refused, SHAPE, len(raws) - unknown - refused)

    def _normalize(self, event: _Event) -> list[Event]:
        data, group = event.data, self.groups.setdefault(event.window_size, len(self.groups))
        if isinstance(data, _Stored):
            return self._stored(data, group)
        if isinstance(data, _Removed):
            return self._removed(data.block_hashes, group)
        if isinstance(data, _Created):
            self.seen.clear()
            return [Cleared()]
        diff = data.cache_level
        if diff is None or diff.new_value is None or diff.new_value == diff.old_value:
            return []  # a change of priority alone
        seen = self.seen.get(data.block_hash)
        old = diff.old_value if diff.old_value is not None else (seen.level if seen else 0)
        out = self._removed([data.block_hash], group, level=old)
        if seen is None:
            out.append(_placeholder([data.block_hash], diff.new_value))
            return out
        seen.level = diff.new_value
        self._remember(data.block_hash, seen)
        out.append(_stored([data.block_hash], seen.parent, seen.block_size, diff.new_value, group))
        return out

    def _stored(self, data: _Stored, group: int) -> list[Event]:
        out: list[Event] = []
        parent = data.parent_hash
        for block in data.blocks:
            size = len(block.tokens)
            self._remember(block.block_hash, _Seen(block.cache_level, parent, size))
            last = out[-1] if out else None
            if (
                type(last) is Stored
                and last.medium == LEVELS.get(block.cache_level)
                and last.block_size == size
                and block.cache_level in LEVELS
            ):
                last.hashes.append(block.block_hash)
            else:
                out.append(_stored([block.block_hash], parent, size, block.cache_level, group))
            parent = block.block_hash
        return out

    def _removed(self, hashes: list[int], group: int, *, level: int | None = None) -> list[Event]:
        by_level: dict[int, list[int]] = {}
        for h in hashes:
            seen = self.seen.pop(h, None) if level is None else self.seen.get(h)
            by_level.setdefault(level if level is not None else (seen.level if seen else 0), []).append(h)
        return [
            Removed(found, LEVELS[lvl], group, None) if lvl in LEVELS else UnknownTier(found, _unknown_tier(lvl))
            for lvl, found in by_level.items()
        ]

    def _remember(self, block_hash: int, seen: _Seen) -> None:
        self.seen[block_hash] = seen
        self.seen.move_to_end(block_hash)
        if len(self.seen) > self.max_tracked:
            self.seen.popitem(last=False)


def _stored(hashes: list[int], parent: int | None, size: int, level: int, group: int) -> Event:
    if level not in LEVELS:
        return UnknownTier(hashes, _unknown_tier(level))
    return Stored(hashes, parent, size, LEVELS[level], group, None)


def _placeholder(hashes: list[int], level: int) -> Event:
    return Placeholder(hashes, LEVELS[level]) if level in LEVELS else UnknownTier(hashes, _unknown_tier(level))


def _unknown_tier(level: int) -> str:
    return str(medium_name(f"level{level}"))


def _kind(raw: msgspec.Raw) -> str | None:
    """An event's `data.type` when it is an object with one (a type this adapter does not know), else None."""
    try:
        data = _type.decode(raw).get("data")
    except msgspec.DecodeError:
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None
