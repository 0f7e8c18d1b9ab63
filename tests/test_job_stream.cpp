// The streaming batch job: pass 1's checks, pass 2's reader, length-aware blocks and their
// padding, the bounded queues and window, --ordered, resume, and the progress line.
#include "error_text.h"
#include "test_paths.h"
#include "temp_files.h"
#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>
#include <thread>

#include "strata/core/error.h"
#include "strata/job/batch_job.h"
#include "strata/job/blocks.h"
#include "strata/job/progress.h"
#include "strata/job/prompt_stream.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() { return test::temp_dir("jobstream"); }
fs::path write_file(const std::string& name, const std::string& text) { return test::write_file(temp_dir() / name, text); }

using test::error_of;

std::vector<json> read_lines(const fs::path& file) {
  std::vector<json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

std::string id_of(const json& line) { return line.contains("custom_id") ? line["custom_id"].dump() : line["id"].dump(); }

// Prompts of mixed lengths: short and long alternate, so input-order blocks pad a lot.
std::string prompt_text(int i) {
  std::string p = "story " + std::to_string(i);
  if (i % 2 == 1)
    for (int k = 0; k < 6; ++k) p += " and then the fox ran";
  return p;
}

fs::path strata_file(const std::string& name, int n) {
  std::ostringstream os;
  for (int i = 0; i < n; ++i)
    os << json{{"id", "p" + std::to_string(i)}, {"prompt", prompt_text(i)}, {"max_new_tokens", 3}}.dump() << "\n";
  return write_file(name, os.str());
}

fs::path openai_file(const std::string& name, int n) {
  std::ostringstream os;
  for (int i = 0; i < n; ++i)
    os << json{{"custom_id", "r" + std::to_string(i)},
               {"method", "POST"},
               {"url", "/v1/completions"},
               {"body", {{"prompt", prompt_text(i)}, {"max_tokens", 3}}}}
              .dump()
       << "\n";
  // One request that cannot be served: an error line in its place.
  os << json{{"custom_id", "bad"}, {"url", "/v1/completions"}, {"body", {{"prompt", "x"}, {"n", 2}}}}.dump() << "\n";
  return write_file(name, os.str());
}

// Every line answers as `want` (by id) does: the same line, or for OpenAI lines the same error,
// choices and usage (the ids and timestamps differ).
void check_same_answers(const std::vector<json>& lines, const std::map<std::string, json>& want, bool openai) {
  REQUIRE(lines.size() == want.size());
  for (const json& l : lines) {
    const json& w = want.at(id_of(l));
    if (!openai) {
      CHECK(l == w);
      continue;
    }
    CHECK(l["error"] == w["error"]);
    if (l["response"].is_null()) continue;
    CHECK(l["response"]["body"]["choices"] == w["response"]["body"]["choices"]);
    CHECK(l["response"]["body"]["usage"] == w["response"]["body"]["usage"]);
  }
}

// Blocks unless `refill`: most tests here are about blocks and their padding.
JobOptions job(const fs::path& in, const fs::path& out, int batch, int window, bool ordered, bool refill = false) {
  JobOptions o;
  o.model = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-opt";
  o.device = "cpu";
  o.threads = 1;
  o.progress = false;
  o.prompts = in;
  o.out = out;
  o.batch_size = batch;
  o.window = window;
  o.ordered = ordered;
  o.refill = refill;
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  return o;
}

}  // namespace

