// The C++ chain table (chain_table.hpp) bound with nanobind, taking and giving what ChainTracker + BlockClock do.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "chain_table.hpp"

namespace nb = nanobind;
using kvobs_bench::ChainTable;

class NbChainTable {
  public:
    NbChainTable() { names_.append(nb::none()); owners_.append(nb::make_tuple(nb::none())); }

    nb::tuple stored(nb::list hashes, nb::object parent, nb::object session, double ts) {
        const size_t n = nb::len(hashes);
        keys_.resize(n);
        for (size_t i = 0; i < n; ++i) keys_[i] = nb::cast<uint64_t>(hashes[i]);
        bool repeated, restored;
        table_.stored(keys_.data(), n, !parent.is_none(), parent.is_none() ? 0 : nb::cast<uint64_t>(parent),
                      owner(session), ts, firsts_, gaps_, repeated, restored);
        nb::object firsts = nb::none(), gaps = nb::none();
        if (repeated) firsts = nb::cast(firsts_);
        if (restored) {
            nb::list out;
            for (size_t i = 0; i < n; ++i) out.append(gaps_[i] < 0 ? nb::none() : nb::object(nb::float_(gaps_[i])));
            gaps = out;
        }
        return nb::make_tuple(firsts, gaps);
    }

    nb::tuple removed(nb::list hashes, bool lost, double ts) {
        const size_t n = nb::len(hashes);
        nb::list parents, owners, lifetimes;
        for (size_t i = 0; i < n; ++i) {
            auto r = table_.removed(nb::cast<uint64_t>(hashes[i]), lost, ts);
            if (!r.known) {
                parents.append(nb::none());
                owners.append(owners_[0]);
                lifetimes.append(nb::none());
                continue;
            }
            parents.append(r.has_parent ? nb::object(nb::int_(r.parent)) : nb::none());
            owners.append(r.more == nullptr ? nb::object(owners_[r.owner]) : owner_tuple(r.owner, *r.more));
            lifetimes.append(nb::float_(r.lifetime));
        }
        return nb::make_tuple(parents, owners, lifetimes);
    }

    nb::object footprint(nb::object session) {
        uint32_t id = 0;
        if (!session.is_none()) {
            if (!ids_.contains(session)) return nb::none();
            id = nb::cast<uint32_t>(ids_[session]);
        }
        auto* fp = table_.footprint_of(id);
        return fp ? nb::object(nb::make_tuple(fp->resident, fp->stored, fp->removed)) : nb::none();
    }

    size_t resident() const { return table_.resident(); }

  private:
    uint32_t owner(nb::object session) {
        if (session.is_none()) return 0;
        if (ids_.contains(session)) return nb::cast<uint32_t>(ids_[session]);
        const uint32_t id = static_cast<uint32_t>(nb::len(names_));
        ids_[session] = id;
        names_.append(session);
        owners_.append(nb::make_tuple(session));
        return id;
    }

    nb::object owner_tuple(uint32_t first, const std::vector<uint32_t>& more) {
        nb::list out;
        out.append(names_[first]);
        for (uint32_t o : more) out.append(names_[o]);
        return nb::tuple(out);
    }

    ChainTable table_;
    nb::dict ids_;
    nb::list names_, owners_;  // session number -> its id, and its one-owner tuple (made once)
    std::vector<uint64_t> keys_;
    std::vector<uint8_t> firsts_;
    std::vector<double> gaps_;
};

NB_MODULE(nanobind_chain_table, m) {
    nb::class_<NbChainTable>(m, "ChainTable")
        .def(nb::init<>())
        .def("stored", &NbChainTable::stored, nb::arg("hashes"), nb::arg("parent").none(), nb::arg("session").none(),
             nb::arg("ts"))
        .def("removed", &NbChainTable::removed)
        .def("footprint", &NbChainTable::footprint, nb::arg("session").none())
        .def("resident", &NbChainTable::resident);
}
