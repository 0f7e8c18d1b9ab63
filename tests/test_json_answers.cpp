// JSON answers (response_format json_object and json_schema): the grammars' token masks against
// xgrammar's builtin JSON grammar over five vocabularies and its compiled JSON schemas over two,
// greedy answers against transformers' generate() with xgrammar's logits processor on the tiny
// models (tests/fixtures/json/make_json_fixtures.py), the schemas refused, and the automaton's own
// edges: where a document ends, how deep it nests, sampled answers.
#include "test_paths.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <cctype>
#include <random>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "forwarding_backend.h"
#include "offload_grid.h"
#include "strata/job/answers.h"
#include "strata/model/model_loader.h"
#include "strata/model/tokenizer.h"
#include "strata/offload/engine.h"
#include "strata/runtime/generator.h"
#include "strata/runtime/json_grammar.h"
#include "strata/runtime/json_schema.h"
#include "strata/runtime/sequence.h"
#include "test_support.h"
#include "token_masks.h"

using namespace strata;
using nlohmann::json;

namespace {

const std::string kFixtures = STRATA_FIXTURES_DIR;

const json& fixture() {
  static const json fx = [] {
    std::ifstream in(kFixtures + "/json/json_masks.json");
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return fx;
}

using test::base64_decode;
using test::mask_differences;

Tokenizer load_tokenizer(const std::string& relative) { return test::fixture_tokenizer(relative); }
bool bit(const std::vector<uint64_t>& mask, int64_t id) { return test::mask_bit(mask, id); }

JsonState state_after(const std::string& text) {
  JsonState s;
  for (char c : text) REQUIRE(json_step(s, uint8_t(c)));
  return s;
}

// The fixture's greedy cases of one model as requests held to JSON: the json_object grammar
// (`schema` null) or a schema's.
struct JsonCases {
  std::vector<GenRequest> requests;
  std::vector<json> cases;
};
JsonCases json_cases(const std::string& model, const Tokenizer& tokenizer) {
  const auto vocabulary = json_vocabulary(tokenizer);
  JsonCases out;
  for (const json& c : fixture()["greedy"]) {
    if (c["model"] != model) continue;
    GenRequest r;
    r.prompt = c["prompt"].get<std::vector<int32_t>>();
    r.sampling.max_new_tokens = c["max_new_tokens"].get<int>();
    if (c["schema"].is_null()) r.grammar = vocabulary;
    else
      r.grammar = std::make_shared<RuleGrammar>(
          compile_json_schema(nlohmann::ordered_json::parse(c["schema"].get<std::string>())), vocabulary->tokens());
    out.requests.push_back(r);
    out.cases.push_back(c);
  }
  return out;
}

// How many of the fixture's greedy cases have all their gaps above `tolerance`.
int cases_past(double tolerance) {
  int n = 0;
  for (const json& c : fixture()["greedy"]) n += c["min_top2_gap"].get<double>() > tolerance ? 1 : 0;
  return n;
}

// Tokens equal xgrammar's wherever the smallest top-2 gap of the masked logits exceeds
// `tolerance`; a document that closed ends the answer (finish Stop) and parses. Returns the cases
// held to that.
int check_json_greedy(const JsonCases& cases, const std::vector<GenResult>& got, const Tokenizer& tokenizer,
                      double tolerance) {
  REQUIRE(got.size() == cases.cases.size());
  int checked = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const json& c = cases.cases[i];
    if (c["min_top2_gap"].get<double>() <= tolerance) continue;
    INFO("case " << i << ", prompt " << c["prompt"].dump());
    CHECK(got[i].tokens == c["greedy"].get<std::vector<int32_t>>());
    const bool closed = c["closed"].get<bool>();
    CHECK(got[i].finish == (closed ? FinishReason::Stop : FinishReason::Length));
    if (closed) CHECK(json::accept(tokenizer.decode(got[i].tokens)));
    ++checked;
  }
  return checked;
}

const char* const kModels[] = {"tiny-llama", "tiny-opt"};

}  // namespace

