// The collector's compiled ingest core: one tier's hash chains (`collectors/kv/chains.py`, ChainTracker) and block clock
// (`kvobs/block_clock.py`, BlockClock) in C++, on the unsigned 64-bit hashes the door normalizes to. It answers what
// the Python classes answer, row for row (tests/collectors/test_kv_core.py holds the two together): the same
// insertion order wherever a Python dict's order decides what is dropped or said first. Sessions are numbers the
// binding (`_chain_table.pyx`) gives; number 0 is "no session", and a number no block owns any more is handed back.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvobs_core {

constexpr double MARGIN = 1.0 / 100;     // kvobs.block_clock.MARGIN
constexpr double TRIM_EVERY = 1.0 / 64;  // kvobs.block_clock.TRIM_EVERY
constexpr double NONE = std::numeric_limits<double>::quiet_NaN();  // a time not known (Python's None)

inline size_t overflow(size_t size, size_t max_blocks) {  // kvobs.block_clock.overflow
    return size - max_blocks + static_cast<size_t>(static_cast<double>(max_blocks) * MARGIN);
}

// A hash map in a Python dict's order: a key inserted anew goes last, a key updated keeps its place. Compact, as it
// holds millions of blocks: its entries live in chunks that never move (a value's address stays valid until its key
// is erased), threaded in order by 32-bit links; an open-addressing index of 32-bit entry numbers finds them.
template <class V>
class Ordered {
  public:
    Ordered() = default;
    Ordered(const Ordered&) = delete;
    Ordered& operator=(const Ordered&) = delete;

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

    V* find(uint64_t key) {
        const size_t i = probe(key);
        return i == NOT_FOUND ? nullptr : &slot(index_[i]).value;
    }

    // The key's value, made (last in order) if absent; `inserted` says which.
    V& at(uint64_t key, bool& inserted) {
        const size_t found = probe(key);
        inserted = found == NOT_FOUND;
        if (!inserted) return slot(index_[found]).value;
        if ((size_ + tombs_ + 1) * 10 > index_.size() * 7) rehash();
        size_t i = mix(key) & (index_.size() - 1);
        while (index_[i] != EMPTY && index_[i] != TOMB) i = (i + 1) & (index_.size() - 1);
        tombs_ -= index_[i] == TOMB;
        const uint32_t n = take();
        index_[i] = n;
        Slot& s = slot(n);
        s.key = key;
        s.value = V{};
        s.prev = tail_;
        s.next = 0;
        (tail_ ? slot(tail_).next : head_) = n;
        tail_ = n;
        ++size_;
        return s.value;
    }

    bool erase(uint64_t key, V* out = nullptr) {
        const size_t i = probe(key);
        if (i == NOT_FOUND) return false;
        const uint32_t n = index_[i];
        Slot& s = slot(n);
        if (out) *out = s.value;
        index_[i] = TOMB;
        ++tombs_;
        (s.prev ? slot(s.prev).next : head_) = s.next;
        (s.next ? slot(s.next).prev : tail_) = s.prev;
        s.next = free_;  // (a free entry's `next` threads the free list)
        free_ = n;
        --size_;
        return true;
    }

    // pop(key) then insert it last with `value` (a Python dict's `pop` and set).
    void move_last(uint64_t key, const V& value) {
        erase(key);
        bool inserted;
        at(key, inserted) = value;
    }

    // Drop the `n` oldest, calling `f(key, value)` on each first.
    template <class F>
    void drop_oldest(size_t n, F&& f) {
        while (n-- > 0 && head_) {
            const Slot& s = slot(head_);
            f(s.key, s.value);
            erase(s.key);
        }
    }

    template <class F>
    void each(F&& f) const {  // in order
        for (uint32_t n = head_; n; n = slot(n).next) f(slot(n).key, slot(n).value);
    }

    template <class F>
    void each_while(F&& f) const {  // in order, until `f` says false
        for (uint32_t n = head_; n && f(slot(n).key, slot(n).value); n = slot(n).next) {
        }
    }

    void clear() {
        chunks_.clear();
        index_.clear();
        size_ = tombs_ = 0;
        made_ = head_ = tail_ = free_ = 0;
    }

  private:
    struct Slot {
        uint64_t key;
        V value;
        uint32_t prev, next;  // entry numbers (from 1; 0: none)
    };
    static constexpr uint32_t EMPTY = 0, TOMB = 0xFFFFFFFFu;
    static constexpr size_t NOT_FOUND = ~size_t{0};
    static constexpr uint32_t CHUNK_BITS = 14;  // entries a chunk: 16,384