TEST_CASE("pass 1 refuses a repeated id at the line of its second occurrence", "[job]") {
  const fs::path f = write_file("dup.jsonl",
                                "{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 2, \"prompt\": \"b\"}\n\n"
                                "{\"id\": 1, \"prompt\": \"c\"}\n{\"id\": 2, \"prompt\": \"d\"}\n");
  CHECK(error_of([&] { scan_prompts(f, {}, {}); }) == f.string() + ":4: duplicate id 1");
  // A repeated id before a malformed line refuses the file first, as read_prompts does.
  const fs::path g = write_file("dup_then_bad.jsonl",
                                "{\"id\": \"a\", \"prompt\": \"a\"}\n{\"id\": \"a\", \"prompt\": \"b\"}\nnot json\n");
  CHECK(error_of([&] { scan_prompts(g, {}, {}); }) == g.string() + ":2: duplicate id \"a\"");
  const fs::path h = write_file("dup_openai.jsonl",
                                "{\"custom_id\": \"x\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\"}}\n"
                                "{\"custom_id\": \"y\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\"}}\n"
                                "{\"custom_id\": \"x\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"b\"}}\n");
  CHECK(error_of([&] { scan_prompts(h, {}, {}); }) == h.string() + ":3: duplicate custom_id \"x\"");
  // The integer 1 and the string "1" are different ids.
  const fs::path k = write_file("not_dup.jsonl", "{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": \"1\", \"prompt\": \"b\"}\n");
  const PromptScan s = scan_prompts(k, {}, {});
  CHECK(s.requests == 2);
  CHECK(s.format == InputFormat::Strata);
}

TEST_CASE("pass 1 refuses a malformed line and shows every record once, in order", "[job]") {
  const fs::path f = write_file("bad3.jsonl",
                                "{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 2, \"prompt\": \"b\"}\n"
                                "{\"id\": 3, \"prompt\": 7}\n{\"id\": 4, \"prompt\": \"d\"}\n");
  CHECK(error_of([&] { scan_prompts(f, {}, {}); }) == f.string() + ":3: field 'prompt' must be a string, got 7");
  const fs::path g = write_file("ok4.jsonl",
                                "{\"id\": 1, \"prompt\": \"a\", \"x\": 1}\n\n{\"id\": 2, \"prompt\": \"b\", \"x\": 2}\n");
  std::vector<int> lines;
  std::vector<std::string> warnings;
  const PromptScan s = scan_prompts(
      g, {}, [&](const std::string& w) { warnings.push_back(w); }, [&](const PromptRecord& r) { lines.push_back(r.line); });
  CHECK(s.requests == 2);
  CHECK(s.lines == 3);
  CHECK(lines == std::vector<int>{1, 3});
  CHECK(warnings.size() == 1);  // once per unknown key
  // Pass 2 reads the same records again.
  PromptReader reader(g, {});
  std::vector<std::string> ids;
  while (auto r = reader.next()) ids.push_back(r->id_key);
  CHECK(ids == std::vector<std::string>{"1", "2"});
}

TEST_CASE("pass 1 over many batches of lines reports as a sequential pass does", "[job]") {
  // 20000 lines: pass 1 parses them in batches of 8192 on several threads.
  auto big = [](const std::string& name, const std::map<int, std::string>& replace) {
    std::string text;
    for (int i = 1; i <= 20000; ++i) {
      const auto it = replace.find(i);
      text += it != replace.end() ? it->second : "{\"id\": " + std::to_string(i) + ", \"prompt\": \"p\"}";
      text += "\n";
    }
    return write_file(name, text);
  };
  const fs::path f = big("big.jsonl", {{9001, "{\"id\": 9001, \"prompt\": \"p\", \"extra\": 1}"},
                                       {17000, "{\"id\": 17000, \"prompt\": \"p\", \"extra\": 2}"},
                                       {12000, ""}});
  for (const int threads : {1, 3}) {
    INFO(threads << " threads");
    std::vector<std::string> warnings;
    std::vector<int> lines;
    const PromptScan s = scan_prompts(
        f, {}, [&](const std::string& w) { warnings.push_back(w); }, [&](const PromptRecord& r) { lines.push_back(r.line); },
        threads);
    CHECK(s.requests == 19999);
    CHECK(s.lines == 20000);
    REQUIRE(lines.size() == 19999);
    CHECK(std::is_sorted(lines.begin(), lines.end()));
    CHECK(lines.back() == 20000);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0] == f.string() + ":9001: ignoring unknown field 'extra'");
  }

  const std::string again = "{\"id\": 5, \"prompt\": \"again\"}";
  const fs::path dup = big("big_dup.jsonl", {{19000, again}});
  CHECK(error_of([&] { scan_prompts(dup, {}, {}, {}, 3); }) == dup.string() + ":19000: duplicate id 5");
  // The first of a repeated id and a malformed line refuses the file, wherever the batches fall.
  const fs::path dup_first = big("big_dup_first.jsonl", {{10000, again}, {19000, "{\"id\": 99999}"}});
  CHECK(error_of([&] { scan_prompts(dup_first, {}, {}, {}, 3); }) == dup_first.string() + ":10000: duplicate id 5");
  const fs::path bad_first = big("big_bad_first.jsonl", {{10000, "{\"id\": 99999}"}, {19000, again}});
  CHECK(error_of([&] { scan_prompts(bad_first, {}, {}, {}, 3); }) == bad_first.string() + ":10000: missing field 'prompt' (or 'messages'; 'input' for an embedding, 'classify' for a classification)");
  const fs::path mixed = big("big_mixed.jsonl", {{16000, "{\"custom_id\": \"x\", \"url\": \"/v1/completions\", \"body\": {}}"}});
  CHECK_THAT(error_of([&] { scan_prompts(mixed, {}, {}, {}, 3); }),
             Catch::StartsWith(mixed.string() + ":16000: this line is in the OpenAI batch format, but line 1 is in the "
                                                "strata format"));
}

