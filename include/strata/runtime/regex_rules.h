// Answers held to a regular expression or to one of a list of strings (vLLM's structured outputs
// `regex` and `choice`), compiled into rules over bytes (rule_grammar.h) as xgrammar compiles them:
// the whole answer matches, code points as UTF-8.
//
// The regex syntax is what xgrammar's regex converter reads (Python's, less some): literals, `.`
// (any code point, newline included), classes `[...]` with ranges and `^`, `\d \w \s` and their
// negations (ASCII digits and word characters; \s Unicode's spaces), escapes
// `\n \r \t \f \v \xHH \uHHHH \UHHHHHHHH` and escaped punctuation, groups `(...)` and
// `(?:...)`, alternation, and the quantifiers `* + ? {n} {n,} {n,m}`, each maybe lazy (`*?`: the same
// texts). `^` first and `$` last are accepted (the match is whole anyway). Refused with RegexError,
// naming the offset: what xgrammar refuses (lookaround, named groups and other group modifiers,
// word boundaries, `\p{..}`, two quantifiers in a row, a `{` that is no bound, an empty class) and,
// where xgrammar would read something else than Python, `\0`, letters escaped for no meaning
// (`\e`, `\Z`), anchors inside the pattern; bounds above 1000 and patterns whose rules would pass
// 200,000 nodes.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "strata/runtime/rule_grammar.h"

namespace strata {

struct RegexError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::shared_ptr<const ByteRules> compile_regex(std::string_view pattern);
// The answer is exactly one of `choices` (xgrammar's grammar root ::= "a" | "b" | ..., what vLLM
// builds for a choice); at least one, each non-empty.
std::shared_ptr<const ByteRules> compile_choices(const std::vector<std::string>& choices);

}  // namespace strata