    static uint64_t mix(uint64_t x) {  // splitmix64's finalizer: hashes that are small ints spread too
        x ^= x >> 30;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 27;
        x *= 0x94d049bb133111ebULL;
        return x ^ (x >> 31);
    }

    Slot& slot(uint32_t n) { return chunks_[(n - 1) >> CHUNK_BITS][(n - 1) & ((1u << CHUNK_BITS) - 1)]; }
    const Slot& slot(uint32_t n) const { return chunks_[(n - 1) >> CHUNK_BITS][(n - 1) & ((1u << CHUNK_BITS) - 1)]; }

    size_t probe(uint64_t key) const {
        if (index_.empty()) return NOT_FOUND;
        const size_t mask = index_.size() - 1;
        for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
            const uint32_t n = index_[i];
            if (n == EMPTY) return NOT_FOUND;
            if (n != TOMB && slot(n).key == key) return i;
        }
    }

    uint32_t take() {  // a free entry, or a new one
        if (free_) {
            const uint32_t n = free_;
            free_ = slot(n).next;
            return n;
        }
        if ((made_ >> CHUNK_BITS) == chunks_.size()) chunks_.emplace_back(new Slot[size_t{1} << CHUNK_BITS]);
        return ++made_;
    }

    void rehash() {  // twice the room when over a third full, else the same room without its tombstones
        size_t room = index_.empty() ? 16 : index_.size();
        if ((size_ + 1) * 3 > room) room *= 2;
        index_.assign(room, EMPTY);
        tombs_ = 0;
        const size_t mask = room - 1;
        for (uint32_t n = head_; n; n = slot(n).next) {
            size_t i = mix(slot(n).key) & mask;
            while (index_[i] != EMPTY) i = (i + 1) & mask;
            index_[i] = n;
        }
    }

    std::vector<std::unique_ptr<Slot[]>> chunks_;
    std::vector<uint32_t> index_;
    size_t size_ = 0, tombs_ = 0;
    uint32_t made_ = 0, head_ = 0, tail_ = 0, free_ = 0;
};

template <class V>
void keys_of(const Ordered<V>& table, std::vector<uint64_t>& out) {  // in order
    out.clear();
    out.reserve(table.size());
    table.each([&](uint64_t key, const V&) { out.push_back(key); });
}

inline void times_of(const Ordered<double>& table, std::vector<uint64_t>& keys, std::vector<double>& times) {
    keys.clear();
    times.clear();
    table.each([&](uint64_t key, double t) {
        keys.push_back(key);
        times.push_back(t);
    });
}

// kvobs.block_clock.BlockClock: the stores it was told of apart from a chain table (a restart's rebuild), and the
// losses within its horizon, each bounded to `max_blocks`.
class Clock {
  public:
    Clock(size_t max_blocks, double horizon_s) : max_blocks(max_blocks), horizon_s(horizon_s) {}

    // `_restores`: each block's time since its loss (NaN: none, or past the horizon); returns whether any was one.
    bool restores(const uint64_t* hashes, size_t n, double ts, std::vector<double>& gaps) {
        gaps.assign(n, NONE);
        bool any = false;
        if (lost_at.empty()) return false;
        for (size_t i = 0; i < n; ++i) {
            double t;
            if (lost_at.erase(hashes[i], &t) && ts - t <= horizon_s) {
                gaps[i] = ts - t;
                any = true;
            }
        }
        return any;
    }

    bool stored(const uint64_t* hashes, size_t n, double ts, std::vector<double>& gaps) {
        const bool any = restores(hashes, n, ts, gaps);
        bool inserted;
        for (size_t i = 0; i < n; ++i) stored_at.at(hashes[i], inserted) = ts;
        bound(stored_at);
        return any;
    }

    bool came_back(const uint64_t* hashes, size_t n, double ts, std::vector<double>& gaps) {
        const bool any = restores(hashes, n, ts, gaps);
        if (!stored_at.empty()) {
            for (size_t i = 0; i < n; ++i) stored_at.erase(hashes[i]);
        }
        return any;
    }

    // Each block's lifetime (NaN: its store not known); `given`: each block's latest store as its caller keeps it
    // (NaN where it does not: this clock's), or nullptr.
    void lost(const uint64_t* hashes, size_t n, double ts, const double* given, std::vector<double>& lifetimes) {
        lifetimes.assign(n, NONE);
        for (size_t i = 0; i < n; ++i) {
            double t = given ? given[i] : NONE;
            if (std::isnan(t) && !stored_at.erase(hashes[i], &t)) continue;
            lifetimes[i] = ts - t;
            lost_at.move_last(hashes[i], ts);
        }
        trim(ts);
    }