TEST_CASE("length-aware blocks count a request's n choices and never split them", "[job]") {
  // Sorted by length: 1 (n 3), 3 (n 1), 3 (n 2), 5 (n 6), 9 (n 1); blocks of 4 sequences.
  const std::vector<int> lengths = {5, 1, 3, 9, 3}, choices = {6, 3, 1, 1, 2};
  const auto blocks = length_blocks(lengths, 4, choices);
  REQUIRE(blocks.size() == 4);
  CHECK(blocks[0] == std::vector<size_t>{1, 2});  // 3 + 1 sequences
  CHECK(blocks[1] == std::vector<size_t>{4});     // 2; the next request's 6 do not fit beside them
  CHECK(blocks[2] == std::vector<size_t>{0});     // 6 > 4: a block of its own, not split
  CHECK(blocks[3] == std::vector<size_t>{3});
}

TEST_CASE("length-aware blocks sort a window by length and cut it into blocks", "[job]") {
  const std::vector<int> lengths = {5, 1, 3, 1, 9, 2};
  const auto blocks = length_blocks(lengths, 2);
  REQUIRE(blocks.size() == 3);
  CHECK(blocks[0] == std::vector<size_t>{1, 3});  // ties keep input order
  CHECK(blocks[1] == std::vector<size_t>{5, 2});
  CHECK(blocks[2] == std::vector<size_t>{0, 4});
  CHECK(length_blocks(lengths, 4).back() == std::vector<size_t>{0, 4});
  CHECK(length_blocks({}, 4).empty());

  // Padding: short and long prompts alternating pad half of every input-order block.
  const std::vector<int> mix = {2, 10, 2, 10};
  Padding sorted;
  for (const auto& b : length_blocks(mix, 2)) sorted.add_block(mix, b);
  CHECK(sorted.useful == 24);
  CHECK(sorted.computed == 24);
  CHECK(sorted.efficiency() == 1.0);
  const Padding input = input_order_padding(mix, 2);
  CHECK(input.useful == 24);
  CHECK(input.computed == 40);
  CHECK(input.efficiency() == Approx(0.6));
}

TEST_CASE("a bounded queue makes its producer wait when full and ends when closed", "[job]") {
  BoundedQueue<int> q(2);
  REQUIRE(q.push(1));
  REQUIRE(q.push(2));
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    q.push(3);
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(pushed);
  CHECK(q.size() == 2);
  CHECK(q.pop() == 1);
  producer.join();
  CHECK(pushed);
  q.close();
  CHECK(q.pop() == 2);
  CHECK(q.pop() == 3);
  CHECK_FALSE(q.pop());
  CHECK_FALSE(q.push(4));
}

TEST_CASE("the progress line shows requests, tokens, rate and an ETA from the blocks", "[job]") {
  ProgressState s;
  s.done = 300;
  s.total = 1000;
  s.tokens = 1200;
  CHECK(progress_line(s, 10) == "300/1000 requests, 1200 tokens, 120.0 tok/s, 10.0 s");
  s.blocks_done = 3;
  s.blocks_planned = 10;
  CHECK(progress_line(s, 10) == "300/1000 requests, 1200 tokens, 120.0 tok/s, 10.0 s, ETA 23 s");
  s.blocks_planned = 3000;
  CHECK_THAT(progress_line(s, 10), Catch::EndsWith("ETA 2h46m"));
}

