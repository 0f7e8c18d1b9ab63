// LoRA adapters (include/strata/model/lora.h) merged at load: PEFT's own outputs for adapters it
// saved over the tiny models (tests/fixtures/lora/make_lora_fixtures.py), and the refusals.
#include "error_text.h"
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "edited_model.h"
#include "engine_run.h"
#include "lora_fixtures.h"
#include "safetensors_files.h"
#include "strata/core/error.h"
#include "strata/model/lora.h"
#include "temp_files.h"
#include "test_support.h"

using namespace strata;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = STRATA_FIXTURES_DIR;

fs::path adapter_dir(const std::string& name) { return test::lora_fixture_dir(name); }
std::string base_model(const std::string& name) { return (kFixtures / "models" / name).string(); }

json load_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return json::parse(in);
}

using test::error_of;

// tiny-llama-lora copied into a scratch directory, its config and tensors edited.
fs::path edited_adapter(const std::string& tag, const std::function<void(json&)>& edit_config,
                        const std::function<void(std::map<std::string, test::RawTensor>&)>& edit_tensors = {}) {
  const fs::path src = adapter_dir("tiny-llama-lora"), dir = test::temp_dir("lora_" + tag);
  json config = load_json(src / "adapter_config.json");
  edit_config(config);
  std::ofstream(dir / "adapter_config.json") << config.dump(1);
  std::map<std::string, test::RawTensor> tensors = test::read_raw_tensors(src / "adapter_model.safetensors");
  if (edit_tensors) edit_tensors(tensors);
  test::write_raw_tensors(dir / "adapter_model.safetensors", tensors);
  return dir;
}

std::string open_error(const std::string& model, const fs::path& adapter) {
  return error_of([&] { open_model(model, {}, adapter); });
}

}  // namespace

TEST_CASE("lora: each adapter merged at load gives PEFT's logits and greedy tokens", "[lora][hf]") {
  for (const auto& [adapter, base] : test::kLoraFixtures) {
    SECTION(adapter) {
      const json exp = load_json(adapter_dir(adapter) / "expected.json");
      REQUIRE(exp["base"] == base);
      // The adapter changes every continuation (the fixture script checks it): a loader that
      // ignored it would fail here.
      for (size_t i = 0; i < exp["greedy"].size(); ++i) REQUIRE(exp["greedy"][i] != exp["base_greedy"][i]);
      const ModelBundle b = open_model(base_model(base), {}, adapter_dir(adapter));
      CHECK_THAT(b.load_note, Catch::StartsWith("LoRA adapter " + adapter_dir(adapter).string()));
      test::check_hf_outputs(b, exp);
    }
  }
}

TEST_CASE("lora: the load note counts the merged and the replaced tensors", "[lora]") {
  LoraSummary s;
  // tiny-llama-lora: 7 projections x 2 layers, embed_tokens and lm_head get a product; the two
  // embedding layers are also stored whole (PEFT saves targeted embedding layers).
  lora_source(open_model(base_model("tiny-llama")).weights, adapter_dir("tiny-llama-lora"),
              open_model(base_model("tiny-llama")).config, &s);
  CHECK(s.rank == 8);
  CHECK(s.alpha == 16);
  CHECK_FALSE(s.rslora);
  CHECK(s.merged == 16);
  CHECK(s.replaced == 2);
  CHECK(lora_load_note("a", s) == "LoRA adapter a: r 8, alpha 16, merged into 16 tensors, 2 replaced whole as they load");
}

