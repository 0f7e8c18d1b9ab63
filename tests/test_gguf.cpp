// GGUF reader, dequantization, llama mapping and chat template, against fixtures made by
// tests/fixtures/gguf/make_gguf_fixtures.py with the python gguf package and transformers.
#include "required_files.h"
#include "test_paths.h"
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "strata/core/error.h"
#include "strata/model/chat_template.h"
#include "strata/backend/backend.h"
#include "strata/model/gguf.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/generator.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace strata;
using json = nlohmann::json;

namespace {

fs::path fixture(const std::string& name) { return fs::path(STRATA_FIXTURES_DIR) / "gguf" / name; }

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f.good());
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

json load_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return json::parse(f);
}

// The message of the strata::Error that parsing `bytes` throws ("" when it parses).
std::string parse_error(std::vector<uint8_t> bytes) {
  try {
    GgufFile::from_bytes(std::move(bytes), "mem.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

size_t find_bytes(const std::vector<uint8_t>& hay, const std::string& needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end());
  REQUIRE(it != hay.end());
  return size_t(it - hay.begin());
}

template <class T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  REQUIRE(at + sizeof(T) <= b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Offset of a tensor info's field, found through its name (u64 length precedes the name bytes).
size_t tensor_info_pos(const std::vector<uint8_t>& b, const std::string& name) {
  std::string needle(8, '\0');
  uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle += name;
  needle += std::string("\x01\x00\x00\x00", 4);  // n_dims == 1 (the 1-D tensors used below)
  return find_bytes(b, needle) + 8 + name.size();  // at n_dims
}

// The fields a Llama-family config read from GGUF shares with the HF config.json `hc`.
void check_llama_config(const ModelConfig& c, const json& hc) {
  CHECK(c.vocab_size == hc["vocab_size"].get<int>());
  CHECK(c.hidden == hc["hidden_size"].get<int>());
  CHECK(c.intermediate == hc["intermediate_size"].get<int>());
  CHECK(c.n_layers == hc["num_hidden_layers"].get<int>());
  CHECK(c.n_heads == hc["num_attention_heads"].get<int>());
  CHECK(c.n_kv_heads == hc["num_key_value_heads"].get<int>());
  CHECK(c.max_positions == hc["max_position_embeddings"].get<int>());
  CHECK(c.rope_theta == Approx(hc["rope_theta"].get<double>()));
  CHECK(c.norm_eps == Approx(hc["rms_norm_eps"].get<double>()));
  CHECK(c.tied_embeddings == hc["tie_word_embeddings"].get<bool>());
  CHECK(c.bos_id == hc["bos_token_id"].get<int>());
  CHECK(c.eos_ids == std::vector<int>{hc["eos_token_id"].get<int>()});
}

}  // namespace

TEST_CASE("gguf: metadata of every value type", "[gguf]") {
  json ex = load_json(fixture("synth_meta.json"));
  GgufFile f = GgufFile::open(fixture("synth_meta.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.data_offset() == ex["data_offset"].get<uint64_t>());
  for (auto& [k, v] : ex["ints"].items()) CHECK(f.get_int(k) == v.get<int64_t>());
  CHECK(f.find("t.u64")->u == std::stoull(ex["u64"]["t.u64"].get<std::string>()));
  CHECK_THROWS_WITH(f.get_int("t.u64"), Catch::Contains("t.u64"));  // > INT64_MAX
  for (auto& [k, v] : ex["floats"].items()) CHECK(f.get_float(k) == v.get<double>());
  for (auto& [k, v] : ex["strings"].items()) CHECK(f.get_string(k) == v.get<std::string>());
  CHECK(f.get_bool("t.bool") == true);
  CHECK(f.find("t.u8")->type == GgufType::U8);
  CHECK(f.find("t.i64")->type == GgufType::I64);
  for (auto& [k, v] : ex["int_arrays"].items()) CHECK(f.get_int_array(k) == v.get<std::vector<int64_t>>());
  for (auto& [k, v] : ex["float_arrays"].items()) CHECK(f.get_float_array(k) == v.get<std::vector<double>>());
  for (auto& [k, v] : ex["string_arrays"].items()) CHECK(f.get_string_array(k) == v.get<std::vector<std::string>>());
  CHECK(f.get_int_array("a.bool") == std::vector<int64_t>{1, 0, 1});
  const GgufValue* nested = f.find("a.nested");
  REQUIRE(nested);
  REQUIRE(nested->elem_type == GgufType::Array);
  auto want = ex["nested"].get<std::vector<std::vector<int64_t>>>();
  REQUIRE(nested->items.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    REQUIRE(nested->items[k].count == want[k].size());
    for (size_t j = 0; j < want[k].size(); ++j) CHECK(nested->items[k].int_at(j) == want[k][j]);
  }
  // Keys keep file order; general.architecture comes first from GGUFWriter.
  CHECK(f.metadata().front().first == "general.architecture");

  CHECK_THROWS_WITH(f.get_int("no.such.key"), Catch::Contains("no.such.key") && Catch::Contains("synth_meta.gguf"));
  CHECK_THROWS_WITH(f.get_string("t.u8"), Catch::Contains("t.u8") && Catch::Contains("expected string"));
  CHECK_THROWS_AS(f.get_string_array("a.u8"), Error);
  CHECK_FALSE(f.get_int_opt("missing").has_value());

  REQUIRE(f.tensors().size() == ex["tensors"].size());
  for (const json& et : ex["tensors"]) {
    const GgufTensorInfo& t = f.tensor(et["name"].get<std::string>());
    CHECK(t.ne == et["ne"].get<std::vector<int64_t>>());
    CHECK(t.offset == et["offset"].get<uint64_t>());
    CHECK(t.type == GgmlType::F32);
    std::vector<float> v(size_t(t.numel));
    f.dequantize(t, v.data());
    CHECK(v == et["values"].get<std::vector<float>>());
  }
  CHECK_THROWS_WITH(f.tensor("nope"), Catch::Contains("nope"));
}

TEST_CASE("gguf: version 2 files parse like version 3", "[gguf]") {
  auto b = slurp(fixture("synth_meta.gguf"));
  poke<uint32_t>(b, 4, 2);  // v2 and v3 differ only in v3's big-endian support
  GgufFile f = GgufFile::from_bytes(b, "v2.gguf");
  CHECK(f.version() == 2);
  CHECK(f.get_string("t.string") == "héllo wörld");
}

TEST_CASE("gguf: custom alignment", "[gguf]") {
  GgufFile f = GgufFile::open(fixture("synth_align.gguf"));
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  const GgufTensorInfo& b = f.tensor("b");
  CHECK(b.type == GgmlType::F16);
  CHECK(b.offset % 64 == 0);
  std::vector<float> v(7);
  f.dequantize(b, v.data());
  for (int k = 0; k < 7; ++k) CHECK(v[size_t(k)] == float(k));
}

TEST_CASE("gguf: dequantization matches the gguf package for every type", "[gguf]") {
  json ex = load_json(fixture("synth_quants.json"));
  auto raw = slurp(fixture("synth_quants_expected.bin"));
  std::vector<float> expected(raw.size() / 4);
  std::memcpy(expected.data(), raw.data(), raw.size());
  GgufFile f = GgufFile::open(fixture("synth_quants.gguf"));
  size_t at = 0;
  for (const json& et : ex["tensors"]) {
    std::string name = et["name"];
    INFO("tensor " << name);
    const GgufTensorInfo& t = f.tensor(name);
    CHECK(uint32_t(t.type) == et["type"].get<uint32_t>());
    CHECK(t.ne == et["ne"].get<std::vector<int64_t>>());
    std::vector<float> got(size_t(t.numel), std::nanf(""));  // poisoned: unwritten elements show
    f.dequantize(t, got.data());
    size_t bad = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      float e = expected[at + k];
      // Same float32 operations as numpy; allow one rounding step of slack for FMA contraction.
      if (!(std::fabs(got[k] - e) <= 1e-6f * std::max(1.0f, std::fabs(e)))) {
        if (bad++ < 5) UNSCOPED_INFO("element " << k << ": got " << got[k] << " want " << e);
      }
    }
    CHECK(bad == 0);
    at += got.size();
  }
  CHECK(at == expected.size());
  const GgufTensorInfo& iq = f.tensor(ex["unsupported"]["name"].get<std::string>());
  std::vector<float> sink(size_t(iq.numel));
  CHECK_THROWS_WITH(f.dequantize(iq, sink.data()), Catch::Contains("IQ4_NL") && Catch::Contains("iq4_nl"));
}

TEST_CASE("gguf: MXFP4 blocks dequantize as the gguf package does, and read as affine codes", "[gguf]") {
  // Random blocks with scale bytes 110..140 (make_gpt_oss_gguf.py); expected floats from
  // gguf.quants.dequantize, checked there against ggml's e2m1 table.
  const auto raw = slurp(fixture("synth_mxfp4_expected.bin"));
  std::vector<float> expected(raw.size() / 4);
  std::memcpy(expected.data(), raw.data(), raw.size());
  GgufFile f = GgufFile::open(fixture("synth_mxfp4.gguf"));
  const GgufTensorInfo& t = f.tensor("MXFP4");
  CHECK(uint32_t(t.type) == 39);
  REQUIRE(size_t(t.numel) == expected.size());
  std::vector<float> got(expected.size(), std::nanf(""));
  f.dequantize(t, got.data());
  CHECK(got == expected);  // powers of two times small integers: exact
  CHECK(ggml_affine_code_bits(t.type) == 5);  // codes 0 .. 24
  std::vector<uint8_t> codes(size_t(t.numel));
  std::vector<float> scales(size_t(t.numel / 32)), mins(scales.size());
  ggml_affine_decode(t.type, t.data, t.numel, codes.data(), scales.data(), mins.data());
  for (size_t k = 0; k < codes.size(); ++k) {
    INFO("element " << k);
    REQUIRE(codes[k] <= 24);
    CHECK(float(codes[k]) * scales[k / 32] + mins[k / 32] == expected[k]);
  }
}

TEST_CASE("gguf: truncated files fail cleanly at every cut point", "[gguf]") {
  for (const char* name : {"synth_meta.gguf", "synth_align.gguf", "synth_quants.gguf"}) {
    auto full = slurp(fixture(name));
    GgufFile f = GgufFile::from_bytes(full, name);
    uint64_t needed = f.data_offset();
    for (const GgufTensorInfo& t : f.tensors()) needed = std::max(needed, f.data_offset() + t.offset + t.nbytes);
    size_t step = full.size() > 4096 ? 7 : 1;
    for (size_t cut = 0; cut < needed; cut += step) {
      std::vector<uint8_t> part(full.begin(), full.begin() + long(cut));
      std::string msg = parse_error(part);
      INFO(name << " cut at " << cut);
      CHECK(!msg.empty());
      CHECK(msg.find("mem.gguf") != std::string::npos);
    }
  }
}

TEST_CASE("gguf: corrupted header fields", "[gguf]") {
  const auto good = slurp(fixture("synth_meta.gguf"));
  REQUIRE(parse_error(good).empty());
  auto mutate = [&](auto fn) {
    auto b = good;
    fn(b);
    return parse_error(b);
  };
  CHECK_THAT(mutate([](auto& b) { b[0] = 'X'; }), Catch::Contains("bad magic"));
  CHECK_THAT(mutate([](auto& b) { poke<uint32_t>(b, 4, 1); }), Catch::Contains("version 1"));
  CHECK_THAT(mutate([](auto& b) { poke<uint32_t>(b, 4, 4); }), Catch::Contains("unsupported GGUF version 4"));
  CHECK_THAT(mutate([](auto& b) { poke<uint32_t>(b, 4, 0x03000000); }), Catch::Contains("big-endian"));
  CHECK_THAT(mutate([](auto& b) { poke<uint64_t>(b, 8, uint64_t(1) << 60); }), Catch::Contains("tensor count"));
  CHECK_THAT(mutate([](auto& b) { poke<uint64_t>(b, 16, uint64_t(1) << 60); }), Catch::Contains("metadata count"));
  // A string array claiming 2^60 elements must fail before allocating.
  CHECK_THAT(mutate([](auto& b) { poke<uint64_t>(b, find_bytes(b, "a.string") + 8 + 4 + 4, uint64_t(1) << 60); }),
             Catch::Contains("a.string") && Catch::Contains("does not fit"));
  CHECK_THAT(mutate([](auto& b) { poke<uint64_t>(b, find_bytes(b, "a.u64") + 5 + 4 + 4, ~uint64_t(0)); }),
             Catch::Contains("a.u64"));
  CHECK_THAT(mutate([](auto& b) { poke<uint64_t>(b, find_bytes(b, "a.nested") + 8 + 4 + 4, uint64_t(1) << 62); }),
             Catch::Contains("a.nested"));
  // The u64 length before the key "t.string".
  CHECK_THAT(mutate([](auto& b) { poke<uint64_t>(b, find_bytes(b, "t.string") - 8, uint64_t(1) << 62); }),
             Catch::Contains("past the end"));
  CHECK_THAT(mutate([](auto& b) { poke<uint32_t>(b, find_bytes(b, "t.u8") + 4, 13); }),
             Catch::Contains("t.u8") && Catch::Contains("unknown value type 13"));
  CHECK_THAT(mutate([](auto& b) { b[find_bytes(b, "t.bool") + 6 + 4] = 7; }), Catch::Contains("bool"));
  CHECK_THAT(mutate([](auto& b) { poke<uint32_t>(b, find_bytes(b, "a.u8") + 4 + 4, 99); }),
             Catch::Contains("a.u8") && Catch::Contains("element type"));
  // Duplicate key: rename "t.i8" to "t.u8".
  CHECK_THAT(mutate([](auto& b) { b[find_bytes(b, "t.i8") + 2] = 'u'; }), Catch::Contains("duplicate metadata key 't.u8'"));

  // Tensor info "vec": n_dims, ne[0], type, offset.
  const size_t vec = tensor_info_pos(good, "vec");
  CHECK_THAT(mutate([&](auto& b) { poke<uint32_t>(b, vec, 5); }), Catch::Contains("vec") && Catch::Contains("n_dims"));
  CHECK_THAT(mutate([&](auto& b) { poke<uint64_t>(b, vec + 4, uint64_t(1) << 40); }),
             Catch::Contains("'vec'") && Catch::Contains("past the end"));
  CHECK_THAT(mutate([&](auto& b) { poke<uint64_t>(b, vec + 4, ~uint64_t(0)); }), Catch::Contains("vec"));
  CHECK_THAT(mutate([&](auto& b) { poke<uint32_t>(b, vec + 12, 5); }),
             Catch::Contains("vec") && Catch::Contains("unknown ggml type id 5"));
  CHECK_THAT(mutate([&](auto& b) { poke<uint32_t>(b, vec + 12, 2); }),  // q4_0 with 3 elements
             Catch::Contains("vec") && Catch::Contains("block size"));
  CHECK_THAT(mutate([&](auto& b) { poke<uint64_t>(b, vec + 16, uint64_t(1) << 40); }),
             Catch::Contains("'vec'") && Catch::Contains("past the end"));
  CHECK_THAT(mutate([&](auto& b) { poke<uint64_t>(b, vec + 16, 33); }), Catch::Contains("'vec'") && Catch::Contains("alignment"));
  // Ranges may overlap: point "vec" at t0's data.
  CHECK(mutate([&](auto& b) { poke<uint64_t>(b, vec + 16, 0); }).empty());
}

TEST_CASE("gguf: bad alignment values", "[gguf]") {
  const auto good = slurp(fixture("synth_align.gguf"));
  const size_t at = find_bytes(good, "general.alignment") + 17 + 4;
  for (uint32_t a : {0u, 48u, 3u, 0x80000000u}) {
    auto b = good;
    poke<uint32_t>(b, at, a);
    INFO("alignment " << a);
    CHECK_THAT(parse_error(b), Catch::Contains("general.alignment"));
  }
  auto b = good;
  poke<uint32_t>(b, at, 16);  // valid, but the recorded offsets stay multiples of 64: parses
  CHECK(parse_error(b).empty());
}

TEST_CASE("gguf: random byte corruption never crashes", "[gguf]") {
  std::mt19937 rng(42);
  for (const char* name : {"synth_meta.gguf", "synth_align.gguf"}) {
    const auto good = slurp(fixture(name));
    for (int iter = 0; iter < 3000; ++iter) {
      auto b = good;
      int n = 1 + int(rng() % 4);
      for (int k = 0; k < n; ++k) {
        size_t pos = rng() % b.size();
        b[pos] = (rng() % 3 == 0) ? 0xFF : uint8_t(rng());
      }
      try {
        GgufFile f = GgufFile::from_bytes(b, name);
        for (const GgufTensorInfo& t : f.tensors()) {
          const GgmlTypeInfo* info = ggml_type_info(uint32_t(t.type));
          if (!info->dequantizable || t.numel > (1 << 20)) continue;
          std::vector<float> v(size_t(t.numel));
          f.dequantize(t, v.data());
        }
      } catch (const Error&) {
      }
    }
  }
}

TEST_CASE("gguf: tiny llama and qwen2 map onto HF names, shapes and values", "[gguf]") {
  for (const std::string arch : {"llama", "qwen2"}) {
    SECTION(arch) {
      json ex = load_json(fixture("tiny_" + arch + "_hf.json"));
      GgufFile f = GgufFile::open(fixture("tiny_" + arch + ".gguf"));
      ModelConfig c = config_from_gguf(f);
      const json& hc = ex["config"];
      CHECK(c.arch == Arch::Llama);
      CHECK(c.norm == NormKind::RMSNorm);
      CHECK(c.pos == PosKind::Rope);
      CHECK(c.mlp == MlpKind::SwiGLU);
      check_llama_config(c, hc);
      CHECK(c.head_dim == c.hidden / c.n_heads);
      CHECK(c.qkv_bias == (arch == "qwen2"));
      CHECK_FALSE(c.o_bias);

      auto src = make_gguf_source(f);
      CHECK(src->names().size() == ex["tensors"].size());
      for (auto& [name, t] : ex["tensors"].items()) {
        INFO(name);
        REQUIRE(src->contains(name));
        auto shape = t["shape"].get<std::vector<int64_t>>();
        CHECK(src->shape(name) == shape);
        auto want = t["values"].get<std::vector<float>>();
        std::vector<float> got(want.size(), std::nanf(""));
        src->read(name, DType::F32, got.data());
        CHECK(got == want);  // F32 storage: exact, including llama's q/k un-permutation
        std::vector<uint16_t> h(want.size());
        src->read(name, DType::F16, h.data());
        for (size_t k = 0; k < want.size(); k += 7) CHECK(half_to_float(h[k]) == Approx(want[k]).margin(1e-3));
      }
      CHECK_THROWS_WITH(src->shape("model.layers.9.mlp.up_proj.weight"),
                        Catch::Contains("model.layers.9.mlp.up_proj.weight"));

      // The owning overload keeps the mapping alive on its own.
      auto owned = make_gguf_source(fixture("tiny_" + arch + ".gguf"));
      CHECK(owned->contains("model.embed_tokens.weight"));
    }
  }
}

TEST_CASE("gguf: Llama 3.1's RoPE scaling as rope_freqs.weight gives transformers' logits and greedy tokens",
          "[gguf][model]") {
  // tiny-llama3 (llama3 rope scaling) converted as llama.cpp converts Llama 3.1; the expected
  // values are transformers' on the original directory (llama.cpp on this file agrees to 2e-5).
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-llama3" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_llama3_rope_freqs.gguf").string());
  CHECK_FALSE(b.config.rope_scaling);
  REQUIRE(b.config.rope_freq_factors.size() == size_t(b.config.head_dim / 2));
  CHECK(b.config.rope_freq_factors.front() == 1.0f);  // the highest frequency is left alone
  CHECK(b.config.rope_freq_factors.back() == 8.0f);   // the lowest is divided by the factor
  CHECK_FALSE(b.weights->contains("rope_freqs.weight"));
  ModelConfig bad = b.config;
  bad.rope_freq_factors[0] = 0.0f;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("RoPE frequency factor 0 is not positive"));
  bad.rope_freq_factors.pop_back();
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("7 RoPE frequency factors for 16 rotary dimensions"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Phi-3 (fused qkv and gate_up, a sliding window) gives transformers' logits and greedy tokens",
          "[gguf][model]") {
  // tiny-phi3 converted as llama.cpp converts Phi-3; expected values are transformers' on the
  // directory (llama.cpp on this file agrees to 1e-5). The 64-token window is the context.
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-phi3" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_phi3.gguf").string());
  CHECK(b.config.max_positions == 64);
  CHECK(b.config.sliding_window == 64);
  CHECK(b.weights->contains("model.layers.1.self_attn.k_proj.weight"));
  CHECK(b.weights->contains("model.layers.0.mlp.gate_proj.weight"));
  CHECK_FALSE(b.weights->contains("model.layers.0.mlp.gate_up_proj.weight"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Qwen3 (per-head q/k norms, head_dim apart from the width, tied) gives transformers' logits and tokens",
          "[gguf][model]") {
  // tiny-qwen3 converted as llama.cpp converts Qwen3; expected values are transformers' on the
  // directory (llama.cpp on this file is checked against them by make_qwen3_fixture.py).
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-qwen3" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_qwen3.gguf").string());
  CHECK(b.config.qk_norm);
  CHECK(b.config.head_dim == 24);
  CHECK(b.config.q_dim() == 96);
  CHECK(b.config.tied_embeddings);
  CHECK(b.weights->contains("model.layers.1.self_attn.k_norm.weight"));
  CHECK(b.weights->shape("model.layers.0.self_attn.q_norm.weight") == std::vector<int64_t>{24});
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: SmolLM3 (every fourth layer without RoPE, q/k permuted) gives transformers' logits and tokens",
          "[gguf][model]") {
  // tiny-smollm3 converted as llama.cpp converts SmolLM3; expected values are transformers' on the
  // directory (llama.cpp on this file agrees to 1e-5: make_smollm3_fixture.py). No key says which
  // layers skip RoPE: every fourth, as llama.cpp has it.
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-smollm3" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_smollm3.gguf").string());
  CHECK(b.config.nope_layers == std::vector<int>{3, 7});
  CHECK(b.config.tied_embeddings);
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Phi-3 with LongRoPE (rope_factors_short/long, attn_factor) gives transformers' logits and tokens",
          "[gguf][model][rope]") {
  // tiny-phi3-longrope as llama.cpp's converter writes it; expected values are transformers' on
  // the directory, within the original 64 positions (the short factors), which cap the context.
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-phi3-longrope" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_phi3_longrope.gguf").string());
  CHECK(b.config.max_positions == 64);
  CHECK(b.config.rope_freq_factors.size() == 8);
  CHECK(b.config.rope_attention_factor == Approx(std::sqrt(1.0 + std::log(4.0) / std::log(64.0))).epsilon(1e-6));
  CHECK_FALSE(b.weights->contains("rope_factors_short.weight"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Phi-4-mini's partial rotary (rope.dimension_count 12 of 16) gives transformers' logits and tokens",
          "[gguf][model][rope]") {
  // tiny-phi4-mini as llama.cpp's converter writes it (tied embeddings: no output.weight);
  // expected values are transformers' on the directory (make_phi3_fixture.py --partial).
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-phi4-mini" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_phi4_mini.gguf").string());
  CHECK(b.config.rotary_dim == 12);
  CHECK(b.config.rope_freq_factors.size() == 6);
  CHECK(b.config.tied_embeddings);
  test::check_hf_outputs(b, exp);

  const std::vector<uint8_t> original = slurp(fixture("tiny_phi4_mini.gguf"));
  for (uint32_t dims : {11u, 18u}) {  // odd; more than head_dim
    INFO(dims);
    std::vector<uint8_t> bytes = original;
    const std::string key = "phi3.rope.dimension_count";
    poke<uint32_t>(bytes, find_bytes(bytes, key) + key.size() + 4, dims);  // after the u32 type tag
    CHECK_THROWS_WITH(config_from_gguf(GgufFile::from_bytes(std::move(bytes), "mem.gguf")),
                      Catch::Contains("mem.gguf") && Catch::Contains("rope.dimension_count " + std::to_string(dims)));
  }
}

