// A compiled PCRE2 pre-tokenizer pattern (UTF + UCP, JIT when available) that splits text the way
// Hugging Face's Split pre-tokenizer does with behavior "Isolated".
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

// The regexes Hugging Face uses for GPT-2 (ByteLevel use_regex=true), LLaMA-3, and Qwen2 (LLaMA-3's
// with one digit a piece), and SmolLM's first split (Digits(individual_digits), then GPT-2's).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;
extern const char* const kGpt4oPattern;
extern const char* const kDigitPattern;

class SplitRegex {
public:
  // `where` names the file and field the pattern came from, for the error message.
  SplitRegex(const std::string& pattern, bool literal, const std::string& where);
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;
  ~SplitRegex();

  // Appends to `out` every match and every non-empty stretch between matches, in order, so the
  // pieces cover `text` (HF "Isolated"). `text` must be valid UTF-8 (checked by the caller).
  void split_isolated(std::string_view text, std::vector<std::string_view>& out) const;
  // Whether the pattern matches somewhere in `text` (UTF-8 is checked).
  bool matches(std::string_view text) const;

private:
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so pcre2.h stays out of other files
  bool jit_ = false;
};

}  // namespace strata::tok

namespace strata::tok {
// Rust's char::is_alphanumeric (Alphabetic or Numeric), which HF's single_word option tests.
bool is_alphanumeric(char32_t cp);
}  // namespace strata::tok
