// GPT-OSS: its config.json (transformers 5's keys and the Hub's), the experts as the weight source
// shows them (fused floats or MXFP4, per expert), refusals naming the field or tensor, the
// presets' sizes, every offloading policy, experts computed on the CPU included, and the same
// model as llama.cpp's converter writes it (GGUF, MXFP4 experts). Parity with
// transformers itself: test_model_hf.cpp (tiny-gpt-oss, tiny-gpt-oss-mxfp4); the sink logits and
// the clamped SwiGLU against float64: test_cpu_attention_f16.cpp, test_cpu_quant_ops.cpp,
// test_layer_fusion.cpp and the emulated CUDA kernel tests.
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/model/weight_source.h"
#include "strata/offload/engine.h"
#include "strata/policy/placement.h"
#include "strata/quant/quant.h"
#include "strata/runtime/forward_ops.h"
#include "strata/runtime/generator.h"
#include "strata/runtime/model_weights.h"
#include "edited_model.h"
#include "engine_run.h"
#include "offload_grid.h"
#include "test_support.h"

using namespace strata;
using namespace strata::test;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";
const std::string kGguf = std::string(STRATA_FIXTURES_DIR) + "/gguf/";

void refused(const std::string& model, const std::function<void(json&)>& edit, const std::string& says) {
  const fs::path dir = edited_model(model, edit, "gpt-oss");
  INFO(says);
  CHECK_THROWS_WITH(config_from_hf_json(dir / "config.json"), Contains(says) && Contains("config.json"));
}

// The model at `dir` loaded on the CPU; throws what loading throws.
void load(const fs::path& dir) {
  auto backend = make_cpu_backend(1);
  ModelBundle b = open_model(dir.string());
  load_model_weights(b.config, *b.weights, *backend);
}

