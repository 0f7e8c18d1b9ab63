// A weight source read with a thread pool (WeightSource::read / read_codes with `pool`, as the
// loaders call them) gives the bytes it gives on one thread, for every kind of source: GGUF block
// types and a fused Phi-3 file, GPTQ and AWQ codes, safetensors, dummy weights.
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "strata/core/thread_pool.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/model/weight_source.h"
#include "strata/quant/quant.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every tensor as F32 and F16, and every matrix's codes at the specs a compressed policy asks
// for, with and without the pool. Returns how many reads were compared.
int compare_with_pool(const WeightSource& src, ThreadPool& pool) {
  int compared = 0;
  for (const std::string& name : src.names()) {
    INFO(src.describe() << ": " << name);
    const std::vector<int64_t> shape = src.shape(name);
    for (DType dt : {DType::F32, DType::F16}) {
      std::vector<uint8_t> alone(size_t(numel(shape)) * dtype_size(dt), 0xAA), pooled(alone.size(), 0x55);
      src.read(name, dt, alone.data());
      src.read(name, dt, pooled.data(), &pool);
      CHECK(alone == pooled);
      ++compared;
    }
    if (shape.size() != 2 || shape[1] % 32 != 0) continue;
    for (const quant::QuantSpec spec : {quant::QuantSpec{4, 32}, quant::QuantSpec{8, 32}, quant::QuantSpec{4, 64}}) {
      if (shape[1] % spec.group_size != 0) continue;
      std::vector<uint8_t> alone(quant::row_bytes(spec, shape[1]) * size_t(shape[0]), 0xAA), pooled(alone.size(), 0x55);
      const bool kept = src.read_codes(name, spec, alone.data());
      CHECK(src.read_codes(name, spec, pooled.data(), &pool) == kept);
      if (kept) CHECK(alone == pooled);
      ++compared;
    }
  }
  return compared;
}

fs::path fixtures() { return fs::path(STRATA_FIXTURES_DIR); }

}  // namespace

TEST_CASE("a source read with a thread pool gives the bytes it gives on one thread", "[weights][gguf][gptq][awq]") {
  ThreadPool pool(3);
  for (const fs::path& model :
       {fixtures() / "gguf" / "tiny_llama_affine.gguf", fixtures() / "gguf" / "tiny_phi3.gguf",
        fixtures() / "gguf" / "tiny_qwen2.gguf", fixtures() / "models" / "tiny-llama-gptq",
        fixtures() / "models" / "tiny-llama-gptq-actorder", fixtures() / "models" / "tiny-llama-awq",
        fixtures() / "models" / "tiny-phi3", fixtures() / "models" / "tiny-opt"}) {
    INFO(model.string());
    const ModelBundle b = open_model(model.string());
    CHECK(compare_with_pool(*b.weights, pool) > 0);
  }
  // Dummy weights: filled in slices of 2^20 values, so fc1 of OPT-125M (2.4 M) spans three.
  const std::unique_ptr<WeightSource> dummy = make_dummy_source(*config_preset("opt-125m"));
  const std::string fc1 = "model.decoder.layers.0.fc1.weight";
  std::vector<float> alone(size_t(numel(dummy->shape(fc1)))), pooled(alone.size());
  dummy->read(fc1, DType::F32, alone.data());
  dummy->read(fc1, DType::F32, pooled.data(), &pool);
  CHECK(alone == pooled);
}