TEST_CASE("JSON token masks equal xgrammar's builtin JSON grammar's", "[sampler][json]") {
  int cases = 0;
  for (const auto& [name, entry] : fixture()["masks"].items()) {
    INFO(name);
    const Tokenizer tokenizer = load_tokenizer(entry["tokenizer"].get<std::string>());
    const auto vocabulary = json_vocabulary(tokenizer);
    const int64_t vocab = entry["vocab_size"].get<int64_t>();
    REQUIRE(vocabulary->size() <= vocab);
    for (const json& c : entry["cases"]) {
      const std::string prefix = base64_decode(c["prefix"].get<std::string>());
      const std::string want = base64_decode(c["allowed"].get<std::string>());
      REQUIRE(int64_t(want.size()) == (vocab + 7) / 8);
      INFO("prefix \"" << prefix << "\"");
      const JsonState state = state_after(prefix);
      CHECK_FALSE(json_complete(state));
      CHECK(mask_differences(want, vocab, *vocabulary->allowed(state), vocabulary->size(),
                             [&](int32_t id) { return vocabulary->accepts(state, id); }, tokenizer) == 0);
      CHECK(std::any_of(want.begin(), want.end(), [](char c) { return c != 0; }));
      ++cases;
    }
  }
  CHECK(cases == 31 + 4 * 188);
}

TEST_CASE("JSON schema masks equal xgrammar's compile_json_schema's", "[sampler][json]") {
  int cases = 0;
  for (const json& entry : fixture()["schemas"]) {
    const std::string text = entry["schema"];
    INFO(text);
    // vLLM's schema for tool_choice "required" over `tools`: Strata's own must hold answers alike.
    const auto rules = compile_json_schema(entry.contains("tools")
                                               ? required_tool_calls_schema(nlohmann::ordered_json::parse(entry["tools"].get<std::string>()))
                                               : nlohmann::ordered_json::parse(text));
    for (const auto& [name, masks] : entry["masks"].items()) {
      INFO(name);
      const Tokenizer tokenizer = load_tokenizer(fixture()["masks"][name]["tokenizer"].get<std::string>());
      const auto grammar = std::make_shared<RuleGrammar>(rules, json_vocabulary(tokenizer)->tokens());
      const int64_t vocab = masks["vocab_size"].get<int64_t>();
      for (const json& c : masks["cases"]) {
        const std::string prefix = base64_decode(c["prefix"].get<std::string>());
        const std::string want = base64_decode(c["allowed"].get<std::string>());
        INFO("prefix \"" << prefix << "\"");
        RuleState state = grammar->start_state();
        for (char ch : prefix) REQUIRE(grammar->step(state, uint8_t(ch)));
        CHECK_FALSE(grammar->complete(state));
        CHECK(mask_differences(want, vocab, *grammar->allowed(state), grammar->size(),
                               [&](int32_t id) { return grammar->accepts(state, id); }, tokenizer) == 0);
        ++cases;
      }
    }
  }
  CHECK(cases == 2 * (96 + 24 + 35 + 70 + 43 + 46 + 19 + 3 + 2 + 13 + 25 + 15 + 12 + 138 + 70));
}

