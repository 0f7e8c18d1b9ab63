#include "test_paths.h"
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "strata/runtime/sampler.h"

using namespace strata;

namespace {

nlohmann::json load_fixture(const std::string& file) {
  std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/sampling/" + file);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// A fixture's distributions (its logit_sets and cases of temperature, top_k, top_p, min_p and
// transformers' probs) against sampling_distribution: the same support exactly, each probability
// within 1e-6.
void check_against_transformers(const nlohmann::json& fx) {
  for (const auto& c : fx["cases"]) {
    const std::vector<float> logits = fx["logit_sets"][c["logits"].get<std::string>()].get<std::vector<float>>();
    const std::vector<double> want = c["probs"].get<std::vector<double>>();
    SamplingParams p;
    p.temperature = c["temperature"].get<float>();
    p.top_k = c["top_k"].get<int>();
    p.top_p = c["top_p"].get<float>();
    p.min_p = c.value("min_p", 0.0f);
    std::vector<double> got(logits.size(), 0.0);
    for (const auto& [tok, prob] : sampling_distribution(logits.data(), int64_t(logits.size()), p))
      got[size_t(tok)] = prob;
    INFO(c["logits"] << " t=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p << " min_p=" << p.min_p);
    for (size_t i = 0; i < want.size(); ++i) {
      CHECK((want[i] == 0.0) == (got[i] == 0.0));  // the same support exactly
      CHECK(got[i] == Approx(want[i]).margin(1e-6));
    }
  }
}

}  // namespace

TEST_CASE("warped distributions equal transformers' logits warpers", "[sampler]") {
  const auto fx = load_fixture("warped_probs.json");
  REQUIRE(fx["cases"].size() == 24);
  check_against_transformers(fx);
}

TEST_CASE("min-p distributions equal transformers' MinPLogitsWarper after temperature, top-k and top-p",
          "[sampler]") {
  const auto fx = load_fixture("penalties.json")["min_p"];
  REQUIRE(fx["cases"].size() == 12);
  check_against_transformers(fx);
}

TEST_CASE("greedy picks the first maximum, sampling is seeded and follows the distribution", "[sampler]") {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f};
  SamplingParams greedy;
  CHECK(Sampler(greedy).sample(logits.data(), 5) == 1);
  SamplingParams k1;
  k1.temperature = 1.0f;
  k1.top_k = 1;
  CHECK(Sampler(k1).sample(logits.data(), 5) == 1);

  SamplingParams s;
  s.temperature = 1.0f;
  s.seed = 42;
  Sampler a(s), b(s);
  std::vector<int32_t> seq_a, seq_b;
  for (int i = 0; i < 50; ++i) {
    seq_a.push_back(a.sample(logits.data(), 5));
    seq_b.push_back(b.sample(logits.data(), 5));
  }
  CHECK(seq_a == seq_b);
  s.seed = 43;
  Sampler c(s);
  std::vector<int32_t> seq_c;
  for (int i = 0; i < 50; ++i) seq_c.push_back(c.sample(logits.data(), 5));
  CHECK(seq_c != seq_a);

  // Frequencies over many draws approach the softmax (within 5 standard deviations).
  const int n = 40000;
  std::map<int32_t, int> counts;
  Sampler d(s);
  for (int i = 0; i < n; ++i) ++counts[d.sample(logits.data(), 5)];
  const auto dist = sampling_distribution(logits.data(), 5, s);
  for (const auto& [tok, p] : dist) {
    const double sd = std::sqrt(p * (1 - p) / n);
    CHECK(std::fabs(double(counts[tok]) / n - p) < 5 * sd + 1e-9);
  }
}
