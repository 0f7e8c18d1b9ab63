// Mixtures of experts (Mixtral, Qwen3-MoE): configs, the router against a brute-force reference,
// combine_rows against float64, GGUF files against transformers, and bad input. The tiny models'
// HF parity on the CPU and CUDA backends is in test_model_hf.cpp; the engine's in test_offload.cpp.
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/model/model_loader.h"
#include "strata/offload/engine.h"
#include "strata/policy/cost_model.h"
#include "strata/runtime/generator.h"
#include "strata/runtime/moe_routing.h"
#include "edited_model.h"
#include "temp_files.h"
#include "test_support.h"

using namespace strata;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kModels = std::string(STRATA_FIXTURES_DIR) + "/models/";

json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

fs::path edited_model(const std::string& model, const std::function<void(json&)>& edit) {
  return test::edited_model(model, edit, "moe");
}

}  // namespace

TEST_CASE("moe: Mixtral's and Qwen3-MoE's config.json map onto the expert fields", "[moe][config]") {
  const ModelConfig mx = config_from_hf_json(kModels + "tiny-mixtral/config.json");
  CHECK(mx.n_experts == 4);
  CHECK(mx.experts_per_token == 2);
  CHECK(mx.expert_intermediate == 48);  // Mixtral's experts are intermediate_size wide
  CHECK(mx.norm_topk_prob);             // always renormalised
  CHECK(mx.moe_naming == MoeNaming::Mixtral);
  CHECK(mx.dense_layers.empty());
  CHECK(mx.uniform_layers());

  const ModelConfig qm = config_from_hf_json(kModels + "tiny-qwen3-moe/config.json");
  CHECK(qm.n_experts == 6);
  CHECK(qm.experts_per_token == 2);
  CHECK(qm.expert_intermediate == 32);
  CHECK(qm.intermediate == 96);  // the dense layer's
  CHECK_FALSE(qm.norm_topk_prob);
  CHECK(qm.qk_norm);
  CHECK(qm.moe_naming == MoeNaming::Qwen3Moe);
  CHECK(qm.dense_layers == std::vector<int>{1});  // mlp_only_layers
  CHECK(qm.sparse_layer(0));
  CHECK_FALSE(qm.sparse_layer(1));
  CHECK(qm.sparse_layer(2));
  CHECK_FALSE(qm.uniform_layers());
  CHECK(qm.layer_param_count(1) == qm.layer_param_count(0) - 6 * (64 + 3 * 64 * 32) + 3 * 64 * 96);

  // decoder_sparse_step: layer l is sparse when (l + 1) is a multiple of it and l is not mlp-only.
  const fs::path stepped = edited_model("tiny-qwen3-moe", [](json& c) {
    c["num_hidden_layers"] = 4;
    c["decoder_sparse_step"] = 2;
    c["mlp_only_layers"] = json::array({3});
  });
  CHECK(config_from_hf_json(stepped / "config.json").dense_layers == std::vector<int>{0, 2, 3});
}

TEST_CASE("moe: the presets have the published parameter counts", "[moe][config]") {
  // mistralai/Mixtral-8x7B-v0.1: 46,702,792,704; Qwen/Qwen3-30B-A3B: 30,532,122,624 (safetensors
  // metadata of the checkpoints).
  const ModelConfig mx = *config_preset("mixtral-8x7b"), a3b = *config_preset("qwen3-30b-a3b");
  CHECK(mx.param_count() == 46702792704);
  CHECK(a3b.param_count() == 30532122624);
  CHECK_NOTHROW(mx.validate());
  CHECK_NOTHROW(a3b.validate());
}

TEST_CASE("moe: inconsistent expert fields fail naming the file and field", "[moe][config]") {
  auto refused = [](const std::string& model, const std::function<void(json&)>& edit, const std::string& what) {
    const fs::path dir = edited_model(model, edit);
    INFO(what);
    CHECK_THROWS_WITH(config_from_hf_json(dir / "config.json"),
                      Catch::Contains((dir / "config.json").string()) && Catch::Contains(what));
  };
  refused("tiny-mixtral", [](json& c) { c["num_experts_per_tok"] = 5; }, "num_experts_per_tok 5");
  refused("tiny-mixtral", [](json& c) { c["num_experts_per_tok"] = 0; }, "num_experts_per_tok 0");
  refused("tiny-mixtral", [](json& c) { c.erase("num_local_experts"); }, "num_local_experts");
  refused("tiny-qwen3-moe", [](json& c) { c.erase("moe_intermediate_size"); }, "moe_intermediate_size");
  refused("tiny-qwen3-moe", [](json& c) { c["mlp_only_layers"] = json::array({7}); }, "mlp_only_layers names layer 7");
  refused("tiny-qwen3-moe", [](json& c) { c["decoder_sparse_step"] = 0; }, "decoder_sparse_step 0");
}