TEST_CASE("schemas with what Strata does not enforce are refused, naming the keyword and where", "[json]") {
  std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"type": "string"})", "the schema's root (#) must be an object or an array"},
      {R"({"anyOf": [{"type": "object"}, {"type": "array"}]})", "the schema's root (#) must be an object or an array"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})",
       "keyword 'pattern' at #/properties/a is not supported"},
      {R"({"type": "array", "minItems": 1})", "'minItems' at # without 'items' is not supported"},
      {R"({"type": "array", "items": {}, "minItems": 3, "maxItems": 2})", "'minItems' at # (3) exceeds 'maxItems' (2)"},
      {R"({"type": "array", "items": {}, "maxItems": -1})", "'maxItems' at # must be a non-negative integer"},
      {R"({"type": "array", "items": {}, "minItems": 1.5})", "'minItems' at # must be a non-negative integer"},
      {R"({"type": "array", "items": {}, "minItems": 5000})", "'minItems' at # above 1024 is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "minItems": 1}}})",
       "'minItems' at #/properties/a on a schema of type 'string' is not supported"},
      {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})",
       "'additionalProperties' at # is supported only as false"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{}]}}})",
       "keyword 'allOf' at #/properties/a is not supported"},
      {R"({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}})", "only references into #/$defs/"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})",
       "#/$defs/missing is not in the schema"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})",
       "names \"b\", which 'properties' does not define"},
      {R"({"type": "object", "properties": {"a": {"enum": [{"k": 1}]}}})", "only scalars are supported"},
      {R"({"type": "object", "properties": {"a/b": {"type": "integer", "minimum": 0}}})",
       "keyword 'minimum' at #/properties/a~1b is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "widget"}}})", "unknown type 'widget'"},
  };
  refused.emplace_back(R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
                          "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}})",
                       "'$ref' #/$defs/A reaches no value: it refers back to itself");
  // Recursion that reaches a value is no reason to refuse.
  CHECK_NOTHROW(compile_json_schema(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
          "$defs": {"A": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/A"}}, {"type": "null"}]}}})")));
  std::string deep = R"({"type": "array", "items": {"type": "integer"}})";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  refused.emplace_back(deep, "nests deeper than 64 levels");
  for (const auto& [schema, message] : refused) {
    INFO(schema.substr(0, 200));
    CHECK_THROWS_WITH(compile_json_schema(nlohmann::ordered_json::parse(schema)), Catch::Contains(message));
  }
}

TEST_CASE("greedy JSON answers are transformers' with xgrammar's logits processor (CPU, resident and engine)",
          "[sampler][json][model][hf]") {
  auto backend = make_cpu_backend(2);
  int checked = 0, closed = 0;
  for (const char* name : kModels) {
    INFO(name);
    ModelBundle model = open_model(kFixtures + "/models/" + name);
    const JsonCases cases = json_cases(name, *model.tokenizer);
    REQUIRE(cases.requests.size() == 15);
    Transformer resident(model.config, load_model_weights(model.config, *model.weights, *backend), *backend);
    checked += check_json_greedy(cases, generate(resident, cases.requests), *model.tokenizer, 1e-3);

    OffloadOptions opt;
    opt.policy = test::policy_of(int(cases.requests.size()), 1, {0, 100, 0}, {0, 100, 0}, {100, 0, 0},
                                 /*cpu_attention=*/true);
    opt.offload_dir = test::offload_dir("json");
    OffloadEngine engine(model.config, *model.weights, *backend, opt, test::shape_of(cases.requests));
    checked += check_json_greedy(cases, engine.generate(cases.requests), *model.tokenizer, 1e-3);
    for (const json& c : cases.cases) closed += c["closed"].get<bool>() ? 1 : 0;
  }
  CHECK(checked == 2 * cases_past(1e-3));  // both paths
  CHECK(checked >= 50);
  CHECK(closed >= 4);  // documents that close, and so end the answer early
  std::error_code ec;
  std::filesystem::remove_all(test::offload_dir("json"), ec);
}

TEST_CASE("CUDA: greedy JSON answers are transformers' with xgrammar's where the margin allows",
          "[sampler][json][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  int checked = 0;
  for (const char* name : kModels) {
    INFO(name);
    ModelBundle model = open_model(kFixtures + "/models/" + name);
    const JsonCases cases = json_cases(name, *model.tokenizer);
    Transformer resident(model.config, load_model_weights(model.config, *model.weights, *backend), *backend);
    // 0.05: the margin-bound CUDA tests' logit tolerance (fp16 logits).
    checked += check_json_greedy(cases, generate(resident, cases.requests), *model.tokenizer, 0.05);
  }
  CHECK(checked == cases_past(0.05));
  CHECK(checked >= 15);
}

