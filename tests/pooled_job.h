// Helpers of the tests that run pooled requests (embeddings, classifications, cross-encoder scores)
// through run_batch_job: the job's options on the CPU, an OpenAI batch line, and the output lines by id.
#pragma once
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "strata/job/batch_job.h"

namespace strata::test {

// A quiet job on the CPU with two threads.
inline JobOptions pooled_job(const std::string& model, const std::filesystem::path& in,
                             const std::filesystem::path& out) {
  JobOptions o;
  o.model = model;
  o.prompts = in;
  o.out = out;
  o.device = "cpu";
  o.threads = 2;
  o.progress = false;
  return o;
}

// One OpenAI batch request line, newline-terminated.
inline std::string batch_request(const std::string& id, const std::string& url, const nlohmann::json& body) {
  return nlohmann::json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}}.dump() + "\n";
}

// An output file's lines by custom_id (OpenAI), or by the id's JSON text (strata: "\"s\"", "1").
inline std::map<std::string, nlohmann::json> lines_by_id(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::map<std::string, nlohmann::json> m;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json l = nlohmann::json::parse(line);
    m[l.contains("custom_id") ? l["custom_id"].get<std::string>() : l["id"].dump()] = l;
  }
  return m;
}

}  // namespace strata::test
