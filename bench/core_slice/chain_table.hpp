// One tier's hash chains and block clock in C++, for bench/core_slice.py: the slice of the collector's attribution
// that `collectors/kv/chains.py` (ChainTracker) and `kvobs/block_clock.py` (BlockClock) do in Python, on 64-bit
// hashes, so that two ways of binding a compiled core (pybind11, Cython) are measured against each other and against
// the pure-Python path on the same events. Owners are session numbers the binding gives (0: no session).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvobs_bench {

struct Block {  // 32 bytes: one owner inline, further owners (rare) in the table's `extras_`
    uint64_t parent;
    double stored_at;
    uint32_t owner;
    uint32_t extra;  // 0: no further owner; else 1 + its index in `extras_`
    bool has_parent;
};

struct Footprint {
    int64_t resident = 0, stored = 0, removed = 0;
    bool seen = false;  // (a session number below the largest seen may be one this table never met)
};

struct Removal {  // a removed block as ChainTracker.removed and BlockClock.lost say it
    bool known;
    uint64_t parent;
    bool has_parent;
    double lifetime;
    uint32_t owner;
    const std::vector<uint32_t>* more;  // its further owners (nullptr: none), valid until the next call
};

class ChainTable {
  public:
    explicit ChainTable(double horizon_s = 3600.0) : horizon_s_(horizon_s) {}

    // ChainTracker.stored + BlockClock.came_back: `firsts` (1 new, 0 announced again) and `gaps` (time since the
    // block's loss, a restore; negative: none) filled a block each; returns whether any block was not new, and
    // whether any came back, through the two flags.
    void stored(const uint64_t* hashes, size_t n, bool has_parent, uint64_t parent, uint32_t owner, double ts,
                std::vector<uint8_t>& firsts, std::vector<double>& gaps, bool& repeated, bool& restored) {
        firsts.assign(n, 1);
        gaps.assign(n, -1.0);
        repeated = restored = false;
        int64_t fresh = 0;
        for (size_t i = 0; i < n; ++i) {
            const uint64_t h = hashes[i];
            if (!lost_at_.empty()) {
                auto lost = lost_at_.find(h);
                if (lost != lost_at_.end()) {
                    const double gap = ts - lost->second;
                    if (gap <= horizon_s_) {
                        gaps[i] = gap;
                        restored = true;
                    }
                    lost_at_.erase(lost);
                }
            }
            auto [it, inserted] = blocks_.try_emplace(h);
            Block& block = it->second;
            if (inserted) {
                block.parent = parent;
                block.has_parent = has_parent;
                block.owner = owner;
                block.extra = 0;
                ++fresh;
            } else {
                firsts[i] = 0;
                repeated = true;
                ++num_repeated;
                if (!owns(block, owner)) {
                    if (block.extra == 0) block.extra = new_extra();
                    extras_[block.extra - 1].push_back(owner);
                    ++fresh;
                }
            }
            block.stored_at = ts;
            parent = h;
            has_parent = true;
        }
        Footprint& fp = footprint(owner);
        fp.resident += fresh;
        fp.stored += fresh;
    }

    // ChainTracker.removed + BlockClock.lost for one block: its parent, owners and lifetime, or unknown.
    Removal removed(uint64_t h, bool lost, double ts) {
        auto it = blocks_.find(h);
        if (it == blocks_.end()) {
            ++num_unknown_removed;
            return Removal{false, 0, false, 0.0, 0, nullptr};
        }
        const Block block = it->second;
        blocks_.erase(it);
        footprint(block.owner).resident -= 1;
        footprint(block.owner).removed += lost;
        last_more_.clear();
        if (block.extra) {
            last_more_.swap(extras_[block.extra - 1]);
            free_extras_.push_back(block.extra);
            for (uint32_t o : last_more_) {
                Footprint& fp = footprint(o);
                fp.resident -= 1;
                fp.removed += lost;
            }
        }
        lost_at_[h] = ts;  // (a block lost again moves to the newest end: the deque's older entry is stale)
        lost_order_.emplace_back(h, ts);
        trim(ts);
        return Removal{true, block.parent, block.has_parent, ts - block.stored_at, block.owner,
                       block.extra ? &last_more_ : nullptr};
    }

    const Footprint* footprint_of(uint32_t owner) const {
        return owner < footprints_.size() && footprints_[owner].seen ? &footprints_[owner] : nullptr;
    }
    size_t resident() const { return blocks_.size(); }
    size_t lost() const { return lost_at_.size(); }

    int64_t num_repeated = 0, num_unknown_removed = 0;

  private:
    Footprint& footprint(uint32_t owner) {
        if (owner >= footprints_.size()) footprints_.resize(owner + 1);
        footprints_[owner].seen = true;
        return footprints_[owner];
    }

    bool owns(const Block& block, uint32_t owner) const {
        if (block.owner == owner) return true;
        if (block.extra == 0) return false;
        for (uint32_t o : extras_[block.extra - 1]) {
            if (o == owner) return true;
        }
        return false;
    }

    uint32_t new_extra() {
        if (!free_extras_.empty()) {
            const uint32_t slot = free_extras_.back();
            free_extras_.pop_back();
            return slot;
        }
        extras_.emplace_back();
        return static_cast<uint32_t>(extras_.size());
    }

    void trim(double ts) {  // losses older than the horizon are forgotten, oldest first
        const double oldest = ts - horizon_s_;
        while (!lost_order_.empty() && lost_order_.front().second < oldest) {
            auto [h, at] = lost_order_.front();
            lost_order_.pop_front();
            auto it = lost_at_.find(h);
            if (it != lost_at_.end() && it->second == at) lost_at_.erase(it);
        }
    }

    double horizon_s_;
    std::unordered_map<uint64_t, Block> blocks_;
    std::unordered_map<uint64_t, double> lost_at_;
    std::deque<std::pair<uint64_t, double>> lost_order_;
    std::vector<Footprint> footprints_;
    std::vector<std::vector<uint32_t>> extras_;
    std::vector<uint32_t> free_extras_, last_more_;
};

}  // namespace kvobs_bench
