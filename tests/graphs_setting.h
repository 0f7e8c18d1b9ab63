// STRATA_CUDA_GRAPHS for a scope: the Transformer and the offloading engine read it when made.
#pragma once
#include <cstdlib>
#include <string>

namespace strata::test {

class GraphsSetting {
public:
  explicit GraphsSetting(const char* v) {
    if (const char* old = std::getenv("STRATA_CUDA_GRAPHS")) old_ = old, had_ = true;
    setenv("STRATA_CUDA_GRAPHS", v, 1);
  }
  ~GraphsSetting() {
    if (had_) setenv("STRATA_CUDA_GRAPHS", old_.c_str(), 1);
    else unsetenv("STRATA_CUDA_GRAPHS");
  }
  GraphsSetting(const GraphsSetting&) = delete;
  GraphsSetting& operator=(const GraphsSetting&) = delete;

private:
  std::string old_;
  bool had_ = false;
};

}  // namespace strata::test