    template <class Blocks>
    void cleared(double ts, const Blocks& resident) {  // every resident block lost at `ts`
        stored_at.each([&](uint64_t h, double) { lost_at.move_last(h, ts); });
        resident.each([&](uint64_t h, const auto&) { lost_at.move_last(h, ts); });
        stored_at.clear();
        trim(ts);
    }

    const size_t max_blocks;
    const double horizon_s;
    Ordered<double> stored_at, lost_at;

  private:
    void trim(double ts) {
        bound(lost_at);
        if (ts < trim_at_) return;
        const double oldest = ts - horizon_s;
        size_t expired = 0;
        double first = ts;
        lost_at.each_while([&](uint64_t, double t) {
            if (t >= oldest) {
                first = t;
                return false;
            }
            ++expired;
            return true;
        });
        lost_at.drop_oldest(expired, [](uint64_t, double) {});
        trim_at_ = first + horizon_s * (1 + TRIM_EVERY);
    }

    void bound(Ordered<double>& entries) {
        if (entries.size() > max_blocks) entries.drop_oldest(overflow(entries.size(), max_blocks), [](uint64_t, double) {});
    }

    double trim_at_ = -std::numeric_limits<double>::infinity();
};

struct Block {
    uint64_t parent;
    double stored_at;  // its latest store
    uint32_t owner;    // the session whose store introduced it
    uint32_t extra : 31;     // 0: no further owner; else 1 + its further owners' index in `ChainTable::extras`
    uint32_t has_parent : 1;  // (24 bytes a block, as ten million may be held)
};

struct Delta {  // a session's footprint change in one call, which the binding adds to its Python footprint
    int64_t resident = 0, stored = 0, removed = 0, cleared = 0;
};

// collectors.kv.chains.ChainTracker over a Clock it shares (a tier a clear ended keeps its clock for the next).
class ChainTable {
  public:
    ChainTable(size_t max_blocks, Clock* clock) : max_blocks(max_blocks), clock(clock) {}

    // ChainTracker.stored: `firsts` a block (1 new, 0 announced again; untouched when every block was new, the
    // returned false); and the session's footprint delta.
    bool stored(const uint64_t* hashes, size_t n, bool has_parent, uint64_t parent, uint32_t owner, double ts,
                std::vector<uint8_t>& firsts) {
        bool disjoint = true;
        for (size_t i = 0; i < n && disjoint; ++i) disjoint = blocks.find(hashes[i]) == nullptr;
        int64_t fresh = 0;
        bool inserted;
        if (disjoint) {  // (as the Python: a hash twice in one store counts twice, the segment's first its parent)
            const bool segment = n >= 3;
            for (size_t i = 0; i < n; ++i) {
                Block& block = blocks.at(hashes[i], inserted);
                if (inserted || !segment) {
                    if (!inserted) release(block);
                    block = Block{parent, ts, owner, 0, has_parent};
                    ref(owner);
                }
                parent = hashes[i];
                has_parent = true;
            }
            fresh = static_cast<int64_t>(n);
        } else {
            firsts.assign(n, 1);
            for (size_t i = 0; i < n; ++i) {
                Block& block = blocks.at(hashes[i], inserted);
                if (inserted) {
                    block = Block{parent, ts, owner, 0, has_parent};
                    ref(owner);
                    ++fresh;
                } else {
                    firsts[i] = 0;
                    ++num_repeated;
                    if (!owns(block, owner)) {
                        if (block.extra == 0) block.extra = new_extra();
                        extras[block.extra - 1].push_back(owner);
                        ref(owner);
                        ++fresh;
                    }
                    block.stored_at = ts;
                }
                parent = hashes[i];
                has_parent = true;
            }
        }
        Delta& d = delta(owner);
        d.resident += fresh;
        d.stored += fresh;
        if (blocks.size() > max_blocks) forget(overflow(blocks.size(), max_blocks));
        unowned(owner);  // (a store of no block)
        return !disjoint;
    }

    // ChainTracker.removed: the block gone from the table into `out` (false: it was not resident), its owners'
    // footprints told; its further owners stay readable in `more_of(out)` until the next call.
    bool removed(uint64_t h, bool lost, Block& out) {
        if (!blocks.erase(h, &out)) {
            ++num_unknown_removed;
            return false;
        }
        for_owners(out, [&](uint32_t o) {
            Delta& d = delta(o);
            d.resident -= 1;
            d.removed += lost;
        });
        release(out);
        return true;
    }

