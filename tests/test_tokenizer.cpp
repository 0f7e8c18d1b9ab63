// Byte-level BPE tokenizer against golden ids and strings from Hugging Face tokenizers
// (tests/fixtures/tokenizer/make_tokenizer_fixtures.py writes them).
#include "test_paths.h"
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "strata/core/error.h"
#include "strata/model/tokenizer.h"

namespace fs = std::filesystem;
using strata::Tokenizer;

namespace {

const fs::path kFixtures = fs::path(STRATA_FIXTURES_DIR) / "tokenizer";
const fs::path kGpt2Dir = kFixtures / "gpt2";
const fs::path kLlama3Json = kFixtures / "llama3-style" / "tokenizer.json";
const fs::path kO200kJson = kFixtures / "o200k-style" / "tokenizer.json";

nlohmann::json load_json(const fs::path& file) {
  std::ifstream in(file);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// GPT-2 takes a while to load in a Debug build, so the tests share one copy (encode is const).
const Tokenizer& gpt2() {
  static const Tokenizer tok = Tokenizer::from_tokenizer_json(kGpt2Dir / "tokenizer.json");
  return tok;
}

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

void check_encode_cases(const Tokenizer& tok, const nlohmann::json& cases) {
  REQUIRE(cases.size() > 10);
  for (const auto& c : cases) {
    std::string text = c.at("text").get<std::string>();
    INFO("text: " << nlohmann::json(text).dump());
    CHECK(tok.encode(text) == ids_of(c.at("ids")));
  }
}

void check_round_trip(const Tokenizer& tok, const nlohmann::json& cases) {
  for (const auto& c : cases) {
    std::string text = c.at("text").get<std::string>();
    // lstrip/rstrip tokens swallow the whitespace next to them, in HF too.
    if (text.find("<|fim|>") != std::string::npos || text.find("<|sep|>") != std::string::npos) continue;
    INFO("text: " << nlohmann::json(text).dump());
    CHECK(tok.decode(tok.encode(text)) == text);
  }
}

void check_decode_cases(const Tokenizer& tok, const nlohmann::json& cases) {
  REQUIRE(!cases.empty());
  for (const auto& c : cases) {
    std::vector<int32_t> ids = ids_of(c.at("ids"));
    bool skip = c.at("skip_special").get<bool>();
    INFO("ids: " << c.at("ids").dump() << " skip_special " << skip);
    CHECK(tok.decode(ids, skip) == c.at("text").get<std::string>());
  }
}

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("strata_tokenizer_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "(no strata::Error thrown)";
}

// A tiny but valid tokenizer.json with the given pre_tokenizer and model fields patched in.
std::string tiny_tokenizer_json(const std::string& model_type, const std::string& merges,
                                const std::string& pre_tokenizer) {
  return R"({"added_tokens": [], "normalizer": null, "pre_tokenizer": )" + pre_tokenizer +
         R"(, "decoder": {"type": "ByteLevel"}, "model": {"type": ")" + model_type +
         R"(", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": )" + merges + "}}";
}

}  // namespace

TEST_CASE("GPT-2 tokenizer.json encodes exactly as Hugging Face", "[tokenizer]") {
  auto cases = load_json(kFixtures / "gpt2_cases.json");
  const Tokenizer& tok = gpt2();
  check_encode_cases(tok, cases["cases"]);
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.token_id("<|endoftext|>") == 50256);
  CHECK(tok.token_id("Hello") == 15496);
  CHECK_FALSE(tok.token_id("no such token").has_value());
  CHECK(tok.is_special(50256));
  CHECK_FALSE(tok.is_special(15496));
}

TEST_CASE("GPT-2 vocab.json + merges.txt gives the same ids as tokenizer.json", "[tokenizer]") {
  auto cases = load_json(kFixtures / "gpt2_cases.json");
  Tokenizer tok = Tokenizer::from_vocab_merges(kGpt2Dir / "vocab.json", kGpt2Dir / "merges.txt");
  check_encode_cases(tok, cases["cases"]);
  CHECK(tok.is_special(50256));
}

TEST_CASE("from_dir prefers tokenizer.json", "[tokenizer]") {
  Tokenizer tok = Tokenizer::from_dir(kGpt2Dir);
  CHECK(tok.encode("Hello world") == std::vector<int32_t>{15496, 995});
}

TEST_CASE("LLaMA-3-style Split + ByteLevel tokenizer encodes exactly as Hugging Face", "[tokenizer]") {
  auto cases = load_json(kFixtures / "llama3_cases.json");
  Tokenizer tok = Tokenizer::from_tokenizer_json(kLlama3Json);
  check_encode_cases(tok, cases["cases"]);
  CHECK(tok.is_special(*tok.token_id("<|im_end|>")));
}

