// Safetensors reader: values of the HF-made fixture models (single file and sharded) against
// numbers the Python safetensors package read, dtype conversion from hand-made F16/BF16 files,
// and one test per kind of corruption checking the error names the problem.
#include "test_paths.h"
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/model/safetensors.h"
#include "strata/model/weight_source.h"
#include "temp_files.h"

namespace fs = std::filesystem;
using nlohmann::json;
using strata::DType;

namespace {

const fs::path kModels = fs::path(STRATA_FIXTURES_DIR) / "models";

json load_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  return json::parse(in);
}

// A fresh scratch directory per test case.
fs::path scratch(const std::string& name) {
  fs::path d = strata::test::temp_dir("st") / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// Builds a safetensors file: 8-byte little-endian header length, header, data.
std::string st_bytes(const std::string& header, const std::string& data, uint64_t len_override = 0) {
  uint64_t n = len_override ? len_override : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string u16_bytes(const std::vector<uint16_t>& v) {
  std::string s;
  for (uint16_t x : v) s += {char(x & 0xff), char(x >> 8)};
  return s;
}

std::string f32_bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// Checks every spot tensor of a fixture model: shape, file, first/last values exactly (float32
// values stored as doubles round-trip exactly) and the sum.
void check_spot_values(const fs::path& open_path, const fs::path& model_dir) {
  const json spots = load_json(model_dir / "spot_values.json");
  strata::SafetensorsSet set = strata::SafetensorsSet::open(open_path);
  REQUIRE(set.names().size() == spots["num_tensors"].get<size_t>());
  auto src = strata::make_safetensors_source(open_path);
  REQUIRE(src->names() == set.names());
  for (const auto& [name, t] : spots["tensors"].items()) {
    INFO(name);
    REQUIRE(set.contains(name));
    const strata::SafetensorsEntry& e = set.get(name);
    CHECK(e.dtype == DType::F32);
    CHECK(e.shape == t["shape"].get<std::vector<int64_t>>());
    CHECK(e.file.filename() == t["file"].get<std::string>());
    CHECK(src->shape(name) == e.shape);

    const size_t n = e.nbytes / 4;
    std::vector<float> v(n);
    src->read(name, DType::F32, v.data());
    const auto first = t["first"].get<std::vector<double>>();
    for (size_t i = 0; i < first.size(); ++i) CHECK(v[i] == float(first[i]));
    CHECK(v[n - 1] == float(t["last"].get<double>()));
    double sum = 0;
    for (float x : v) sum += x;
    CHECK(sum == Approx(t["sum"].get<double>()).margin(1e-4));

    std::vector<uint16_t> h(n);
    src->read(name, DType::F16, h.data());
    CHECK(h[0] == strata::float_to_half(v[0]));
    src->read(name, DType::BF16, h.data());
    CHECK(h[n - 1] == strata::float_to_bf16(v[n - 1]));
  }
}

}  // namespace

TEST_CASE("safetensors: single-file fixture model matches the safetensors package", "[safetensors]") {
  check_spot_values(kModels / "tiny-opt", kModels / "tiny-opt");
  check_spot_values(kModels / "tiny-opt" / "model.safetensors", kModels / "tiny-opt");
  check_spot_values(kModels / "tiny-qwen2", kModels / "tiny-qwen2");
  // Tied embeddings: HF stores no lm_head for OPT.
  auto src = strata::make_safetensors_source(kModels / "tiny-opt");
  CHECK_FALSE(src->contains("lm_head.weight"));
  CHECK(src->shape("model.decoder.embed_tokens.weight") == std::vector<int64_t>{1000, 72});
  CHECK_THAT(src->describe(), Catch::Contains("tiny-opt"));
}

TEST_CASE("safetensors: sharded fixture model through its index", "[safetensors]") {
  const fs::path dir = kModels / "tiny-llama";
  check_spot_values(dir, dir);
  check_spot_values(dir / "model.safetensors.index.json", dir);
  strata::SafetensorsSet set = strata::SafetensorsSet::open(dir);
  const json index = load_json(dir / "model.safetensors.index.json");
  REQUIRE(set.names().size() == index["weight_map"].size());
  for (const auto& [name, file] : index["weight_map"].items())
    CHECK(set.get(name).file.filename() == file.get<std::string>());
  CHECK(set.get("lm_head.weight").shape == std::vector<int64_t>{1000, 120});
  REQUIRE_THROWS_WITH(set.get("model.layers.9.mlp.up_proj.weight"),
                      Catch::Contains("missing tensor 'model.layers.9.mlp.up_proj.weight'"));
}

TEST_CASE("safetensors: F16 and BF16 are converted on read", "[safetensors]") {
  const fs::path d = scratch("convert");
  // 1, -2, 0.5, 65504 (largest half), 2^-24 (smallest subnormal half), -0.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000};
  const std::vector<float> f16_val = {1.0f, -2.0f, 0.5f, 65504.0f, 5.9604645e-8f, -0.0f};
  // 1, -2, 3.140625, 1e38-ish (0x7E96 = 9.969e37), smallest normal bf16 (0x0080).
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x4049, 0x7E96, 0x0080};
  const std::vector<float> bf16_val = {1.0f, -2.0f, 3.140625f, strata::bf16_to_float(0x7E96), 1.17549435e-38f};
  const std::string data = u16_bytes(f16) + u16_bytes(bf16) + f32_bytes({1.5f, -0.25f});
  // An odd-length header misaligns the data area: the reader must cope.
  for (std::string pad : {"", " "}) {
    const std::string header = R"({"__metadata__":{"format":"pt"},)"
                               R"("h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
                               R"("b":{"dtype":"BF16","shape":[5],"data_offsets":[12,22]},)"
                               R"("f":{"dtype":"F32","shape":[2],"data_offsets":[22,30]},)"
                               R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[30,30]}})" + pad;
    write_bytes(d / "x.safetensors", st_bytes(header, data));
    auto src = strata::make_safetensors_source(d / "x.safetensors");
    CHECK(src->names() == std::vector<std::string>{"b", "empty", "f", "h"});
    CHECK(src->shape("h") == std::vector<int64_t>{2, 3});
    CHECK(src->shape("empty") == std::vector<int64_t>{0, 4});

    std::vector<float> out(6);
    src->read("h", DType::F32, out.data());
    CHECK(out == f16_val);
    CHECK(std::signbit(out[5]));
    src->read("b", DType::F32, out.data());
    CHECK(std::vector<float>(out.begin(), out.begin() + 5) == bf16_val);
    src->read("f", DType::F32, out.data());
    CHECK(out[0] == 1.5f);
    CHECK(out[1] == -0.25f);

    std::vector<uint16_t> h(6);
    src->read("h", DType::F16, h.data());  // same dtype: a copy
    CHECK(h == f16);
    src->read("b", DType::F16, h.data());
    CHECK(h[0] == 0x3C00);
    CHECK(h[2] == strata::float_to_half(3.140625f));
    src->read("f", DType::BF16, h.data());
    CHECK(h[0] == 0x3FC0);
    CHECK(h[1] == 0xBE80);
    REQUIRE_THROWS_WITH(src->read("f", DType::I32, out.data()), Catch::Contains("cannot be read as I32"));
  }
}

