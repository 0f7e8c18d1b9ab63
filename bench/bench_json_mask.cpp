// The host's cost of holding answers to JSON (response_format json_object): laying a tokenizer's
// vocabulary out for masks (once per job), a state's mask computed (once per distinct state), and
// a row's mask applied to its logits (every constrained row, every step). The states are those of
// a JSON document read token by token, as an answer passes through them.
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
    // The states the document passes through at its token boundaries (the last one closes it).
    std::vector<JsonState> states(1);
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      if (!vocabulary->accepts(states.back(), tokens[i])) {
        std::fprintf(stderr, "bench_json_mask: the document's token %zu is refused\n", i);
        return 1;
      }
      states.push_back(vocabulary->after(states.back(), tokens[i]));
    }
    // First masks: a fresh vocabulary per pass, so that every distinct state is computed once.
    double first = 1e30;
    size_t distinct = 0;
    for (int r = 0; r < repeat; ++r) {
      auto fresh = json_vocabulary(tokenizer);
      const double t0 = now();
      for (const JsonState& s : states) fresh->allowed(s);
      first = std::min(first, now() - t0);
      distinct = 0;
      for (size_t i = 0; i < states.size(); ++i)
        distinct += std::find(states.begin(), states.begin() + int64_t(i), states[i]) == states.begin() + int64_t(i);
    }
    // A row's mask applied to its logits and the answer moved on by its token, as the sampler does
    // every step (the states' masks are in the vocabulary's cache by now).
    std::vector<float> logits(size_t(vocabulary->size()), 0.5f);
    double apply = 1e30;
    for (int r = 0; r < repeat; ++r) {
      JsonMatcher m(vocabulary);
      const double t0 = now();
      for (size_t i = 0; i < states.size(); ++i) {
        if (m.mask(logits.data(), int64_t(logits.size())) == 0) return 1;
        if (i + 1 < states.size()) m.advance(tokens[i]);
      }
      apply = std::min(apply, now() - t0);
    }
    std::printf("tokenizer %s: %lld tokens; document of %zu bytes, %zu tokens, %zu distinct states\n", path.c_str(),
                static_cast<long long>(vocabulary->size()), std::strlen(kDocument), tokens.size(), distinct);
    std::printf("  %-36s %10.2f ms (once per job)\n", "vocabulary laid out", build * 1e3);
    std::printf("  %-36s %10.1f us a distinct state (once per state)\n", "mask computed", first / double(distinct) * 1e6);
    std::printf("  %-36s %10.1f us a row (every constrained row, every step)\n", "cached mask applied, token taken",
                apply / double(states.size()) * 1e6);
    std::printf("fastest of %d passes, one thread\n", repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_json_mask: %s\n", e.what());
    return 1;
  }
  return 0;
}
