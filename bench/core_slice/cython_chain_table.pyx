# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False
"""The C++ chain table (chain_table.hpp) bound with Cython, taking and giving what ChainTracker + BlockClock do."""

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.vector cimport vector


cdef extern from "chain_table.hpp" namespace "kvobs_bench":
    cdef cppclass Footprint:
        int64_t resident, stored, removed

    cdef cppclass Removal:
        cbool known, has_parent
        uint64_t parent
        double lifetime
        uint32_t owner
        const vector[uint32_t]* more

    cdef cppclass ChainTable:
        ChainTable() except +
        void stored(const uint64_t* hashes, size_t n, cbool has_parent, uint64_t parent, uint32_t owner, double ts,
                    vector[uint8_t]& firsts, vector[double]& gaps, cbool& repeated, cbool& restored) except +
        Removal removed(uint64_t h, cbool lost, double ts) except +
        const Footprint* footprint_of(uint32_t owner)
        size_t resident()


cdef class CyChainTable:
    cdef ChainTable table
    cdef dict ids
    cdef list names, owners
    cdef vector[uint64_t] keys
    cdef vector[uint8_t] firsts
    cdef vector[double] gaps

    def __init__(self):
        self.ids = {}
        self.names = [None]
        self.owners = [(None,)]  # session number -> its one-owner tuple (made once)

    cdef uint32_t _owner(self, object session):
        if session is None:
            return 0
        found = self.ids.get(session)
        if found is not None:
            return found
        cdef uint32_t id_ = len(self.names)
        self.ids[session] = id_
        self.names.append(session)
        self.owners.append((session,))
        return id_

    def stored(self, list hashes, object parent, object session, double ts):
        cdef size_t n = len(hashes), i
        cdef cbool repeated = False, restored = False
        self.keys.resize(n)
        for i in range(n):
            self.keys[i] = hashes[i]
        self.table.stored(self.keys.data(), n, parent is not None, 0 if parent is None else parent,
                          self._owner(session), ts, self.firsts, self.gaps, repeated, restored)
        firsts = [self.firsts[i] for i in range(n)] if repeated else None
        gaps = [None if self.gaps[i] < 0 else self.gaps[i] for i in range(n)] if restored else None
        return firsts, gaps

    def removed(self, list hashes, cbool lost, double ts):
        cdef size_t n = len(hashes), i, j
        cdef Removal r
        cdef list parents = [None] * n, owners = [None] * n, lifetimes = [None] * n
        for i in range(n):
            r = self.table.removed(hashes[i], lost, ts)
            if not r.known:
                owners[i] = self.owners[0]
                continue
            if r.has_parent:
                parents[i] = r.parent
            if r.more == NULL:
                owners[i] = self.owners[r.owner]
            else:
                owners[i] = (self.names[r.owner], *[self.names[r.more.at(j)] for j in range(r.more.size())])
            lifetimes[i] = r.lifetime
        return parents, owners, lifetimes

    def footprint(self, object session):
        cdef const Footprint* fp
        if session is not None and session not in self.ids:
            return None
        fp = self.table.footprint_of(0 if session is None else self.ids[session])
        return None if fp == NULL else (fp.resident, fp.stored, fp.removed)

    def resident(self):
        return self.table.resident()