// GPT-OSS's o200k_harmony shape: o200k's split (letters by case class, marks with them,
// case-insensitive contractions, '/' kept with punctuation) and harmony's special tokens.
TEST_CASE("o200k-style Split + ByteLevel tokenizer encodes and decodes exactly as Hugging Face", "[tokenizer]") {
  const auto cases = load_json(kFixtures / "o200k_cases.json");
  Tokenizer tok = Tokenizer::from_tokenizer_json(kO200kJson);
  check_encode_cases(tok, cases["cases"]);
  check_round_trip(tok, cases["cases"]);
  check_decode_cases(tok, cases["decode_cases"]);
  CHECK(tok.is_special(*tok.token_id("<|return|>")));
}

TEST_CASE("decode(encode(text)) gives the text back", "[tokenizer]") {
  check_round_trip(gpt2(), load_json(kFixtures / "gpt2_cases.json")["cases"]);
  check_round_trip(Tokenizer::from_tokenizer_json(kLlama3Json), load_json(kFixtures / "llama3_cases.json")["cases"]);
}

TEST_CASE("decode matches Hugging Face, including UTF-8 cut between tokens", "[tokenizer]") {
  check_decode_cases(gpt2(), load_json(kFixtures / "gpt2_cases.json")["decode_cases"]);
  check_decode_cases(Tokenizer::from_tokenizer_json(kLlama3Json),
                     load_json(kFixtures / "llama3_cases.json")["decode_cases"]);
}

TEST_CASE("from_parts with GPT-2's vocab and merges matches Hugging Face", "[tokenizer]") {
  auto vocab = load_json(kGpt2Dir / "vocab.json");
  std::vector<std::string> tokens(vocab.size());
  for (const auto& [token, id] : vocab.items()) tokens.at(id.get<size_t>()) = token;
  std::vector<std::string> merges;
  std::ifstream in(kGpt2Dir / "merges.txt");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && !line.starts_with("#version")) merges.push_back(line);
  }
  Tokenizer tok = Tokenizer::from_parts(tokens, merges, {{50256, "<|endoftext|>", true}}, strata::PreTokenizer::GPT2);
  check_encode_cases(tok, load_json(kFixtures / "gpt2_cases.json")["cases"]);
}

TEST_CASE("from_parts with the LLaMA-3 pattern matches Hugging Face", "[tokenizer]") {
  auto j = load_json(kLlama3Json);
  std::vector<std::string> tokens(j["model"]["vocab"].size());
  for (const auto& [token, id] : j["model"]["vocab"].items()) tokens.at(id.get<size_t>()) = token;
  std::vector<std::string> merges;
  for (const auto& m : j["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  std::vector<strata::AddedToken> added;
  for (const auto& a : j["added_tokens"]) added.push_back({a["id"], a["content"], a["special"]});
  Tokenizer tok = Tokenizer::from_parts(tokens, merges, added, strata::PreTokenizer::Llama3, /*ignore_merges=*/true);
  const auto cases = load_json(kFixtures / "llama3_cases.json");
  for (const auto& c : cases["cases"]) {
    std::string text = c["text"];
    // AddedToken carries no lstrip/rstrip, so the cases built on those options do not apply.
    if (text.find("<|fim|>") != std::string::npos || text.find("<|sep|>") != std::string::npos) continue;
    INFO("text: " << c["text"].dump());
    CHECK(tok.encode(text) == ids_of(c["ids"]));
  }
}

TEST_CASE("bytes_only maps each byte to its own id and back", "[tokenizer]") {
  Tokenizer tok = Tokenizer::bytes_only();
  CHECK(tok.vocab_size() == 256);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += char(b);
  std::vector<int32_t> ids = tok.encode(all_bytes);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[b] == b);
  std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80 ok";
  CHECK(tok.decode(tok.encode(text)) == text);
  CHECK(tok.decode(std::vector<int32_t>{0x61, 0xFF, 0x62}) == "a\xEF\xBF\xBD" "b");  // invalid byte -> U+FFFD
}

TEST_CASE("invalid UTF-8 input is refused with a clear error", "[tokenizer]") {
  const Tokenizer& tok = gpt2();
  std::string msg = error_of([&] { tok.encode("ok \xC3("); });
  CHECK_THAT(msg, Catch::Contains("not valid UTF-8") && Catch::Contains("offset 3"));
}

TEST_CASE("random text and random ids neither crash nor lose text", "[tokenizer]") {
  const Tokenizer llama3 = Tokenizer::from_tokenizer_json(kLlama3Json);
  std::mt19937 rng(1234);
  // Code points from the ranges the pre-tokenizer regexes care about: ASCII, whitespace, Latin,
  // combining marks, CJK, emoji, and the whole of Unicode.
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x00, 0x7F}, {0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0x24F}, {0x300, 0x36F}, {0x4E00, 0x4FFF}, {0x1F300, 0x1F6FF},
      {0x80, 0xD7FF}, {0xE000, 0x10FFFF}};
  auto append_utf8 = [](std::string& s, char32_t cp) {
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
    } else {
      s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F)), s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    }
  };
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      auto [lo, hi] = ranges[rng() % ranges.size()];
      append_utf8(text, lo + char32_t(rng() % (hi - lo + 1)));
    }
    INFO("text: " << nlohmann::json(text).dump());
    CHECK(gpt2().decode(gpt2().encode(text)) == text);
    CHECK(llama3.decode(llama3.encode(text)) == text);

    // Random bytes: valid UTF-8 or a strata::Error, never a crash.
    std::string bytes;
    for (int i = 0; i < n; ++i) bytes += char(rng() % 256);
    std::optional<std::vector<int32_t>> byte_ids;
    try {
      byte_ids = gpt2().encode(bytes);
    } catch (const strata::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("not valid UTF-8"));
    }
    if (byte_ids) CHECK(gpt2().decode(*byte_ids) == bytes);

    // Random ids (some out of range) decode to valid UTF-8, which encode accepts.
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(int32_t(rng() % 51000) - 100);
    CHECK_NOTHROW(gpt2().encode(gpt2().decode(ids)));
  }
}

