#include "strata/runtime/step_graphs.h"

#include <cstdlib>
#include <cstring>
#include <iterator>

namespace strata {

bool cuda_graphs_allowed() {
  const char* v = std::getenv("STRATA_CUDA_GRAPHS");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

StepGraphs::StepGraphs(Backend& backend, bool enabled, size_t max_graphs)
    : backend_(backend), enabled_(enabled && backend.device() == Device::CUDA), max_graphs_(max_graphs) {}

// When full, the keys that never captured go first (a shape seen once, or whose capture failed:
// continuous batching's steps take many sizes); only if that frees nothing do the graphs go too.
StepGraphs::Graph& StepGraphs::entry(const Key& key) {
  if (graphs_.size() >= max_graphs_ && graphs_.find(key) == graphs_.end()) {
    for (auto it = graphs_.begin(); it != graphs_.end();) it = it->second.exec ? std::next(it) : graphs_.erase(it);
    if (graphs_.size() >= max_graphs_) graphs_.clear();
  }
  return graphs_[key];
}

Tensor StepGraphs::run(const Key& key, const std::function<Tensor()>& work) {
  if (!enabled_) return work();
  Graph& g = entry(key);
  if (!g.exec) {
    if (g.failed || ++g.seen < 2) return work();
    g.exec = backend_.capture([&] { g.out = work(); });
    if (!g.exec) {  // nothing ran: the work runs eagerly from now on
      g.failed = true;
      return work();
    }
  }
  backend_.replay(g.exec);
  ++replays_;
  return g.out;
}

}  // namespace strata
