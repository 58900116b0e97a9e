# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled ChainTracker and BlockClock (chain_table.hpp), taking and giving what the Python classes do.

Built by `python -m collectors.kv.core.build` (scripts/install.sh runs it); `collectors.kv.core` picks it when it is
built. Session ids are numbered here (0: no session) and a number is handed back once no block names its session,
so the numbers do not grow with every session the collector ever saw.
"""

from collections.abc import Mapping

from libc.math cimport NAN, isnan
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.pair cimport pair
from libcpp.vector cimport vector

from collectors.kv.chains import Footprint
from kvobs.block_clock import HORIZON_S, MAX_BLOCKS


cdef extern from "chain_table.hpp" namespace "kvobs_core":
    cdef cppclass Ordered[V]:
        V* find(uint64_t key)
        size_t size()

    cdef cppclass Clock:
        Clock(size_t max_blocks, double horizon_s) except +
        cbool stored(const uint64_t* hashes, size_t n, double ts, vector[double]& gaps) except +
        cbool came_back(const uint64_t* hashes, size_t n, double ts, vector[double]& gaps) except +
        void lost(const uint64_t* hashes, size_t n, double ts, const double* given, vector[double]& lifetimes) except +
        void cleared(double ts, const Ordered[double]& resident) except +
        size_t max_blocks
        double horizon_s
        Ordered[double] stored_at, lost_at

    cdef cppclass Block:
        uint64_t parent
        double stored_at
        uint32_t owner
        uint32_t extra
        cbool has_parent

    cdef cppclass Delta:
        int64_t resident, stored, removed, cleared

    cdef cppclass ChainTable:
        ChainTable(size_t max_blocks, Clock* clock) except +
        cbool stored(const uint64_t* hashes, size_t n, cbool has_parent, uint64_t parent, uint32_t owner, double ts,
                     vector[uint8_t]& firsts) except +
        cbool removed(uint64_t h, cbool lost, Block& out) except +
        void cleared(double ts, vector[pair[uint32_t, int64_t]]& lost) except +
        cbool adopt(uint64_t h, uint32_t owner) except +
        const vector[uint32_t]* more_of(const Block& block)
        void settled()
        cbool referenced(uint32_t owner)
        vector[uint32_t] touched, freed
        vector[Delta] deltas
        size_t max_blocks
        Ordered[Block] blocks
        int64_t num_repeated, num_unknown_removed

    cdef void keys_of "kvobs_core::keys_of"[V](const Ordered[V]& table, vector[uint64_t]& out) except +
    cdef void times_of "kvobs_core::times_of"(const Ordered[double]& table, vector[uint64_t]& keys,
                                              vector[double]& times) except +


include "_rows.pxi"


cdef inline void _fill(vector[uint64_t]& keys, list hashes):
    cdef size_t n = len(hashes), i
    keys.resize(n)
    for i in range(n):
        keys[i] = hashes[i]


cdef inline object _times(vector[double]& values, size_t n):
    return [None if isnan(values[i]) else values[i] for i in range(n)]


cdef dict _ordered(Ordered[double]& table):
    cdef vector[uint64_t] keys
    cdef vector[double] times
    times_of(table, keys, times)
    return {keys[i]: times[i] for i in range(keys.size())}


cdef class CompiledClock:
    """kvobs.block_clock.BlockClock. `stored_at` and `lost_at` are copies in order (for reading, not for the path)."""

    cdef Clock* clock
    cdef vector[uint64_t] keys
    cdef vector[double] gaps, given, lives

    def __cinit__(self, size_t max_blocks=MAX_BLOCKS, double horizon_s=HORIZON_S):
        self.clock = new Clock(max_blocks, horizon_s)

    def __dealloc__(self):
        del self.clock

    @property
    def max_blocks(self):
        return self.clock.max_blocks

    @property
    def horizon_s(self):
        return self.clock.horizon_s

    @property
    def stored_at(self):
        return _ordered(self.clock.stored_at)

    @property
    def lost_at(self):
        return _ordered(self.clock.lost_at)

    def stored(self, list hashes, double ts):
        _fill(self.keys, hashes)
        if self.clock.stored(self.keys.data(), self.keys.size(), ts, self.gaps):
            return _times(self.gaps, self.keys.size())
        return None

    def came_back(self, list hashes, double ts):
        _fill(self.keys, hashes)
        if self.clock.came_back(self.keys.data(), self.keys.size(), ts, self.gaps):
            return _times(self.gaps, self.keys.size())
        return None

    def lost(self, hashes, double ts, stored=None):
        cdef size_t i, n
        _fill(self.keys, list(hashes))
        n = self.keys.size()
        if stored is None:
            self.clock.lost(self.keys.data(), n, ts, NULL, self.lives)
        else:
            self.given.resize(n)
            for i, t in enumerate(stored):
                self.given[i] = float("nan") if t is None else t
            self.clock.lost(self.keys.data(), n, ts, self.given.data(), self.lives)
        return _times(self.lives, n)

    def cleared(self, double ts, resident=()):
        """Every block it holds lost at `ts`. (The compiled chains clear their own resident blocks in C++: a caller
        with blocks of its own uses the Python clock.)"""
        if resident:
            raise TypeError("CompiledClock.cleared takes no resident blocks of its caller's")
        cdef Ordered[double] none
        self.clock.cleared(ts, none)


class CompiledParents(Mapping):
    """The parents of the resident blocks (`ChainTracker.parents`), looked up in the compiled table."""

    def __init__(self, chains):
        self.chains = chains

    def __getitem__(self, key):
        return self.chains.parent_of(key)

    def __contains__(self, key):
        return self.chains.holds(key)

    def __iter__(self):
        return iter(self.chains.hashes())

    def __len__(self):
        return self.chains.resident()


cdef class CompiledChains:
    """collectors.kv.chains.ChainTracker, compiled."""

    cdef ChainTable* table
    cdef readonly CompiledClock clock
    cdef public dict footprints
    cdef dict ids  # session -> its number
    cdef list names  # number -> session (None: a number handed back)
    cdef list ones  # number -> (session,), made once
    cdef list free  # numbers handed back
    cdef vector[uint64_t] work  # a call's hashes
    cdef vector[uint8_t] firsts
    cdef vector[double] given
    cdef vector[pair[uint32_t, int64_t]] lost

    def __cinit__(self, size_t max_blocks=2_000_000, CompiledClock clock=None):
        self.clock = CompiledClock() if clock is None else clock
        self.table = new ChainTable(max_blocks, self.clock.clock)
        self.footprints = {}
        self.ids = {None: 0}
        self.names = [None]
        self.ones = [(None,)]
        self.free = []

    def __dealloc__(self):
        del self.table

    @property
    def max_blocks(self):
        return self.table.max_blocks

    @property
    def num_repeated(self):
        return self.table.num_repeated

    @property
    def num_unknown_removed(self):
        return self.table.num_unknown_removed

    def resident(self):
        return self.table.blocks.size()

    def hashes(self):
        cdef vector[uint64_t] out
        keys_of(self.table.blocks, out)
        return [k for k in out]

    cdef uint32_t _number(self, object session) except? 0:
        found = self.ids.get(session)
        if found is not None:
            return found
        cdef uint32_t number
        if self.free:
            number = self.free.pop()
            self.names[number] = session
            self.ones[number] = (session,)
        else:
            number = len(self.names)
            self.names.append(session)
            self.ones.append((session,))
        self.ids[session] = number
        return number

    cdef void _hand_back(self, uint32_t number):
        session = self.names[number]
        if number == 0 or session is None or self.table.referenced(number):
            return  # (no session's number, handed back already, or named again)
        del self.ids[session]
        self.names[number] = None
        self.ones[number] = None
        self.free.append(number)

    cdef int _settle(self) except -1:
        """Add the call's footprint changes to the sessions' footprints; hand back numbers no block names now."""
        cdef uint32_t o
        cdef Delta* d
        footprints = self.footprints
        for o in self.table.touched:
            session = self.names[o]
            fp = footprints.get(session)
            if fp is None:
                fp = footprints[session] = Footprint()
            d = &self.table.deltas[o]
            fp.resident += d.resident
            fp.stored += d.stored
            fp.removed += d.removed
            fp.cleared += d.cleared
        for o in self.table.freed:
            self._hand_back(o)
        self.table.settled()
        return 0

    cdef object _owners(self, const Block& block):
        cdef const vector[uint32_t]* more = self.table.more_of(block)
        cdef size_t j
        if more == NULL:
            return self.ones[block.owner]
        return (self.names[block.owner], *[self.names[more[0][j]] for j in range(more.size())])

    def stored(self, list hashes, parent, session, double ts):
        """ChainTracker.stored: None when every block was new, else a flag a block (1 new, 0 announced again)."""
        cdef size_t n = len(hashes), i
        _fill(self.work, hashes)
        cdef uint32_t owner = self._number(session)
        repeated = self.table.stored(self.work.data(), n, parent is not None, 0 if parent is None else parent, owner,
                                     ts, self.firsts)
        self._settle()
        return [self.firsts[i] for i in range(n)] if repeated else None

    def store(self, list hashes, parent, session, double ts):
        """ChainTracker.store: (`stored`'s flags, the clock's restores)."""
        return self.stored(hashes, parent, session, ts), self.clock.came_back(hashes, ts)

    def store_rows(self, CompiledRows rows, event, double ts, row_kind, shared_start):
        """ChainTracker.store_rows: the event's blocks stored, a row each written into `rows`."""
        cdef list hashes = event.hashes
        cdef size_t n = len(hashes), i, row = rows.hashes.size()
        cdef CompiledClock clock = self.clock
        parent, session = event.parent, event.session_id
        cdef uint64_t first_parent = 0 if parent is None else parent
        _fill(self.work, hashes)
        repeated = self.table.stored(self.work.data(), n, parent is not None, first_parent, self._number(session), ts,
                                     self.firsts)
        self._settle()
        restored = clock.clock.came_back(self.work.data(), n, ts, clock.gaps)
        for i in range(n):
            rows._row(True, self.work[i], i > 0 or parent is not None, self.work[i - 1] if i else first_parent,
                      self.firsts[i] if repeated else 1, NAN, 1 if restored and not isnan(clock.gaps[i]) else 0,
                      clock.gaps[i] if restored else NAN)
        rows._session(session, n)
        if event.extra_keys is not None:
            for i, value in enumerate(event.extra_keys):
                if value is not None:
                    rows.sparse_extra += [row + i, value]
        if shared_start:
            rows.sparse_shared += [row, shared_start]
        rows._run((row_kind, event.medium, event.block_size, None, None, event.group_idx, event.kv_cache_spec_kind,
                   event.lora_name), n)

    def remove_rows(self, CompiledRows rows, list hashes, cbool lost, double ts, medium, num_tokens, group_idx,
                    reason, row_kind, bint device):
        """ChainTracker.remove_rows: the blocks removed, a row each and owner written into `rows` (and, for the
        device tier, each row's owner into its losers)."""
        cdef size_t n = len(hashes), i, j, k, first_row = rows.hashes.size()
        cdef Block block
        cdef const vector[uint32_t]* more
        cdef vector[size_t] ends  # each block's rows end
        cdef CompiledClock clock = self.clock
        _fill(self.work, hashes)
        self.given.resize(n)
        losers = rows.losers
        for i in range(n):
            if not self.table.removed(self.work[i], lost, block):
                self.given[i] = NAN
                rows._row(True, self.work[i], False, 0, 1, NAN, -1, NAN)
                rows._session(None, 1)
                if device:
                    losers.append(None)
                ends.push_back(rows.hashes.size())
                continue
            self.given[i] = block.stored_at
            more = self.table.more_of(block)
            k = 1 if more == NULL else 1 + more.size()
            for j in range(k):
                owner = self.names[block.owner if j == 0 else more[0][j - 1]]
                rows._row(True, self.work[i], block.has_parent, block.parent, 1 if j == 0 else 0, NAN, -1, NAN)
                rows._session(owner, 1)
                if device:
                    losers.append(owner)
            ends.push_back(rows.hashes.size())
        self._settle()
        clock.clock.lost(self.work.data(), n, ts, self.given.data(), clock.lives)
        j = first_row
        for i in range(n):
            while j < ends[i]:
                rows.lifetimes[j] = clock.lives[i]
                j += 1
        if rows.hashes.size() > first_row:
            rows._run((row_kind, medium, num_tokens, reason, None, group_idx, None, None),
                      rows.hashes.size() - first_row)

    def remove(self, list hashes, cbool lost, double ts):
        """ChainTracker.remove: each block's `(parent, owners, stored_at)` (None: not resident), its lifetime."""
        cdef size_t n = len(hashes), i
        cdef Block block
        _fill(self.work, hashes)
        self.given.resize(n)
        blocks = [None] * n
        for i in range(n):
            if self.table.removed(self.work[i], lost, block):
                blocks[i] = (block.parent if block.has_parent else None, self._owners(block), block.stored_at)
                self.given[i] = block.stored_at
            else:
                self.given[i] = float("nan")
        self._settle()
        cdef CompiledClock clock = self.clock
        clock.clock.lost(self.work.data(), n, ts, self.given.data(), clock.lives)
        return blocks, _times(clock.lives, n)

    def removed(self, block_hash, cbool lost=True):
        """ChainTracker.removed (the clock is not told: `remove` tells it)."""
        cdef Block block
        if not self.table.removed(block_hash, lost, block):
            self._settle()
            return None
        found = (block.parent if block.has_parent else None, self._owners(block), block.stored_at)
        self._settle()
        return found

    def block(self, block_hash):
        cdef Block* block = self.table.blocks.find(block_hash)
        if block == NULL:
            return None
        return (block.parent if block.has_parent else None, self._owners(block[0]), block.stored_at)

    def holds(self, block_hash):
        return self.table.blocks.find(block_hash) != NULL

    def parent_of(self, block_hash):
        cdef Block* block = self.table.blocks.find(block_hash)
        if block == NULL:
            raise KeyError(block_hash)
        return block.parent if block.has_parent else None

    def parents(self):
        return CompiledParents(self)

    def adopt(self, block_hash, session) -> bool:
        cdef uint32_t owner = self._number(session)
        adopted = self.table.adopt(block_hash, owner)
        self._settle()
        return adopted

    def cleared(self, double ts):
        self.table.cleared(ts, self.lost)
        lost = {self.names[p.first]: p.second for p in self.lost}
        self._settle()
        return lost

    def footprint(self, session):
        fp = self.footprints.get(session)
        if fp is None:
            fp = self.footprints[session] = Footprint()
        return fp
