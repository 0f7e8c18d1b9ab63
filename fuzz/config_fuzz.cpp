// libFuzzer entry for a Hugging Face config.json (its GPTQ quantization_config, and
// config_from_hf_json_text, what config_from_hf_json runs on the file's text), then what the program does next with the config:
// validate it, count its parameters, and build the RoPE frequencies. strata::Error is the expected
// way to reject input; anything else (crash, sanitizer report such as a signed overflow in the
// counts, nlohmann::json::exception escaping, gigabytes allocated) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/config.h"
#include "strata/model/packed_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {  // a GPTQ checkpoint's quantization_config, read beside the model's own fields
    if (const auto f = strata::packed_format_from_config_text(text, "fuzz-model/config.json"))
      if (f->bits != 2 && f->bits != 4 && f->bits != 8) __builtin_trap();
  } catch (const strata::Error&) {
  }
  try {
    const strata::ModelConfig c = strata::config_from_hf_json_text(text, "fuzz-model/config.json");
    c.validate();
    volatile int64_t sink = c.param_count() + c.layer_param_count();
    if (c.pos == strata::PosKind::Rope) {
      const std::vector<float> inv = strata::rope_inv_freq(c);
      // Gemma 3's sliding layers add a row of their own frequencies.
      if (inv.size() != size_t(c.head_dim / 2) * (c.local_rope_theta > 0.0f ? 2 : 1)) __builtin_trap();
      sink = sink + int64_t(inv.size());
    }
    (void)sink;
  } catch (const strata::Error&) {
  }
  return 0;
}