TEST_CASE("lora: an adapter over the GGUF file of the same model gives PEFT's outputs", "[lora][gguf]") {
  // tiny_llama3_rope_freqs.gguf is tiny-llama3 as llama.cpp's converter writes it (q and k rows
  // permuted, its own tensor names); the GGUF source shows Hugging Face's names and layout.
  const json exp = load_json(adapter_dir("tiny-llama3-lora") / "expected.json");
  const ModelBundle b =
      open_model((kFixtures / "gguf" / "tiny_llama3_rope_freqs.gguf").string(), {}, adapter_dir("tiny-llama3-lora"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("lora: through the offloading engine, weights on the CPU tier, the merged model gives PEFT's tokens",
          "[lora][offload]") {
  // The engine reads each layer's weights from the source itself, on its own threads.
  const json exp = load_json(adapter_dir("tiny-llama-lora") / "expected.json");
  const ModelBundle b = open_model(base_model("tiny-llama"), {}, adapter_dir("tiny-llama-lora"));
  const test::EngineRun run = test::run_engine(b, exp, test::policy_of(2, 2, {0, 100, 0}, {100, 0, 0}, {100, 0, 0}));
  REQUIRE(run.results.size() == exp["greedy"].size());
  for (size_t i = 0; i < run.results.size(); ++i)
    CHECK(run.results[i].tokens == exp["greedy"][i].get<std::vector<int32_t>>());
}

TEST_CASE("lora: a changed tensor reads as W + s B A, and its stored codes are left unused", "[lora][gptq]") {
  // An adapter written here over tiny-llama-gptq (a checkpoint of 4-bit codes): the product is
  // checked in double against the base as read and the adapter's values; the other tensors still
  // come as the file's codes.
  const std::string model = base_model("tiny-llama-gptq");
  const ModelBundle base = open_model(model);
  const std::string q = "model.layers.0.self_attn.q_proj", up = "model.layers.1.mlp.up_proj";
  const std::vector<int64_t> s = base.weights->shape(q + ".weight");
  const int64_t r = 2, rows = s[0], cols = s[1];
  std::vector<float> a(size_t(r * cols)), b(size_t(rows * r));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 7) - 3) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2) / 16;
  auto raw = [](const std::vector<int64_t>& shape, const std::vector<float>& v) {
    return test::RawTensor{"F32", shape, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)};
  };
  const fs::path dir = test::temp_dir("lora_gptq");
  std::ofstream(dir / "adapter_config.json") << json{{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 3}}.dump();
  test::write_raw_tensors(dir / "adapter_model.safetensors",
                          {{"base_model.model." + q + ".lora_A.weight", raw({r, cols}, a)},
                           {"base_model.model." + q + ".lora_B.weight", raw({rows, r}, b)}});
  const ModelBundle merged = open_model(model, {}, dir);
  CHECK_THAT(merged.load_note, Catch::Contains("LoRA adapter " + dir.string() + ": r 2, alpha 3, merged into 1 tensor as"));

  std::vector<float> w(size_t(rows * cols)), got(w.size());
  base.weights->read(q + ".weight", DType::F32, w.data());
  merged.weights->read(q + ".weight", DType::F32, got.data());
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double want = w[size_t(i * cols + j)];
      for (int64_t k = 0; k < r; ++k) want += 1.5 * double(b[size_t(i * r + k)]) * double(a[size_t(k * cols + j)]);
      worst = std::max(worst, std::fabs(double(got[size_t(i * cols + j)]) - want) / (1 + std::fabs(want)));
    }
  CHECK(worst < 1e-6);

  const std::optional<quant::QuantSpec> spec = merged.weights->codes_spec();
  REQUIRE(spec);
  std::vector<uint8_t> codes(quant::row_bytes(*spec, cols) * size_t(rows));
  CHECK_FALSE(merged.weights->read_codes(q + ".weight", *spec, codes.data()));
  const std::vector<int64_t> su = merged.weights->shape(up + ".weight");
  std::vector<uint8_t> up_codes(quant::row_bytes(*spec, su[1]) * size_t(su[0]));
  CHECK(merged.weights->read_codes(up + ".weight", *spec, up_codes.data()));
}

