// The C++ chain table (chain_table.hpp) bound with pybind11, taking and giving what ChainTracker + BlockClock do.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "chain_table.hpp"

namespace py = pybind11;
using kvobs_bench::ChainTable;

class PyChainTable {
  public:
    PyChainTable() { names_.append(py::none()); owners_.append(py::make_tuple(py::none())); }

    py::tuple stored(const py::list& hashes, const py::object& parent, const py::object& session, double ts) {
        const size_t n = hashes.size();
        keys_.resize(n);
        for (size_t i = 0; i < n; ++i) keys_[i] = hashes[i].cast<uint64_t>();
        bool repeated, restored;
        table_.stored(keys_.data(), n, !parent.is_none(), parent.is_none() ? 0 : parent.cast<uint64_t>(),
                      owner(session), ts, firsts_, gaps_, repeated, restored);
        py::object firsts = py::none(), gaps = py::none();
        if (repeated) firsts = py::cast(firsts_);
        if (restored) {
            py::list out(n);
            for (size_t i = 0; i < n; ++i) out[i] = gaps_[i] < 0 ? py::none() : py::object(py::float_(gaps_[i]));
            gaps = out;
        }
        return py::make_tuple(firsts, gaps);
    }

    py::tuple removed(const py::list& hashes, bool lost, double ts) {
        const size_t n = hashes.size();
        py::list parents(n), owners(n), lifetimes(n);
        for (size_t i = 0; i < n; ++i) {
            auto r = table_.removed(hashes[i].cast<uint64_t>(), lost, ts);
            if (!r.known) {
                parents[i] = py::none();
                owners[i] = owners_[0];
                lifetimes[i] = py::none();
                continue;
            }
            parents[i] = r.has_parent ? py::object(py::int_(r.parent)) : py::object(py::none());
            owners[i] = r.more == nullptr ? owners_[r.owner] : owner_tuple(r.owner, *r.more);
            lifetimes[i] = py::float_(r.lifetime);
        }
        return py::make_tuple(parents, owners, lifetimes);
    }

    py::object footprint(const py::object& session) {
        if (session.is_none()) {
            auto* fp = table_.footprint_of(0);
            return fp ? py::object(py::make_tuple(fp->resident, fp->stored, fp->removed)) : py::object(py::none());
        }
        if (!ids_.contains(session)) return py::none();
        auto* fp = table_.footprint_of(ids_[session].cast<uint32_t>());
        return fp ? py::object(py::make_tuple(fp->resident, fp->stored, fp->removed)) : py::object(py::none());
    }

    size_t resident() const { return table_.resident(); }

  private:
    uint32_t owner(const py::object& session) {
        if (session.is_none()) return 0;
        if (ids_.contains(session)) return ids_[session].cast<uint32_t>();
        const uint32_t id = static_cast<uint32_t>(py::len(names_));
        ids_[session] = id;
        names_.append(session);
        owners_.append(py::make_tuple(session));
        return id;
    }

    py::tuple owner_tuple(uint32_t first, const std::vector<uint32_t>& more) {
        py::tuple out(1 + more.size());
        out[0] = names_[first];
        for (size_t i = 0; i < more.size(); ++i) out[i + 1] = names_[more[i]];
        return out;
    }

    ChainTable table_;
    py::dict ids_;
    py::list names_, owners_;  // session number -> its id, and its one-owner tuple (made once)
    std::vector<uint64_t> keys_;
    std::vector<uint8_t> firsts_;
    std::vector<double> gaps_;
};

PYBIND11_MODULE(pybind_chain_table, m) {
    py::class_<PyChainTable>(m, "ChainTable")
        .def(py::init<>())
        .def("stored", &PyChainTable::stored)
        .def("removed", &PyChainTable::removed)
        .def("footprint", &PyChainTable::footprint)
        .def("resident", &PyChainTable::resident);
}
