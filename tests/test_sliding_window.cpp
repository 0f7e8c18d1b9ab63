// A model with sliding-window attention (Mistral 7B v0.1's config) is served up to its window,
// where sliding and full attention agree: tiny-llama relabelled "mistral" with a 12-token window
// must give transformers' tiny-llama greedy tokens, cut at the window, and refuse a longer prompt.
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.h"

using nlohmann::json;
namespace fs = std::filesystem;

TEST_CASE("a sliding-window model answers within its window, as transformers does", "[cli]") {
  constexpr int kWindow = 12;
  const fs::path models = fs::path(STRATA_FIXTURES_DIR) / "models";
  const fs::path dir = strata::test::temp_dir("sliding") / "tiny-mistral";
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(models / "tiny-llama"))
    fs::copy_file(entry.path(), dir / entry.path().filename(), fs::copy_options::overwrite_existing);
  json config = json::parse(strata::test::read_file(dir / "config.json"));
  config["model_type"] = "mistral";
  config["sliding_window"] = kWindow;
  strata::test::write_file(dir / "config.json", config.dump());

  const json fx = json::parse(strata::test::read_file(models / "tiny-llama-cli.json"));
  const fs::path prompts = dir / "prompts.jsonl", out = dir / "out.jsonl";
  {
    std::ofstream f(prompts);
    for (const json& c : fx["cases"])
      if (c["prompt_ids"].size() < size_t(kWindow)) f << json{{"id", c["id"]}, {"prompt", c["prompt"]}}.dump() << "\n";
  }
  const strata::test::CliResult r = strata::test::run_strata("run --model " + dir.string() + " --prompts " +
                                                             prompts.string() + " --out " + out.string() +
                                                             " --device cpu --max-new-tokens 16");
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::map<int, json> cases;
  for (const json& c : fx["cases"]) cases[c["id"].get<int>()] = c;
  std::ifstream in(out);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const json got = json::parse(line);
    const json& want = cases[got["id"].get<int>()];
    const size_t room = size_t(kWindow) - want["prompt_ids"].size();  // the window holds prompt + completion
    REQUIRE(want["greedy"].size() > room);
    CHECK(got["finish_reason"] == "length");
    CHECK(got["tokens"] == json(std::vector<json>(want["greedy"].begin(), want["greedy"].begin() + long(room))));
    ++n;
  }
  CHECK(n == 2);

  // A prompt past the window is refused naming the window as the context.
  const fs::path long_prompt = dir / "long.jsonl";
  for (const json& c : fx["cases"])
    if (c["prompt_ids"].size() >= size_t(kWindow))
      std::ofstream(long_prompt) << json{{"id", c["id"]}, {"prompt", c["prompt"]}}.dump() << "\n";
  const strata::test::CliResult refused = strata::test::run_strata(
      "run --model " + dir.string() + " --prompts " + long_prompt.string() + " --out " + (dir / "long_out.jsonl").string() +
      " --device cpu");
  CHECK(refused.code != 0);
  CHECK_THAT(refused.output, Catch::Contains("fills the model's context of 12 (its sliding-window attention"));
}