TEST_CASE("gguf: GLM-4 (glm4: interleaved partial RoPE, sandwich norms, fused gate/up) gives transformers' logits "
          "and tokens", "[gguf][model][rope]") {
  // tiny-glm4 as llama.cpp's converter writes it (make_glm_fixture.py): q/k rows as in Hugging
  // Face, rope.dimension_count 8 of 16, pre-tokenizer glm4; expected values are transformers'.
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-glm4" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_glm4.gguf").string());
  CHECK(b.config.rotary_dim == 8);
  CHECK(b.config.rope_interleaved);
  CHECK(b.config.sandwich_norms);
  CHECK(b.config.qkv_bias);
  CHECK_FALSE(b.config.o_bias);
  CHECK_FALSE(b.add_bos);  // llama.cpp never prepends BOS for the glm4 pre-tokenizer
  CHECK(b.weights->contains("model.layers.1.post_mlp_layernorm.weight"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: OLMo 2 (olmo2: norms after each block, q/k normed whole) gives transformers' logits and tokens",
          "[gguf][model]") {
  // tiny-olmo2 as llama.cpp's converter writes it (make_olmo_fixtures.py): q/k rows as in Hugging
  // Face, pre-tokenizer dbrx; expected values are transformers' on the directory.
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-olmo2" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_olmo2.gguf").string());
  CHECK_FALSE(b.config.pre_norms);
  CHECK(b.config.sandwich_norms);
  CHECK(b.config.qk_norm_whole);
  CHECK(b.weights->contains("model.layers.1.post_feedforward_layernorm.weight"));
  CHECK_FALSE(b.weights->contains("model.layers.1.input_layernorm.weight"));
  test::check_hf_outputs(b, exp);

  // A q norm of one head's width (Qwen3's) is not OLMo 2's: refused naming the tensor.
  std::vector<uint8_t> bytes = slurp(fixture("tiny_olmo2.gguf"));
  poke<uint64_t>(bytes, tensor_info_pos(bytes, "blk.0.attn_q_norm.weight") + 4, 16);  // ne[0]: head_dim
  CHECK_THROWS_WITH(config_from_gguf(GgufFile::from_bytes(std::move(bytes), "mem.gguf")),
                    Catch::Contains("mem.gguf") && Catch::Contains("olmo2 needs blk.0.attn_q_norm.weight of 64"));
}