TEST_CASE("encode is safe to call from several threads", "[tokenizer]") {
  Tokenizer tok = Tokenizer::from_tokenizer_json(kLlama3Json);
  auto cases = load_json(kFixtures / "llama3_cases.json")["cases"];
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        for (const auto& c : cases) {
          if (tok.encode(c["text"].get<std::string>()) != ids_of(c["ids"])) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == 0);
}

TEST_CASE("tokenizer loading errors name the file and the problem", "[tokenizer]") {
  TempDir dir;
  const std::string byte_level = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";

  SECTION("missing file") {
    std::string msg = error_of([&] { Tokenizer::from_tokenizer_json(dir.path / "nope.json"); });
    CHECK_THAT(msg, Catch::Contains("nope.json") && Catch::Contains("does not exist"));
    msg = error_of([&] { Tokenizer::from_dir(dir.path); });
    CHECK_THAT(msg, Catch::Contains("neither tokenizer.json nor vocab.json"));
  }
  SECTION("malformed JSON") {
    auto file = dir.write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {)");
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("tokenizer.json") && Catch::Contains("not valid JSON"));
  }
  SECTION("a valid tiny file loads") {
    auto file = dir.write("tokenizer.json", tiny_tokenizer_json("BPE", R"(["a b"])", byte_level));
    CHECK(Tokenizer::from_tokenizer_json(file).encode("ab") == std::vector<int32_t>{2});
  }
  SECTION("unknown model type") {
    auto file = dir.write("tokenizer.json", tiny_tokenizer_json("WordPiece", "[]", byte_level));
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("tokenizer.json") && Catch::Contains("model.type is 'WordPiece'"));
  }
  SECTION("merge with a token missing from the vocab") {
    auto file = dir.write("tokenizer.json", tiny_tokenizer_json("BPE", R"([["a", "b"], ["a", "zz"]])", byte_level));
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("model.merges[1]") && Catch::Contains("'zz'") && Catch::Contains("not in the vocab"));
  }
  SECTION("unsupported pre-tokenizer") {
    auto file = dir.write("tokenizer.json", tiny_tokenizer_json("BPE", "[]", R"({"type": "Whitespace"})"));
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("tokenizer.json") && Catch::Contains("pre_tokenizer.type is 'Whitespace'"));
    file = dir.write("tokenizer.json",
                     tiny_tokenizer_json("BPE", "[]", R"({"type": "Metaspace", "replacement": "_"})"));
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("tokenizer.json") && Catch::Contains("pre_tokenizer.replacement is \"_\""));
  }
  SECTION("unsupported Split behavior") {
    auto file = dir.write("tokenizer.json", tiny_tokenizer_json("BPE", "[]",
        R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed",
            "invert": false}, {"type": "ByteLevel", "use_regex": false}]})"));
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("pre_tokenizer.pretokenizers[0].behavior is 'Removed'"));
  }
  SECTION("bad regex") {
    auto file = dir.write("tokenizer.json", tiny_tokenizer_json("BPE", "[]",
        R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated",
            "invert": false}, {"type": "ByteLevel", "use_regex": false}]})"));
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("pre_tokenizer.pretokenizers[0].pattern") && Catch::Contains("cannot compile"));
  }
  SECTION("wrong JSON type for an id") {
    auto file = dir.write("tokenizer.json", R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE",
        "vocab": {"a": "zero"}, "merges": []}})");
    CHECK_THAT(error_of([&] { Tokenizer::from_tokenizer_json(file); }),
               Catch::Contains("token 'a'") && Catch::Contains("non-negative integers"));
  }
  SECTION("merges.txt line with an unknown token") {
    auto vocab = dir.write("vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
    auto merges = dir.write("merges.txt", "#version: 0.2\na b\nb c\n");
    CHECK_THAT(error_of([&] { Tokenizer::from_vocab_merges(vocab, merges); }),
               Catch::Contains("merges.txt") && Catch::Contains("line 3") && Catch::Contains("'c'"));
  }
}

