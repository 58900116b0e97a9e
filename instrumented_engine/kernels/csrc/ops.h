// The CPU operations of kvobs' engine, bound to Python in bindings.cpp.
#pragma once
#include <torch/extension.h>

#include <vector>

namespace kvobs {
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor seq_lens, double scale);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor add, torch::Tensor weight, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
void rotary_(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin, int64_t heads, int64_t head_dim);
}  // namespace kvobs
