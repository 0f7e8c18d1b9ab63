// libFuzzer entry for the batch job's input (read_prompts): both JSONL formats, strata and OpenAI
// batch, told apart by the first line. strata::Error is the expected way to reject input; anything
// else (crash, sanitizer report, a foreign exception such as nlohmann::json::exception) is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/job/classify.h"
#include "strata/job/cross_encoder.h"
#include "strata/job/embeddings.h"
#include "strata/job/prompts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  size_t warnings = 0;
  try {
    const auto records = strata::read_prompts(in, "fuzz.jsonl", strata::SamplingParams{},
                                              [&](const std::string& w) { warnings += w.size(); });
    // What the job does next with each record: shard hashing and the key used for resume.
    const strata::Shard shard{1, 3};
    for (const strata::PromptRecord& r : records) {
      (void)strata::in_shard(r, shard);
      if (r.id_key != r.id.dump()) __builtin_trap();
      // A completions request's prompts, a request each, as the job's reader splits them.
      const std::vector<strata::PromptRecord> parts = strata::completion_parts(r);
      if (parts.size() != std::max<size_t>(1, r.prompts.size()) || !parts.back().prompts.empty()) __builtin_trap();
      // A classification's answer line, from states as wide as a small head's.
      if (r.embedding && !r.error && r.embedding->use == strata::EmbeddingUse::Classify) {
        strata::ClassifierHead head;
        head.labels = {"a", "b", "c"};
        head.hidden = 4;
        head.weight.assign(12, 0.25f);
        std::vector<std::vector<float>> pooled(r.embedding->inputs.size(), std::vector<float>(4, 0.5f));
        (void)strata::classification_line(r, pooled, head, 1, "m", 0).dump();
        continue;
      }
      // A score or rerank request's answer line from a cross-encoder: one state per pair.
      if (r.embedding && !r.error &&
          (r.embedding->use == strata::EmbeddingUse::Score || r.embedding->use == strata::EmbeddingUse::Rerank)) {
        strata::ClassifierHead head;
        head.labels = {"LABEL_0"};
        head.hidden = 4;
        head.weight.assign(4, 0.25f);
        head.activation = strata::ClassifierActivation::Sigmoid;
        const size_t pairs = strata::request_pairs(*r.embedding).size();
        std::vector<std::vector<float>> pooled(pairs, std::vector<float>(4, 0.5f));
        (void)strata::cross_encoder_line(r, pooled, head, 1, "m", 0).dump();
      }
      // An embeddings request's answer line, from vectors as wide as it asks for.
      if (r.embedding && !r.error) {
        const size_t width = r.embedding->dimensions > 0 ? size_t(r.embedding->dimensions) : 4;
        if (width > 4096) continue;
        std::vector<std::vector<float>> vectors(r.embedding->inputs.size(), std::vector<float>(width, 0.5f));
        (void)strata::embedding_line(r, std::move(vectors), 1, true, "m", 0).dump();
      }
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
