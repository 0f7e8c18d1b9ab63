#include "strata/policy/refill.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"

namespace strata {

double GenLengths::mean() const {
  if (samples.empty()) return assumed_mean;
  double sum = 0;
  for (int n : samples) sum += n;
  return sum / double(samples.size());
}

double GenLengths::slot_weighted_mean() const {
  if (samples.empty()) return assumed_mean;  // no spread known
  double sum = 0, squares = 0;
  for (int n : samples) sum += n, squares += double(n) * n;
  return squares / sum;
}

double GenLengths::expected_longest(int draws) const {
  if (samples.empty()) return std::max(double(assumed_longest), assumed_mean);
  // E[max] = sum over the distinct lengths v of v * (F(v)^draws - F(v-)^draws), F the samples' CDF.
  std::map<int, int> count;
  for (int n : samples) ++count[n];
  double below = 0, expected = 0;
  const double total = double(samples.size());
  for (const auto& [v, c] : count) {
    const double at = below + c;
    expected += v * (std::pow(at / total, draws) - std::pow(below / total, draws));
    below = at;
  }
  return expected;
}

GenLengths GenLengths::assumed(double mean, int longest) {
  STRATA_CHECK(mean >= 1, "the mean answer length must be at least 1 token, got " << mean);
  GenLengths g;
  g.assumed_mean = mean;
  g.assumed_longest = longest;
  return g;
}

GenLengths GenLengths::from_file(const std::string& path) {
  std::ifstream f(path);
  STRATA_CHECK(f.good(), path << ": cannot read the answer lengths");
  GenLengths g;
  auto add = [&](const nlohmann::json& v, int line) {
    STRATA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1,
                 path << ":" << line << ": completion_tokens must be a positive integer, got " << v.dump());
    g.samples.push_back(int(v.get<int64_t>()));
  };
  std::string text;
  for (int line = 1; std::getline(f, text); ++line) {
    const size_t first = text.find_first_not_of(" \t\r");
    if (first == std::string::npos || text[first] == '#') continue;
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_number_integer()) {
      add(j, line);
    } else if (j.is_object() && j.contains("choices") && j["choices"].is_array()) {
      for (const nlohmann::json& c : j["choices"]) {
        STRATA_CHECK(c.is_object() && c.contains("completion_tokens"),
                     path << ":" << line << ": a choice without completion_tokens");
        add(c["completion_tokens"], line);
      }
    } else if (j.is_object() && j.contains("completion_tokens")) {
      add(j["completion_tokens"], line);
    } else if (j.is_object() && j.contains("error")) {
      continue;  // a request the job refused: no answer
    } else {
      STRATA_FAIL(path << ":" << line
                       << ": expected an answer length (an integer, or a JSON line of strata run's output with "
                          "completion_tokens)");
    }
  }
  STRATA_CHECK(!g.samples.empty(), path << ": no answer lengths in it");
  return g;
}

RefillPrediction predict_refill(const ModelConfig& cfg, const Policy& p, int prompt_len, const GenLengths& lengths,
                                const HardwareProfile& hw) {
  RefillPrediction r;
  r.mean_len = lengths.mean();
  const int block = p.block_size();
  r.block_len = std::max(1.0, lengths.expected_longest(block));
  const Fractions x = realized_fractions(p, cfg.n_layers);

  // Blocks: every slot held until the block's longest answer ends.
  r.blocks = evaluate(cfg, p, Workload{prompt_len, std::max(1, int(std::lround(r.block_len)))}, hw);
  r.blocks_tok_s = double(block) * r.mean_len / r.blocks.total_s;
  r.blocks_occupancy = std::min(1.0, r.mean_len / r.block_len);

  // Refill: the forms at the steady state's mean context, prompt + half the answer a slot is in.
  Policy steady = p;
  steady.prefill_batches_per_step = 0;  // no staggered start: every slot is busy from the first step
  const int context_len = std::max(1, int(std::lround(lengths.slot_weighted_mean())));
  const CostForms F = cost_forms(cfg, steady, Workload{prompt_len, context_len}, hw);
  const double newcomers = 1.0 / std::max(1.0, r.mean_len);  // the share of slots prefilling per step
  const double batches = F.num_gpu_batches;
  // The weights are read once for the step's decode and prefill work, as in a staggered super-step.
  r.steady_step = stage_time(mixed_step_terms(F, x, batches * newcomers, batches * (1 - newcomers)), F, batches);
  r.refill_tok_s = double(block) / (r.steady_step.total * cfg.n_layers);
  return r;
}

}  // namespace strata