TEST_CASE("progress to a log file prints the final state once", "[job]") {
  if (isatty(STDERR_FILENO)) {  // Progress redraws one line on a terminal instead
    WARN("stderr is a terminal: skipped");
    return;
  }
  std::ostringstream log;
  Progress progress(log, true);
  ProgressState s;
  s.done = s.total = 4;
  s.tokens = 128;
  auto lines = [&] {
    const std::string text = log.str();
    return std::count(text.begin(), text.end(), '\n');
  };
  progress.update(s);        // the first update prints
  progress.update(s, true);  // the job's closing update: nothing new to say
  CHECK(lines() == 1);
  s.tokens = 130;
  progress.update(s, true);
  CHECK(lines() == 2);
  progress.end();
  CHECK(lines() == 2);
}

TEST_CASE("streamed jobs give the same answers in any window, completion order or input order", "[job]") {
  for (const bool openai : {false, true}) {
    INFO((openai ? "OpenAI" : "strata") << " format");
    const int n = 10;
    const fs::path in = openai ? openai_file("mix_oa.jsonl", n) : strata_file("mix.jsonl", n);
    std::vector<std::string> input_ids;
    for (int i = 0; i < n; ++i) input_ids.push_back(json(std::string(openai ? "r" : "p") + std::to_string(i)).dump());
    if (openai) input_ids.push_back("\"bad\"");
    std::ostringstream log;
    // One request at a time, in input order: the schedule of the job before streaming.
    const fs::path ref = temp_dir() / "mix_ref.jsonl";
    run_batch_job(job(in, ref, 1, 1, false), log);
    std::map<std::string, json> want;
    std::vector<std::string> ref_order;
    for (const json& l : read_lines(ref)) want[id_of(l)] = l, ref_order.push_back(id_of(l));
    CHECK(ref_order == input_ids);
    REQUIRE(want.size() == input_ids.size());

    auto same_answers = [&](const std::vector<json>& lines) { check_same_answers(lines, want, openai); };
    // Blocks of 4 out of a window of all: completion order differs from input order.
    const fs::path out = temp_dir() / "mix_out.jsonl";
    const JobSummary s = run_batch_job(job(in, out, 4, 0, false), log);
    const std::vector<json> lines = read_lines(out);
    same_answers(lines);
    std::vector<std::string> order;
    for (const json& l : lines) order.push_back(id_of(l));
    CHECK(order != input_ids);
    CHECK(s.blocks == 3);
    CHECK(s.padding.efficiency() > s.padding_input_order.efficiency());
    // --ordered restores input order.
    const fs::path ordered = temp_dir() / "mix_ordered.jsonl";
    run_batch_job(job(in, ordered, 4, 0, true), log);
    const std::vector<json> olines = read_lines(ordered);
    same_answers(olines);
    order.clear();
    for (const json& l : olines) order.push_back(id_of(l));
    CHECK(order == input_ids);
  }
}

TEST_CASE("a refilled job answers as one request at a time, in completion order or --ordered", "[job][continuous]") {
  for (const bool openai : {false, true}) {
    INFO((openai ? "OpenAI" : "strata") << " format");
    const int n = 12;
    const fs::path in = openai ? openai_file("refill_oa.jsonl", n) : strata_file("refill.jsonl", n);
    std::ostringstream log;
    const fs::path ref = temp_dir() / "refill_ref.jsonl";
    run_batch_job(job(in, ref, 1, 1, false), log);
    std::map<std::string, json> want;
    std::vector<std::string> input_order;  // one at a time: the lines in input order
    for (const json& l : read_lines(ref)) want[id_of(l)] = l, input_order.push_back(id_of(l));
    auto same_answers = [&](const std::vector<json>& lines) { check_same_answers(lines, want, openai); };
    for (const bool ordered : {false, true}) {
      INFO((ordered ? "--ordered" : "completion order"));
      std::ostringstream rlog;
      const fs::path out = temp_dir() / "refill_out.jsonl";
      const JobSummary s = run_batch_job(job(in, out, 3, 5, ordered, true), rlog);
      const std::vector<json> lines = read_lines(out);
      same_answers(lines);
      CHECK(s.refilled);
      CHECK(s.blocks == 0);
      CHECK(s.occupancy > 0);
      CHECK(s.window_peak == 5);  // windows of 5, 5 and the rest
      CHECK_THAT(rlog.str(), Catch::Contains("continuous batching: 3 slots, occupancy "));
      if (ordered) {
        std::vector<std::string> order;
        for (const json& l : lines) order.push_back(id_of(l));
        CHECK(order == input_order);
      }
    }
  }
}

