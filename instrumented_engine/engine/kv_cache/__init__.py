"""The KV cache's bookkeeping: the block pool (`pool`), and the block manager (`manager`), session lifecycle
(`sessions`) and invalidation (`invalidation`) built on it; blocks, hashes, the free queue and eviction policies.
No tensors: the engine and the what-if simulator run the same code."""
