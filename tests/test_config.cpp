#include "test_paths.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/model/config.h"
#include "temp_files.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {
fs::path write_config(const std::string& text) {
  const fs::path dir = test::temp_dir("cfg");
  std::ofstream(dir / "config.json") << text;
  return dir / "config.json";
}
const std::string kFixtures = STRATA_FIXTURES_DIR;
}  // namespace

TEST_CASE("config.json of each architecture maps onto ModelConfig", "[config]") {
  const ModelConfig opt = config_from_hf_json(kFixtures + "/models/tiny-opt/config.json");
  CHECK(opt.arch == Arch::OPT);
  CHECK(opt.hidden == 72);
  CHECK(opt.head_dim == 24);
  CHECK(opt.pos == PosKind::Learned);
  CHECK(opt.pos_offset == 2);
  CHECK(opt.norm == NormKind::LayerNorm);
  CHECK(opt.tied_embeddings);
  CHECK(opt.qkv_bias);

  const ModelConfig llama = config_from_hf_json(kFixtures + "/models/tiny-llama/config.json");
  CHECK(llama.arch == Arch::Llama);
  CHECK(llama.n_heads == 6);
  CHECK(llama.n_kv_heads == 2);
  CHECK(llama.head_dim == 20);
  CHECK_FALSE(llama.tied_embeddings);
  CHECK_FALSE(llama.qkv_bias);

  const ModelConfig qwen = config_from_hf_json(kFixtures + "/models/tiny-qwen2/config.json");
  CHECK(qwen.qkv_bias);
  CHECK_FALSE(qwen.o_bias);
  CHECK(qwen.tied_embeddings);

  const ModelConfig l3 = config_from_hf_json(kFixtures + "/models/tiny-llama3/config.json");
  REQUIRE(l3.rope_scaling.has_value());
  CHECK(l3.rope_scaling->factor == 8.0f);
  CHECK(l3.n_kv_heads == 1);
  CHECK(l3.rope_theta == 500000.0f);
}

TEST_CASE("Qwen3: per-head q/k norms, head_dim apart from the width, no q/k/v biases", "[config]") {
  const ModelConfig q3 = config_from_hf_json(kFixtures + "/models/tiny-qwen3/config.json");
  CHECK(q3.arch == Arch::Llama);
  CHECK(q3.qk_norm);
  CHECK_FALSE(q3.qkv_bias);
  CHECK_FALSE(q3.o_bias);
  CHECK(q3.head_dim == 24);
  CHECK(q3.q_dim() == 96);  // wider than hidden_size 64, as Qwen3-32B's 8192 of 5120
  CHECK(q3.tied_embeddings);
  CHECK(q3.max_positions == 128);  // use_sliding_window false
  // Two norms of head_dim per layer on top of LLaMA's count.
  ModelConfig plain = q3;
  plain.qk_norm = false;
  CHECK(q3.layer_param_count() == plain.layer_param_count() + 2 * 24);
  CHECK_FALSE(config_from_hf_json(kFixtures + "/models/tiny-qwen2/config.json").qk_norm);

  // Qwen/Qwen3-8B and -32B model cards: 8.2B (6.95B non-embedding) and 32.8B (31.2B).
  const ModelConfig q8 = *config_preset("qwen3-8b"), q32 = *config_preset("qwen3-32b");
  CHECK(double(q8.param_count()) == Approx(8.2e9).epsilon(0.005));
  CHECK(double(q8.n_layers) * double(q8.layer_param_count()) == Approx(6.95e9).epsilon(0.005));
  CHECK(double(q32.param_count()) == Approx(32.8e9).epsilon(0.005));
  CHECK(double(q32.n_layers) * double(q32.layer_param_count()) == Approx(31.2e9).epsilon(0.005));
}

TEST_CASE("preset parameter counts equal the published model sizes", "[config]") {
  // Counts of the Hugging Face checkpoints (facebook/opt-*, meta-llama/Meta-Llama-3-8B).
  CHECK(config_preset("opt-125m")->param_count() == 125239296);
  CHECK(config_preset("opt-6.7b")->param_count() == 6658473984);
  CHECK(config_preset("llama-3-8b")->param_count() == 8030261248);
  CHECK(double(config_preset("smollm3-3b")->param_count()) == Approx(3.08e9).epsilon(0.005));  // its model card
  CHECK(config_preset("smollm3-3b")->nope_layers.size() == 9);
  CHECK(double(config_preset("phi-4-mini")->param_count()) == Approx(3.84e9).epsilon(0.005));  // card: 3.8B
  CHECK(double(config_preset("glm-4-9b")->param_count()) == Approx(9.40e9).epsilon(0.005));     // GLM-4-9B-0414
  CHECK(double(config_preset("olmo-2-32b")->param_count()) == Approx(32.2e9).epsilon(0.005));  // OLMo-2-0325-32B
  CHECK_FALSE(config_preset("opt-7b").has_value());
  for (const std::string& name : config_preset_names()) CHECK_NOTHROW(config_preset(name)->validate());
}

