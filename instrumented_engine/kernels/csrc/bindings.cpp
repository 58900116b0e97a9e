#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &kvobs::paged_decode_attention, "paged decode attention over the cache in place");
  m.def("rms_norm", &kvobs::rms_norm, "RMSNorm of rows, rounded as the torch layer rounds");
  m.def("add_rms_norm", &kvobs::add_rms_norm, "(RMSNorm(x + add), x + add)");
  m.def("silu_mul", &kvobs::silu_mul, "SiLU(gate) * up of rows holding [gate | up]");
  m.def("rotary_", &kvobs::rotary_, "rotary embedding in place on the first `heads` heads of each row");
}
