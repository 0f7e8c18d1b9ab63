// The batch job's input validation and its resumable output file.
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/job/output.h"
#include "strata/job/prompts.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() { return test::temp_dir("jobio"); }
fs::path write_file(const std::string& name, const std::string& text) { return test::write_file(temp_dir() / name, text); }
using test::read_file;
}  // namespace

TEST_CASE("prompt lines are read with their sampling fields", "[job]") {
  SamplingParams defaults;
  defaults.max_new_tokens = 7;
  std::vector<std::string> warnings;
  const auto recs = read_prompts(write_file("ok.jsonl",
                                            "{\"id\": 1, \"prompt\": \"a\"}\n\n"
                                            "{\"id\": \"x\", \"prompt\": \"b\", \"max_new_tokens\": 3, \"temperature\": 0.5,"
                                            " \"top_p\": 0.9, \"top_k\": 4, \"seed\": 11, \"meta\": 1}\r\n"),
                                 defaults, [&](const std::string& w) { warnings.push_back(w); });
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].line == 1);
  CHECK(recs[0].sampling.max_new_tokens == 7);
  CHECK(recs[0].id_key == "1");
  CHECK(recs[1].line == 3);
  CHECK(recs[1].id_key == "\"x\"");
  CHECK(recs[1].sampling.max_new_tokens == 3);
  CHECK(recs[1].sampling.temperature == 0.5f);
  CHECK(recs[1].sampling.top_p == 0.9f);
  CHECK(recs[1].sampling.top_k == 4);
  CHECK(recs[1].sampling.seed == 11);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("unknown field 'meta'"));
}

TEST_CASE("bad prompt lines fail with file, line and reason", "[job]") {
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 2, \"prompt\": \"b\"\n", "bad1.jsonl:2: invalid JSON"},
      {"[1, 2]\n", "bad2.jsonl:1: expected a JSON object"},
      {"{\"id\": 1}\n", "bad3.jsonl:1: missing field 'prompt'"},
      {"{\"id\": 1, \"prompt\": 5}\n", "bad4.jsonl:1: field 'prompt' must be a string"},
      {"{\"prompt\": \"a\"}\n", "bad5.jsonl:1: missing field 'id'"},
      {"{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 1, \"prompt\": \"b\"}\n", "bad6.jsonl:2: duplicate id 1"},
      {"{\"id\": 1, \"prompt\": \"a\", \"max_new_tokens\": \"9\"}\n", "bad7.jsonl:1: field 'max_new_tokens' must be an integer"},
      {"{\"id\": 1, \"prompt\": \"a\", \"max_new_tokens\": 0}\n", "bad8.jsonl:1: field 'max_new_tokens' must be in"},
      {"{\"id\": 1, \"prompt\": \"a\", \"top_p\": 0}\n", "bad9.jsonl:1: field 'top_p' must be in (0, 1]"},
      {"{\"id\": 1, \"prompt\": \"a\", \"temperature\": -1}\n", "bad10.jsonl:1: field 'temperature' must be in"},
      {"{\"id\": 1.5, \"prompt\": \"a\"}\n", "bad11.jsonl:1: field 'id' must be a string or an integer"},
      {"{\"id\": 1, \"prompt\": \"\"}\n", "bad12.jsonl:1: field 'prompt' is empty"},
      {"{\"id\": 1, \"prompt\": \"a\", \"seed\": -3}\n", "bad13.jsonl:1: field 'seed' must be a non-negative integer"},
      {"{\"id\": 1, \"messages\": [{\"role\": \"user\"}]}\n", "bad14.jsonl:1: messages[0].content must be a string"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path p = write_file("bad" + std::to_string(i + 1) + ".jsonl", cases[i].text);
    INFO(cases[i].text);
    CHECK_THROWS_WITH(read_prompts(p, {}), Catch::Contains(cases[i].message));
  }
  CHECK_THROWS_WITH(read_prompts(temp_dir() / "missing.jsonl", {}), Catch::Contains("cannot open prompts file"));
}

TEST_CASE("output goes to OUT.partial and becomes OUT only when finished", "[job]") {
  const fs::path out = temp_dir() / "out1.jsonl";
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  {
    OutputWriter w(out);
    CHECK(w.done_ids().empty());
    w.write({{"id", 1}, {"completion", "x"}});
    w.flush();
    CHECK(fs::exists(out.string() + ".partial"));
    CHECK_FALSE(fs::exists(out));
    w.finish();
  }
  CHECK(fs::exists(out));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  CHECK(read_file(out) == "{\"completion\":\"x\",\"id\":1}\n");
}

TEST_CASE("a rerun resumes from the partial file and drops a torn last line", "[job]") {
  const fs::path out = temp_dir() / "out2.jsonl";
  fs::remove(out);
  write_file("out2.jsonl.partial", "{\"id\":1,\"completion\":\"a\"}\n{\"id\":\"b\",\"completion\":\"b\"}\n{\"id\":3,\"compl");
  OutputWriter w(out);
  CHECK(w.done_ids() == std::unordered_set<std::string>{"1", "\"b\""});
  w.write({{"id", 3}});
  w.finish();
  CHECK(read_file(out) == "{\"id\":1,\"completion\":\"a\"}\n{\"id\":\"b\",\"completion\":\"b\"}\n{\"id\":3}\n");
}
