// Paged decode attention on the CPU, reading K and V where they lie in the paged cache (no gather copy).
//
// Caches (num_blocks, block_size, kv_heads, head_dim), float32 or bfloat16; q (B, H, D) of the same dtype;
// block_tables (B, max_blocks) int64; seq_lens (B,) int64. One task per (sequence, kv head) across the
// intra-op threads: the task's G = H / KVH query heads are scored against each of the sequence's tokens,
// block by block (each key row read once for all G, in place), then a softmax in float32 (built
// with -ffast-math, so exp and the dot products vectorise), then the values, read once, accumulated.
// Same contract as the pure-torch reference (kernels/reference.py), which tests hold this to.
#include "ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace kvobs {
namespace {

// Element i of a row as float. A bfloat16 is the top half of a float32: widening is a 16-bit shift, which the
// compiler vectorises. Each key and value row is widened once, into registers, for all G query heads.
inline float load(const float* row, int64_t i) { return row[i]; }
inline float load(const at::BFloat16* row, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[i]) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

constexpr int64_t kMaxDim = 256;

// Dim is the head dim when known at compile time (64, 128: the loops unroll and a widened row stays in
// registers), or 0 to read it from q.
template <typename T, int64_t Dim>
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = Dim ? Dim : q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), max_blocks = block_tables.size(1);
  const int64_t group = heads / kv_heads;
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const int64_t token_stride = kv_heads * dim;  // between rows of a block
  const int64_t block_stride = block_size * token_stride;
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(group * dim), acc(group * dim), scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kh = task % kv_heads;
      const int64_t len = std::min<int64_t>(lens[b], max_blocks * block_size);
      const int64_t* table = tables + b * max_blocks;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t d = 0; d < dim; ++d)
          qf[g * dim + d] = load(qp, (b * heads + kh * group + g) * dim + d) * fscale;
      scores.assign(group * len, 0.0f);
      for (int64_t start = 0; start < len; start += block_size) {  // block by block: one table lookup each
        const T* block = kp + table[start / block_size] * block_stride + kh * dim;
        const int64_t rows = std::min(block_size, len - start);
        for (int64_t r = 0; r < rows; ++r) {
          const T* k = block + r * token_stride;
          float kf[Dim ? Dim : kMaxDim];
          for (int64_t d = 0; d < dim; ++d) kf[d] = load(k, d);
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = qf.data() + g * dim;
            float s = 0.0f;
            for (int64_t d = 0; d < dim; ++d) s += qg[d] * kf[d];
            scores[g * len + start + r] = s;
          }
        }
      }
      for (int64_t g = 0; g < group; ++g) {  // softmax over the sequence's tokens
        float* sg = scores.data() + g * len;
        float top = std::numeric_limits<float>::lowest();
        for (int64_t t = 0; t < len; ++t) top = std::max(top, sg[t]);
        float total = 0.0f;
        for (int64_t t = 0; t < len; ++t) total += (sg[t] = std::exp(sg[t] - top));
        const float norm = len > 0 ? 1.0f / total : 0.0f;
        for (int64_t t = 0; t < len; ++t) sg[t] *= norm;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t start = 0; start < len; start += block_size) {
        const T* block = vp + table[start / block_size] * block_stride + kh * dim;
        const int64_t rows = std::min(block_size, len - start);
        for (int64_t r = 0; r < rows; ++r) {
          const T* v = block + r * token_stride;
          float vf[Dim ? Dim : kMaxDim];
          for (int64_t d = 0; d < dim; ++d) vf[d] = load(v, d);
          for (int64_t g = 0; g < group; ++g) {
            const float p = scores[g * len + start + r];
            float* ag = acc.data() + g * dim;
            for (int64_t d = 0; d < dim; ++d) ag[d] += p * vf[d];
          }
        }
      }
      for (int64_t g = 0; g < group; ++g)
        for (int64_t d = 0; d < dim; ++d)
          op[(b * heads + kh * group + g) * dim + d] = static_cast<T>(acc[g * dim + d]);
    }
  });
}

template <typename T, typename... Args>
void dispatch_dim(int64_t dim, Args&&... args) {
  if (dim == 64) return decode<T, 64>(std::forward<Args>(args)...);
  if (dim == 128) return decode<T, 128>(std::forward<Args>(args)...);
  decode<T, 0>(std::forward<Args>(args)...);
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "bad shapes");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of the cache's kv heads");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "head_dim of q and the cache differ");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
              "q and the caches must share a dtype");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  q = q.contiguous();
  block_tables = block_tables.to(torch::kLong).contiguous();
  seq_lens = seq_lens.to(torch::kLong).contiguous();
  auto out = torch::empty_like(q);
  TORCH_CHECK(q.size(2) <= kMaxDim, "head_dim above ", kMaxDim, " is not supported");
  const int64_t dim = q.size(2);
  if (q.scalar_type() == torch::kFloat) {
    dispatch_dim<float>(dim, q, k_cache, v_cache, block_tables, seq_lens, scale, out);
  } else if (q.scalar_type() == torch::kBFloat16) {
    dispatch_dim<at::BFloat16>(dim, q, k_cache, v_cache, block_tables, seq_lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_decode_attention takes float32 or bfloat16, not ", q.scalar_type());
  }
  return out;
}

}  // namespace kvobs