TEST_CASE("unsupported variants are refused by name", "[config]") {
  CHECK_THROWS_WITH(config_from_hf_json(write_config(R"({"model_type":"opt","hidden_size":1024,"ffn_dim":4096,
      "num_hidden_layers":24,"num_attention_heads":16,"max_position_embeddings":2048,"vocab_size":50272,
      "word_embed_proj_dim":512,"do_layer_norm_before":false})")),
                    Catch::Contains("word_embed_proj_dim 512"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config(R"({"model_type":"gpt2"})")),
                    Catch::Contains("model_type 'gpt2' is not supported"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config(R"({"model_type":"llama","hidden_size":64,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":100})")),
                    Catch::Contains("intermediate_size"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config(R"({"model_type":"llama","hidden_size":64,"intermediate_size":8,
      "num_hidden_layers":2,"num_attention_heads":6,"num_key_value_heads":4,"vocab_size":100})")),
                    Catch::Contains("not a multiple"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config("{not json")), Catch::Contains("invalid JSON"));
  CHECK_THROWS_WITH(config_from_hf_json("/nonexistent/config.json"), Catch::Contains("cannot open"));
}

TEST_CASE("generation_config.json's eos_token_id joins the config's end tokens", "[config]") {
  ModelConfig c = config_from_hf_json(kFixtures + "/models/tiny-llama/config.json");
  REQUIRE(c.eos_ids == std::vector<int>{2});
  const fs::path dir = test::temp_dir("generation-config");
  auto with = [&](const std::string& text) {
    std::ofstream(dir / "generation_config.json") << text;
    ModelConfig copy = c;
    read_generation_config(dir / "generation_config.json", copy);
    return copy.eos_ids;
  };
  CHECK(with(R"({"eos_token_id": [2, 7, 7, 9]})") == std::vector<int>{2, 7, 9});  // after the config's, once each
  CHECK(with(R"({"eos_token_id": 5})") == std::vector<int>{2, 5});
  CHECK(with(R"({"temperature": 0.6})") == std::vector<int>{2});
  CHECK(with(R"({"eos_token_id": null})") == std::vector<int>{2});
  ModelConfig absent = c;
  CHECK(read_generation_config(dir / "missing.json", absent).empty());
  CHECK(absent.eos_ids == std::vector<int>{2});
  const std::string file = (dir / "generation_config.json").string();
  CHECK_THROWS_WITH(with(R"({"eos_token_id": [2, 1000]})"),
                    Catch::Contains(file) && Catch::Contains("eos_token_id 1000 outside the vocabulary"));
  CHECK_THROWS_WITH(with(R"({"eos_token_id": -1})"), Catch::Contains(file) && Catch::Contains("outside"));
  CHECK_THROWS_WITH(with(R"({"eos_token_id": "2"})"), Catch::Contains(file) && Catch::Contains("eos_token_id"));
  CHECK_THROWS_WITH(with("{not json"), Catch::Contains(file) && Catch::Contains("invalid JSON"));
  CHECK_THROWS_WITH(with("[2]"), Catch::Contains(file) && Catch::Contains("expected a JSON object"));
}

