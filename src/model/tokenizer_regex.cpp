// PCRE2 wrapper for the pre-tokenizer split; JIT-compiled when the library supports it.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_regex.h"

#include <pcre2.h>

#include <memory>
#include <utility>

#include "strata/core/error.h"
#include "tokenizer_unicode.h"

namespace strata::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (tiktoken's; GPT-OSS's tokenizer.json Split): a word is an optional lead character, then
// letters cut where lower case turns to upper ("HelloWorld" is two), then an English contraction;
// digits go in threes; a "/" may join the line breaks after punctuation.
const char* const kGpt4oPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kDigitPattern = R"(\p{N})";

namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &err, &err_offset, nullptr);
  if (code == nullptr) {
    STRATA_FAIL(where << ": cannot compile the regex at offset " << err_offset << ": "
                      << pcre2_message(err) << " (pattern: " << pattern << ")");
  }
  code_ = code;
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  jit_ = have_jit && pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::SplitRegex(SplitRegex&& o) noexcept : code_(std::exchange(o.code_, nullptr)), jit_(o.jit_) {}

SplitRegex& SplitRegex::operator=(SplitRegex&& o) noexcept {
  std::swap(code_, o.code_);
  std::swap(jit_, o.jit_);
  return *this;
}

SplitRegex::~SplitRegex() {
  if (code_ != nullptr) pcre2_code_free(as_code(code_));
}

void SplitRegex::split_isolated(std::string_view text, std::vector<std::string_view>& out) const {
  // Match data is per call so one compiled pattern serves many threads.
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(as_code(code_), nullptr));
  STRATA_CHECK(md != nullptr, "out of memory allocating PCRE2 match data");
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;  // end of the previous match
  size_t offset = 0;
  while (offset <= text.size()) {
    // UTF validity was checked once by the caller; skip PCRE2's per-call check.
    int rc = pcre2_match(as_code(code_), subject, text.size(), offset, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_) {
      // Very long whitespace runs can exhaust the JIT stack; the interpreter uses the heap.
      rc = pcre2_match(as_code(code_), subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(),
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    STRATA_CHECK(rc >= 0, "PCRE2 match failed in the tokenizer pre-tokenizer: " << pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t begin = ov[0], end = ov[1];
    if (begin == end) {
      // HF drops empty pieces; step over one code point so the loop advances.
      if (offset >= text.size()) break;
      ++offset;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (begin > gap_start) out.push_back(text.substr(gap_start, begin - gap_start));
    out.push_back(text.substr(begin, end - begin));
    gap_start = offset = end;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
}

bool SplitRegex::matches(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(as_code(code_), nullptr));
  STRATA_CHECK(md != nullptr, "out of memory allocating PCRE2 match data");
  int rc = pcre2_match(as_code(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md.get(), nullptr);
  return rc >= 0;
}

bool is_alphanumeric(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  static const SplitRegex alnum(R"(^[\p{Alphabetic}\p{N}]$)", false, "built-in alphanumeric test");
  std::string s;
  append_utf8(s, cp);
  return alnum.matches(s);
}

}  // namespace strata::tok