TEST_CASE("gguf: OLMo 3 (olmo2 with a window: sliding layers' own base, YaRN on the full ones) gives transformers' "
          "logits and tokens", "[gguf][model][rope]") {
  // tiny-olmo3 as llama.cpp's converter writes it (make_olmo_fixtures.py): sliding_window 8,
  // sliding_window_pattern, freq_base_swa 5000 (which llama.cpp 0.3.36 does not read; transformers
  // and Strata do), YaRN keys; expected values are transformers' on the directory.
  const json exp = load_json(fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-olmo3" / "expected.json");
  ModelBundle b = open_model(fixture("tiny_olmo3.gguf").string());
  const ModelConfig dir = open_model((fs::path(STRATA_FIXTURES_DIR) / "models" / "tiny-olmo3").string()).config;
  CHECK(b.config.layer_window == 8);
  CHECK(b.config.window_layers == std::vector<int>{0, 1, 2});
  CHECK(b.config.local_rope_theta == 5000.0f);
  CHECK(b.config.rope_freq_factors == dir.rope_freq_factors);
  CHECK(b.config.max_positions == dir.max_positions);  // the window is the sliding layers', not the context
  CHECK(b.config.attention_scale(3) == Approx(dir.attention_scale(3)).epsilon(1e-7));
  test::check_hf_outputs(b, exp);

  // A pattern of another length than the layers' is refused naming the key.
  std::vector<uint8_t> bytes = slurp(fixture("tiny_olmo3.gguf"));
  const std::string key = "olmo2.block_count";
  poke<uint32_t>(bytes, find_bytes(bytes, key) + key.size() + 4, 5);  // after the u32 type tag
  CHECK_THROWS_WITH(config_from_gguf(GgufFile::from_bytes(std::move(bytes), "mem.gguf")),
                    Catch::Contains("mem.gguf") &&
                        Catch::Contains("olmo2.attention.sliding_window_pattern has 4 values for 5 layers"));
}

TEST_CASE("gguf: a Phi-3 file's special tokens swallow the whitespace after them, as in llama.cpp", "[gguf][tokenizer]") {
  // llama.cpp's rule by general.name ("tiny-phi3"): every special token but <unk>, <s> and
  // <|endoftext|> strips the whitespace to its right. Ids from llama.cpp tokenizing the file.
  const json fx = load_json(fixture("tiny_phi3_tokenize.json"));
  const Tokenizer tok = tokenizer_from_gguf(GgufFile::open(fixture("tiny_phi3.gguf")));
  REQUIRE(fx["cases"].size() >= 4);
  for (const json& c : fx["cases"]) {
    INFO(c["text"].dump());
    CHECK(tok.encode(c["text"].get<std::string>()) == c["ids"].get<std::vector<int32_t>>());
  }
  // The same file under another name keeps the whitespace: "  b" is two more tokens there.
  std::vector<uint8_t> bytes = slurp(fixture("tiny_phi3.gguf"));
  std::memcpy(bytes.data() + find_bytes(bytes, "tiny-phi3"), "tiny-ph1x", 9);
  const Tokenizer renamed = tokenizer_from_gguf(GgufFile::from_bytes(std::move(bytes), "renamed.gguf"));
  const std::vector<int32_t> stripped = tok.encode("a</s>  b"), kept = renamed.encode("a</s>  b");
  CHECK(kept.size() > stripped.size());
  CHECK(std::vector<int32_t>(kept.begin(), kept.begin() + 2) == std::vector<int32_t>(stripped.begin(), stripped.begin() + 2));
}

TEST_CASE("gguf: a malformed rope_freqs.weight is refused naming it", "[gguf]") {
  std::vector<uint8_t> bytes = slurp(fixture("tiny_llama3_rope_freqs.gguf"));
  const size_t at = tensor_info_pos(bytes, "rope_freqs.weight");
  poke<uint64_t>(bytes, at + 4, 7);  // ne[0]: 7 factors instead of head_dim / 2 = 8
  GgufFile f = GgufFile::from_bytes(std::move(bytes), "mem.gguf");
  CHECK_THROWS_WITH(config_from_gguf(f), Catch::Contains("rope_freqs.weight") && Catch::Contains("rope.dimension_count / 2 = 8"));
}

TEST_CASE("gguf: a bias the forward pass has no place for is refused, not dropped", "[gguf]") {
  std::vector<uint8_t> bytes = slurp(fixture("tiny_qwen2.gguf"));
  const size_t at = find_bytes(bytes, "blk.0.attn_v.bias");
  std::memcpy(bytes.data() + at, "blk.0.ffn_up.bias", 17);  // same length: the file stays valid
  GgufFile f = GgufFile::from_bytes(std::move(bytes), "mem.gguf");
  CHECK_THROWS_WITH(make_gguf_source(f), Catch::Contains("unexpected tensor 'blk.0.ffn_up.bias' for a qwen2 model"));
}

TEST_CASE("gguf: llama mapping refuses other architectures", "[gguf]") {
  GgufFile f = GgufFile::open(fixture("synth_meta.gguf"));
  CHECK_THROWS_WITH(config_from_gguf(f), Catch::Contains("synthetic") && Catch::Contains("supported: llama, qwen2"));
  CHECK_THROWS_WITH(make_gguf_source(f), Catch::Contains("architecture"));
  CHECK_THROWS_WITH(tokenizer_from_gguf(f), Catch::Contains("tokenizer.ggml.model"));
}

namespace {

// A GGUF v3 file of metadata only: (key, type, value bytes) per entry, as the spec lays them out.
std::vector<uint8_t> metadata_only_gguf(const std::vector<std::tuple<std::string, uint32_t, std::vector<uint8_t>>>& kvs) {
  std::vector<uint8_t> b = {'G', 'G', 'U', 'F'};
  auto put = [&b](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  };
  put(uint32_t(3));
  put(uint64_t(0));  // tensors
  put(uint64_t(kvs.size()));
  for (const auto& [key, type, value] : kvs) {
    put(uint64_t(key.size()));
    b.insert(b.end(), key.begin(), key.end());
    put(type);
    b.insert(b.end(), value.begin(), value.end());
  }
  b.resize((b.size() + 31) / 32 * 32, 0);
  return b;
}

template <class T>
std::vector<uint8_t> value_bytes(T v) {
  std::vector<uint8_t> b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

// A GGUF string value: its u64 length, then its bytes.
std::vector<uint8_t> string_bytes(const std::string& s) {
  std::vector<uint8_t> b = value_bytes(uint64_t(s.size()));
  b.insert(b.end(), s.begin(), s.end());
  return b;
}

}  // namespace

TEST_CASE("gguf: general.sampling.* are the file's recommended sampling settings, as llama.cpp reads them", "[gguf]") {
  constexpr uint32_t kU32 = 4, kI32 = 5, kF32 = 6;
  const GgufFile f = GgufFile::from_bytes(metadata_only_gguf({{"general.sampling.temp", kF32, value_bytes(0.6f)},
                                                               {"general.sampling.top_k", kI32, value_bytes(int32_t(20))},
                                                               {"general.sampling.top_p", kF32, value_bytes(0.95f)},
                                                               {"general.sampling.min_p", kF32, value_bytes(0.05f)},
                                                               {"general.sampling.penalty_repeat", kF32, value_bytes(1.1f)}}),
                                          "sampling.gguf");
  const RecommendedSampling r = recommended_sampling_from_gguf(f);
  CHECK(r.temperature == 0.6f);
  CHECK(r.top_k == 20);
  CHECK(r.top_p == 0.95f);
  CHECK(r.min_p == 0.05f);
  CHECK(r.repetition_penalty == 1.1f);
  CHECK_FALSE(r.max_new_tokens);
  CHECK(r.source == "sampling.gguf");
  CHECK(recommended_sampling_from_gguf(GgufFile::open(fixture("tiny_llama.gguf"))).empty());
  CHECK(recommended_sampling_from_gguf(GgufFile::from_bytes(
                                           metadata_only_gguf({{"general.sampling.top_k", kU32, value_bytes(uint32_t(0))}})))
            .top_k == 0);
  CHECK_THROWS_WITH(recommended_sampling_from_gguf(GgufFile::from_bytes(
                        metadata_only_gguf({{"general.sampling.top_p", kF32, value_bytes(1.5f)}}), "bad.gguf")),
                    Catch::Contains("bad.gguf") && Catch::Contains("general.sampling.top_p"));
  CHECK_THROWS_WITH(recommended_sampling_from_gguf(GgufFile::from_bytes(
                        metadata_only_gguf({{"general.sampling.temp", kF32, value_bytes(-1.0f)}}), "bad.gguf")),
                    Catch::Contains("bad.gguf") && Catch::Contains("general.sampling.temp"));
}

TEST_CASE("gguf: tokenizer metadata of the tiny llama", "[gguf]") {
  GgufFile f = GgufFile::open(fixture("tiny_llama.gguf"));
  Tokenizer tok = tokenizer_from_gguf(f);
  CHECK(tok.vocab_size() == 40);
  CHECK(tok.token_id("<s>") == 0);
  CHECK(tok.is_special(1));
  CHECK_FALSE(tok.is_special(5));
}

TEST_CASE("gguf: each byte-level pre-tokenizer name splits text as llama.cpp does", "[gguf][tokenizer]") {
  // bpe_pre_vocab.json's merges cross every boundary a regex draws, so GPT-2's, LLaMA-3's, Qwen2's
  // (one digit a piece), SmolLM's (digits split off first) and gpt-4o's (o200k: words cut at case
  // changes, contractions kept on the word) give different ids; llama.cpp's are the expected ones.
  const json fx = load_json(fixture("bpe_pre_cases.json"));
  const json tj = load_json(fixture(fx["tokenizer"].get<std::string>()));
  std::vector<std::string> tokens(tj["model"]["vocab"].size());
  for (const auto& [token, id] : tj["model"]["vocab"].items()) tokens.at(id.get<size_t>()) = token;
  std::vector<std::string> merges;
  for (const json& m : tj["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  std::vector<AddedToken> added;
  for (const json& t : tj["added_tokens"]) added.push_back({t["id"].get<int>(), t["content"].get<std::string>(), true});
  REQUIRE(fx["cases"].size() == 5);
  for (const auto& [name, cases] : fx["cases"].items()) {
    INFO(name);
    const std::optional<PreTokenizer> pre = gguf_pre_tokenizer(name);
    REQUIRE(pre);
    const Tokenizer tok = Tokenizer::from_parts(tokens, merges, added, *pre, gguf_ignores_merges(name));
    REQUIRE(cases.size() > 40);
    for (const json& c : cases) {
      INFO(c["text"].dump());
      CHECK(tok.encode(c["text"].get<std::string>()) == c["ids"].get<std::vector<int32_t>>());
    }
  }
  CHECK(gguf_pre_tokenizer("gpt2") == PreTokenizer::GPT2);  // the spelling older Strata fixtures use
  CHECK(gguf_pre_tokenizer("llama3") == PreTokenizer::Llama3);
  CHECK_FALSE(gguf_pre_tokenizer("default"));
  CHECK_FALSE(gguf_pre_tokenizer("deepseek-llm"));
}

TEST_CASE("gguf: llama-bpe's whole-word tokens win over the merges as in llama.cpp, and qwen2's do not",
          "[gguf][tokenizer]") {
  // bpe_ignore_merges_cases.json (make_gguf_fixtures.py): words appended to a vocabulary as tokens
  // that its merges never build; llama.cpp's ids, equal to Hugging Face tokenizers' with
  // ignore_merges true and false.
  const json fx = load_json(fixture("bpe_ignore_merges_cases.json"));
  for (const char* name : {"llama-bpe", "qwen2"}) {
    INFO(name);
    std::string file = std::string("bpe_ignore_merges_") + name + ".gguf";
    std::replace(file.begin(), file.end(), '-', '_');
    const Tokenizer tok = tokenizer_from_gguf(GgufFile::open(fixture(file)));
    REQUIRE(fx["cases"][name].size() == 4);
    for (const json& c : fx["cases"][name]) {
      INFO(c["text"].dump());
      CHECK(tok.encode(c["text"].get<std::string>()) == c["ids"].get<std::vector<int32_t>>());
    }
  }
  CHECK(gguf_ignores_merges("glm4"));
  CHECK(gguf_ignores_merges("llama3"));
  CHECK_FALSE(gguf_ignores_merges("gpt-4o"));
  CHECK_FALSE(gguf_ignores_merges("chatglm-bpe"));
}

TEST_CASE("gguf: ChatML template rendering matches transformers", "[gguf]") {
  json ex = load_json(fixture("smollm2_hf.json"));
  ChatTemplate t = ChatTemplate::parse(ex["chat_template"].get<std::string>());
  REQUIRE(t.default_system());
  CHECK(*t.default_system() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  for (const json& c : ex["chat"]) {
    std::vector<ChatMessage> msgs;
    for (const json& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    CHECK(t.render(msgs) == c["text"].get<std::string>());
  }
  CHECK(t.render({}) == ex["chat_empty"].get<std::string>());
  CHECK(ChatTemplate::chatml().render({{"user", "x"}}, false) == "<|im_start|>user\nx<|im_end|>\n");
  const char* llama3 =
      "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
      "message['content'] | trim + '<|eot_id|>' }}{% endfor %}";
  CHECK(ChatTemplate::parse(llama3).format() == ChatFormat::Jinja);  // no BOS, no prompt: not Llama 3's
  CHECK_THROWS_WITH(ChatTemplate::parse(""), "the chat template is empty");
}

TEST_CASE("gguf: SmolLM2-135M-Instruct Q4_1 against transformers", "[gguf]") {
  const fs::path path = strata::test::require_smollm2_gguf();
  json ex = load_json(fixture("smollm2_hf.json"));
  GgufFile f = GgufFile::open(path);
  ModelConfig c = config_from_gguf(f);
  const json& hc = ex["config"];
  check_llama_config(c, hc);
  CHECK(c.head_dim == 64);
  CHECK(c.pad_id == 2);

  auto src = make_gguf_source(f);
  CHECK_FALSE(src->contains("lm_head.weight"));
  for (auto& [name, w] : ex["weights"].items()) {
    INFO(name);
    auto shape = w["shape"].get<std::vector<int64_t>>();
    REQUIRE(src->shape(name) == shape);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<float> all(static_cast<size_t>(numel));
    src->read(name, DType::F32, all.data());
    const int64_t row = shape.back();
    auto want = w["values"].get<std::vector<float>>();
    std::vector<int64_t> rows = w["rows"].is_null() ? std::vector<int64_t>{0} : w["rows"].get<std::vector<int64_t>>();
    size_t bad = 0;
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t k = 0; k < (shape.size() == 1 ? shape[0] : row); ++k) {
        float g = all[size_t(rows[r] * (shape.size() == 1 ? 0 : row) + k)], e = want[size_t(int64_t(r) * row + k)];
        if (!(std::fabs(g - e) <= 1e-6f * std::max(1.0f, std::fabs(e)))) ++bad;
      }
    CHECK(bad == 0);
  }

  Tokenizer tok = tokenizer_from_gguf(f);
  CHECK(tok.vocab_size() == 49152);
  for (const json& e : ex["encode"]) {
    INFO(e["text"].get<std::string>());
    CHECK(tok.encode(e["text"].get<std::string>()) == e["ids"].get<std::vector<int32_t>>());
  }
  ChatTemplate t = ChatTemplate::parse(f.get_string("tokenizer.chat_template"));
  for (const json& c : ex["chat"]) {
    std::vector<ChatMessage> msgs;
    for (const json& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    std::string text = t.render(msgs);
    CHECK(text == c["text"].get<std::string>());
    CHECK(tok.encode(text) == c["ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("gguf: a mixture of experts with more experts per token than experts, or no router, is refused",
          "[gguf][moe]") {
  const std::vector<uint8_t> original = slurp(fixture("tiny_mixtral.gguf"));
  {
    std::vector<uint8_t> bytes = original;
    const std::string key = "llama.expert_used_count";
    const size_t at = find_bytes(bytes, key) + key.size();
    uint32_t type = 0;
    std::memcpy(&type, bytes.data() + at, 4);
    REQUIRE(type == 4);  // GGUF uint32: the value follows
    poke<uint32_t>(bytes, at + 4, 9);
    GgufFile f = GgufFile::from_bytes(std::move(bytes), "mem.gguf");
    CHECK_THROWS_WITH(config_from_gguf(f), Catch::Contains("mem.gguf") && Catch::Contains("expert_used_count 9") &&
                                               Catch::Contains("expert_count 4"));
  }
  {
    // Each router renamed (same length, so the file stays valid): experts but no layer routes.
    std::vector<uint8_t> bytes = original;
    for (const std::string layer : {"0", "1"}) {
      const std::string name = "blk." + layer + ".ffn_gate_inp.weight", renamed = "blk." + layer + ".ffn_gate_inx.weight";
      std::memcpy(bytes.data() + find_bytes(bytes, name), renamed.data(), renamed.size());
    }
    GgufFile f = GgufFile::from_bytes(std::move(bytes), "mem.gguf");
    CHECK_THROWS_WITH(config_from_gguf(f), Catch::Contains("no layer has a router"));
  }
}

TEST_CASE("gguf: GPT-OSS without its window or expert count is refused naming the key", "[gguf][moe]") {
  const std::vector<uint8_t> original = slurp(fixture("tiny_gpt_oss.gguf"));
  // The key renamed in place (same length, so the file stays valid): as if the converter never wrote it.
  auto without = [&](const std::string& key) {
    std::vector<uint8_t> bytes = original;
    std::string renamed = key;
    renamed.back() = '~';
    std::memcpy(bytes.data() + find_bytes(bytes, key), renamed.data(), renamed.size());
    return GgufFile::from_bytes(std::move(bytes), "mem.gguf");
  };
  REQUIRE_NOTHROW(config_from_gguf(GgufFile::from_bytes(original, "mem.gguf")));
  CHECK_THROWS_WITH(config_from_gguf(without("gpt-oss.attention.sliding_window")),
                    Catch::Contains("mem.gguf") && Catch::Contains("gpt-oss without gpt-oss.attention.sliding_window"));
  CHECK_THROWS_WITH(config_from_gguf(without("gpt-oss.expert_count")),
                    Catch::Contains("mem.gguf") && Catch::Contains("gpt-oss without gpt-oss.expert_count"));
}

// Gemma 2 and 3 as llama.cpp's converter writes them (tests/fixtures/gguf/make_gemma_gguf.py): the
// expected values are transformers' on the models the files were converted from, and llama.cpp
// running each file is checked against them by the script.
TEST_CASE("gguf: Gemma 2 (soft caps, even layers sliding, norms stored as 1 + w) gives transformers' logits and tokens",
          "[gguf][model][gemma]") {
  const json exp = load_json(fixture("tiny_gemma2_expected.json"));
  ModelBundle b = open_model(fixture("tiny_gemma2.gguf").string());
  const ModelConfig& c = b.config;
  CHECK(c.mlp == MlpKind::GeGLU);
  CHECK(c.norm_plus_one);
  CHECK(c.sandwich_norms);
  CHECK_FALSE(c.qk_norm);
  CHECK(c.embed_scale == Approx(8.0));  // sqrt(hidden 64)
  CHECK(c.query_scale == 16.0f);        // head_dim: the file does not hold query_pre_attn_scalar
  CHECK(c.attn_softcap == 5.0f);
  CHECK(c.final_softcap == 10.0f);
  CHECK(c.layer_window == 8);
  CHECK(c.window_layers == std::vector<int>{0, 2});
  CHECK(c.sliding_window == 0);  // the window is the sliding layers', not the context's
  CHECK(c.max_positions == 128);
  CHECK(c.local_rope_theta == 0.0f);
  CHECK(c.tied_embeddings);
  CHECK(c.checkpoint_dtype == DType::BF16);
  CHECK(b.weights->contains("model.layers.3.pre_feedforward_layernorm.weight"));
  CHECK(b.weights->contains("model.layers.3.post_feedforward_layernorm.weight"));
  CHECK(b.weights->contains("model.layers.3.post_attention_layernorm.weight"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Gemma 3 (five layers in six sliding, local RoPE base, q/k norms) gives transformers' logits and tokens",
          "[gguf][model][gemma]") {
  const json exp = load_json(fixture("tiny_gemma3_expected.json"));
  ModelBundle b = open_model(fixture("tiny_gemma3.gguf").string());
  const ModelConfig& c = b.config;
  CHECK(c.mlp == MlpKind::GeGLU);
  CHECK(c.norm_plus_one);
  CHECK(c.qk_norm);
  CHECK(c.query_scale == 32.0f);
  CHECK(c.attn_softcap == 0.0f);
  CHECK(c.final_softcap == 0.0f);
  CHECK(c.window_layers == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(c.layer_window == 8);
  CHECK(c.rope_theta == 1000000.0f);
  CHECK(c.local_rope_theta == 10000.0f);
  CHECK(c.rope_freq_factors == std::vector<float>(16, 4.0f));  // linear scaling of the full layer only
  CHECK(b.weights->contains("model.layers.5.self_attn.q_norm.weight"));
  test::check_hf_outputs(b, exp);
}

TEST_CASE("gguf: Gemma's attention scale, window and soft caps follow llama.cpp's rules where the file is silent",
          "[gguf][gemma]") {
  constexpr uint32_t kU32 = 4, kF32 = 6, kString = 8;
  // The shape keys of a Gemma file; `extra` adds or replaces.
  auto config_of = [&](const std::string& arch, uint32_t layers, uint32_t hidden, uint32_t heads, uint32_t head_dim,
                       std::vector<std::tuple<std::string, uint32_t, std::vector<uint8_t>>> extra) {
    std::vector<std::tuple<std::string, uint32_t, std::vector<uint8_t>>> kvs = {
        {"general.architecture", kString, string_bytes(arch)},
        {arch + ".block_count", kU32, value_bytes(layers)},
        {arch + ".embedding_length", kU32, value_bytes(hidden)},
        {arch + ".feed_forward_length", kU32, value_bytes(hidden * 4)},
        {arch + ".attention.head_count", kU32, value_bytes(heads)},
        {arch + ".attention.head_count_kv", kU32, value_bytes(heads / 2)},
        {arch + ".attention.key_length", kU32, value_bytes(head_dim)},
        {arch + ".attention.value_length", kU32, value_bytes(head_dim)},
        {arch + ".context_length", kU32, value_bytes(uint32_t(8192))},
        {arch + ".attention.layer_norm_rms_epsilon", kF32, value_bytes(1e-6f)},
        {arch + ".vocab_size", kU32, value_bytes(uint32_t(256000))}};
    kvs.insert(kvs.end(), extra.begin(), extra.end());
    return config_from_gguf(GgufFile::from_bytes(metadata_only_gguf(kvs), arch + ".gguf"));
  };
  const auto window = [&](const std::string& arch, uint32_t w) {
    return std::tuple<std::string, uint32_t, std::vector<uint8_t>>(arch + ".attention.sliding_window", kU32,
                                                                   value_bytes(w));
  };
  // query_pre_attn_scalar in Google's config.json of each: Gemma 2 27B 144 (hidden 4608 / 32
  // heads), Gemma 3 27B 168 (5376 / 32), Gemma 3 12B 256 (its head_dim), Gemma 2 9B 256.
  CHECK(config_of("gemma2", 46, 4608, 32, 128, {window("gemma2", 4096)}).query_scale == 144.0f);
  CHECK(config_of("gemma3", 62, 5376, 32, 128, {window("gemma3", 1024)}).query_scale == 168.0f);
  CHECK(config_of("gemma3", 48, 3840, 16, 256, {window("gemma3", 1024)}).query_scale == 256.0f);
  const ModelConfig g2 = config_of("gemma2", 42, 3584, 16, 256, {});
  CHECK(g2.query_scale == 256.0f);
  CHECK(g2.layer_window == 4096);  // Gemma 2's default window
  CHECK(g2.attn_softcap == 50.0f);  // and soft caps (transformers' Gemma2Config, llama.cpp)
  CHECK(g2.final_softcap == 30.0f);
  CHECK(g2.window_layers.size() == 21);
  const ModelConfig g3 = config_of("gemma3", 62, 5376, 32, 128, {window("gemma3", 1024)});
  CHECK(g3.window_layers.size() == 52);  // 62 layers, every sixth full: 10 full ones
  CHECK(g3.window_layers[4] == 4);
  CHECK(g3.window_layers[5] == 6);       // 5 is full (5 % 6 == 5)
  CHECK(g3.window_layers.back() == 61);  // 59 is full, 60 and 61 slide
  CHECK(g3.final_softcap == 0.0f);
  CHECK(config_of("gemma3", 62, 5376, 32, 128, {window("gemma3", 1024),
                                                 {"gemma3.final_logit_softcapping", kF32, value_bytes(30.0f)}})
            .final_softcap == 30.0f);
  CHECK_THROWS_WITH(config_of("gemma3", 26, 1152, 4, 256, {}),
                    Catch::Contains("gemma3.gguf") && Catch::Contains("gemma3.attention.sliding_window"));
  CHECK_THROWS_WITH(config_of("gemma2", 26, 2304, 8, 256, {{"gemma2.attn_logit_softcapping", kF32, value_bytes(-1.0f)}}),
                    Catch::Contains("gemma2.attn_logit_softcapping"));
}

TEST_CASE("fuzz finding 9: a head_dim far beyond any model's is refused as it is read, not gigabytes allocated",
          "[gguf][config][fuzz]") {
  // gguf_fuzz, after about a minute from the glm4 / granite seeds: attention.key_length near 2^31
  // with YaRN scaling made yarn_freq_divisors allocate head_dim / 2 floats (8 GB) before validate()
  // bounds head_dim at 2^16. config.json's head_dim reached the same tables.
  constexpr uint32_t kU32 = 4, kF32 = 6, kString = 8;
  const uint32_t head_dim = 1u << 31;
  const std::vector<std::tuple<std::string, uint32_t, std::vector<uint8_t>>> kvs = {
      {"general.architecture", kString, string_bytes("llama")},
      {"llama.block_count", kU32, value_bytes(uint32_t(2))},
      {"llama.embedding_length", kU32, value_bytes(uint32_t(64))},
      {"llama.feed_forward_length", kU32, value_bytes(uint32_t(128))},
      {"llama.attention.head_count", kU32, value_bytes(uint32_t(4))},
      {"llama.attention.key_length", kU32, value_bytes(head_dim - 2)},
      {"llama.context_length", kU32, value_bytes(uint32_t(128))},
      {"llama.rope.scaling.type", kString, string_bytes("yarn")},
      {"llama.rope.scaling.factor", kF32, value_bytes(4.0f)},
      {"llama.vocab_size", kU32, value_bytes(uint32_t(1000))}};
  CHECK_THROWS_WITH(config_from_gguf(GgufFile::from_bytes(metadata_only_gguf(kvs), "huge.gguf")),
                    Catch::Contains("huge.gguf") && Catch::Contains("head_dim 2147483646 is above the limit of 65536"));
  const json cfg = {{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 128},
                    {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"head_dim", 1 << 30},
                    {"vocab_size", 1000}, {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}};
  CHECK_THROWS_WITH(config_from_hf_json_text(cfg.dump(), "huge/config.json"),
                    Catch::Contains("huge/config.json") &&
                        Catch::Contains("config field head_dim is 1073741824, above the limit of 65536"));
}
