#include "strata/job/prompt_stream.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <thread>
#include <queue>
#include <unordered_set>

#include "strata/core/error.h"

namespace strata {
namespace {

// FNV-1a then splitmix64's finalizer, which spreads FNV's weak high bits: for 10M ids the
// chance of any collision is about 3e-6, and a collision costs only a reread (confirm_repeats).
uint64_t fingerprint(std::string_view key) {
  uint64_t h = fnv1a64(key);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

// Fingerprints in chunks of 1M: no reallocation doubles the peak, and sorted chunks merge.
class Fingerprints {
public:
  void add(uint64_t f) {
    if (chunks_.empty() || chunks_.back().size() == kChunk) {
      chunks_.emplace_back();
      chunks_.back().reserve(kChunk);
    }
    chunks_.back().push_back(f);
  }
  // The fingerprints seen more than once, sorted.
  std::vector<uint64_t> repeated() {
    for (auto& c : chunks_) std::sort(c.begin(), c.end());
    using Head = std::pair<uint64_t, size_t>;  // value, chunk
    std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
    std::vector<size_t> pos(chunks_.size(), 0);
    for (size_t c = 0; c < chunks_.size(); ++c)
      if (!chunks_[c].empty()) heads.push({chunks_[c][0], c});
    std::vector<uint64_t> out;
    bool have_prev = false;
    uint64_t prev = 0;
    while (!heads.empty()) {
      const auto [v, c] = heads.top();
      heads.pop();
      if (have_prev && v == prev && (out.empty() || out.back() != v)) out.push_back(v);
      prev = v, have_prev = true;
      if (++pos[c] < chunks_[c].size()) heads.push({chunks_[c][pos[c]], c});
    }
    return out;
  }
  void clear() { std::vector<std::vector<uint64_t>>().swap(chunks_); }

private:
  static constexpr size_t kChunk = size_t(1) << 20;
  std::vector<std::vector<uint64_t>> chunks_;
};

// Rereads lines 1..last_line and throws "FILE:LINE: duplicate id X" at the first line whose id
// an earlier line had, among the ids whose fingerprint repeats (`suspects`, sorted).
void confirm_repeats(const std::filesystem::path& file, const SamplingParams& defaults,
                     const std::vector<uint64_t>& suspects, int last_line) {
  std::ifstream in(file);
  if (!in) STRATA_FAIL("cannot open prompts file " << file.string());
  PromptLineParser parser(file.string(), defaults);
  std::unordered_set<std::string> seen;
  std::string text;
  for (int line = 1; line <= last_line && std::getline(in, text); ++line) {
    const std::optional<PromptRecord> r = parser.parse(text, line);
    if (!r || !std::binary_search(suspects.begin(), suspects.end(), fingerprint(r->id_key))) continue;
    if (!seen.insert(r->id_key).second)
      throw Error(file.string() + ":" + std::to_string(line) + ": " + duplicate_id_message(*r));
  }
}

// Pass 1 parses batches of lines on several threads; the calling thread reads the lines and
// merges the batches in file order, so errors, warnings and `each` come as a sequential pass's.
struct LineBatch {
  int first_line = 0;  // the line number of lines[0]
  std::vector<std::string> lines;
};

struct BatchResult {
  std::vector<PromptRecord> records;
  std::vector<uint64_t> prints;       // one a record
  std::vector<std::string> warnings;
  std::exception_ptr error;           // the batch's first malformed line
  int checked = 0;                    // the last line parsed without error
};

BatchResult parse_batch(const LineBatch& b, const std::string& file, const SamplingParams& defaults,
                        InputFormat format, int format_line) {
  BatchResult r;
  PromptLineParser parser(file, defaults, [&r](const std::string& w) { r.warnings.push_back(w); });
  parser.expect_format(format, format_line);
  r.checked = b.first_line - 1;
  try {
    for (size_t i = 0; i < b.lines.size(); ++i) {
      const int line = b.first_line + int(i);
      std::optional<PromptRecord> rec = parser.parse(b.lines[i], line);
      r.checked = line;
      if (!rec) continue;
      r.prints.push_back(fingerprint(rec->id_key));
      r.records.push_back(std::move(*rec));
    }
  } catch (const Error&) {
    r.error = std::current_exception();
  }
  return r;
}

constexpr size_t kBatchLines = 8192;

}  // namespace

PromptScan scan_prompts(const std::filesystem::path& file, const SamplingParams& defaults,
                        const std::function<void(const std::string&)>& warn,
                        const std::function<void(const PromptRecord&)>& each, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  std::ifstream in(file);
  if (!in) STRATA_FAIL("cannot open prompts file " << file.string());
  const std::string name = file.string();
  // Warnings once per field across batches: keyed by their text after "FILE:LINE: ".
  std::unordered_set<std::string> warned;
  auto emit = [&](const std::string& w) {
    const size_t at = w.find(": ", name.size());
    if (warned.insert(at == std::string::npos ? w : w.substr(at + 2)).second && warn) warn(w);
  };
  PromptLineParser head(name, defaults, emit);  // the lines up to the first request
  Fingerprints prints;
  PromptScan scan;
  int checked = 0;  // lines whose records were parsed and seen (their ids among the fingerprints)
  auto add = [&](const PromptRecord& r, uint64_t print) {
    prints.add(print);
    ++scan.requests;
    checked = r.line;
    if (each) each(r);
  };
  const size_t workers =
      threads > 0 ? size_t(threads) : std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  try {
    std::string text;
    while (!head.format() && std::getline(in, text)) {
      const std::optional<PromptRecord> r = head.parse(text, ++scan.lines);
      checked = scan.lines;
      if (r) add(*r, fingerprint(r->id_key));
    }
    if (head.format()) {
      const InputFormat format = *head.format();
      const int format_line = checked;
      std::deque<std::future<BatchResult>> pending;
      auto merge = [&](BatchResult r) {
        for (const std::string& w : r.warnings) emit(w);
        for (size_t i = 0; i < r.records.size(); ++i) add(r.records[i], r.prints[i]);
        checked = r.checked;
        if (r.error) std::rethrow_exception(r.error);
      };
      for (;;) {
        LineBatch b;
        b.first_line = scan.lines + 1;
        b.lines.reserve(kBatchLines);
        while (b.lines.size() < kBatchLines && std::getline(in, text)) {
          ++scan.lines;
          b.lines.push_back(std::move(text));
        }
        if (b.lines.empty()) break;
        if (workers == 1) {  // no thread: the same batches, parsed here
          merge(parse_batch(b, name, defaults, format, format_line));
          continue;
        }
        pending.push_back(std::async(std::launch::async, [b = std::move(b), &name, &defaults, format, format_line] {
          return parse_batch(b, name, defaults, format, format_line);
        }));
        if (pending.size() > workers) {
          BatchResult r = pending.front().get();
          pending.pop_front();
          merge(std::move(r));
        }
      }
      while (!pending.empty()) {
        BatchResult r = pending.front().get();
        pending.pop_front();
        merge(std::move(r));
      }
    }
    if (in.bad()) STRATA_FAIL("error reading " << name);
  } catch (const Error&) {
    // A repeated id before the bad line refuses the file first, as read_prompts does.
    const std::vector<uint64_t> suspects = prints.repeated();
    prints.clear();
    if (!suspects.empty()) confirm_repeats(file, defaults, suspects, checked);
    throw;
  }
  const std::vector<uint64_t> suspects = prints.repeated();
  prints.clear();
  if (!suspects.empty()) confirm_repeats(file, defaults, suspects, scan.lines);
#ifdef __GLIBC__
  malloc_trim(0);  // give back what the parsing threads' malloc arenas hold
#endif
  scan.format = head.format();
  scan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return scan;
}

PromptReader::PromptReader(const std::filesystem::path& file, const SamplingParams& defaults)
    : file_(file.string()), in_(file), parser_(file.string(), defaults) {
  if (!in_) STRATA_FAIL("cannot open prompts file " << file_);
}

std::optional<PromptRecord> PromptReader::next() {
  while (std::getline(in_, text_)) {
    std::optional<PromptRecord> r = parser_.parse(text_, ++line_);
    if (r) return r;
  }
  if (in_.bad()) STRATA_FAIL("error reading " << file_);
  return std::nullopt;
}

}  // namespace strata
