// GPTQ and AWQ checkpoints (include/strata/model/packed_checkpoint.h): tiny-llama-gptq,
// tiny-llama-gptq-actorder and tiny-llama-awq, quantized and saved by GPTQModel; expected values
// from transformers running the library's own dequantization
// (tests/fixtures/models/make_packed_fixtures.py), never from Strata. Their uncompressed logits
// and greedy tokens are checked with the other tiny models (test_model_hf.cpp).
#include "error_text.h"
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "engine_run.h"
#include "strata/core/error.h"
#include "strata/model/packed_checkpoint.h"
#include "strata/model/safetensors.h"
#include "safetensors_files.h"
#include "test_support.h"
#include "worst_error.h"

using namespace strata;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path model_dir(const std::string& name) { return fs::path(STRATA_FIXTURES_DIR) / "models" / name; }

json load_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return json::parse(in);
}

using test::RawTensor;

// A copy of tiny-llama-gptq in a scratch directory, its config.json and tensors edited.
fs::path edited_copy(const std::string& tag, const std::function<void(json&)>& edit_config,
                     const std::function<void(std::map<std::string, RawTensor>&)>& edit_tensors = {},
                     const std::string& fixture = "tiny-llama-gptq") {
  const fs::path src = model_dir(fixture);
  const fs::path dir = test::temp_dir("gptq_" + tag);
  json config = load_json(src / "config.json");
  edit_config(config);
  std::ofstream(dir / "config.json") << config.dump(1);
  fs::copy_file(src / "tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  std::map<std::string, RawTensor> tensors = test::read_raw_tensors(src / "model.safetensors");
  if (edit_tensors) edit_tensors(tensors);
  test::write_raw_tensors(dir / "model.safetensors", tensors);
  return dir;
}

using test::error_of;

}  // namespace

TEST_CASE("gptq: the format comes from config.json's quantization_config", "[gptq][awq]") {
  const std::optional<PackedFormat> f = read_packed_format(model_dir("tiny-llama-gptq"));
  REQUIRE(f);
  CHECK(f->bits == 4);
  CHECK(f->group_size == 64);
  CHECK(f->zero_minus_one);
  CHECK(describe_packed(*f) == "GPTQ 4-bit, group 64");
  CHECK(read_packed_format(model_dir("tiny-llama-gptq-actorder"))->group_size == 32);
  const std::optional<PackedFormat> awq = read_packed_format(model_dir("tiny-llama-awq"));
  REQUIRE(awq);
  CHECK(awq->method == PackedMethod::Awq);
  CHECK(awq->bits == 4);
  CHECK_FALSE(awq->zero_minus_one);
  CHECK(describe_packed(*awq) == "AWQ 4-bit, group 64");
  CHECK_FALSE(read_packed_format(model_dir("tiny-llama")));
  // The loader sees Hugging Face's weights: P.weight [out, in] in place of the packed tensors.
  const ModelBundle b = open_model(model_dir("tiny-llama-gptq").string());
  CHECK(b.weights->shape("model.layers.1.mlp.down_proj.weight") == std::vector<int64_t>{128, 256});
  CHECK(b.weights->contains("model.layers.0.self_attn.k_proj.weight"));
  CHECK_FALSE(b.weights->contains("model.layers.0.self_attn.k_proj.qweight"));
  for (const std::string& name : b.weights->names()) CHECK_FALSE(name.ends_with(".qzeros"));
  // The compression that keeps the codes (the search tries it under --compress): 4 bits, the
  // largest of Strata's groups dividing 64; groups of 48 keep none.
  REQUIRE(b.weights->codes_spec());
  CHECK(b.weights->codes_spec()->bits == 4);
  CHECK(b.weights->codes_spec()->group_size == 64);
  auto format = [](int bits, int group) {
    PackedFormat f;
    f.bits = bits, f.group_size = group;
    return f;
  };
  CHECK(packed_codes_spec(format(8, 256))->group_size == 128);
  CHECK(packed_codes_spec(format(8, 256))->bits == 8);
  CHECK(packed_codes_spec(format(2, 0))->bits == 4);  // one group per row: any of Strata's divides it
  CHECK_FALSE(packed_codes_spec(format(4, 48)));
  CHECK_FALSE(open_model(model_dir("tiny-llama").string()).weights->codes_spec());
}