TEST_CASE("a row's JSON mask refuses exactly the tokens its state refuses, and every id past the vocabulary",
          "[sampler][json]") {
  for (const char* name : {"tokenizer/gpt2/tokenizer.json", "models/tiny-opt"}) {
    INFO(name);
    const Tokenizer tokenizer = load_tokenizer(name);
    const auto vocabulary = json_vocabulary(tokenizer);
    const std::vector<int32_t> doc = tokenizer.encode("{\"k\": [1.5, \"t\\u00e9xt \u00e9\", true], \"n\": {}}");
    // Rows as long as the vocabulary, shorter (a mask word cut) and longer (a model's padded ids).
    for (int64_t extra : {int64_t(0), int64_t(-37), int64_t(339)}) {
      const int64_t V = vocabulary->size() + extra;
      JsonMatcher m(vocabulary);
      JsonState s;
      for (size_t i = 0; i < doc.size(); ++i) {
        std::vector<float> row(size_t(V), 1.0f);
        const int64_t kept = m.mask(row.data(), V);
        const std::vector<uint64_t>& want = *vocabulary->allowed(s);
        int64_t wrong = 0, allowed = 0;
        for (int64_t id = 0; id < V; ++id) {
          const bool ok = id < vocabulary->size() && bit(want, id);
          allowed += ok;
          wrong += (row[size_t(id)] == 1.0f) != ok || (!ok && row[size_t(id)] != -INFINITY);
        }
        CHECK(wrong == 0);
        CHECK(kept == allowed);
        REQUIRE(m.accepts(doc[i]));
        m.advance(doc[i]);
        s = vocabulary->after(s, doc[i]);
      }
      CHECK(m.complete());
    }
  }
}

TEST_CASE("a JSON document ends at its closing bracket, numbers end at what follows them", "[sampler][json]") {
  auto ends = [](const std::string& text) { return json_complete(state_after(text)); };
  CHECK(ends("{}"));
  CHECK(ends("[ 1 , -2.5e+3 , {\"a\" : [true, false, null]} ]"));
  CHECK(ends("{\"k\":\"\\u00e9\\n\xe2\x82\xac\"}"));
  CHECK_FALSE(ends("{\"a\":1"));
  CHECK_FALSE(ends("[[]"));
  JsonState done = state_after("{}");
  CHECK_FALSE(json_step(done, ' '));  // nothing after the document, not even whitespace
  JsonState root;
  CHECK_FALSE(json_step(root, ' '));  // nor before it
  CHECK_FALSE(json_step(root, '1'));  // the root is an object or an array
  for (const char* bad : {"[01", "[1.]", "[-]", "[1e]", "[tru ", "{\"a\" 1", "{,", "[1,]", "{\"a\":1,}", "[\"\x01",
                          "[\"\\x", "[\"\\u12g", "[\"\xc0", "[\"\xe0\x80", "[\"\xf4\x90", "[\"\x80", "[1}",
                          "{\"a\":1]"}) {
    INFO(bad);
    JsonState s;
    const std::string text = bad;
    bool ok = true;
    for (char c : text) ok = ok && json_step(s, uint8_t(c));
    CHECK_FALSE(ok);
  }
  // Nesting stops at kMaxJsonDepth.
  JsonState nested = state_after(std::string(size_t(kMaxJsonDepth), '['));
  CHECK_FALSE(json_step(nested, '['));
  CHECK(json_step(nested, ']'));
}

TEST_CASE("sampled JSON answers draw only what the grammar allows, and closed ones parse", "[sampler][json][model]") {
  auto backend = make_cpu_backend(2);
  ModelBundle model = open_model(kFixtures + "/models/tiny-llama");
  const auto vocabulary = json_vocabulary(*model.tokenizer);
  std::vector<GenRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenRequest r;
    r.prompt = {1, 15 + i, 300, 7};
    r.sampling.temperature = i % 2 ? 0.7f : 1.0f;
    r.sampling.top_p = i % 3 ? 1.0f : 0.9f;
    r.sampling.top_k = i == 4 ? 20 : 0;
    r.sampling.seed = uint64_t(100 + i);
    r.sampling.max_new_tokens = 48;
    r.n = 2;
    r.grammar = vocabulary;
    requests.push_back(r);
  }
  Transformer resident(model.config, load_model_weights(model.config, *model.weights, *backend), *backend);
  const std::vector<GenResult> got = generate(resident, requests);
  REQUIRE(got.size() == 12);
  int closed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("answer " << i);
    JsonState s;
    for (int32_t t : got[i].tokens) {
      REQUIRE(vocabulary->accepts(s, t));
      s = vocabulary->after(s, t);
    }
    CHECK(json_complete(s) == (got[i].finish == FinishReason::Stop));
    if (!json_complete(s)) continue;
    ++closed;
    const std::string text = model.tokenizer->decode(got[i].tokens);
    // nlohmann refuses the surrogates (escaped, or encoded from ED A0) that xgrammar's grammar lets through.
    bool surrogate = false;
    for (size_t at = 0; at + 3 < text.size(); ++at)
      surrogate |= (text.compare(at, 2, "\\u") == 0 && (text[at + 2] | 0x20) == 'd' && std::isxdigit(text[at + 3]) &&
                    (text[at + 3] >= '8' || std::isalpha(text[at + 3]))) ||
                   (uint8_t(text[at]) == 0xED && uint8_t(text[at + 1]) >= 0xA0);
    if (!surrogate) CHECK(json::accept(text));
  }
  CHECK(closed >= 2);
}