TEST_CASE("moe: a router or an expert of the wrong shape fails at load naming the tensor", "[moe][model]") {
  auto backend = make_cpu_backend(1);
  // Three experts configured over a checkpoint of four: the router's shape gives it away.
  const fs::path fewer = edited_model("tiny-mixtral", [](json& c) { c["num_local_experts"] = 3; });
  ModelBundle b = open_model(fewer.string());
  CHECK_THROWS_WITH(load_model_weights(b.config, *b.weights, *backend),
                    Catch::Contains("model.layers.0.block_sparse_moe.gate.weight") && Catch::Contains("[4, 64]") &&
                        Catch::Contains("[3, 64]"));
  // A wider expert than the checkpoint's.
  const fs::path wider = edited_model("tiny-qwen3-moe", [](json& c) { c["moe_intermediate_size"] = 40; });
  ModelBundle w = open_model(wider.string());
  CHECK_THROWS_WITH(load_model_weights(w.config, *w.weights, *backend),
                    Catch::Contains("experts.0.gate_proj.weight") && Catch::Contains("[32, 64]"));
}

TEST_CASE("moe: routing picks transformers' experts and weights, grouped by expert", "[moe]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const auto& [T, E, k] : {std::tuple{1, 4, 1}, {9, 6, 2}, {13, 8, 3}, {5, 5, 5}}) {
    for (bool renormalize : {true, false}) {
      std::vector<float> logits(size_t(T * E));
      for (float& v : logits) v = normal(rng);
      logits[1] = logits[0];  // a tie: the lower expert wins, as torch.topk's CPU kernel picks
      const MoeRouting r = route_tokens(logits.data(), T, E, k, renormalize);
      INFO("T " << T << " E " << E << " k " << k << " renormalize " << renormalize);
      REQUIRE(r.gather.size() == size_t(T * k));
      REQUIRE(r.expert_begin.size() == size_t(E + 1));
      CHECK(r.expert_begin.front() == 0);
      CHECK(r.expert_begin.back() == T * k);
      std::set<int> active;
      for (int t = 0; t < T; ++t) {
        // Brute force in double: the k largest softmax probabilities, ties to the lower index.
        std::vector<double> p(static_cast<size_t>(E));
        double top = -1e300, sum = 0;
        for (int e = 0; e < E; ++e) top = std::max(top, double(logits[size_t(t * E + e)]));
        for (int e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(logits[size_t(t * E + e)]) - top);
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
        std::vector<int> want(order.begin(), order.begin() + k);
        std::sort(want.begin(), want.end());
        double picked = 0;
        for (int e : want) picked += p[size_t(e)] / sum;
        for (int j = 0; j < k; ++j) {
          const int a = r.combine_rows[size_t(t * k + j)];
          // The assignment is token t's, inside expert want[j]'s contiguous range.
          CHECK(r.gather[size_t(a)] == t);
          CHECK(a >= r.expert_begin[size_t(want[size_t(j)])]);
          CHECK(a < r.expert_begin[size_t(want[size_t(j)]) + 1]);
          const double prob = p[size_t(want[size_t(j)])] / sum;
          CHECK(r.combine_weights[size_t(t * k + j)] == Approx(renormalize ? prob / picked : prob).epsilon(1e-5));
          active.insert(want[size_t(j)]);
        }
      }
      CHECK(r.active_experts() == int(active.size()));
      // Within an expert's range, tokens ascend.
      for (int e = 0; e < E; ++e)
        for (int a = r.expert_begin[size_t(e)] + 1; a < r.expert_begin[size_t(e) + 1]; ++a)
          CHECK(r.gather[size_t(a)] > r.gather[size_t(a - 1)]);
    }
  }
}

TEST_CASE("moe: combine_rows sums each token's weighted expert rows as float64 does", "[moe][backend]") {
  auto backend = make_cpu_backend(2);
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& [T, k, h, A] : {std::tuple{1, 1, 1, 1}, {3, 2, 7, 6}, {17, 3, 33, 60}}) {
    std::vector<float> src(size_t(A * h)), weights(size_t(T * k));
    std::vector<int32_t> rows(size_t(T * k));
    for (float& v : src) v = u(rng);
    for (float& v : weights) v = u(rng);
    for (int32_t& r : rows) r = int32_t(rng() % uint32_t(A));
    std::vector<float> out(size_t(T * h), std::nanf(""));  // poisoned: every element must be written
    backend->combine_rows(Tensor(src.data(), DType::F32, Device::CPU, {A, h}),
                          Tensor(rows.data(), DType::I32, Device::CPU, {T, k}),
                          Tensor(weights.data(), DType::F32, Device::CPU, {T, k}),
                          Tensor(out.data(), DType::F32, Device::CPU, {T, h}));
    for (int i = 0; i < T; ++i)
      for (int c = 0; c < h; ++c) {
        double want = 0;
        for (int j = 0; j < k; ++j) want += double(weights[size_t(i * k + j)]) * src[size_t(rows[size_t(i * k + j)] * h + c)];
        INFO("T " << T << " k " << k << " h " << h << " token " << i << " column " << c);
        CHECK(out[size_t(i * h + c)] == Approx(want).margin(1e-6));
      }
  }
  std::vector<float> src(4), out(4), w(2);
  std::vector<int32_t> bad = {0, 2};
  CHECK_THROWS_WITH(backend->combine_rows(Tensor(src.data(), DType::F32, Device::CPU, {2, 2}),
                                          Tensor(bad.data(), DType::I32, Device::CPU, {1, 2}),
                                          Tensor(w.data(), DType::F32, Device::CPU, {1, 2}),
                                          Tensor(out.data(), DType::F32, Device::CPU, {1, 2})),
                    Catch::Contains("row 2 outside"));
}

