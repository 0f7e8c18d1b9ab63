// An environment variable set for a scope: STRATA_CUDA_GRAPHS (GraphsSetting) or another the
// Transformer and the offloading engine read when made (STRATA_DEVICE_ROUTING).
#pragma once
#include <cstdlib>
#include <string>

namespace strata::test {

class EnvSetting {
public:
  EnvSetting(const char* name, const char* v) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, v, 1);
  }
  ~EnvSetting() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  EnvSetting(const EnvSetting&) = delete;
  EnvSetting& operator=(const EnvSetting&) = delete;

private:
  std::string name_, old_;
  bool had_ = false;
};

class GraphsSetting : public EnvSetting {
public:
  explicit GraphsSetting(const char* v) : EnvSetting("STRATA_CUDA_GRAPHS", v) {}
};

}  // namespace strata::test