namespace {


// Eight greedy JSON answers' first step: rows 0-6's argmax "{" opens a document (the backend's
// argmax decides them), row 7's "a" cannot ("[" is the best token that can). Checks the tokens
// against the host's Sampler over the full rows, and that only row 7's logits crossed to the host
// (one row of eight: StepSampler copies it alone, not the step's).
void check_held_argmax(Backend& inner) {
  const Tokenizer tokenizer = load_tokenizer("tokenizer/llama3-style/tokenizer.json");
  const auto vocabulary = json_vocabulary(tokenizer);
  const int64_t R = 8, V = vocabulary->size();
  auto token = [&](const std::string& text) {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    REQUIRE(ids.size() == 1);
    return ids[0];
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> host(size_t(R * V));
  for (float& x : host) x = normal(rng);
  for (int64_t r = 0; r + 1 < R; ++r) host[size_t(r * V + token("{"))] = 100.0f;
  host[size_t((R - 1) * V + token("a"))] = 100.0f;
  host[size_t((R - 1) * V + token("["))] = 50.0f;
  test::CopyCountingBackend backend(inner);
  Buffer buf = backend.alloc(host.size() * 4);
  backend.copy_to_device(buf.data(), host.data(), host.size() * 4);
  ModelConfig cfg;
  cfg.vocab_size = int(V);
  cfg.max_positions = 16;
  cfg.eos_ids = {0};
  std::vector<GenRequest> reqs(static_cast<size_t>(R));
  std::vector<Sequence> seqs;
  for (int64_t r = 0; r < R; ++r) {
    reqs[size_t(r)].prompt = {1, 2};
    reqs[size_t(r)].sampling.max_new_tokens = 4;
    reqs[size_t(r)].grammar = vocabulary;
    seqs.push_back(start_sequence(reqs[size_t(r)], cfg, int(r), size_t(r)));
  }
  std::vector<Sequence*> rows;
  for (Sequence& q : seqs) rows.push_back(&q);
  StepSampler sampler(backend, cfg, size_t(R));
  sampler.sample(buf.view(0, DType::F32, {R, V}), rows);
  for (int64_t r = 0; r < R; ++r) {
    Sampler reference(reqs[size_t(r)].sampling, {}, vocabulary.get());
    CHECK(seqs[size_t(r)].result.tokens == std::vector<int32_t>{reference.sample(host.data() + r * V, V)});
  }
  CHECK(seqs[0].result.tokens[0] == token("{"));
  CHECK(seqs[R - 1].result.tokens[0] == token("["));
  CHECK(std::count(backend.copies.begin(), backend.copies.end(), size_t(V) * 4) == 1);
  CHECK(std::count(backend.copies.begin(), backend.copies.end(), size_t(R * V) * 4) == 0);
}

}  // namespace

TEST_CASE("a greedy JSON answer takes the backend's argmax where its grammar allows it", "[sampler][json]") {
  auto backend = make_cpu_backend(1);
  check_held_argmax(*backend);
}

TEST_CASE("CUDA: a greedy JSON answer takes the device's argmax where its grammar allows it", "[sampler][json][cuda]") {
  if (!cuda_available()) {
    WARN("no GPU: skipped");
    return;
  }
  auto backend = make_cuda_backend(0);
  check_held_argmax(*backend);
}