// model.safetensors of `dir` rewritten without the tensor `drop` (its bytes left in place).
void drop_tensor(const fs::path& dir, const std::string& drop) {
  const fs::path file = dir / "model.safetensors";
  std::ifstream in(file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(std::string(bytes.data() + 8, n));
  REQUIRE(header.erase(drop) == 1);
  std::string text = header.dump();
  text.resize(n, ' ');  // the same length, so the data area stays where it was
  std::memcpy(bytes.data() + 8, text.data(), n);
  std::ofstream(file, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// `name`'s 8-bit codes of group 32 decode to what read() gives, bit for bit (MXFP4 rows are such
// codes exactly); returns the codes.
std::vector<uint8_t> check_codes_are_values(const WeightSource& w, const std::string& name) {
  const std::vector<int64_t> shape = w.shape(name);
  const int64_t rows = shape[0], cols = shape[1];
  std::vector<float> values(size_t(rows * cols)), decoded(size_t(rows * cols), std::nanf(""));
  w.read(name, DType::F32, values.data());
  const quant::QuantSpec spec{8, 32};
  std::vector<uint8_t> codes(quant::row_bytes(spec, cols) * size_t(rows));
  REQUIRE(w.read_codes(name, spec, codes.data()));
  quant::dequantize_rows(spec, codes.data(), rows, cols, decoded.data(), DType::F32);
  CHECK(decoded == values);
  return codes;
}

// The tiny MXFP4 model through the engine at {8 bits, group 32}: every expert matrix keeps the
// file's values (3 layers x 6 experts x gate, up, down) and the attention's q, k, v and o are
// quantized at load, so the tokens are transformers' with just those four matrices a layer
// quantized (make_quant.py's round trip: the fixture's "compressed_8_32").
void check_compressed_8_32(ModelBundle& b, const json& exp) {
  const test::EngineRun run = test::run_engine(b, exp, test::compressed_weights_policy(8, 32));
  CHECK(run.report.weights_kept_codes == 3 * 6 * 3);
  CHECK(run.report.weights_quantized == 3 * 4);
  const json& want = exp["compressed_8_32"]["greedy"];
  REQUIRE(run.results.size() == want.size());
  for (size_t i = 0; i < run.results.size(); ++i) {
    INFO("prompt " << i);
    CHECK(run.results[i].tokens == want[i].get<std::vector<int32_t>>());
  }
}

}  // namespace

TEST_CASE("gpt-oss: config.json maps onto ModelConfig", "[gpt_oss][config]") {
  const ModelConfig c = config_from_hf_json(kModels + "tiny-gpt-oss/config.json");
  CHECK(c.mlp == MlpKind::ClampedSwiGLU);
  CHECK(c.glu_limit == 1.5f);
  CHECK(c.glu_alpha == 1.702f);
  CHECK(c.attn_sinks);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  CHECK(c.router_bias);
  CHECK(c.expert_bias);
  CHECK_FALSE(c.tied_embeddings);
  CHECK(c.moe_naming == MoeNaming::GptOss);
  CHECK(c.n_experts == 6);
  CHECK(c.experts_per_token == 2);
  CHECK(c.expert_intermediate == 32);
  CHECK(c.norm_topk_prob);  // softmax over the top k logits
  CHECK(c.dense_layers.empty());
  CHECK(c.layer_window == 8);
  CHECK(c.window_layers == std::vector<int>{0, 2});
  CHECK(c.norm_eps == 1e-5f);
  CHECK(c.rope_theta == 150000.0f);
  // YaRN, factor 4 over 256 positions, truncate false: the frequencies transformers computed.
  const json exp = json::parse(std::ifstream(kModels + "tiny-gpt-oss/expected.json"));
  const std::vector<float> want = exp["rope_inv_freq"].get<std::vector<float>>(), got = rope_inv_freq(c);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
  CHECK(c.rope_attention_factor == Approx(exp["rope_attention_factor"].get<double>()).epsilon(1e-6));
  CHECK(c.max_positions == 1024);
  CHECK(c.eos_ids == std::vector<int>{2});
  CHECK(c.bos_id == -1);

  // The layer's attention: its window and its row of the sinks table.
  std::vector<float> table(size_t(3 * 4));
  for (size_t i = 0; i < table.size(); ++i) table[i] = float(i);
  const Tensor sinks(table.data(), DType::F32, Device::CPU, {3, 4});
  const LayerAttention a0 = layer_attention(c, Tensor(), sinks, 0), a1 = layer_attention(c, Tensor(), sinks, 1);
  CHECK(a0.spec.window == 8);
  CHECK(a1.spec.window == 0);
  CHECK(a1.spec.sinks == table.data() + 4);
  CHECK_THROWS_WITH(layer_attention(c, Tensor(), Tensor(), 1), Contains("attention sinks"));
}

TEST_CASE("gpt-oss: a config.json in the Hub's keys runs as transformers 5's", "[gpt_oss][config]") {
  // As openai/gpt-oss-20b's file: rope_theta and rope_scaling, no rope_parameters and no
  // layer_types (the even layers slide). Transformers' greedy tokens must follow.
  const fs::path dir = edited_model("tiny-gpt-oss", [](json& c) {
    c.erase("rope_parameters");
    c.erase("layer_types");
  }, "gpt-oss");
  const ModelConfig hub = config_from_hf_json(dir / "config.json");
  const ModelConfig v5 = config_from_hf_json(kModels + "tiny-gpt-oss/config.json");
  CHECK(hub.window_layers == v5.window_layers);
  CHECK(rope_inv_freq(hub) == rope_inv_freq(v5));
  CHECK(hub.rope_attention_factor == v5.rope_attention_factor);
  auto backend = make_cpu_backend(2);
  ModelBundle b = open_model(dir.string());
  Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
  check_hf_greedy(model, load_expected("tiny-gpt-oss"));
}

TEST_CASE("gpt-oss: a config.json it cannot serve is refused naming the field", "[gpt_oss][config]") {
  refused("tiny-gpt-oss", [](json& c) { c["swiglu_limit"] = 0; }, "swiglu_limit 0");
  refused("tiny-gpt-oss", [](json& c) { c["num_experts_per_tok"] = 7; }, "num_experts_per_tok 7");
  refused("tiny-gpt-oss", [](json& c) { c.erase("num_local_experts"); }, "num_local_experts");
  refused("tiny-gpt-oss", [](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act 'gelu'");
  refused("tiny-gpt-oss", [](json& c) { c["layer_types"][1] = "chunked_attention"; }, "layer_types[1]");
  refused("tiny-gpt-oss", [](json& c) { c["sliding_window"] = 0; }, "sliding_window 0");
  refused("tiny-gpt-oss", [](json& c) { c["rope_parameters"]["rope_type"] = "llama3"; }, "'llama3'");
  // MXFP4 is GPT-OSS's: another model's quantization_config naming it is refused.
  const fs::path llama = edited_model("tiny-llama", [](json& c) {
    c["quantization_config"] = {{"quant_method", "mxfp4"}};
  }, "gpt-oss");
  CHECK_THROWS_WITH(open_model(llama.string()), Contains("quant_method") && Contains("mxfp4"));
}

TEST_CASE("gpt-oss: fused and MXFP4 experts of the wrong shape, or half stored, fail naming the tensor",
          "[gpt_oss][model]") {
  // A wider expert than the checkpoint's: the fused tensor and the MXFP4 blocks give it away.
  const auto wider = [](json& c) { c["intermediate_size"] = 64; };
  CHECK_THROWS_WITH(load(edited_model("tiny-gpt-oss", wider, "gpt-oss")),
                    Contains("model.layers.0.mlp.experts.gate_up_proj'") && Contains("[6, 64, 64]") &&
                        Contains("[6, 64, 128]"));
  CHECK_THROWS_WITH(load(edited_model("tiny-gpt-oss-mxfp4", wider, "gpt-oss")),
                    Contains("model.layers.0.mlp.experts.gate_up_proj_blocks") && Contains("[6, 128, 2, 16]"));
  // Blocks without their scales.
  const fs::path half = edited_model("tiny-gpt-oss-mxfp4", [](json&) {}, "gpt-oss");
  drop_tensor(half, "model.layers.1.mlp.experts.down_proj_scales");
  CHECK_THROWS_WITH(load(half), Contains("model.layers.1.mlp.experts.down_proj_blocks") && Contains("down_proj") &&
                                    Contains("_scales"));
  // A fused tensor is read through its experts, never by its own name.
  ModelBundle b = open_model(kModels + "tiny-gpt-oss");
  CHECK_FALSE(b.weights->contains("model.layers.0.mlp.experts.gate_up_proj"));
  CHECK(b.weights->contains("model.layers.0.mlp.experts.5.up_proj.bias"));
  CHECK(b.weights->shape("model.layers.2.mlp.experts.3.down_proj.weight") == std::vector<int64_t>{64, 32});
}

TEST_CASE("gpt-oss: an expert's tensors are the fused tensor's interleaved columns and bias entries",
          "[gpt_oss][model]") {
  // Against the stored bytes as transformers lays them out: gate_up_proj [E, h, 2f] with gate at
  // even columns, up at odd ones; down_proj [E, f, h]; biases [E, 2f] and [E, h].
  ModelBundle b = open_model(kModels + "tiny-gpt-oss");
  const std::unique_ptr<WeightSource> raw = make_safetensors_source(kModels + "tiny-gpt-oss");
  auto read = [](const WeightSource& s, const std::string& name) {
    int64_t n = 1;
    for (int64_t d : s.shape(name)) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    s.read(name, DType::F32, v.data());
    return v;
  };
  const std::string l = "model.layers.1.mlp.experts.";
  const std::vector<float> gate_up = read(*raw, l + "gate_up_proj"), down = read(*raw, l + "down_proj");
  const std::vector<float> gate_up_b = read(*raw, l + "gate_up_proj_bias");
  const std::vector<float> down_b = read(*raw, l + "down_proj_bias");
  const int64_t h = 64, f = 32, e = 4;
  const std::vector<float> gate = read(*b.weights, l + "4.gate_proj.weight");
  const std::vector<float> up = read(*b.weights, l + "4.up_proj.weight");
  const std::vector<float> dw = read(*b.weights, l + "4.down_proj.weight");
  for (int64_t i = 0; i < f; ++i)
    for (int64_t j = 0; j < h; ++j) {
      CHECK(gate[size_t(i * h + j)] == gate_up[size_t((e * h + j) * 2 * f + 2 * i)]);
      CHECK(up[size_t(i * h + j)] == gate_up[size_t((e * h + j) * 2 * f + 2 * i + 1)]);
      CHECK(dw[size_t(j * f + i)] == down[size_t((e * f + i) * h + j)]);
    }
  const std::vector<float> gb = read(*b.weights, l + "4.gate_proj.bias");
  const std::vector<float> ub = read(*b.weights, l + "4.up_proj.bias");
  const std::vector<float> db = read(*b.weights, l + "4.down_proj.bias");
  for (int64_t i = 0; i < f; ++i) {
    CHECK(gb[size_t(i)] == gate_up_b[size_t(e * 2 * f + 2 * i)]);
    CHECK(ub[size_t(i)] == gate_up_b[size_t(e * 2 * f + 2 * i + 1)]);
  }
  for (int64_t j = 0; j < h; ++j) CHECK(db[size_t(j)] == down_b[size_t(e * h + j)]);
}

TEST_CASE("gpt-oss: MXFP4 experts are Strata's 8-bit rows of group 32 exactly, and cross the links as such",
          "[gpt_oss][quant][offload]") {
  ModelBundle b = open_model(kModels + "tiny-gpt-oss-mxfp4");
  const std::string l = "model.layers.2.mlp.experts.";
  for (const std::string name : {l + "3.gate_proj.weight", l + "3.up_proj.weight", l + "0.down_proj.weight"}) {
    INFO(name);
    std::vector<uint8_t> codes = check_codes_are_values(*b.weights, name);
    // No other spec holds them exactly: the loader quantizes what read() gives.
    for (const quant::QuantSpec other : {quant::QuantSpec{4, 32}, quant::QuantSpec{8, 64}})
      CHECK_FALSE(b.weights->read_codes(name, other, codes.data()));
  }
  // Biases, attention weights and float experts have no codes.
  CHECK_FALSE(b.weights->read_codes(l + "3.gate_proj.bias", {8, 32}, std::vector<uint8_t>(4096).data()));
  ModelBundle floats = open_model(kModels + "tiny-gpt-oss");
  std::vector<uint8_t> scratch(quant::row_bytes({8, 32}, 64) * 32);
  CHECK_FALSE(floats.weights->read_codes(l + "3.gate_proj.weight", {8, 32}, scratch.data()));
  // What the search tries under --compress, and the job's note.
  REQUIRE(b.weights->codes_spec());
  CHECK(b.weights->codes_spec()->bits == 8);
  CHECK(b.weights->codes_spec()->group_size == 32);
  CHECK_FALSE(floats.weights->codes_spec());
  CHECK_THAT(b.load_note, Contains("{bits: 8, group_size: 32}"));
  CHECK(floats.load_note.empty());

  // Through the engine at {8, 32} (the fixture's smallest top-2 gap there is 0.01).
  check_compressed_8_32(b, load_expected("tiny-gpt-oss-mxfp4"));
}

// GPT-OSS as llama.cpp's converter writes the Hub's MXFP4 checkpoints (tests/fixtures/gguf/
// make_gpt_oss_gguf.py): expected values are transformers' on the directory the file came from
// (transformers parity: test_model_hf.cpp's "gguf/tiny_gpt_oss"); llama.cpp running the file is
// checked by the script.
TEST_CASE("gpt-oss: a GGUF file reads as its directory would: fields, windows, unrounded YaRN, experts as codes",
          "[gpt_oss][gguf]") {
  const json exp = json::parse(std::ifstream(kGguf + "tiny_gpt_oss_expected.json"));
  ModelBundle b = open_model(kGguf + "tiny_gpt_oss.gguf");
  const ModelConfig& c = b.config;
  // llama.cpp's constants, which the file does not hold (GptOssConfig's defaults).
  CHECK(c.mlp == MlpKind::ClampedSwiGLU);
  CHECK(c.glu_limit == 7.0f);
  CHECK(c.glu_alpha == 1.702f);
  CHECK(c.norm_topk_prob);
  CHECK((c.attn_sinks && c.router_bias && c.expert_bias && c.qkv_bias && c.o_bias));
  CHECK(c.moe_naming == MoeNaming::GptOss);
  CHECK(c.n_experts == 6);
  CHECK(c.experts_per_token == 2);
  CHECK(c.expert_intermediate == 32);
  CHECK(c.dense_layers.empty());
  CHECK(c.window_layers == std::vector<int>{0, 2});  // the even layers, as llama.cpp fixes them
  CHECK(c.layer_window == 8);
  CHECK(c.sliding_window == 0);  // the window is the sliding layers', not the context's
  CHECK(c.max_positions == 1024);
  CHECK(c.head_dim == 16);
  CHECK(c.norm_eps == 1e-5f);
  CHECK_FALSE(c.tied_embeddings);
  CHECK(c.bos_id == -1);
  CHECK(c.eos_ids == std::vector<int>{2});
  CHECK(c.checkpoint_dtype == DType::BF16);
  // YaRN with its ramp's ends unrounded (truncate false), as transformers runs the directory.
  const std::vector<float> want = exp["rope_inv_freq"].get<std::vector<float>>(), got = rope_inv_freq(c);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
  CHECK(c.rope_attention_factor == Approx(exp["rope_attention_factor"].get<double>()).epsilon(1e-6));

  const std::string l = "model.layers.2.mlp.experts.";
  CHECK(b.weights->shape(l + "5.gate_proj.bias") == std::vector<int64_t>{32});
  CHECK(b.weights->shape(l + "5.down_proj.bias") == std::vector<int64_t>{64});
  CHECK(b.weights->shape(l + "5.down_proj.weight") == std::vector<int64_t>{64, 32});
  CHECK(b.weights->shape("model.layers.2.mlp.router.bias") == std::vector<int64_t>{6});
  CHECK(b.weights->shape("model.layers.2.self_attn.sinks") == std::vector<int64_t>{4});
  // MXFP4 blocks are 8-bit codes of group 32, the file's values bit for bit.
  REQUIRE(b.weights->codes_spec());
  CHECK(b.weights->codes_spec()->bits == 8);
  CHECK(b.weights->codes_spec()->group_size == 32);
  for (const std::string name : {l + "3.gate_proj.weight", l + "3.up_proj.weight", l + "0.down_proj.weight"}) {
    INFO(name);
    check_codes_are_values(*b.weights, name);
  }
  CHECK_FALSE(b.weights->read_codes(l + "3.gate_proj.bias", {8, 32}, std::vector<uint8_t>(4096).data()));
}

TEST_CASE("gpt-oss: a GGUF file at {8 bits, group 32} keeps its experts' codes and gives transformers' tokens",
          "[gpt_oss][gguf][offload]") {
  // As for the MXFP4 directory (the fixture's smallest top-2 gap there is 2.6e-3).
  ModelBundle b = open_model(kGguf + "tiny_gpt_oss.gguf");
  check_compressed_8_32(b, json::parse(std::ifstream(kGguf + "tiny_gpt_oss_expected.json")));
}

TEST_CASE("gpt-oss: a layer block stacks each expert's gate and up biases like its matrices", "[gpt_oss][weights]") {
  const ModelConfig c = config_from_hf_json(kModels + "tiny-gpt-oss/config.json");
  const HalvedLayout halves = halved_layer_layout(c, 1, DType::F16, 4096);
  std::vector<uint8_t> block(halves.layout.bytes);
  const LayerWeights w = layer_views(halves.layout, block.data(), Device::CPU);
  REQUIRE(w.experts.size() == 6);
  CHECK(w.router_b.numel() == 6);
  for (const ExpertWeights& e : w.experts) {
    CHECK(e.gate_up_b.data == e.gate_b.data);
    CHECK(e.gate_up_b.numel() == 64);
    CHECK(static_cast<char*>(e.up_b.data) == static_cast<char*>(e.gate_b.data) + 32 * 2);
    CHECK(e.down_b.numel() == 64);
    // The MLP half holds the router and the experts, biases included.
    CHECK(static_cast<uint8_t*>(e.down_b.data) >= block.data() + halves.mlp_offset);
  }
}

TEST_CASE("gpt-oss: the presets have the published sizes", "[gpt_oss][config]") {
  // openai/gpt-oss-20b 20.9B and gpt-oss-120b 116.8B parameters (the model card).
  for (const auto& [name, size] : {std::pair{"gpt-oss-20b", 20.9e9}, std::pair{"gpt-oss-120b", 116.8e9}}) {
    const std::optional<ModelConfig> c = config_preset(name);
    REQUIRE(c.has_value());
    INFO(name << ": " << c->param_count());
    CHECK(double(c->param_count()) == Approx(size).epsilon(0.01));
    CHECK(c->attn_sinks);
    CHECK(c->window_layer(0));
    CHECK_FALSE(c->window_layer(1));
    CHECK(c->rope_attention_factor == Approx(1.0 + 0.1 * std::log(32.0)));
  }
}

// Sinks reach attention delegated to the CPU; the router's and experts' biases travel in the MLP
// half; experts computed on the CPU where they live add theirs there.
TEST_CASE("gpt-oss: every policy generates Hugging Face's greedy tokens, experts on the CPU too",
          "[gpt_oss][policy_grid]") {
  auto backend = make_cpu_backend(2);
  const json exp = load_expected("tiny-gpt-oss");
  ModelBundle model = open_model(kModels + "tiny-gpt-oss");
  const std::vector<GenRequest> reqs = fixture_requests(exp);
  int n = 0, computed_on_cpu = 0;
  for (Policy policy : policy_grid()) {
    if (policy.weights.cpu > 0) {  // experts computed where they live, in decode, prefill or both
      const int phase = n++ % 3;
      policy.cpu_experts_prefill = phase != 0;
      policy.cpu_experts_decode = phase != 1;
    }
    OffloadOptions opt;
    opt.policy = policy;
    opt.offload_dir = offload_dir("gpt-oss");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, shape_of(reqs));
    const std::vector<GenResult> got = run_blocks(engine, reqs);
    REQUIRE(got.size() == reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(describe(policy) << ", cpu_experts " << cpu_experts_name(policy) << ", prompt " << i);
      CHECK(got[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
    }
    computed_on_cpu += cpu_experts_used(model.config, opt.policy, engine.plan().weight_tier);
  }
  CHECK(computed_on_cpu >= 6);
}
