// libFuzzer entry for the hardware profile YAML reader (parse_hardware_profile). strata::Error is
// the expected way to reject input; anything else (crash, sanitizer report, YAML::Exception
// escaping) is a bug. A profile that parses must also read back from hardware_profile_to_yaml.
#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/core/error.h"
#include "strata/profile/hardware.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const strata::HardwareProfile hw =
        strata::parse_hardware_profile(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
    (void)hw.gemm_flops(1);
    (void)hw.gemm_flops(1e9);
    (void)strata::parse_hardware_profile(strata::hardware_profile_to_yaml(hw), "roundtrip.yaml");
  } catch (const strata::Error&) {
  }
  return 0;
}
