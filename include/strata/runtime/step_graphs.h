// Captured graphs of repeated GPU work (Backend::capture), shared by the resident Transformer (a
// whole step) and the offloading engine (a layer half of one unit). The first time a key comes,
// its work runs eagerly (capturing costs more than it saves for a shape seen once); the second
// time it is captured, and from then on replayed with one launch. docs/cuda-backend.md, "Graphs".
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/core/tensor.h"

namespace strata {

// STRATA_CUDA_GRAPHS=0 turns graphs off; anything else, or unset, leaves them on.
bool cuda_graphs_allowed();

class StepGraphs {
public:
  // Everything a capture fixes (addresses, token counts): work under one key must launch the same
  // kernels with the same arguments each time, reading what changes from the device's memory.
  using Key = std::vector<int64_t>;

  // `enabled` false, or a backend without graphs (the CPU): run() always runs the work eagerly.
  // At most `max_graphs` keys are kept.
  StepGraphs(Backend& backend, bool enabled, size_t max_graphs);

  bool enabled() const { return enabled_; }
  // Enqueues `work` on the compute stream, eagerly, captured or replayed as above. Returns what the
  // work returned (a view it wrote, the same for every run under the key), or the captured run's.
  Tensor run(const Key& key, const std::function<Tensor()>& work);
  // After the addresses the keys name are freed or moved.
  void clear() { graphs_.clear(); }
  // Runs that replayed a graph instead of launching op by op.
  int64_t replays() const { return replays_; }

  static int64_t address(const void* p) { return int64_t(reinterpret_cast<intptr_t>(p)); }

private:
  struct Graph {
    int seen = 0;
    bool failed = false;  // the capture did not work (no graphs on this backend, or an op it cannot hold)
    std::shared_ptr<void> exec;
    Tensor out;
  };
  Graph& entry(const Key& key);

  Backend& backend_;
  bool enabled_;
  size_t max_graphs_;
  std::map<Key, Graph> graphs_;
  int64_t replays_ = 0;
};

}  // namespace strata
