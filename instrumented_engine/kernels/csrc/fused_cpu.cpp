// Fused elementwise layers on the CPU: RMSNorm, residual add + RMSNorm, SiLU(gate) * up, rotary embedding in
// place. Each is one pass over its rows instead of the five to twelve small torch ops of the layer it replaces
// (`kernels/fused.py` holds those, as the oracle and the fallback), and rounds where those ops round: a
// bfloat16 result is rounded to bfloat16 at each point where the torch layer stores one (round to nearest
// even, as torch does), so the same bfloat16 numbers come out up to the order of float32 sums.
#include "ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvobs {
namespace {

inline float widen(float x) { return x; }
inline float widen(at::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// x rounded to T and back to float (float: unchanged). Integer bit arithmetic, so -ffast-math leaves it alone.
inline float round_as(float x, float*) { return x; }
inline float round_as(float x, at::BFloat16*) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  bits = nan ? (bits | 0x00400000u) : bits + 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
template <typename T>
inline float rnd(float x) { return round_as(x, static_cast<T*>(nullptr)); }

inline void put(float* p, float x) { *p = x; }
inline void put(at::BFloat16* p, float x) {  // x already holds a bfloat16 value: its top half is exact
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  p->x = static_cast<uint16_t>(bits >> 16);
}

// Rows per task: small batches (a decode step) run on one thread, where waking others costs more than the work.
inline int64_t grain(int64_t width) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(width, 1)); }

// out = w * T(x * rsqrt(mean(x^2) + eps)), x as float; `sum` (optional) = T(x + add) is the normed row.
template <typename T>
void norm_rows(const T* x, const T* add, const T* w, T* sum, T* out, int64_t rows, int64_t width, int64_t xs,
               int64_t as, double eps) {
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(width);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * xs;
      float total = 0.0f;
      for (int64_t i = 0; i < width; ++i) {
        const float v = add ? rnd<T>(widen(xr[i]) + widen(add[r * as + i])) : widen(xr[i]);
        buf[i] = v;
        total += v * v;
      }
      const float inv = 1.0f / std::sqrt(total / static_cast<float>(width) + static_cast<float>(eps));
      T* o = out + r * width;
      for (int64_t i = 0; i < width; ++i) put(o + i, rnd<T>(widen(w[i]) * rnd<T>(buf[i] * inv)));
      if (sum)
        for (int64_t i = 0; i < width; ++i) put(sum + r * width + i, buf[i]);
    }
  });
}

template <typename T>
void silu_mul_rows(const T* in, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, grain(inter), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = in + r * 2 * inter;
      const T* up = gate + inter;
      T* o = out + r * inter;
      for (int64_t i = 0; i < inter; ++i) {
        const float g = widen(gate[i]);
        put(o + i, rnd<T>(rnd<T>(g / (1.0f + std::exp(-g))) * widen(up[i])));
      }
    }
  });
}

// HF's rotate_half: out = T(T(x * c) + T(rot(x) * s)), rot(x) = (-x[half:], x[:half]); c, s rounded to T first.
template <typename T>
void rotary_rows(T* x, const int64_t* positions, const float* cos_sin, int64_t tokens, int64_t heads,
                 int64_t dim, int64_t row_stride) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, grain(heads * dim), [&](int64_t begin, int64_t end) {
    std::vector<float> c(dim), s(dim), v(dim);
    for (int64_t t = begin; t < end; ++t) {
      const float* cs = cos_sin + positions[t] * 2 * dim;
      for (int64_t d = 0; d < dim; ++d) {
        c[d] = rnd<T>(cs[d]);
        s[d] = rnd<T>(cs[dim + d]);
      }
      for (int64_t h = 0; h < heads; ++h) {
        T* row = x + t * row_stride + h * dim;
        for (int64_t d = 0; d < dim; ++d) v[d] = widen(row[d]);
        for (int64_t d = 0; d < half; ++d)
          put(row + d, rnd<T>(rnd<T>(v[d] * c[d]) + rnd<T>(-v[d + half] * s[d])));
        for (int64_t d = half; d < dim; ++d)
          put(row + d, rnd<T>(rnd<T>(v[d] * c[d]) + rnd<T>(v[d - half] * s[d])));
      }
    }
  });
}

void check_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, what, " must be (rows, width) with contiguous rows");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16, what,
              " must be float32 or bfloat16, not ", x.scalar_type());
}

// f(a value of the element type): float32 or bfloat16, which check_rows has made sure of.
template <typename F>
void by_dtype(at::ScalarType type, F&& f) {
  if (type == torch::kFloat) {
    f(float{});
  } else {
    f(at::BFloat16{});
  }
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1), "weight must match x");
  weight = weight.contiguous();
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  by_dtype(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), nullptr, weight.data_ptr<scalar_t>(), nullptr,
                        out.data_ptr<scalar_t>(), x.size(0), x.size(1), x.stride(0), 0, eps);
  });
  return out;
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor add, torch::Tensor weight, double eps) {
  check_rows(x, "x");
  check_rows(add, "add");
  TORCH_CHECK(add.sizes() == x.sizes() && add.scalar_type() == x.scalar_type(), "add must match x");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1), "weight must match x");
  weight = weight.contiguous();
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  auto sum = torch::empty({x.size(0), x.size(1)}, x.options());
  by_dtype(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), add.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                        sum.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.size(0), x.size(1), x.stride(0),
                        add.stride(0), eps);
  });
  return {out, sum};
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  gate_up = gate_up.contiguous();
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up must hold gate and up halves");
  const int64_t inter = gate_up.size(1) / 2;
  auto out = torch::empty({gate_up.size(0), inter}, gate_up.options());
  by_dtype(gate_up.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), gate_up.size(0), inter);
  });
  return out;
}

void rotary_(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin, int64_t heads, int64_t head_dim) {
  check_rows(x, "x");
  TORCH_CHECK(heads * head_dim <= x.size(1) && head_dim % 2 == 0, "x must hold `heads` heads of even head_dim");
  TORCH_CHECK(cos_sin.scalar_type() == torch::kFloat && cos_sin.is_contiguous() && cos_sin.dim() == 3 &&
                  cos_sin.size(1) == 2 && cos_sin.size(2) == head_dim,
              "cos_sin must be contiguous float32 (positions, 2, head_dim)");
  positions = positions.to(torch::kLong).contiguous();
  TORCH_CHECK(positions.numel() == x.size(0), "one position per row");
  if (positions.numel()) {
    const int64_t top = positions.max().item<int64_t>(), bottom = positions.min().item<int64_t>();
    TORCH_CHECK(bottom >= 0 && top < cos_sin.size(0), "positions must lie in [0, ", cos_sin.size(0), ")");
  }
  by_dtype(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    rotary_rows<scalar_t>(x.data_ptr<scalar_t>(), positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(),
                          x.size(0), heads, head_dim, x.stride(0));
  });
}

}  // namespace kvobs