TEST_CASE("safetensors: corrupt files are refused with a message naming the problem", "[safetensors]") {
  const fs::path d = scratch("corrupt");
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string good_data = f32_bytes({1, 2, 3, 4});
  auto open_with = [&](const std::string& bytes) {
    write_bytes(d / "model.safetensors", bytes);
    return strata::SafetensorsSet::open(d / "model.safetensors");
  };
  REQUIRE(open_with(st_bytes(good_header, good_data)).get("w").nbytes == 16);

  SECTION("too short for the header length") {
    REQUIRE_THROWS_WITH(open_with(std::string("\x05\x00\x00", 3)), Catch::Contains("model.safetensors: file is 3 bytes"));
    REQUIRE_THROWS_WITH(open_with(""), Catch::Contains("too short"));
  }
  SECTION("truncated data") {
    const std::string full = st_bytes(good_header, good_data);
    REQUIRE_THROWS_WITH(open_with(full.substr(0, full.size() - 5)),
                        Catch::Contains("tensor 'w' data_offsets [0, 16] exceed the data area of 11 bytes"));
  }
  SECTION("truncated header") {
    const std::string full = st_bytes(good_header, "");
    REQUIRE_THROWS_WITH(open_with(full.substr(0, 20)), Catch::Contains("exceeds file size 20"));
  }
  SECTION("header length too big") {
    REQUIRE_THROWS_WITH(open_with(st_bytes(good_header, good_data, 9999999999ull)),
                        Catch::Contains("header length 9999999999 exceeds file size"));
    // Within the file but over the 100 MB cap: a sparse file keeps this cheap.
    {
      std::ofstream out(d / "model.safetensors", std::ios::binary);
      std::string len = st_bytes("", "", 200ull << 20);
      out.write(len.data(), 8);
      out.seekp((200ll << 20) + 8 + 100);
      out.put('\0');
    }
    REQUIRE_THROWS_WITH(strata::SafetensorsSet::open(d / "model.safetensors"),
                        Catch::Contains("header length 209715200 exceeds the limit"));
  }
  SECTION("offsets past the end") {
    const std::string h = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})";
    REQUIRE_THROWS_WITH(open_with(st_bytes(h, good_data)),
                        Catch::Contains("model.safetensors: tensor 'w' data_offsets [8, 24] exceed the data area of 16 bytes"));
    const std::string rev = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})";
    REQUIRE_THROWS_WITH(open_with(st_bytes(rev, good_data)), Catch::Contains("data_offsets [8, 4] exceed"));
  }
  SECTION("size does not match dtype x shape") {
    const std::string h = R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})";
    REQUIRE_THROWS_WITH(open_with(st_bytes(h, good_data)),
                        Catch::Contains("tensor 'w' data_offsets [0, 16] hold 16 bytes but F32 x [3, 2] needs 24"));
    const std::string big = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})";
    REQUIRE_THROWS_WITH(open_with(st_bytes(big, good_data)), Catch::Contains("overflows"));
    const std::string neg = R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})";
    REQUIRE_THROWS_WITH(open_with(st_bytes(neg, good_data)), Catch::Contains("tensor 'w' shape has a negative dimension -1"));
  }
  SECTION("bad JSON") {
    REQUIRE_THROWS_WITH(open_with(st_bytes(R"({"w":{"dtype":"F32",)", good_data)),
                        Catch::Contains("model.safetensors: header is not valid JSON"));
    REQUIRE_THROWS_WITH(open_with(st_bytes("[1,2]", good_data)), Catch::Contains("header is not a JSON object"));
    REQUIRE_THROWS_WITH(open_with(st_bytes(R"({"w":{"dtype":"F32","shape":[4]}})", good_data)),
                        Catch::Contains("tensor 'w' has no 'data_offsets' pair"));
    REQUIRE_THROWS_WITH(open_with(st_bytes(R"({"w":{"shape":[4],"data_offsets":[0,16]}})", good_data)),
                        Catch::Contains("tensor 'w' has no string 'dtype'"));
  }
  SECTION("unknown dtype") {
    const std::string h = R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})";
    REQUIRE_THROWS_WITH(open_with(st_bytes(h, good_data)),
                        Catch::Contains("tensor 'w' has unsupported dtype I64"));
  }
  SECTION("missing file or model") {
    REQUIRE_THROWS_WITH(strata::SafetensorsSet::open(d / "nope.safetensors"),
                        Catch::Contains("nope.safetensors: cannot open"));
    const fs::path empty = scratch("empty_dir");
    REQUIRE_THROWS_WITH(strata::SafetensorsSet::open(empty),
                        Catch::Contains("neither model.safetensors nor model.safetensors.index.json"));
  }
}