// SentencePiece-style BPE (LLaMA-2, Mistral, TinyLlama, Gemma): four small tokenizers of the shapes
// Hugging Face writes, with ids and decodings from Hugging Face tokenizers
// (tests/fixtures/tokenizer/make_sentencepiece_fixtures.py).
TEST_CASE("SentencePiece-style tokenizer.json files encode and decode exactly as Hugging Face", "[tokenizer]") {
  const nlohmann::json all = load_json(kFixtures / "sentencepiece_cases.json");
  REQUIRE(all.size() == 4);
  for (const auto& [name, fixture] : all.items()) {
    INFO(name);
    const Tokenizer tok = Tokenizer::from_tokenizer_json(kFixtures / fixture["tokenizer"].get<std::string>());
    check_encode_cases(tok, fixture["cases"]);
    for (const auto& c : fixture["cases"]) {
      const std::vector<int32_t> ids = ids_of(c["ids"]);
      INFO("text: " << c["text"].dump());
      CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
      CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
    }
    check_decode_cases(tok, fixture["decode_cases"]);
  }
}

TEST_CASE("SentencePiece-style tokenizers: byte tokens, specials and spaces as the decoder writes them",
          "[tokenizer]") {
  const Tokenizer tok = Tokenizer::from_tokenizer_json(kFixtures / "sp-normalizer" / "tokenizer.json");
  // The pieces text is made of (stop strings and logprobs use them): a real space for the
  // "\u2581", the byte of a <0xXX> token, a special token's own text.
  const std::optional<int> byte_a = tok.token_id("<0x41>"), s = tok.token_id("<s>");
  REQUIRE(byte_a);
  REQUIRE(s);
  CHECK(tok.token_bytes(*byte_a) == "A");
  CHECK(tok.token_bytes(*s) == "<s>");
  CHECK(tok.is_special(*s));
  for (const char* piece : {"\u2581the", "\u2581"}) {
    const std::optional<int> id = tok.token_id(piece);
    if (!id) continue;
    CHECK(tok.token_bytes(*id).front() == ' ');
  }
}

TEST_CASE("SentencePiece-style tokenizer.json shapes Strata cannot match are refused", "[tokenizer]") {
  TempDir dir;
  nlohmann::json j = load_json(kFixtures / "sp-normalizer" / "tokenizer.json");
  auto refused = [&](const nlohmann::json& file) {
    const fs::path path = dir.write("tokenizer.json", file.dump());
    return error_of([&] { Tokenizer::from_tokenizer_json(path); });
  };
  nlohmann::json no_decoder = j;
  no_decoder["decoder"] = nullptr;
  CHECK_THAT(refused(no_decoder), Catch::Contains("needs its decoder"));
  nlohmann::json normalized_added = j;
  normalized_added["added_tokens"][1]["normalized"] = true;
  CHECK_THAT(refused(normalized_added), Catch::Contains("added token '<s>' is normalized"));
  nlohmann::json other_normalizer = j;
  other_normalizer["normalizer"] = {{"type", "NFKC"}};
  CHECK_THAT(refused(other_normalizer), Catch::Contains("normalizer.type is 'NFKC'"));
  nlohmann::json pre_beside_normalizer = j;
  pre_beside_normalizer["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  CHECK_THAT(refused(pre_beside_normalizer), Catch::Contains("beside the Prepend + Replace normalizer"));
  nlohmann::json byte_level_decoder = j;
  byte_level_decoder["decoder"] = {{"type", "ByteLevel"}};
  CHECK_THAT(refused(byte_level_decoder), Catch::Contains("decoder is"));
}