TEST_CASE("the window bounds the requests held, and --ordered holds back at most one window", "[job]") {
  const fs::path in = strata_file("window.jsonl", 10), out = temp_dir() / "window_out.jsonl";
  std::ostringstream log;
  const JobSummary s = run_batch_job(job(in, out, 2, 3, true), log);
  CHECK(s.window == 3);
  CHECK(s.window_peak == 3);
  CHECK(s.reorder_peak <= 3);
  CHECK(s.blocks == 7);  // windows of 3, 3, 3, 1 requests: blocks of 2 + 1, three times, then 1
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 10);
  for (int i = 0; i < 10; ++i) CHECK(lines[size_t(i)]["id"] == "p" + std::to_string(i));
  CHECK_THAT(log.str(), Catch::Contains("padding efficiency:"));
}

TEST_CASE("padding efficiency of a known mix: sorted blocks pad nothing, input order half", "[job]") {
  // Two lengths alternating; blocks of 2 out of one window: sorted, each block is of one length.
  std::string text;
  for (int i = 0; i < 4; ++i)
    text += json{{"id", "p" + std::to_string(i)}, {"prompt", i % 2 ? "once upon a time there was a fox" : "hello"},
                 {"max_new_tokens", 2}}.dump() + "\n";
  const fs::path in = write_file("pad.jsonl", text), out = temp_dir() / "pad_out.jsonl";
  std::ostringstream log;
  const JobSummary s = run_batch_job(job(in, out, 2, 0, false), log);
  std::map<std::string, int64_t> len;
  for (const json& l : read_lines(out)) len[l["id"]] = l["prompt_tokens"];
  REQUIRE(len.size() == 4);
  const int64_t short_len = len["p0"], long_len = len["p1"];
  REQUIRE(len["p2"] == short_len);
  REQUIRE(len["p3"] == long_len);
  REQUIRE(long_len > short_len);
  CHECK(s.padding.useful == 2 * short_len + 2 * long_len);
  CHECK(s.padding.computed == s.padding.useful);
  CHECK(s.padding_input_order.computed == 4 * long_len);
  CHECK(s.prompt_tokens == s.padding.useful);
}