TEST_CASE("generation_config.json's sampling settings are read as vLLM and transformers read them", "[config]") {
  const ModelConfig c = config_from_hf_json(kFixtures + "/models/tiny-llama/config.json");
  const fs::path dir = test::temp_dir("generation-sampling");
  const std::string file = (dir / "generation_config.json").string();
  auto read = [&](const std::string& text) {
    std::ofstream(dir / "generation_config.json") << text;
    ModelConfig copy = c;
    return read_generation_config(dir / "generation_config.json", copy);
  };
  // Qwen3's published file: every named setting, the file named as their source.
  RecommendedSampling r = read(R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                   "eos_token_id": [2], "bos_token_id": 1})");
  CHECK(r.temperature == 0.6f);
  CHECK(r.top_k == 20);
  CHECK(r.top_p == 0.95f);
  CHECK_FALSE(r.min_p);
  CHECK_FALSE(r.repetition_penalty);
  CHECK_FALSE(r.max_new_tokens);
  CHECK(r.source == file);
  // Gemma 3's: sampling without a temperature samples at generate()'s default, 1.
  r = read(R"({"do_sample": true, "top_k": 64, "top_p": 0.95})");
  CHECK(r.temperature == 1.0f);
  CHECK(r.top_k == 64);
  // No do_sample: what is named counts (vLLM), nothing else is made up.
  r = read(R"({"temperature": 0.7, "repetition_penalty": 1.05, "min_p": 0.1, "max_new_tokens": 100})");
  CHECK(r.temperature == 0.7f);
  CHECK(r.repetition_penalty == 1.05f);
  CHECK(r.min_p == 0.1f);
  CHECK(r.max_new_tokens == 100);
  CHECK_FALSE(r.top_p);
  // do_sample false: generate() decodes greedily, so the sampling settings are not taken; the
  // penalty and the length still are.
  r = read(R"({"do_sample": false, "temperature": 0.6, "top_p": 0.9, "top_k": 5, "min_p": 0.2,
               "repetition_penalty": 1.1, "max_new_tokens": 64})");
  CHECK_FALSE(r.temperature);
  CHECK_FALSE(r.top_p);
  CHECK_FALSE(r.top_k);
  CHECK_FALSE(r.min_p);
  CHECK(r.repetition_penalty == 1.1f);
  CHECK(r.max_new_tokens == 64);
  CHECK(read(R"({"top_k": -1})").top_k == 0);  // off, as vLLM's -1
  CHECK(read(R"({"temperature": null, "do_sample": null})").empty());
  CHECK(read(R"({"eos_token_id": 2})").empty());

  // A setting the sampler cannot take fails naming the file and the field.
  for (const char* bad : {R"({"temperature": -0.5})", R"({"top_p": 1.5})", R"({"top_p": 0})", R"({"min_p": 2})",
                          R"({"top_k": -2})", R"({"top_k": 2.5})", R"({"repetition_penalty": 0})",
                          R"({"max_new_tokens": 0})", R"({"temperature": "0.6"})"}) {
    INFO(bad);
    const std::string field = nlohmann::json::parse(bad).begin().key();
    CHECK_THROWS_WITH(read(bad), Catch::Contains(file) && Catch::Contains(field));
  }
  CHECK_THROWS_WITH(read(R"({"do_sample": "yes"})"), Catch::Contains(file) && Catch::Contains("do_sample"));
}

TEST_CASE("SmolLM3: layers without RoPE from no_rope_layers or the interval, a zero row of frequencies", "[config]") {
  const ModelConfig s3 = config_from_hf_json(kFixtures + "/models/tiny-smollm3/config.json");
  CHECK(s3.arch == Arch::Llama);
  CHECK(s3.nope_layers == std::vector<int>{3, 7});
  CHECK(s3.rope_row(2) == 0);
  CHECK(s3.rope_row(3) == 1);
  const std::vector<float> table = rope_inv_freq(s3);
  REQUIRE(table.size() == size_t(s3.head_dim));  // the model's frequencies, then the zero row
  CHECK(table[0] == 1.0f);
  CHECK(std::all_of(table.begin() + s3.head_dim / 2, table.end(), [](float f) { return f == 0.0f; }));
  ModelConfig cut = s3;
  cut.keep_layers(5);
  CHECK(cut.nope_layers == std::vector<int>{3});

  const std::string head = R"({"model_type":"smollm3","hidden_size":64,"intermediate_size":8,"num_attention_heads":4,
      "vocab_size":100,"max_position_embeddings":128,)";
  // Without the list, every no_rope_layer_interval-th layer (transformers' SmolLM3Config).
  CHECK(config_from_hf_json(write_config(head + R"("num_hidden_layers":9,"no_rope_layer_interval":3})")).nope_layers ==
        std::vector<int>{2, 5, 8});
  CHECK(config_from_hf_json(write_config(head + R"("num_hidden_layers":8})")).nope_layers == std::vector<int>{3, 7});
  CHECK_THROWS_WITH(config_from_hf_json(write_config(head + R"("num_hidden_layers":2,"no_rope_layers":[1]})")),
                    Catch::Contains("no_rope_layers must list num_hidden_layers (2)"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config(head + R"("num_hidden_layers":2,"no_rope_layers":[1,2]})")),
                    Catch::Contains("no_rope_layers[1] must be 0 or 1"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config(head + R"("num_hidden_layers":2,"use_sliding_window":true})")),
                    Catch::Contains("use_sliding_window=true is not supported for SmolLM3"));
  // A layer count past validate()'s bound is refused before any per-layer list is built.
  for (const char* type : {"smollm3", "gemma3_text", "gpt_oss"}) {
    std::string text = head + R"("num_hidden_layers":2000000000})";
    text.replace(text.find("smollm3"), 7, type);
    CHECK_THROWS_WITH(config_from_hf_json(write_config(text)), Catch::Contains("num_hidden_layers is 2000000000, above the limit of 16384"));
  }
  ModelConfig bad = s3;
  bad.nope_layers = {7, 3};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("layer without RoPE 3") && Catch::Contains("out of order"));
  // Gemma 3's local row stays row 1; a layer without RoPE would take row 2.
  ModelConfig both = s3;
  both.local_rope_theta = 10000.0f;
  both.layer_window = 4;
  both.window_layers = {0, 1};
  CHECK(both.rope_row(0) == 1);
  CHECK(both.rope_row(2) == 0);
  CHECK(both.rope_row(3) == 2);
  CHECK(rope_inv_freq(both).size() == size_t(3 * s3.head_dim / 2));
}

