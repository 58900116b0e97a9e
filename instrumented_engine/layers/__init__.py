"""The model's layers: paged-KV attention, norms, rotary, sampling (torch, Triton and C++ CPU kernels)."""
