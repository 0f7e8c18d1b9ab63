// Answers held to a regex or a list of choices (include/strata/runtime/regex_rules.h): the token
// masks against xgrammar's compile_regex and vLLM's choice grammar over three vocabularies, greedy
// answers against transformers' generate() with xgrammar's logits processor on tiny-llama
// (tests/fixtures/json/make_pattern_fixtures.py), and the patterns refused.
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/backend/device_info.h"
#include "strata/job/answers.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/generator.h"
#include "strata/runtime/regex_rules.h"
#include "strata/runtime/transformer.h"
#include "test_support.h"
#include "token_masks.h"

using namespace strata;
using nlohmann::json;

namespace {

const json& fixture() {
  static const json fx = [] {
    std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/json/pattern_masks.json");
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return fx;
}

std::shared_ptr<const ByteRules> rules_of(const json& entry) {
  if (entry["kind"] == "regex") return compile_regex(entry["pattern"].get<std::string>());
  return compile_choices(entry["pattern"].get<std::vector<std::string>>());
}

std::string regex_error(const std::string& pattern) {
  try {
    compile_regex(pattern);
  } catch (const RegexError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("regex and choice masks equal xgrammar's, its stop token wherever the text is whole",
          "[sampler][json][regex]") {
  int cases = 0;
  for (const json& entry : fixture()["patterns"]) {
    INFO(entry["kind"].get<std::string>() << " " << entry["pattern"].dump());
    const auto rules = rules_of(entry);
    for (const auto& [name, masks] : entry["masks"].items()) {
      INFO(name);
      const Tokenizer tokenizer = test::fixture_tokenizer(masks["tokenizer"].get<std::string>());
      const int32_t end = masks["end_token"].get<int32_t>();
      const auto grammar = std::make_shared<RuleGrammar>(rules, json_vocabulary(tokenizer)->tokens(),
                                                         std::vector<int32_t>{end});
      const int64_t vocab = masks["vocab_size"].get<int64_t>();
      for (const json& c : masks["cases"]) {
        const std::string prefix = test::base64_decode(c["prefix"].get<std::string>());
        const std::string want = test::base64_decode(c["allowed"].get<std::string>());
        INFO("prefix \"" << prefix << "\"");
        RuleState state = grammar->start_state();
        for (char ch : prefix) REQUIRE(grammar->step(state, uint8_t(ch)));
        const std::vector<uint64_t>& mine = *grammar->allowed(state);
        CHECK(test::mask_differences(want, vocab, mine, grammar->size(),
                                     [&](int32_t id) { return grammar->accepts(state, id); }, tokenizer) == 0);
        // The answer ends by itself exactly where xgrammar allows its stop token alone.
        int64_t allowed = 0;
        for (int64_t id = 0; id < grammar->size(); ++id) allowed += test::mask_bit(mine, id);
        CHECK(grammar->complete(state) == (allowed == 1 && test::mask_bit(mine, end)));
        CHECK(grammar->whole(state) == test::mask_bit(mine, end));
        ++cases;
      }
    }
  }
  CHECK(cases == 3 * 194);
}

namespace {

// The fixture's greedy cases on `backend`: tokens and finish reasons equal transformers' with
// xgrammar's processor wherever the smallest top-2 gap exceeds `tolerance`; returns how many.
int check_pattern_greedy(Backend& backend, double tolerance) {
  const std::string dir = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-llama";
  const ModelBundle b = open_model(dir);
  Transformer model(b.config, load_model_weights(b.config, *b.weights, backend), backend);
  const auto tokens = json_vocabulary(*b.tokenizer)->tokens();
  std::vector<GenRequest> reqs;
  for (const json& c : fixture()["greedy"]) {
    GenRequest r;
    r.prompt = c["prompt"].get<std::vector<int32_t>>();
    REQUIRE(r.prompt == b.tokenizer->encode(c["text"].get<std::string>()));
    r.sampling.max_new_tokens = c["max_new_tokens"].get<int>();
    r.grammar = std::make_shared<RuleGrammar>(rules_of(c), tokens, b.config.eos_ids);
    reqs.push_back(std::move(r));
  }
  const std::vector<GenResult> got = generate(model, reqs, GenOptions{});
  REQUIRE(got.size() == fixture()["greedy"].size());
  int checked = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const json& c = fixture()["greedy"][i];
    if (c["min_top2_gap"].get<double>() <= tolerance) continue;
    INFO(c["pattern"].dump() << " after \"" << c["text"].get<std::string>() << "\"");
    CHECK(got[i].tokens == c["greedy"].get<std::vector<int32_t>>());
    const FinishReason want = c["closed"].get<bool>()        ? FinishReason::Stop
                              : c["ends_with_eos"].get<bool>() ? FinishReason::Eos
                                                               : FinishReason::Length;
    CHECK(got[i].finish == want);
    ++checked;
  }
  return checked;
}

}  // namespace

TEST_CASE("greedy regex and choice answers are transformers' with xgrammar's logits processor",
          "[sampler][json][regex][model]") {
  // fp32 against fp32: every case is held to it.
  auto backend = make_cpu_backend(2);
  CHECK(check_pattern_greedy(*backend, 1e-3) == int(fixture()["greedy"].size()));
}

TEST_CASE("CUDA: greedy regex and choice answers are transformers' with xgrammar's where the margin allows",
          "[sampler][json][regex][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  // 0.05: the margin-bound CUDA tests' logit tolerance (fp16 logits); one case's gap is 0.003.
  CHECK(check_pattern_greedy(*backend, 0.05) == int(fixture()["greedy"].size()) - 1);
}

TEST_CASE("regexes xgrammar refuses or reads otherwise than Python are refused, naming the offset", "[json][regex]") {
  const std::pair<const char*, const char*> refused[] = {
      {"(?=a)b", "offset 1: group modifiers other than ?:"},
      {"(?P<w>a)", "group modifiers other than ?:"},
      {"(?i)abc", "group modifiers"},
      {"\\bword", "word boundaries are not supported"},
      {"(a)\\1", "backreferences are not supported"},
      {"a++", "two repetition modifiers in a row"},
      {"a{,3}", "invalid repetition count"},
      {"a{2", "invalid repetition count"},
      {"{}", "nothing to repeat"},
      {"*a", "offset 0: nothing to repeat"},
      {"a{3,2}", "n < m"},
      {"a{1001}", "a repeat bound above 1000"},
      {"[]a]", "an empty character class"},
      {"[z-a]", "a range out of order"},
      {"[a-\\d]", "a range ends in a class"},
      {"[abc", "a '[' without its ']'"},
      {"(ab", "a '(' without its ')'"},
      {"ab)", "unbalanced ')'"},
      {"a^b", "anchors other than a leading ^ and a trailing $"},
      {"a$b", "anchors other than"},
      {"\\Aab", "anchors other than"},
      {"\\p{L}", "unknown escape \\p"},
      {"\\e", "unknown escape \\e"},
      {"\\0", "\\0 is not supported"},
      {"\\x4", "an escape needs 2 hex digits"},
      {"a\\", "a trailing backslash"},
      {"\xff", "not valid UTF-8"},
  };
  for (const auto& [pattern, why] : refused) {
    INFO(pattern);
    CHECK_THAT(regex_error(pattern), Catch::Contains(why));
  }
  CHECK_THAT(regex_error("(a{1000}){1000}"), Catch::Contains("too large"));
  CHECK_THROWS_AS(compile_choices({}), RegexError);
  // Accepted as xgrammar accepts them.
  for (const char* ok : {"^abc$", "a{2}?", "a*?", "[a-]", "[\\d-x]", "\\{\\}", "a|", "()", "\\$", "[.]+\\."})
    CHECK_NOTHROW(compile_regex(ok));
}

TEST_CASE("a choice that is the start of another lets the answer go on or end", "[json][regex]") {
  // "yes" is whole but "yes!" may follow: the end token is allowed beside "!", and the answer does
  // not end by itself; after "yes!" nothing can follow, and it does.
  const Tokenizer tokenizer = Tokenizer::bytes_only();
  const auto grammar = std::make_shared<RuleGrammar>(compile_choices({"yes", "yes!", "no"}),
                                                     json_vocabulary(tokenizer)->tokens(), std::vector<int32_t>{7});
  RuleState s = grammar->start_state();
  CHECK_FALSE(grammar->accepts(s, 7));
  for (char c : std::string("yes")) REQUIRE(grammar->step(s, uint8_t(c)));
  CHECK(grammar->whole(s));
  CHECK_FALSE(grammar->complete(s));
  CHECK(grammar->accepts(s, 7));
  CHECK(grammar->after(s, 7) == s);
  REQUIRE(grammar->step(s, uint8_t('!')));
  CHECK(grammar->complete(s));
  // Without end tokens (a JSON document's way) a whole text ends the answer.
  const auto closed = std::make_shared<RuleGrammar>(compile_choices({"yes", "yes!"}), json_vocabulary(tokenizer)->tokens());
  RuleState t = closed->start_state();
  for (char c : std::string("yes")) REQUIRE(closed->step(t, uint8_t(c)));
  CHECK(closed->complete(t));
}