TEST_CASE("a sliding window shorter than the context becomes the context", "[config]") {
  // Mistral 7B v0.1's shape: full attention and a 4096 window agree on every sequence of at most
  // 4096 tokens, so those are served and longer ones refused as past the context.
  const std::string head = R"({"hidden_size":64,"intermediate_size":8,"num_hidden_layers":2,"num_attention_heads":4,
      "vocab_size":100,"max_position_embeddings":32768,)";
  const ModelConfig mistral = config_from_hf_json(write_config(head + R"("model_type":"mistral","sliding_window":4096})"));
  CHECK(mistral.max_positions == 4096);
  CHECK(mistral.sliding_window == 4096);
  const ModelConfig v02 = config_from_hf_json(write_config(head + R"("model_type":"mistral","sliding_window":null})"));
  CHECK(v02.max_positions == 32768);
  CHECK(v02.sliding_window == 0);
  const ModelConfig qwen_off =
      config_from_hf_json(write_config(head + R"("model_type":"qwen2","use_sliding_window":false,"sliding_window":4096})"));
  CHECK(qwen_off.max_positions == 32768);
  const ModelConfig qwen_on =
      config_from_hf_json(write_config(head + R"("model_type":"qwen2","use_sliding_window":true,"sliding_window":1024})"));
  CHECK(qwen_on.max_positions == 1024);
  const ModelConfig wide = config_from_hf_json(write_config(head + R"("model_type":"mistral","sliding_window":65536})"));
  CHECK(wide.max_positions == 32768);
  CHECK(wide.sliding_window == 0);
}

TEST_CASE("the checkpoint's dtype comes from torch_dtype or dtype, and a bad one names the file and field", "[config]") {
  const std::string head = R"({"model_type":"llama","hidden_size":64,"intermediate_size":8,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":100,"max_position_embeddings":64)";
  CHECK(config_from_hf_json(write_config(head + "}")).checkpoint_dtype == DType::F16);
  CHECK(config_from_hf_json(write_config(head + R"(,"torch_dtype":"bfloat16"})")).checkpoint_dtype == DType::BF16);
  CHECK(config_from_hf_json(write_config(head + R"(,"torch_dtype":"float32"})")).checkpoint_dtype == DType::F32);
  // transformers 5 writes "dtype" beside the classic key; it wins.
  CHECK(config_from_hf_json(write_config(head + R"(,"dtype":"bfloat16","torch_dtype":"float16"})")).checkpoint_dtype ==
        DType::BF16);
  const fs::path bad = write_config(head + R"(,"torch_dtype":"int8"})");
  CHECK_THROWS_WITH(config_from_hf_json(bad), Catch::Contains(bad.string()) && Catch::Contains("'torch_dtype' is int8"));
  CHECK_THROWS_WITH(config_from_hf_json(write_config(head + R"(,"dtype":16})")), Catch::Contains("'dtype' must be a string"));
  // The presets of bf16 releases (Llama 3, Qwen, Mixtral) run in bf16 under --dtype auto; OPT in fp16.
  CHECK(config_preset("llama-3-8b")->checkpoint_dtype == DType::BF16);
  CHECK(config_preset("mixtral-8x7b")->checkpoint_dtype == DType::BF16);
  CHECK(config_preset("opt-6.7b")->checkpoint_dtype == DType::F16);
}

TEST_CASE("llama3 RoPE scaling matches the transformers formula", "[config]") {
  ModelConfig c = *config_preset("llama-3.1-8b");
  const std::vector<float> inv = rope_inv_freq(c);
  REQUIRE(inv.size() == 64);
  // transformers 5.23 ROPE_INIT_FUNCTIONS["llama3"] for Llama-3.1-8B's settings (float32):
  // index 20 is a high frequency (unchanged), 40 and 45 are in the blended band, 63 is divided by 8.
  CHECK(inv[0] == Approx(1.0f).epsilon(1e-6));
  CHECK(inv[20] == Approx(0.016560440883040428).epsilon(1e-5));
  CHECK(inv[40] == Approx(3.428102354519069e-05).epsilon(1e-5));
  CHECK(inv[45] == Approx(1.2297638932068367e-05).epsilon(1e-5));
  CHECK(inv[63] == Approx(3.068925877869333e-07).epsilon(1e-5));
}
