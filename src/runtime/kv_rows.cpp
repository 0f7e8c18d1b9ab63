#include "kv_rows.h"

#include <algorithm>

#include "strata/core/error.h"

namespace strata::kv_rows {

void copy_prefix(Backend& be, const KvCache& from, int src, const KvCache& to, int dst, int len) {
  const size_t row_bytes = from.k[0].nbytes() / (size_t(from.slots) * size_t(from.capacity));
  for (size_t l = 0; l < from.k.size(); ++l)
    for (const auto& [f, t] : {std::pair{&from.k[l], &to.k[l]}, std::pair{&from.v[l], &to.v[l]}})
      be.copy_on_device(static_cast<char*>(t->data) + size_t(dst) * size_t(to.capacity) * row_bytes,
                        static_cast<char*>(f->data) + size_t(src) * size_t(from.capacity) * row_bytes,
                        size_t(len) * row_bytes);
}

int kept_length(const KeptPrefixes& kept, const std::vector<int32_t>& prompt, const PrefixSharingOptions& o) {
  int best = 0;
  for (const KeptPrefixes::Entry& e : kept.entries) best = std::max(best, shareable_length(e.tokens, prompt, o));
  return best;
}

int copy_kept_prefix(Backend& be, KeptPrefixes* kept, const std::vector<int32_t>& prompt, const KvCache& cache,
                     int slot, const PrefixSharingOptions& o) {
  if (!kept) return 0;
  int best = 0;
  size_t at = 0;
  for (size_t e = 0; e < kept->entries.size(); ++e)
    if (const int n = shareable_length(kept->entries[e].tokens, prompt, o); n > best) best = n, at = e;
  if (best == 0) return 0;
  copy_prefix(be, kept->entries[at].rows, 0, cache, slot, best);
  std::rotate(kept->entries.begin(), kept->entries.begin() + long(at), kept->entries.begin() + long(at) + 1);
  return best;
}

void keep(Backend& be, const ModelConfig& cfg, std::vector<int32_t> tokens, const KvCache& cache, int slot,
          KeptPrefixes& kept) {
  auto& entries = kept.entries;
  const auto same = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.tokens == tokens; });
  if (same != entries.end()) {
    std::rotate(entries.begin(), same, same + 1);
    return;
  }
  KeptPrefixes::Entry next;
  try {
    next.rows = make_kv_cache(cfg, be, 1, int(tokens.size()));
  } catch (const Error&) {
    return;
  }
  copy_prefix(be, cache, slot, next.rows, 0, int(tokens.size()));
  next.tokens = std::move(tokens);
  entries.insert(entries.begin(), std::move(next));
  entries.resize(std::min(entries.size(), std::max<size_t>(kept.capacity, 1)));
}

}  // namespace strata::kv_rows