TEST_CASE("gguf: Mixtral (architecture llama, 3-D expert tensors) gives transformers' logits and tokens",
          "[moe][gguf][model]") {
  // tiny-mixtral converted as llama.cpp converts Mixtral (make_moe_fixtures.py); expected values
  // are transformers' on the directory.
  const json exp = read_json(kModels + "tiny-mixtral/expected.json");
  ModelBundle b = open_model(std::string(STRATA_FIXTURES_DIR) + "/gguf/tiny_mixtral.gguf");
  CHECK(b.config.n_experts == 4);
  CHECK(b.config.experts_per_token == 2);
  CHECK(b.config.expert_intermediate == 48);
  CHECK(b.weights->shape("model.layers.1.block_sparse_moe.experts.3.w2.weight") == std::vector<int64_t>{64, 48});
  CHECK(b.weights->shape("model.layers.0.block_sparse_moe.gate.weight") == std::vector<int64_t>{4, 64});
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Qwen3-MoE (qwen3moe, a dense layer, no renormalisation) gives transformers' logits and tokens",
          "[moe][gguf][model]") {
  const json exp = read_json(kModels + "tiny-qwen3-moe/expected.json");
  ModelBundle b = open_model(std::string(STRATA_FIXTURES_DIR) + "/gguf/tiny_qwen3_moe.gguf");
  CHECK(b.config.n_experts == 6);
  CHECK(b.config.expert_intermediate == 32);
  CHECK(b.config.intermediate == 96);
  CHECK(b.config.dense_layers == std::vector<int>{1});
  CHECK_FALSE(b.config.norm_topk_prob);
  CHECK(b.weights->contains("model.layers.2.mlp.experts.5.up_proj.weight"));
  CHECK(b.weights->contains("model.layers.1.mlp.up_proj.weight"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("moe: the expected distinct experts of a step are what uniform routing activates", "[moe][cost]") {
  CHECK(expected_active_experts(8, 2, 1) == Approx(2.0));
  CHECK(expected_active_experts(128, 8, 1) == Approx(8.0));
  CHECK(expected_active_experts(8, 2, 0) == 0.0);
  CHECK(expected_active_experts(8, 8, 3) == Approx(8.0));
  // The runtime's own count (route_tokens over iid Gaussian logits: every k-subset equally
  // likely) averaged over many steps, against the formula: a few standard errors apart at most.
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [E, k, B] : {std::tuple{8, 2, 4}, {64, 6, 12}, {128, 8, 3}}) {
    const int steps = 3000;
    double sum = 0, sum_sq = 0;
    std::vector<float> logits(size_t(B * E));
    for (int s = 0; s < steps; ++s) {
      for (float& v : logits) v = normal(rng);
      const double active = route_tokens(logits.data(), B, E, k, true).active_experts();
      sum += active;
      sum_sq += active * active;
    }
    const double mean = sum / steps, sd = std::sqrt(std::max(0.0, sum_sq / steps - mean * mean));
    INFO("E " << E << " k " << k << " B " << B << ": measured " << mean << ", formula "
              << expected_active_experts(E, k, B));
    CHECK(std::fabs(mean - expected_active_experts(E, k, B)) <= 4 * sd / std::sqrt(double(steps)));
  }
}

TEST_CASE("moe: generation reports its sparse layers' routing", "[moe][model]") {
  auto backend = make_cpu_backend(2);
  ModelBundle b = open_model(kModels + "tiny-mixtral");
  Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
  const json exp = read_json(kModels + "tiny-mixtral/expected.json");
  std::vector<GenRequest> reqs = test::fixture_requests(exp);
  GenOptions opt;
  opt.prefill_token_budget = 1 << 20;  // one prefill step for the batch
  GenStats stats;
  const std::vector<GenResult> got = generate(model, reqs, opt, &stats);
  int64_t prompt_tokens = 0, decode_tokens = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    prompt_tokens += int64_t(reqs[i].prompt.size());
    decode_tokens += int64_t(got[i].tokens.size()) - 1;  // the last token is sampled, never fed back
  }
  // Both layers are sparse: each forward step routes its tokens twice (prefill steps, then one per
  // decode step), every computed token once per layer.
  const int64_t prefill_layer_steps = stats.routing.layer_steps - 2 * stats.decode_steps;
  CHECK(prefill_layer_steps >= 2);
  CHECK(prefill_layer_steps % 2 == 0);
  CHECK(stats.routing.tokens == 2 * (prompt_tokens - stats.shared_prompt_tokens + decode_tokens));
  CHECK(stats.routing.active_experts <= 4 * stats.routing.layer_steps);
  CHECK(stats.routing.active_experts >= 2 * stats.routing.layer_steps);  // k = 2 distinct per token
}