    // Every resident chain ended at `ts`: `lost` gets (session, blocks) in the order the Python dict has them.
    void cleared(double ts, std::vector<std::pair<uint32_t, int64_t>>& lost) {
        clock->cleared(ts, blocks);
        std::unordered_map<uint32_t, size_t> at;
        lost.clear();
        blocks.each([&](uint64_t, const Block& block) {
            for_owners(block, [&](uint32_t o) {
                auto [it, fresh] = at.try_emplace(o, lost.size());
                if (fresh) lost.emplace_back(o, 0);
                lost[it->second].second += 1;
            });
        });
        blocks.clear();
        extras.clear();
        free_extras.clear();
        pending_extra_ = 0;
        for (auto [o, n] : lost) {
            Delta& d = delta(o);
            d.resident -= n;
            d.cleared += n;
            refs[o] = 0;
            if (o) freed.push_back(o);
        }
    }

    bool adopt(uint64_t h, uint32_t owner) {  // a block that named no session becomes `owner`'s
        Block* block = blocks.find(h);
        if (!block || block->owner != 0 || block->extra != 0) {
            unowned(owner);  // (a session numbered for this call alone)
            return false;
        }
        unref(0);
        block->owner = owner;
        ref(owner);
        return true;
    }

    template <class F>
    void for_owners(const Block& block, F&& f) const {
        f(block.owner);
        if (block.extra) {
            for (uint32_t o : extras[block.extra - 1]) f(o);
        }
    }

    const std::vector<uint32_t>* more_of(const Block& block) const {
        return block.extra ? &extras[block.extra - 1] : nullptr;
    }

    // The deltas of the sessions this call touched, and the session numbers no block owns any more; the binding
    // reads both and calls `settled`.
    std::vector<uint32_t> touched, freed;
    std::vector<Delta> deltas;

    void settled() {
        for (uint32_t o : touched) {
            deltas[o] = Delta{};
            marked_[o] = 0;
        }
        touched.clear();
        freed.clear();
        if (!pending_extra_) return;
        free_extras.push_back(pending_extra_);  // (a removed block's further owners, read by the binding by now)
        pending_extra_ = 0;
    }

    bool referenced(uint32_t owner) const { return owner < refs.size() && refs[owner] > 0; }

    const size_t max_blocks;
    Clock* clock;
    Ordered<Block> blocks;
    std::vector<std::vector<uint32_t>> extras;
    std::vector<uint32_t> free_extras;
    int64_t num_repeated = 0, num_unknown_removed = 0;

  private:
    Delta& delta(uint32_t owner) {
        if (owner >= deltas.size()) {
            deltas.resize(owner + 1);
            marked_.resize(owner + 1, 0);
        }
        if (!marked_[owner]) {
            marked_[owner] = 1;
            touched.push_back(owner);
        }
        return deltas[owner];
    }

    void ref(uint32_t owner) {
        if (owner >= refs.size()) refs.resize(owner + 1, 0);
        ++refs[owner];
    }

    void unowned(uint32_t owner) {  // a session no block names: its number to be handed back
        if (owner && !referenced(owner)) freed.push_back(owner);
    }

    void unref(uint32_t owner) {
        if (--refs[owner] == 0 && owner) freed.push_back(owner);
    }

    void release(const Block& block) {  // its owners hold one block fewer; its further owners' slot is given back
        for_owners(block, [&](uint32_t o) { unref(o); });
        if (block.extra) {
            if (pending_extra_) free_extras.push_back(pending_extra_);
            pending_extra_ = block.extra;
        }
    }

    bool owns(const Block& block, uint32_t owner) const {
        if (block.owner == owner) return true;
        if (block.extra == 0) return false;
        for (uint32_t o : extras[block.extra - 1]) {
            if (o == owner) return true;
        }
        return false;
    }

    uint32_t new_extra() {
        if (!free_extras.empty()) {
            const uint32_t slot = free_extras.back();
            free_extras.pop_back();
            extras[slot - 1].clear();
            return slot;
        }
        extras.emplace_back();
        return static_cast<uint32_t>(extras.size());
    }

    void forget(size_t n) {  // the oldest stored forgotten (no loss: they leave their footprints' resident count)
        blocks.drop_oldest(n, [&](uint64_t, const Block& block) {
            for_owners(block, [&](uint32_t o) { delta(o).resident -= 1; });
            for_owners(block, [&](uint32_t o) { unref(o); });
            if (block.extra) free_extras.push_back(block.extra);
        });
    }

    std::vector<int64_t> refs;
    std::vector<uint8_t> marked_;  // a session in `touched` already
    uint32_t pending_extra_ = 0;
};

}  // namespace kvobs_core
