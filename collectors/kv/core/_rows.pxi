# A batch's `kv_events` rows kept in C++ columns (included by _chain_table.pyx): what collectors.kv.batch_rows'
# BatchRows keeps in Python lists, filled by the compiled chains (`store_rows`, `remove_rows`) a block at a time
# with no Python object a row, and handed out as the same columns (`columns()`) once a batch.

from libc.stdint cimport int8_t

from collectors.kv.batch_rows import COLUMNS, EVENT_COLUMNS, ROW_COLUMNS, TIER_STORED
from kvobs.store.runs import Runs

# the row columns as `columns()` spells them out: a column added to the record fails the import until it is filled
if ("block_hash", "parent_hash", "session_id", "first_owner", "extra_keys", "lifetime_s", "restored",
        "restored_after_s", "shared_start_tokens") != ROW_COLUMNS:
    raise ImportError(f"CompiledRows does not fill every row column: {ROW_COLUMNS}")


cdef class CompiledRows:
    """collectors.kv.batch_rows.BatchRows in C++ columns (a value's absence: a flag, -1 or NaN)."""

    cdef vector[uint64_t] hashes, parents
    cdef vector[uint8_t] has_hash, has_parent
    cdef vector[int8_t] firsts, restored  # -1: None
    cdef vector[double] lifetimes, restored_after  # NaN: None
    cdef list sessions  # runs of rows: [session, rows, session, rows, ...]
    cdef list sparse_extra, sparse_shared  # [row, value, ...] where the value is not None
    cdef list events  # each run's `EVENT_COLUMNS` values
    cdef list lengths  # each run's rows
    cdef public list losers  # the owner of each device-tier removed row (not a column)

    def __init__(self):
        self.sessions, self.sparse_extra, self.sparse_shared = [], [], []
        self.events, self.lengths, self.losers = [], [], []

    def __len__(self):
        return self.hashes.size()

    cdef void _run(self, tuple shared, size_t n):  # (no negative index: the module is compiled without wraparound)
        cdef Py_ssize_t last = len(self.events) - 1
        if last >= 0 and self.events[last] == shared:
            self.lengths[last] += n
        else:
            self.events.append(shared)
            self.lengths.append(n)

    cdef void _session(self, object session, size_t n):
        cdef Py_ssize_t last = len(self.sessions) - 1
        if last > 0 and self.sessions[last - 1] is session:
            self.sessions[last] += n
        else:
            self.sessions += [session, n]

    cdef void _row(self, bint has_hash, uint64_t h, bint has_parent, uint64_t parent, int8_t first, double lifetime,
                   int8_t restored, double after):
        self.hashes.push_back(h)
        self.has_hash.push_back(has_hash)
        self.parents.push_back(parent)
        self.has_parent.push_back(has_parent)
        self.firsts.push_back(first)
        self.lifetimes.push_back(lifetime)
        self.restored.push_back(restored)
        self.restored_after.push_back(after)

    def placeholders(self, list hashes, medium, list firsts, gaps=None):
        """BatchRows.placeholders."""
        cdef size_t i, n = len(hashes)
        for i in range(n):
            gap = None if gaps is None else gaps[i]
            self._row(True, hashes[i], False, 0, firsts[i], NAN, 0 if gap is None else 1, NAN if gap is None else gap)
        self._session(None, n)
        self._run((TIER_STORED, medium, None, None, None, None, None, None), n)

    def removed(self, list hashes, list parents, list sessions, list firsts, list lifetimes, *, medium, num_tokens,
                group_idx, reason, row_kind):
        """BatchRows.removed."""
        cdef size_t i, n = len(hashes)
        for i in range(n):
            parent, lifetime = parents[i], lifetimes[i]
            self._row(True, hashes[i], parent is not None, 0 if parent is None else parent, firsts[i],
                      NAN if lifetime is None else lifetime, -1, NAN)
            self._session(sessions[i], 1)
        self._run((row_kind, medium, num_tokens, reason, None, group_idx, None, None), n)

    def add(self, kind, **fields):
        """BatchRows.add: one row by column name; a column not named is NULL."""
        fields["kind"] = kind
        if not fields.keys() <= set(COLUMNS):
            raise TypeError(f"not a kv_events column: {', '.join(sorted(fields.keys() - set(COLUMNS)))}")
        h, parent, first = fields.get("block_hash"), fields.get("parent_hash"), fields.get("first_owner")
        lifetime, restored, after = fields.get("lifetime_s"), fields.get("restored"), fields.get("restored_after_s")
        cdef size_t row = self.hashes.size()
        self._row(h is not None, 0 if h is None else h, parent is not None, 0 if parent is None else parent,
                  -1 if first is None else first, NAN if lifetime is None else lifetime,
                  -1 if restored is None else restored, NAN if after is None else after)
        self._session(fields.get("session_id"), 1)
        for name, sparse in (("extra_keys", self.sparse_extra), ("shared_start_tokens", self.sparse_shared)):
            if fields.get(name) is not None:
                sparse += [row, fields[name]]
        self._run(tuple(fields.get(name) for name in EVENT_COLUMNS), 1)

    def columns(self):
        """Every column, as BatchRows.columns gives them: `ROW_COLUMNS` as lists, `EVENT_COLUMNS` as runs."""
        cdef size_t i, n = self.hashes.size()
        cdef list hashes = [None] * n, parents = [None] * n, firsts = [None] * n, lifetimes = [None] * n
        cdef list restored = [None] * n, after = [None] * n
        for i in range(n):
            if self.has_hash[i]:
                hashes[i] = self.hashes[i]
            if self.has_parent[i]:
                parents[i] = self.parents[i]
            if self.firsts[i] >= 0:
                firsts[i] = self.firsts[i]
            if not isnan(self.lifetimes[i]):
                lifetimes[i] = self.lifetimes[i]
            if self.restored[i] >= 0:
                restored[i] = self.restored[i]
            if not isnan(self.restored_after[i]):
                after[i] = self.restored_after[i]
        sessions = []
        for i in range(0, len(self.sessions), 2):
            sessions += [self.sessions[i]] * self.sessions[i + 1]
        made = {
            "block_hash": hashes,
            "parent_hash": parents,
            "session_id": sessions,
            "first_owner": firsts,
            "extra_keys": _spread(self.sparse_extra, n),
            "lifetime_s": lifetimes,
            "restored": restored,
            "restored_after_s": after,
            "shared_start_tokens": _spread(self.sparse_shared, n),
        }
        shared = zip(*self.events) if self.events else [[] for _ in EVENT_COLUMNS]
        for name, values in zip(EVENT_COLUMNS, shared):
            made[name] = Runs(list(values), list(self.lengths), n)
        return made


cdef list _spread(list sparse, size_t n):
    out = [None] * n
    for i in range(0, len(sparse), 2):
        out[sparse[i]] = sparse[i + 1]
    return out
