// Hugging Face's greedy continuations with log-probabilities (tests/fixtures/logprobs/
// make_logprobs.py) and the tiny fixture models they were made with, loaded on a backend.
#pragma once
#include <fstream>
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "strata/backend/backend.h"
#include "strata/model/model_loader.h"
#include "strata/runtime/model_weights.h"
#include "strata/runtime/transformer.h"
#include "test_paths.h"

namespace strata::test {

inline const nlohmann::json& logprobs_fixture() {
  static const nlohmann::json fx = [] {
    std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/logprobs/logprobs_cases.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return fx;
}

struct FixtureModel {
  std::unique_ptr<Backend> backend;
  ModelBundle bundle;
  std::unique_ptr<Transformer> model;
};

// tests/fixtures/models/NAME with its weights on `backend`.
inline FixtureModel load_fixture_model(const std::string& name, std::unique_ptr<Backend> backend) {
  FixtureModel l;
  l.backend = std::move(backend);
  l.bundle = open_model(std::string(STRATA_FIXTURES_DIR) + "/models/" + name);
  l.model = std::make_unique<Transformer>(l.bundle.config, load_model_weights(l.bundle.config, *l.bundle.weights, *l.backend),
                                          *l.backend);
  return l;
}

}  // namespace strata::test
