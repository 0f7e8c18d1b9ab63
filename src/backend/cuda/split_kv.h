// When decode attention splits each token's keys across blocks (flash-decoding), and into how many
// chunks: plain host code, no CUDA, so the backend, the tests and docs/cuda-backend.md name one rule.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

namespace strata::cuda {

constexpr int kSplitKvTileKeys = 64;     // keys per tile of the attention kernels
constexpr int kSplitKvMaxChunks = 32;    // the merge stages one weight per chunk in shared memory
constexpr int kSplitKvMinTilesPerChunk = 2;
constexpr int kSplitKvBlocksPerSm = 2;   // fewer blocks than this per SM leave SMs idle
constexpr int kSplitKvGroupHeads = 8;    // query heads of one kv head that a split block holds

// Chunks for one attention call of `tokens` queries of `heads` heads (`kv_heads` kv heads) over
// contexts of at most `max_keys` keys, on a GPU of `sm_count` SMs. 1: no split (the per-token
// kernel). The per-token kernel runs tokens x heads blocks; when that is at least
// kSplitKvBlocksPerSm per SM the GPU is full and splitting only adds the merge. Otherwise the split
// kernel runs tokens x kv_heads blocks per chunk (a block holds up to kSplitKvGroupHeads query
// heads of a kv head; more take several blocks), and the chunk count aims at kSplitKvBlocksPerSm
// blocks per SM, keeping at least kSplitKvMinTilesPerChunk tiles of keys per chunk so each
// block's loads outweigh its partial's write and merge. Chosen from this occupancy arithmetic;
// not yet timed on a GPU (docs/cuda-backend.md).
inline int split_kv_chunks(int64_t tokens, int heads, int kv_heads, int64_t max_keys, int sm_count) {
  if (tokens <= 0 || heads <= 0 || kv_heads <= 0 || sm_count <= 0) return 1;
  const int64_t target_blocks = int64_t(kSplitKvBlocksPerSm) * sm_count;
  if (tokens * heads >= target_blocks) return 1;
  const int64_t tiles = (max_keys + kSplitKvTileKeys - 1) / kSplitKvTileKeys;
  const int64_t by_length = tiles / kSplitKvMinTilesPerChunk;
  const int64_t group = heads / kv_heads;
  const int64_t blocks_per_chunk = tokens * kv_heads * ((group + kSplitKvGroupHeads - 1) / kSplitKvGroupHeads);
  const int64_t by_occupancy = (target_blocks + blocks_per_chunk - 1) / blocks_per_chunk;
  int64_t chunks = by_occupancy < by_length ? by_occupancy : by_length;
  if (chunks > kSplitKvMaxChunks) chunks = kSplitKvMaxChunks;
  return chunks >= 2 ? int(chunks) : 1;
}

// STRATA_SPLIT_KV: unset, "" or "auto": split_kv_chunks decides; "0": never split; N in
// [1, kSplitKvMaxChunks]: every attention call that the tensor-core kernel leaves goes through the
// split kernel with N chunks (1: the split kernel's shared K/V reads without a split). For tests
// and for timing the crossover on a GPU. Returns -1 for auto, else the count; false when `value`
// is none of these.
constexpr int kSplitKvAuto = -1;
inline bool parse_split_kv(const char* value, int& setting) {
  setting = kSplitKvAuto;
  if (value == nullptr || value[0] == '\0' || std::string(value) == "auto") return true;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (*end != '\0' || n < 0 || n > kSplitKvMaxChunks) return false;
  setting = int(n);
  return true;
}

}  // namespace strata::cuda