TEST_CASE("gptq, awq: compressed, the file's codes cross the links and give transformers' results",
          "[gptq][awq][quant][offload]") {
  for (const char* name : {"tiny-llama-gptq", "tiny-llama-awq"}) {
    SECTION(name) {
      const json exp = load_json(model_dir(name) / "expected.json");
      const ModelBundle model = open_model(model_dir(name).string());
      // 4-bit codes fit 4- and 8-bit rows; groups of 32 or 64 lie inside the file's groups of 64,
      // whose scale and minimum they repeat. So every spec computes the same values: the file's
      // codes with each group's fp16 scale s and fp16 minimum fp16(-s * z), which the fixture's
      // "codes" values are transformers' results for (matched to fp32 summation order, as the
      // GGUF codes test).
      for (const auto& [bits, group] : {std::pair{4, 64}, {4, 32}, {8, 64}, {8, 32}}) {
        INFO(bits << "-bit, group " << group);
        const test::EngineRun run = test::run_engine(model, exp, test::compressed_weights_policy(bits, group));
        CHECK(run.report.weights_kept_codes == 14);
        CHECK(run.report.weights_quantized == 0);
        REQUIRE(run.results.size() == exp["prompts"].size());
        double worst = 0, worst_exact = 0;
        for (size_t p = 0; p < run.results.size(); ++p) {
          INFO("prompt " << p);
          const double err = test::max_nll_error(test::prompt_nlls(run.results[p]), exp["codes"]["prompt_nll"][p]);
          CHECK(err < 5e-5);
          CHECK(run.results[p].tokens == exp["codes"]["greedy"][p].get<std::vector<int32_t>>());
          worst = std::max(worst, err);
          worst_exact = std::max(worst_exact, test::max_nll_error(test::prompt_nlls(run.results[p]), exp["prompt_nll"][p]));
        }
        // The fp16 minimum moves a group's weights by up to half an fp16 ulp of s * z, which
        // moves the NLLs from the exact dequantization's by far more (observed 8e-3 for GPTQ)
        // than from the values with that rounding: those are what Strata computes.
        INFO("max |NLL difference| " << worst << ", " << worst_exact << " from the exact dequantization");
        CHECK(worst * 10 < worst_exact);
      }
    }
  }
}

TEST_CASE("gptq: codes that do not fit the spec are dequantized, then quantized at load", "[gptq][quant][offload]") {
  const json exp = load_json(model_dir("tiny-llama-gptq") / "expected.json");
  const ModelBundle model = open_model(model_dir("tiny-llama-gptq").string());
  // A group of 128 would join two of the file's groups of 64, which have their own scales.
  const test::EngineRun wide = test::run_engine(model, exp, test::compressed_weights_policy(4, 128));
  CHECK(wide.report.weights_kept_codes == 0);
  CHECK(wide.report.weights_quantized == 14);
  // desc_act: input i is in group g_idx[i], not i / 32, so no row of Strata's holds its groups.
  const json exp_act = load_json(model_dir("tiny-llama-gptq-actorder") / "expected.json");
  const ModelBundle act = open_model(model_dir("tiny-llama-gptq-actorder").string());
  const test::EngineRun permuted = test::run_engine(act, exp_act, test::compressed_weights_policy(4, 32));
  CHECK(permuted.report.weights_kept_codes == 0);
  CHECK(permuted.report.weights_quantized == 14);
  // Uncompressed through the engine, the permuted groups give transformers' NLLs.
  const test::EngineRun plain = test::run_engine(act, exp_act, test::policy_of(2, 2, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}));
  for (size_t p = 0; p < plain.results.size(); ++p) {
    INFO("prompt " << p);
    CHECK(test::max_nll_error(test::prompt_nlls(plain.results[p]), exp_act["prompt_nll"][p]) < 5e-5);
    CHECK(plain.results[p].tokens == exp_act["greedy"][p].get<std::vector<int32_t>>());
  }
}

TEST_CASE("gptq: an older checkpoint's quantize_config.json gives the format when config.json has none", "[gptq]") {
  const fs::path dir = edited_copy("legacy", [](json& c) { c.erase("quantization_config"); });
  // AutoGPTQ's file: no quant_method, no checkpoint_format (zeros stored minus one).
  std::ofstream(dir / "quantize_config.json") << R"({"bits": 4, "group_size": 64, "damp_percent": 0.01,
      "desc_act": false, "static_groups": false, "sym": false, "true_sequential": true})";
  const std::optional<PackedFormat> f = read_packed_format(dir);
  REQUIRE(f);
  CHECK(f->source == (dir / "quantize_config.json").string());
  const ModelBundle b = open_model(dir.string());
  test::check_hf_outputs(b, load_json(model_dir("tiny-llama-gptq") / "expected.json"));
}