TEST_CASE("lora: adapters Strata cannot merge are refused naming the file and field", "[lora]") {
  const std::string llama = base_model("tiny-llama");
  SECTION("not an adapter directory") {
    CHECK_THAT(open_error(llama, kFixtures / "lora" / "no-such-adapter"), Catch::Contains("not a directory"));
    CHECK_THAT(open_error(llama, kFixtures / "models" / "tiny-opt"), Catch::Contains("no adapter_config.json"));
  }
  SECTION("a pickled adapter") {
    const fs::path dir = edited_adapter("bin", [](json&) {});
    fs::rename(dir / "adapter_model.safetensors", dir / "adapter_model.bin");
    CHECK_THAT(open_error(llama, dir), Catch::Contains("adapter_model.bin (a pickle)"));
  }
  SECTION("another PEFT method") {
    const fs::path dir = edited_adapter("ia3", [](json& c) { c["peft_type"] = "IA3"; });
    CHECK_THAT(open_error(llama, dir), Catch::Contains("adapter_config.json: peft_type is 'IA3'"));
  }
  SECTION("LoRA variants whose product is not W + s B A") {
    CHECK_THAT(open_error(llama, edited_adapter("dora", [](json& c) { c["use_dora"] = true; })),
               Catch::Contains("adapter_config.json: use_dora is set: DoRA"));
    CHECK_THAT(open_error(llama, edited_adapter("fifo", [](json& c) { c["fan_in_fan_out"] = true; })),
               Catch::Contains("fan_in_fan_out is set"));
    CHECK_THAT(open_error(llama, edited_adapter("alora", [](json& c) { c["alora_invocation_tokens"] = {5, 6}; })),
               Catch::Contains("activated LoRA"));
    // The defaults PEFT writes (false, null, {}) are not refusals.
    CHECK_NOTHROW(open_model(llama, {}, edited_adapter("defaults", [](json& c) {
                               c["use_dora"] = false;
                               c["loftq_config"] = json::object();
                               c["layer_replication"] = nullptr;
                             })));
  }
  SECTION("a bad r, lora_alpha or pattern") {
    CHECK_THAT(open_error(llama, edited_adapter("r0", [](json& c) { c["r"] = 0; })),
               Catch::Contains("field 'r' must be a positive integer"));
    CHECK_THAT(open_error(llama, edited_adapter("alpha", [](json& c) { c["lora_alpha"] = "16"; })),
               Catch::Contains("field 'lora_alpha' must be a number"));
    CHECK_THAT(open_error(llama, edited_adapter("rank", [](json& c) { c["rank_pattern"] = {{"q_proj", 4}}; })),
               Catch::Contains("has shape [8, 120], but model.layers.0.self_attn.q_proj.weight [120, 120] needs [4, 120]"));
    CHECK_THAT(open_error(llama, edited_adapter("regex", [](json& c) { c["alpha_pattern"] = {{"q_proj(", 4}}; })),
               Catch::Contains("alpha_pattern key 'q_proj('"));
  }
  SECTION("an adapter for another model") {
    CHECK_THAT(open_error(llama, adapter_dir("tiny-opt-lora")),
               Catch::Contains("'base_model.model.model.decoder.layers.0.fc1.lora_B.bias' is for "
                               "'model.decoder.layers.0.fc1.bias', which is not in"));
    CHECK_THAT(open_error(base_model("tiny-llama3"), adapter_dir("tiny-llama-lora")), Catch::Contains("has shape"));
  }
  SECTION("a tensor without its partner, of the wrong shape, or of an unknown kind") {
    const std::string a = "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight";
    CHECK_THAT(open_error(llama, edited_adapter("partner", [](json&) {}, [&](auto& t) { t.erase(a); })),
               Catch::Contains("has no lora_A partner for model.layers.1.mlp.up_proj"));
    CHECK_THAT(open_error(llama, edited_adapter("shape", [](json&) {}, [&](auto& t) { t[a].shape = {8, 60, 2}; })),
               Catch::Contains("tensor '" + a + "' has shape [8, 60, 2], but model.layers.1.mlp.up_proj.weight"));
    CHECK_THAT(open_error(llama, edited_adapter("magnitude", [](json&) {},
                                                [&](auto& t) {
                                                  t["base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector"] =
                                                      t[a];
                                                })),
               Catch::Contains("lora_magnitude_vector' is not a LoRA matrix"));
  }
  SECTION("a bias for a module without one") {
    const fs::path dir = edited_adapter("bias", [](json& c) { c["lora_bias"] = true; }, [](auto& t) {
      t["base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias"] = {"F32", {120}, std::string(480, '\0')};
    });
    CHECK_THAT(open_error(llama, dir), Catch::Contains("adds a bias to model.layers.0.self_attn.q_proj, which has none"));
  }
  SECTION("the embeddings or lm_head of a model that ties them") {
    const fs::path tied = test::edited_model("tiny-llama", [](json& c) { c["tie_word_embeddings"] = true; }, "lora_tied");
    CHECK_THAT(open_error(tied.string(), adapter_dir("tiny-llama-lora")),
               Catch::Contains("ties its output matrix to its embeddings"));
  }
  SECTION("a dummy model") {
    CHECK_THAT(open_error("dummy:opt-125m", adapter_dir("tiny-opt-lora")), Catch::Contains("--lora needs a model with weights"));
  }
}

