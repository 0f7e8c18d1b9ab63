// Copies of KV cache rows between slots and caches, shared by the block generator and the
// continuous one (generator.cpp, continuous.cpp): a request's choices take its prompt's rows, a
// prompt takes a kept or a live prompt's shared beginning.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/runtime/generator.h"

namespace strata::kv_rows {

// Copies positions [0, len) of slot `src` of `from` to slot `dst` of `to`, keys and values of every
// layer: each is one contiguous run of rows in a cache seen as [slots * capacity, kv_dim].
void copy_prefix(Backend& be, const KvCache& from, int src, const KvCache& to, int dst, int len);

// The longest beginning of `prompt` a kept prefix holds, if it is long enough to share (0: none).
int kept_length(const KeptPrefixes& kept, const std::vector<int32_t>& prompt, const PrefixSharingOptions& o);

// Copies into `slot` the longest beginning of `prompt` that a kept prefix holds, if it is long
// enough to share, and makes that prefix the most recently used. Returns its length (0: none).
int copy_kept_prefix(Backend& be, KeptPrefixes* kept, const std::vector<int32_t>& prompt, const KvCache& cache,
                     int slot, const PrefixSharingOptions& o);

// Keeps positions [0, tokens.size()) of `slot` as the most recently used kept prefix (or makes an
// equal entry the most recent), dropping the least recent past the capacity. Without device
// memory for it, keeps nothing: later prompts compute their own.
void keep(Backend& be, const ModelConfig& cfg, std::vector<int32_t> tokens, const KvCache& cache, int slot,
          KeptPrefixes& kept);

}  // namespace strata::kv_rows
