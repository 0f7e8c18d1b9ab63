// The host's cost of holding answers to JSON (response_format json_object and json_schema), a regex
// and a choice (structured outputs): laying a tokenizer's vocabulary out for masks (once per job),
// then a text the grammar holds (a JSON document; a sentence ending in a date; one of 20 labels)
// read token by token as an answer is, each step's mask applied to a row of logits: first with
// each state's mask computed when first met, then with every mask cached.
//   bench_json_mask [--tokenizer PATH] [--repeat N]
// PATH: a tokenizer.json or a model directory; default the GPT-2 fixture (50257 tokens).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "strata/job/answers.h"
#include "strata/model/tokenizer.h"
#include "strata/runtime/json_grammar.h"
#include "strata/runtime/json_schema.h"
#include "strata/runtime/regex_rules.h"

using namespace strata;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Strings, escapes, non-ASCII text, numbers, literals and nesting, indented as models write it.
const char* const kDocument =
    "{\n  \"name\": \"Zoë Ångström\",\n  \"age\": 37,\n  \"scores\": [98.5, -1.25e3, 0],\n"
    "  \"tags\": [\"a\\\"b\", \"line\\nbreak\", \"\\u00e9t\\u00e9\"],\n  \"active\": true,\n"
    "  \"address\": {\"street\": \"12 Rue de la Paix\", \"city\": \"Paris\", \"zip\": null},\n"
    "  \"notes\": \"Le café coûte 3,50 € — très bon.\"\n}";

// A schema the document is valid under: required and optional properties, arrays, a nested
// object, a type list.
const char* const kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"}, "scores": {"type": "array", "items": {"type": "number"}},
  "tags": {"type": "array", "items": {"type": "string"}}, "active": {"type": "boolean"},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                               "zip": {"type": ["string", "null"]}}, "required": ["street", "city"]},
  "notes": {"type": "string"}}, "required": ["name", "age", "tags"]})";

// A regex of words then an ISO date, and a text it matches whole.
const char* const kRegex = "([A-Z]?[a-z]+,? )+on [0-9]{4}-[0-9]{2}-[0-9]{2}";
const char* const kSentence = "The committee met in Geneva, agreed the text and signed it on 2024-11-05";

// Twenty labels, as a classification job's choice lists them; the answer is the last.
const std::vector<std::string> kLabels = {
    "arts", "business", "crime", "education", "entertainment", "environment", "fashion", "food", "health", "politics",
    "religion", "science", "sports", "technology", "travel", "weather", "world news", "local news", "opinion",
    "obituaries"};

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/tokenizer/gpt2/tokenizer.json";
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokenizer") && i + 1 < argc) path = argv[++i];
    else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_json_mask [--tokenizer PATH] [--repeat N]\n");
      return 2;
    }
  }
  try {
    const Tokenizer tokenizer = path.ends_with(".json") ? Tokenizer::from_tokenizer_json(path) : Tokenizer::from_dir(path);
    const std::vector<int32_t> tokens = tokenizer.encode(kDocument);
    double build = 1e30;
    std::shared_ptr<const JsonVocabulary> vocabulary;
    for (int r = 0; r < repeat; ++r) {
      const double t0 = now();
      vocabulary = json_vocabulary(tokenizer);
      build = std::min(build, now() - t0);
    }
    std::printf("tokenizer %s: %lld tokens; document of %zu bytes, %zu tokens\n", path.c_str(),
                static_cast<long long>(vocabulary->size()), std::strlen(kDocument), tokens.size());
    std::printf("  %-44s %10.2f ms (once per job)\n", "vocabulary laid out", build * 1e3);
    const auto rules = compile_json_schema(nlohmann::ordered_json::parse(kSchema));
    std::vector<float> logits(size_t(vocabulary->size()), 0.5f);
    // The document read token by token as the sampler reads an answer: each step's mask applied
    // to a row, then the token taken. A fresh grammar's pass computes the mask of every state the
    // first time it is met; a second pass finds them all cached.
    auto time_pass = [&](const AnswerGrammar& grammar, const std::vector<int32_t>& text) {
      std::unique_ptr<AnswerCursor> cursor = grammar.start();
      const double t0 = now();
      for (size_t i = 0; i < text.size(); ++i) {
        if (cursor->mask(logits.data(), int64_t(logits.size())) == 0) throw std::runtime_error("no token allowed");
        if (!cursor->accepts(text[i])) throw std::runtime_error("the text's token " + std::to_string(i) + " is refused");
        cursor->advance(text[i]);
      }
      if (!cursor->complete()) throw std::runtime_error("the text did not end the answer");
      return (now() - t0) / double(text.size());
    };
    auto report = [&](const char* name, auto make, const std::vector<int32_t>& text) {
      double first = 1e30, cached = 1e30;
      for (int r = 0; r < repeat; ++r) {
        const std::shared_ptr<const AnswerGrammar> grammar = make();
        first = std::min(first, time_pass(*grammar, text));
        cached = std::min(cached, time_pass(*grammar, text));
      }
      std::printf("  %-44s %10.1f us a step, masks computed as met\n", name, first * 1e6);
      std::printf("  %-44s %10.1f us a step, masks cached\n", name, cached * 1e6);
    };
    report("json_object", [&] { return json_vocabulary(tokenizer); }, tokens);
    report("json_schema (the document's)", [&] {
      return std::make_shared<const RuleGrammar>(rules, vocabulary->tokens());
    }, tokens);
    const std::vector<int32_t> end = {tokenizer.vocab_size() - 1};  // a special token stands for EOS
    const std::vector<int32_t> sentence = tokenizer.encode(kSentence), label = tokenizer.encode(kLabels.back());
    std::printf("regex %s: %zu tokens; choice of %zu labels: %zu tokens\n", kRegex, sentence.size(), kLabels.size(),
                label.size());
    report("regex (words, then a date)", [&] {
      return std::make_shared<const RuleGrammar>(compile_regex(kRegex), vocabulary->tokens(), end);
    }, sentence);
    report("choice (20 labels)", [&] {
      return std::make_shared<const RuleGrammar>(compile_choices(kLabels), vocabulary->tokens(), end);
    }, label);
    std::printf("fastest of %d passes, one thread\n", repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_json_mask: %s\n", e.what());
    return 1;
  }
  return 0;
}
