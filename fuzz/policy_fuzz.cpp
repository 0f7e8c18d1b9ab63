// libFuzzer entry for the policy YAML reader (parse_policy). strata::Error is the expected way to
// reject input; anything else (crash, sanitizer report, YAML::Exception escaping) is a bug. A
// policy that parses must also survive a round trip through policy_to_yaml.
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/core/error.h"
#include "strata/policy/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const strata::Policy p = strata::parse_policy(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
    const strata::Policy q = strata::parse_policy(strata::policy_to_yaml(p), "roundtrip.yaml");
    if (strata::policy_to_yaml(q) != strata::policy_to_yaml(p)) __builtin_trap();
  } catch (const strata::Error&) {
  }
  return 0;
}