TEST_CASE("safetensors: broken shard indexes are refused", "[safetensors]") {
  const fs::path d = scratch("shards");
  write_bytes(d / "a.safetensors", st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                            f32_bytes({1, 2, 3, 4})));
  write_bytes(d / "b.safetensors", st_bytes(R"({"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                            f32_bytes({5})));
  auto open_index = [&](const std::string& weight_map) {
    write_bytes(d / "model.safetensors.index.json", R"({"metadata":{},"weight_map":)" + weight_map + "}");
    return strata::SafetensorsSet::open(d);
  };
  strata::SafetensorsSet ok = open_index(R"({"w":"a.safetensors","v":"b.safetensors"})");
  CHECK(ok.names() == std::vector<std::string>{"v", "w"});
  float v = 0;
  std::memcpy(&v, ok.get("v").data, 4);  // the data area need not be aligned
  CHECK(v == 5.0f);

  REQUIRE_THROWS_WITH(open_index(R"({"w":"a.safetensors","v":"c.safetensors"})"),
                      Catch::Contains("shard file 'c.safetensors' is missing"));
  REQUIRE_THROWS_WITH(open_index(R"({"w":"b.safetensors","v":"b.safetensors"})"),
                      Catch::Contains("puts tensor 'w' in 'b.safetensors', which does not hold it"));
  write_bytes(d / "c.safetensors", st_bytes(R"({"u":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                            R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                            f32_bytes({6, 7})));
  REQUIRE_THROWS_WITH(open_index(R"({"w":"a.safetensors","u":"c.safetensors"})"),
                      Catch::Contains("c.safetensors: tensor 't' is not listed in model.safetensors.index.json"));
  REQUIRE_THROWS_WITH(open_index(R"({"w":"../a.safetensors"})"),  // standalone: input
                      Catch::Contains("outside the model directory"));
  REQUIRE_THROWS_WITH(open_index("[]"), Catch::Contains("no 'weight_map' object"));
  write_bytes(d / "model.safetensors.index.json", "{not json");
  REQUIRE_THROWS_WITH(strata::SafetensorsSet::open(d), Catch::Contains("model.safetensors.index.json: not valid JSON"));
}