TEST_CASE("awq: an older AutoAWQ checkpoint's quant_config.json gives the format when config.json has none", "[awq]") {
  auto awq_copy = [](const std::string& tag, const std::string& quant_config) {
    const fs::path dir = edited_copy(tag, [](json& c) { c.erase("quantization_config"); }, {}, "tiny-llama-awq");
    std::ofstream(dir / "quant_config.json") << quant_config;
    return dir;
  };
  // AutoAWQ's keys (w_bit, q_group_size), its upper-case version.
  const fs::path dir = awq_copy("awq_legacy", R"({"zero_point": true, "q_group_size": 64, "w_bit": 4, "version": "GEMM"})");
  const std::optional<PackedFormat> f = read_packed_format(dir);
  REQUIRE(f);
  CHECK(f->method == PackedMethod::Awq);
  CHECK(f->bits == 4);
  CHECK(f->group_size == 64);
  CHECK_FALSE(f->zero_minus_one);
  CHECK(f->source == (dir / "quant_config.json").string());
  const ModelBundle b = open_model(dir.string());
  test::check_hf_outputs(b, load_json(model_dir("tiny-llama-awq") / "expected.json"));

  // Its errors name the file and AutoAWQ's own keys.
  const std::pair<const char*, const char*> bad[] = {
      {R"({"zero_point": true, "q_group_size": 64, "w_bit": 3, "version": "GEMM"})", "quant_config.json.w_bit is 3"},
      {R"({"zero_point": true, "w_bit": 4, "version": "GEMM"})", "quant_config.json.q_group_size is missing"},
      {R"({"zero_point": true, "q_group_size": 64, "w_bit": 4, "version": "GEMV"})", "quant_config.json.version is 'GEMV'"},
      {R"({"zero_point": false, "q_group_size": 64, "w_bit": 4, "version": "GEMM"})", "quant_config.json.zero_point is false"},
      {R"([4, 64])", "quant_config.json: not a JSON object"},
  };
  int n = 0;
  for (const auto& [text, message] : bad) {
    INFO(text);
    const fs::path d = awq_copy("awq_legacy_bad" + std::to_string(n++), text);
    CHECK_THAT(error_of([&] { open_model(d.string()); }), Catch::Contains(message));
  }
}

TEST_CASE("gptq: packed codes without a quantization config are refused as such", "[gptq]") {
  const fs::path dir = edited_copy("unmarked", [](json& c) { c.erase("quantization_config"); });
  CHECK_THAT(error_of([&] { open_model(dir.string()); }),
             Catch::Contains("holds packed quantized codes, but config.json has no quantization_config") &&
                 Catch::Contains(".qweight"));
}

TEST_CASE("gptq: checkpoint_format gptq_v2 stores the zero itself, not the zero minus one", "[gptq]") {
  // The fixture is format "gptq"; read as gptq_v2 every zero is one lower, which moves the logits.
  const fs::path dir = edited_copy("v2", [](json& c) { c["quantization_config"]["checkpoint_format"] = "gptq_v2"; });
  const std::optional<PackedFormat> f = read_packed_format(dir);
  REQUIRE(f);
  CHECK_FALSE(f->zero_minus_one);
  const json exp = load_json(model_dir("tiny-llama-gptq") / "expected.json");
  const ModelBundle b = open_model(dir.string());
  auto backend = make_cpu_backend(2);
  Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
  const std::vector<float> got = test::last_logits(model, exp["prompts"][4].get<std::vector<int32_t>>());
  const std::vector<float> want = exp["last_logits"][4].get<std::vector<float>>();
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = test::worst_of(worst, std::fabs(got[i] - want[i]));
  CHECK(worst > 0.1f);
}