TEST_CASE("a malformed or repeated line refuses the streamed job before any output", "[job]") {
  std::string text;
  for (int i = 0; i < 5; ++i) text += "{\"id\": " + std::to_string(i) + ", \"prompt\": \"hello\"}\n";
  const fs::path out = temp_dir() / "refused_out.jsonl";
  std::ostringstream log;
  const fs::path bad = write_file("refused.jsonl", text + "{\"id\": 9, \"prompt\": \"x\", \"top_p\": 2}\n" + text.substr(0, 10));
  CHECK_THAT(error_of([&] { run_batch_job(job(bad, out, 2, 0, false), log); }),
             Catch::Contains("refused.jsonl:6: field 'top_p' must be in (0, 1]"));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
  const fs::path dup = write_file("refused_dup.jsonl", text + "{\"id\": 3, \"prompt\": \"again\"}\n");
  CHECK(error_of([&] { run_batch_job(job(dup, out, 2, 0, false), log); }) ==
        dup.string() + ":6: duplicate id 3");
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_CASE("a streamed job resumes: only the ids not yet in OUT.partial run", "[job]") {
  const bool refill = GENERATE(false, true);
  INFO((refill ? "continuous batching" : "blocks"));
  const fs::path in = strata_file("resume.jsonl", 6), out = temp_dir() / "resume_out.jsonl";
  std::ostringstream log;
  JobOptions o = job(in, out, 2, 0, false, refill);
  std::ofstream(out.string() + ".partial") << "{\"id\":\"p1\",\"completion\":\"kept\"}\n"
                                              "{\"id\":\"p4\",\"completion\":\"kept\"}\n{\"id\":\"p5\",\"comp";
  const JobSummary s = run_batch_job(o, log);
  CHECK(s.resumed == 2);
  CHECK_THAT(log.str(), Catch::Contains("2 of 6 prompts already done"));
  const std::vector<json> lines = read_lines(out);
  REQUIRE(lines.size() == 6);
  CHECK(lines[0]["completion"] == "kept");
  CHECK(lines[1]["completion"] == "kept");
  std::map<std::string, int> seen;
  for (const json& l : lines) ++seen[l["id"]];
  for (int i = 0; i < 6; ++i) CHECK(seen["p" + std::to_string(i)] == 1);
}

TEST_CASE("pass 1 refuses a strata prompt that fills the context, tokenizing only the long ones", "[job]") {
  // tiny-opt's context is 128 tokens. A prompt of 160 bytes may or may not fill it: pass 1
  // tokenizes it (its byte bound reaches the context) and decides.
  std::string fits, fills;
  for (int i = 0; i < 40; ++i) fits += "the ";  // 160 bytes, 41 tokens
  for (int i = 0; i < 150; ++i) fills += "x y ";
  std::string text;
  for (int i = 0; i < 3; ++i) text += json{{"id", i}, {"prompt", "short " + std::to_string(i)}}.dump() + "\n";
  text += json{{"id", 3}, {"prompt", fits}, {"max_new_tokens", 2}}.dump() + "\n";
  const fs::path ok = write_file("ctx_ok.jsonl", text), out = temp_dir() / "ctx_out.jsonl";
  std::ostringstream log;
  JobOptions o = job(ok, out, 2, 0, false);
  o.progress = true;  // the "checked" line
  o.defaults.max_new_tokens = 2;
  const JobSummary s = run_batch_job(o, log);
  CHECK(s.prompts == 4);
  CHECK_THAT(log.str(), Catch::Contains("checked 4 requests") && Catch::Contains("tokenized 1 of them"));
  const fs::path bad = write_file("ctx_bad.jsonl", text + json{{"id", 4}, {"prompt", fills}}.dump() + "\n");
  CHECK_THAT(error_of([&] { run_batch_job(job(bad, out, 2, 0, false), log); }),
             Catch::Contains("ctx_bad.jsonl:5: prompt of") && Catch::Contains("fills the model's context of 128"));
  CHECK_FALSE(fs::exists(out.string() + ".partial"));
}

TEST_CASE("under --policy the engine is planned for the job's longest prompt, found in pass 1", "[job][offload]") {
  const fs::path in = strata_file("plan.jsonl", 9), out = temp_dir() / "plan_out.jsonl";
  const fs::path policy = write_file("plan.yaml", "gpu_batch_size: 2\nnum_gpu_batches: 2\n"
                                                  "weights: {gpu: 0, cpu: 100, disk: 0}\n"
                                                  "kv_cache: {gpu: 0, cpu: 100, disk: 0}\n"
                                                  "activations: {gpu: 100, cpu: 0, disk: 0}\n");
  JobOptions o = job(in, out, 2, 0, false);
  o.policy = policy;
  o.offload_dir = temp_dir() / "offload";
  std::ostringstream log;
  const JobSummary s = run_batch_job(o, log);
  int64_t longest = 0;
  for (const json& l : read_lines(out)) longest = std::max<int64_t>(longest, l["prompt_tokens"]);
  INFO(log.str());
  CHECK_THAT(log.str(), Catch::Contains("block 2 x 2, prompt <= " + std::to_string(longest) + ", generation <= 3"));
  CHECK(s.blocks == 3);  // 9 requests in blocks of 4
  // The same answers as the resident generator's.
  const fs::path ref = temp_dir() / "plan_ref.jsonl";
  run_batch_job(job(in, ref, 3, 0, false), log);
  std::map<std::string, json> want;
  for (const json& l : read_lines(ref)) want[l["id"]] = l["tokens"];
  for (const json& l : read_lines(out)) CHECK(l["tokens"] == want.at(l["id"]));
}
