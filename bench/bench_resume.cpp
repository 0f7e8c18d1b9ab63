// Resume's recovery of OUT.partial (job/output.cpp) in the units of its limit (docs/design.md,
// Habits): writes --lines output lines with completions of --text-bytes, then reads them back as a
// rerun does, and prints lines/s, MB/s and the peak RSS the recovery adds, beside reading the lines
// alone (the ceiling) and the old way (a full DOM parse per line into an unordered_set of id keys).
// Usage: bench_resume [--lines 1000000] [--text-bytes 200] [--format both|openai|strata] [--dir DIR]
// Rates are per CPU second (the machine may be shared). Each variant runs in a forked child whose
// peak RSS is reset first (/proc/self/clear_refs), so one's memory does not hide the next one's.
// The file is read from the page cache, just written.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "bench_common.h"
#include "strata/backend/blas_core.h"
#include "strata/core/error.h"
#include "strata/job/output.h"

using namespace strata;
using nlohmann::json;
namespace fs = std::filesystem;
using bench::Clock;
using bench::seconds_since;

namespace {

struct Args {
  int64_t lines = 1000000;
  int64_t text_bytes = 200;
  std::string format = "both", dir;
};

// Flags only, each followed by its value (bench_generate's convention).
Args parse(int argc, char** argv) {
  Args a;
  bench::for_each_option(argc, argv, [&a](const std::string& k, const std::string& v) {
    if (k == "--lines") a.lines = std::stoll(v);
    else if (k == "--text-bytes") a.text_bytes = std::stoll(v);
    else if (k == "--format") a.format = v;
    else if (k == "--dir") a.dir = v;
    else STRATA_FAIL("unknown option " << k << " (expected --lines, --text-bytes, --format, --dir)");
  });
  STRATA_CHECK(a.lines > 0 && a.text_bytes >= 0, "--lines must be positive and --text-bytes non-negative");
  STRATA_CHECK(a.format == "both" || a.format == "openai" || a.format == "strata",
               "--format must be both, openai or strata");
  return a;
}

// This process's CPU time (user + system): on a shared machine, the figure that other load does not
// inflate (the recovery is single-threaded).
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// A field of /proc/self/status in kB (VmHWM: peak resident set, VmRSS: now).
int64_t status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// Text of about `bytes` bytes from a small vocabulary, different for every line.
std::string text_of(int64_t i, int64_t bytes) {
  static const char* words[] = {"the", "model", "answers", "a", "question", "about", "offloading", "weights",
                                "to", "disk", "while", "the", "batch", "job", "streams", "prompts", "of",
                                "length", "one", "million", "é", "lines"};
  uint64_t x = uint64_t(i) * 0x9e3779b97f4a7c15ull + 1;
  std::string t;
  while (int64_t(t.size()) < bytes) {
    x ^= x >> 29, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 32;
    t += words[x % (sizeof words / sizeof *words)];
    t += ' ';
  }
  t.resize(size_t(bytes));
  if (!t.empty() && (unsigned char)t.back() == 0xC3) t.pop_back();  // half an "é": no torn UTF-8
  return t;
}

std::string id_of(int64_t i) { return "req-" + std::to_string(i); }

// The partial file of a job that answered `lines` requests, as OutputWriter writes it.
void write_partial(const fs::path& out, const Args& a, bool openai) {
  fs::remove(out.string() + ".partial");
  OutputWriter w(out);
  for (int64_t i = 0; i < a.lines; ++i) {
    const std::string text = text_of(i, a.text_bytes);
    const int64_t tokens = std::max<int64_t>(1, int64_t(text.size()) / 4);
    if (openai) {
      PromptRecord r;
      r.id = id_of(i);
      r.endpoint = i % 2 ? Endpoint::ChatCompletions : Endpoint::Completions;
      Completion c;
      c.text = text;
      c.finish_reason = "length";
      c.prompt_tokens = 20 + i % 100, c.completion_tokens = tokens;
      c.model = "SmolLM2-135M-Instruct";
      c.created = 1795424789;
      w.write(openai_response_line(r, c));
    } else {
      std::vector<int64_t> ids(static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) ids[size_t(t)] = (i * 31 + t * 7919) % 49152;
      w.write({{"id", id_of(i)}, {"completion", text}, {"tokens", ids}, {"prompt_tokens", 20 + i % 100},
               {"completion_tokens", tokens}, {"finish_reason", "length"}});
    }
  }
  w.flush();  // the destructor leaves OUT.partial, as a crash does
}

// The recovery before the compact done set: a DOM per line, the id keys in a hash set.
std::unordered_set<std::string> old_recover(const fs::path& partial) {
  std::unordered_set<std::string> ids;
  std::ifstream in(partial, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;
    try {
      auto j = json::parse(line);
      if (!j.is_object()) break;
      if (j.contains("custom_id")) ids.insert(j["custom_id"].dump());
      else if (j.contains("id")) ids.insert(j["id"].dump());
      else break;
    } catch (const json::exception&) {
      break;
    }
  }
  return ids;
}

struct Outcome {
  int64_t ids = 0;
  double lookup_wall = 0, lookup_cpu = 0;  // seconds of the lookups, not counted as recovery
};

// Runs `run` in a child process and prints its time (wall and CPU), rates per CPU second and
// peak RSS growth.
void measure(const std::string& name, const fs::path& partial, int64_t lines,
             const std::function<Outcome()>& run) {
  std::fflush(stdout);
  const pid_t pid = fork();
  STRATA_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    std::ofstream("/proc/self/clear_refs") << "5";  // peak RSS := current RSS
    const int64_t rss0 = status_kb("VmRSS"), hwm0 = status_kb("VmHWM");
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    const Outcome o = run();
    const double cpu = cpu_seconds() - c0 - o.lookup_cpu, wall = seconds_since(t0) - o.lookup_wall;
    const int64_t grow_kb = status_kb("VmHWM") - rss0;
    const double mb = double(fs::file_size(partial)) / 1e6;
    std::printf("  %-26s %6.2f s wall %6.2f s CPU  %8.0f lines/s %6.1f MB/s  peak RSS +%6.1f MiB", name.c_str(), wall,
                cpu, double(lines) / cpu, mb / cpu, double(grow_kb) / 1024);
    if (o.ids > 0) std::printf(" = %5.1f B/id", double(grow_kb) * 1024 / double(o.ids));
    if (o.lookup_cpu > 0) std::printf("  lookup %4.0f ns", o.lookup_cpu * 1e9 / double(lines));
    std::printf("%s\n", hwm0 <= rss0 + 1024 ? "" : "  (peak RSS not reset: it includes the parent's)");
    std::fflush(stdout);
    _exit(o.ids == lines || o.ids == 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  STRATA_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, name << " failed or found the wrong number of ids");
}

// Looks every id up once (as pass 2 does for each request), its key built as PromptRecord's is.
template <class Set, class Contains>
void time_lookups(const Set& set, int64_t lines, Outcome& o, Contains contains) {
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  int64_t found = 0;
  for (int64_t i = 0; i < lines; ++i) found += contains(set, json(id_of(i)).dump());
  o.lookup_cpu = cpu_seconds() - c0, o.lookup_wall = seconds_since(t0);
  STRATA_CHECK(found == lines, "lookups found " << found << " of " << lines);
}

void bench_format(const Args& a, bool openai) {
  const fs::path dir = a.dir.empty() ? fs::temp_directory_path() : fs::path(a.dir);
  fs::create_directories(dir);
  const fs::path out = dir / ("bench_resume_" + std::to_string(::getpid()) + ".jsonl");
  const fs::path partial = out.string() + ".partial";
  const auto t0 = Clock::now();
  write_partial(out, a, openai);
  const double bytes = double(fs::file_size(partial));
  std::printf("%s format: %lld lines, %.1f MB (%.0f bytes a line, completion text %lld bytes), written in %.1f s\n",
              openai ? "OpenAI batch" : "strata", (long long)a.lines, bytes / 1e6, bytes / double(a.lines),
              (long long)a.text_bytes, seconds_since(t0));

  measure("read lines only (ceiling)", partial, a.lines, [&] {
    std::ifstream in(partial, std::ios::binary);
    int64_t n = 0;
    for (std::string line; std::getline(in, line);) n += !in.eof();
    STRATA_CHECK(n == a.lines, "read " << n << " lines");
    return Outcome{};
  });
  measure("new: SAX + IdSet", partial, a.lines, [&] {
    OutputWriter w(out);  // what a rerun does: recover, then open for appending
    Outcome o{int64_t(w.done_ids().size())};
    time_lookups(w.done_ids(), a.lines, o, [](const IdSet& s, const std::string& k) { return s.contains(k); });
    return o;
  });
  measure("old: DOM + unordered_set", partial, a.lines, [&] {
    const auto ids = old_recover(partial);
    Outcome o{int64_t(ids.size())};
    time_lookups(ids, a.lines, o,
                 [](const std::unordered_set<std::string>& s, const std::string& k) { return s.count(k) > 0; });
    return o;
  });
  fs::remove(partial);
}

}  // namespace

int main(int argc, char** argv) {
  strata::use_best_blas_core(argv);
  try {
    const Args a = parse(argc, argv);
    if (a.format != "strata") bench_format(a, true);
    if (a.format != "openai") bench_format(a, false);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_resume: %s\n", e.what());
    return 1;
  }
}