TEST_CASE("gptq, awq: unsupported quantization configs are refused naming the file and field", "[gptq][awq]") {
  const std::pair<std::function<void(json&)>, std::string> cases[] = {
      {[](json& c) { c["quantization_config"]["quant_method"] = "bitsandbytes"; },
       "config.json: quantization_config.quant_method is 'bitsandbytes'"},
      {[](json& c) { c["quantization_config"]["quant_method"] = 4; }, "quantization_config.quant_method is not a string"},
      {[](json& c) { c["quantization_config"]["bits"] = 3; }, "quantization_config.bits is 3"},
      {[](json& c) { c["quantization_config"].erase("bits"); }, "quantization_config.bits is missing"},
      {[](json& c) { c["quantization_config"]["group_size"] = 0; }, "quantization_config.group_size is 0"},
      {[](json& c) { c["quantization_config"]["checkpoint_format"] = "marlin"; },
       "quantization_config.checkpoint_format is 'marlin'"},
      {[](json& c) { c["quantization_config"]["dynamic"] = {{"-:.*down_proj", json::object()}}; },
       "quantization_config.dynamic"},
      {[](json& c) { c["quantization_config"] = "gptq"; }, "quantization_config is not an object"},
      {[](json& c) { c["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 64}, {"version", "gemv"}}; },
       "quantization_config.version is 'gemv'"},
      {[](json& c) { c["quantization_config"] = {{"quant_method", "awq"}, {"bits", 8}, {"group_size", 64}}; },
       "quantization_config.bits is 8: AWQ checkpoints of 4 bits"},
      {[](json& c) { c["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", -1}}; },
       "quantization_config.group_size is -1"},
  };
  int n = 0;
  for (const auto& [edit, message] : cases) {
    const fs::path dir = edited_copy("config" + std::to_string(n++), edit);
    INFO(message);
    CHECK_THAT(error_of([&] { open_model(dir.string()); }), Catch::Contains(message) && Catch::Contains(dir.string()));
  }
}

TEST_CASE("gptq: a packed linear whose tensors disagree is refused naming the tensor", "[gptq]") {
  const std::string q = "model.layers.0.self_attn.q_proj";
  using Tensors = std::map<std::string, RawTensor>;
  const std::pair<std::function<void(Tensors&)>, std::string> cases[] = {
      {[&](Tensors& t) { t.erase(q + ".qzeros"); }, "has no '" + q + ".qzeros' beside it"},
      {[&](Tensors& t) { t.erase(q + ".qweight"); }, "tensor '" + q + ".g_idx' has no '" + q + ".qweight' beside it"},
      {[&](Tensors& t) { t[q + ".scales"].shape = {1, 256}; t[q + ".scales"].bytes.resize(512); },
       "tensor '" + q + ".scales' has shape [1, 256]; its columns must be the outputs"},
      {[&](Tensors& t) { t[q + ".qweight"].dtype = "F32"; }, "tensor '" + q + ".qweight' has dtype F32, not I32"},
      {[&](Tensors& t) { t[q + ".weight"] = {"F16", {128, 128}, std::string(128 * 128 * 2, '\0')}; },
       "tensor '" + q + ".weight' is stored beside the packed"},
  };
  int n = 0;
  for (const auto& [edit, message] : cases) {
    const fs::path dir = edited_copy("tensors" + std::to_string(n++), [](json&) {}, edit);
    INFO(message);
    CHECK_THAT(error_of([&] { open_model(dir.string()); }), Catch::Contains(message));
  }
  // A group index beyond the groups is found when the matrix is read.
  const fs::path dir = edited_copy("g_idx", [](json&) {}, [&](Tensors& t) {
    const int32_t bad = 7;
    std::memcpy(t[q + ".g_idx"].bytes.data() + 4 * 5, &bad, 4);
  });
  const ModelBundle b = open_model(dir.string());
  std::vector<float> w(128 * 128);
  CHECK_THAT(error_of([&] { b.weights->read(q + ".weight", DType::F32, w.data()); }),
             Catch::Contains("tensor '" + q + ".g_idx': input 5 is in group 7 of 2"));
}

TEST_CASE("CUDA: GPTQ and AWQ codes cross the links and give transformers' NLLs within fp16 tolerance",
          "[gptq][awq][quant][offload][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  for (const char* name : {"tiny-llama-gptq", "tiny-llama-awq"}) {
    SECTION(name) {
      const json exp = load_json(model_dir(name) / "expected.json");
      const ModelBundle model = open_model(model_dir(name).string());
      auto backend = make_cuda_backend(0);
      // fp16 activations: the bound of the GGUF codes CUDA test (test_gguf_codes.cpp).
      const test::EngineRun run = test::run_engine(model, exp, test::compressed_weights_policy(4, 64), *backend);
      CHECK(run.report.weights_kept_codes == 14);
      for (size_t p = 0; p < run.results.size(); ++p) {
        INFO("prompt " << p);
        CHECK(test::max_nll_error(test::prompt_nlls(run.results[p]), exp["codes"]["prompt_nll"][p]) < 5e-2);
      }
    }
  }
}