TEST_CASE("strata run --lora answers with the adapter's greedy tokens and says so", "[lora][cli]") {
  const json exp = load_json(adapter_dir("tiny-llama-lora") / "expected.json");
  const fs::path dir = test::temp_dir("lora_cli"), prompts = dir / "prompts.jsonl", out = dir / "out.jsonl";
  {
    std::ofstream f(prompts);
    for (size_t i = 0; i < exp["texts"].size(); ++i) f << json{{"id", int(i)}, {"prompt", exp["texts"][i]}}.dump() << "\n";
  }
  const test::CliResult r =
      test::run_strata("run --model " + base_model("tiny-llama") + " --lora " + adapter_dir("tiny-llama-lora").string() +
                       " --prompts " + prompts.string() + " --out " + out.string() + " --device cpu --ordered " +
                       "--max-new-tokens " + std::to_string(exp["max_new_tokens"].get<int>()) + " --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("LoRA adapter " + adapter_dir("tiny-llama-lora").string() + ": r 8, alpha 16"));
  std::ifstream in(out);
  std::string line;
  size_t i = 0;
  for (; std::getline(in, line); ++i) {
    const json got = json::parse(line);
    REQUIRE(i < exp["text_greedy"].size());
    CHECK(got["prompt_tokens"] == exp["text_prompts"][i].size());
    CHECK(got["tokens"] == exp["text_greedy"][i]);
  }
  CHECK(i == exp["texts"].size());

  const test::CliResult bad = test::run_strata("run --model " + base_model("tiny-llama3") + " --lora " +
                                               adapter_dir("tiny-llama-lora").string() + " --prompts " +
                                               prompts.string() + " --out " + (dir / "bad.jsonl").string() + " --device cpu");
  CHECK(bad.code != 0);
  CHECK_THAT(bad.output, Catch::Contains("adapter_model.safetensors: tensor"));
  CHECK_FALSE(fs::exists(dir / "bad.jsonl"));
}

TEST_CASE("strata run --lora NAME=DIR answers the OpenAI requests for NAME and refuses the others", "[lora][cli]") {
  const fs::path dir = test::temp_dir("lora_named"), prompts = dir / "batch.jsonl", out = dir / "out.jsonl";
  auto line = [](const std::string& id, const std::string& model) {
    return json{{"custom_id", id},
                {"method", "POST"},
                {"url", "/v1/completions"},
                {"body", {{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 4}}}}
               .dump() +
           "\n";
  };
  test::write_file(prompts, line("a", "tiny-lora") + line("b", "tiny-llama") + line("c", "tiny-lora"));
  const test::CliResult r = test::run_strata("run --model " + base_model("tiny-llama") + " --lora tiny-lora=" +
                                             adapter_dir("tiny-llama-lora").string() + " --prompts " +
                                             prompts.string() + " --out " + out.string() + " --device cpu --no-progress");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("LoRA adapter " + adapter_dir("tiny-llama-lora").string()));
  std::ifstream in(out);
  std::map<std::string, json> got;
  for (std::string l; std::getline(in, l);) {
    const json j = json::parse(l);
    got[j["custom_id"].get<std::string>()] = j;
  }
  REQUIRE(got.size() == 3);
  CHECK(got["a"]["error"].is_null());
  CHECK(got["a"]["response"]["body"]["model"] == "tiny-lora");
  CHECK(got["c"]["error"].is_null());
  CHECK(got["b"]["response"].is_null());
  CHECK(got["b"]["error"]["code"] == "model_not_found");
  CHECK_THAT(got["b"]["error"]["message"].get<std::string>(),
             Catch::Contains("body.model 'tiny-llama' is not served by this job, which runs the LoRA adapter 'tiny-lora'"));
}
