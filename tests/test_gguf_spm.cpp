// GGUF's SentencePiece tokenizer (tokenizer.ggml.model "llama": scores, no merges), as LLaMA-2,
// Mistral and TinyLlama GGUF files carry it. Expected ids come from llama.cpp and SentencePiece,
// decodes from transformers and llama.cpp, greedy tokens from llama.cpp running the file
// (tests/fixtures/gguf/make_gguf_spm_fixture.py).
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "strata/backend/backend.h"
#include "strata/core/error.h"
#include "strata/model/gguf.h"
#include "strata/model/model_loader.h"
#include "strata/model/tokenizer.h"
#include "strata/runtime/generator.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) { return fs::path(STRATA_FIXTURES_DIR) / "gguf" / name; }

const json& cases() {
  static const json j = [] {
    std::ifstream in(fixture("tiny_spm_cases.json"));
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return j;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// A vocabulary small enough to follow by hand: spaces as "\u2581", no byte tokens.
SentencePieceVocab hand_vocab(std::vector<float> scores) {
  SentencePieceVocab v;
  v.tokens = {"<unk>", "a", "b", "c", "ab", "bc", "abc"};
  v.scores = std::move(scores);
  v.types = {2, 1, 1, 1, 1, 1, 1};
  v.add_space_prefix = false;
  return v;
}

}  // namespace

TEST_CASE("gguf sentencepiece: ids are llama.cpp's, decodes transformers'", "[gguf][tokenizer]") {
  const json& fx = cases();
  const Tokenizer tok = tokenizer_from_gguf(GgufFile::open(fixture(fx["gguf"].get<std::string>())));
  CHECK(tok.vocab_size() == fx["vocab_size"].get<int>());
  REQUIRE(fx["cases"].size() > 100);
  for (const json& c : fx["cases"]) {
    const std::string text = c["text"].get<std::string>();
    INFO("text: " << json(text).dump());
    const std::vector<int32_t> want = ids_of(c["ids"]);
    CHECK(tok.encode(text) == want);
    CHECK(tok.decode(want) == c["decoded"].get<std::string>());
    CHECK(tok.decode(want, true) == c["decoded_skip_special"].get<std::string>());
  }
  // Prefixes of byte-fallback runs: a character cut between <0xXX> tokens reads U+FFFD per byte.
  REQUIRE(!fx["decode_cases"].empty());
  for (const json& c : fx["decode_cases"]) {
    INFO("ids: " << c["ids"].dump());
    CHECK(tok.decode(ids_of(c["ids"])) == c["text"].get<std::string>());
  }
  // Control, unknown and user-defined tokens: the first two special, all three matched whole.
  CHECK(tok.is_special(fx["bos_id"].get<int>()));
  CHECK(tok.is_special(fx["unk_id"].get<int>()));
  REQUIRE(tok.token_id("<sep>"));
  CHECK_FALSE(tok.is_special(*tok.token_id("<sep>")));
  CHECK(tok.token_bytes(*tok.token_id("<0x41>")) == "A");
}

TEST_CASE("gguf sentencepiece: add_space_prefix false puts no space before the text", "[gguf][tokenizer]") {
  const json& fx = cases();
  const Tokenizer tok = tokenizer_from_gguf(GgufFile::open(fixture(fx["no_prefix_gguf"].get<std::string>())));
  REQUIRE(fx["no_prefix_cases"].size() > 10);
  for (const json& c : fx["no_prefix_cases"]) {
    const std::string text = c["text"].get<std::string>();
    INFO("text: " << json(text).dump());
    CHECK(tok.encode(text) == ids_of(c["ids"]));
    CHECK(tok.decode(ids_of(c["ids"])) == c["decoded"].get<std::string>());
  }
}

TEST_CASE("gguf sentencepiece: the pair making the best-scoring token merges first", "[tokenizer]") {
  // SentencePiece's and llama.cpp's rule, followed by hand on "abc": each step merges the adjacent
  // pair whose concatenation scores highest, the leftmost of equal scores first.
  auto encode = [](std::vector<float> scores) {
    return Tokenizer::from_sentencepiece(hand_vocab(std::move(scores)), "hand").encode("abc");
  };
  // "bc" outscores "ab": a + bc, then abc.
  CHECK(encode({0, -1, -1, -1, -5, -2, -9}) == std::vector<int32_t>{6});
  // Without "abc" in reach (a lower score does not matter, only whether it exists): a, bc.
  SentencePieceVocab no_abc = hand_vocab({0, -1, -1, -1, -5, -2, -9});
  no_abc.tokens[6] = "xyz";
  CHECK(Tokenizer::from_sentencepiece(no_abc, "hand").encode("abc") == std::vector<int32_t>{1, 5});
  no_abc.scores = {0, -1, -1, -1, -2, -5, -9};  // "ab" outscores "bc": ab, c
  CHECK(Tokenizer::from_sentencepiece(no_abc, "hand").encode("abc") == std::vector<int32_t>{4, 3});
  no_abc.scores = {0, -1, -1, -1, -3, -3, -9};  // a tie: the leftmost pair, ab, c
  CHECK(Tokenizer::from_sentencepiece(no_abc, "hand").encode("abc") == std::vector<int32_t>{4, 3});
  // Scores, not ids, order the merges: "bc" has the larger id and still goes first.
  no_abc.scores = {0, -1, -1, -1, -4, -3, -9};
  CHECK(Tokenizer::from_sentencepiece(no_abc, "hand").encode("abc") == std::vector<int32_t>{1, 5});
  // No scores at all (llama.cpp reads them as 0): every merge ties, so left to right.
  no_abc.scores.clear();
  CHECK(Tokenizer::from_sentencepiece(no_abc, "hand").encode("abc") == std::vector<int32_t>{4, 3});
  // A character outside the vocabulary, with no byte tokens to fall back to: <unk>.
  CHECK(encode({0, -1, -1, -1, -5, -2, -9}) != Tokenizer::from_sentencepiece(no_abc, "hand").encode("abd"));
  CHECK(Tokenizer::from_sentencepiece(no_abc, "hand").encode("abd") == std::vector<int32_t>{4, 0});
}

TEST_CASE("gguf sentencepiece: malformed vocabularies are refused naming the problem", "[tokenizer]") {
  SentencePieceVocab v = hand_vocab({0, -1, -1, -1, -5, -2, -9});
  v.scores.pop_back();
  CHECK_THROWS_WITH(Tokenizer::from_sentencepiece(v, "f.gguf"), Catch::Contains("f.gguf") &&
                                                                     Catch::Contains("6 token scores for 7 tokens"));
  v = hand_vocab({0, -1, -1, -1, -5, -2, -9});
  v.types.push_back(1);
  CHECK_THROWS_WITH(Tokenizer::from_sentencepiece(v, "f.gguf"), Catch::Contains("8 token types for 7 tokens"));
  v = hand_vocab({0, -1, -1, -1, -5, std::nanf(""), -9});
  CHECK_THROWS_WITH(Tokenizer::from_sentencepiece(v, "f.gguf"), Catch::Contains("token 5 has a score that is not"));
  v = hand_vocab({0, -1, -1, -1, -5, -2, -9});
  v.tokens[3] = "\xff";
  CHECK_THROWS_WITH(Tokenizer::from_sentencepiece(v, "f.gguf"), Catch::Contains("token 3 is not valid UTF-8"));
  v.tokens.clear();
  CHECK_THROWS_WITH(Tokenizer::from_sentencepiece(v, "f.gguf"), Catch::Contains("no tokens"));
}

TEST_CASE("gguf sentencepiece: the loader adds BOS as the file and llama.cpp say", "[gguf]") {
  const json& fx = cases();
  const ModelBundle with_flag = open_model(fixture(fx["gguf"].get<std::string>()).string());
  CHECK(with_flag.add_bos);  // add_bos_token true
  CHECK(with_flag.config.bos_id == fx["bos_id"].get<int>());
  // No add_bos_token key: llama.cpp adds BOS for a SentencePiece vocabulary.
  const ModelBundle without = open_model(fixture(fx["no_prefix_gguf"].get<std::string>()).string());
  CHECK(without.add_bos);
}

TEST_CASE("gguf sentencepiece: a tiny LLaMA-2-style file generates llama.cpp's greedy tokens", "[gguf][model]") {
  const json& fx = cases();
  auto backend = make_cpu_backend(2);
  ModelBundle b = open_model(fixture(fx["gguf"].get<std::string>()).string());
  Transformer model(b.config, load_model_weights(b.config, *b.weights, *backend), *backend);
  std::vector<GenRequest> reqs;
  for (const json& g : fx["greedy"]) {
    GenRequest r;
    r.prompt = b.tokenizer->encode(g["prompt"].get<std::string>());
    r.prompt.insert(r.prompt.begin(), b.config.bos_id);
    CHECK(r.prompt == ids_of(g["prompt_ids"]));
    r.sampling.max_new_tokens = int(g["new_ids"].size());
    reqs.push_back(r);
  }
  const std::vector<GenResult> got = generate(model, reqs, GenOptions{});
  for (size_t i = 0; i < reqs.size(); ++i) {
    // llama.cpp keeps its KV cache in fp16; its smallest top-2 gap here is above 0.02.
    INFO("prompt " << i << ", llama.cpp's min top-2 gap " << fx["greedy"][i]["min_top2_gap"]);
    CHECK(got[i].tokens == ids_of(fx["greedy"][i]["new_ids"]));
  }
}

TEST_CASE("strata run on a SentencePiece GGUF writes llama.cpp's greedy completions", "[cli]") {
  const json& fx = cases();
  const fs::path dir = test::temp_dir("gguf_spm");
  const fs::path prompts = dir / "prompts.jsonl", out = dir / "out.jsonl";
  {
    std::ofstream f(prompts);
    for (size_t i = 0; i < fx["greedy"].size(); ++i) {
      const json& g = fx["greedy"][i];
      f << json{{"id", i}, {"prompt", g["prompt"]}, {"max_new_tokens", g["new_ids"].size()}, {"ignore_eos", true}}.dump()
        << "\n";
    }
  }
  fs::remove(out);
  const test::CliResult r = test::run_strata("run --model " + fixture(fx["gguf"].get<std::string>()).string() +
                                             " --prompts " + prompts.string() + " --out " + out.string() +
                                             " --device cpu");
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::ifstream in(out);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    const json got = json::parse(line);
    const json& g = fx["greedy"][got["id"].get<size_t>()];
    CHECK(got["tokens"] == g["new_ids"]);
    CHECK(got["prompt_tokens"] == g["prompt_ids"].size());  // BOS included
    ++n;
  }
  CHECK(n == fx["greedy"].size());
}
