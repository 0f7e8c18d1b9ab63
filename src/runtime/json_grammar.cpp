#include "strata/runtime/json_grammar.h"

#include <algorithm>

#include "strata/core/error.h"

namespace strata {

namespace {

enum Mode : uint8_t {
  Root,          // the text's first byte: '{' or '['
  Value,         // a value starts (after ':', or ',' in an array)
  ArrayFirst,    // after '[': a value or ']'
  ObjectFirst,   // after '{': a key or '}'
  ObjectKey,     // after ',' in an object: a key
  Colon,         // after a key
  AfterValue,    // ',' or the open container's closing bracket
  String,        // inside a string (`key` says whose)
  Escape,        // after '\'
  Hex,           // after "\u": `aux` hex digits to go
  Utf8,          // inside a character: `aux` continuation bytes to go, the next in [lo, hi]
  Literal,       // inside true, false or null: `aux` = literal * 8 + bytes read
  NumberMinus,   // after '-'
  NumberZero,    // after a leading 0 (no more integer digits)
  NumberInt,     // in the integer digits
  NumberDot,     // after '.'
  NumberFrac,    // in the fraction digits
  NumberExp,     // after 'e' or 'E'
  NumberExpSign, // after the exponent's sign
  NumberExpInt,  // in the exponent digits
  Done,          // the root container closed
};

constexpr const char* kLiterals[3] = {"true", "false", "null"};

bool is_space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

bool top_is_object(const JsonState& s) {
  const int d = s.depth - 1;
  return (s.objects[d / 64] >> (d % 64)) & 1;
}

void set_mode(JsonState& s, Mode m) {
  s.mode = m;
  s.aux = s.lo = s.hi = 0;
}

// A value ended: back to its container, or the text is done.
void end_value(JsonState& s) {
  s.key = false;
  set_mode(s, s.depth == 0 ? Done : AfterValue);
}

bool open(JsonState& s, bool object) {
  if (s.depth >= kMaxJsonDepth) return false;
  const int d = s.depth++;
  if (object) s.objects[d / 64] |= uint64_t(1) << (d % 64);
  set_mode(s, object ? ObjectFirst : ArrayFirst);
  return true;
}

void close(JsonState& s) {
  const int d = --s.depth;
  s.objects[d / 64] &= ~(uint64_t(1) << (d % 64));
  end_value(s);
}

void start_string(JsonState& s, bool key) {
  set_mode(s, String);
  s.key = key;
}

// The first byte of a value (not whitespace).
bool start_value(JsonState& s, uint8_t b) {
  switch (b) {
    case '{': return open(s, true);
    case '[': return open(s, false);
    case '"': start_string(s, false); return true;
    case '-': set_mode(s, NumberMinus); return true;
    case '0': set_mode(s, NumberZero); return true;
    case 't': case 'f': case 'n':
      set_mode(s, Literal);
      s.aux = uint8_t((b == 't' ? 0 : b == 'f' ? 1 : 2) * 8 + 1);
      return true;
    default:
      if (b >= '1' && b <= '9') return set_mode(s, NumberInt), true;
      return false;
  }
}

// A string's byte outside escapes: UTF-8 lead bytes set the continuation bytes' range.
bool string_byte(JsonState& s, uint8_t b) {
  if (b == '"') {
    if (s.key) return set_mode(s, Colon), s.key = false, true;
    return end_value(s), true;
  }
  if (b == '\\') return set_mode(s, Escape), true;
  if (b < 0x20) return false;
  if (b < 0x80) return true;
  uint8_t left = 0, lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) left = 1;
  else if (b == 0xE0) left = 2, lo = 0xA0;
  else if (b >= 0xE1 && b <= 0xEF) left = 2;  // ED's surrogates included, as xgrammar
  else if (b == 0xF0) left = 3, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) left = 3;
  else if (b == 0xF4) left = 3, hi = 0x8F;
  else return false;
  const bool key = s.key;
  set_mode(s, Utf8);
  s.key = key, s.aux = left, s.lo = lo, s.hi = hi;
  return true;
}

// Back to the string a character or escape interrupted.
void resume_string(JsonState& s) {
  const bool key = s.key;
  start_string(s, key);
}

}  // namespace

bool json_step(JsonState& s, uint8_t b) {
  switch (Mode(s.mode)) {
    case Root:
      if (b == '{' || b == '[') return open(s, b == '{');
      return false;
    case Value:
      return is_space(b) || start_value(s, b);
    case ArrayFirst:
      if (is_space(b)) return true;
      if (b == ']') return close(s), true;
      return start_value(s, b);
    case ObjectFirst:
      if (is_space(b)) return true;
      if (b == '}') return close(s), true;
      if (b == '"') return start_string(s, true), true;
      return false;
    case ObjectKey:
      if (is_space(b)) return true;
      if (b == '"') return start_string(s, true), true;
      return false;
    case Colon:
      if (is_space(b)) return true;
      if (b == ':') return set_mode(s, Value), true;
      return false;
    case AfterValue: {
      if (is_space(b)) return true;
      const bool object = top_is_object(s);
      if (b == ',') return set_mode(s, object ? ObjectKey : Value), true;
      if (b == (object ? '}' : ']')) return close(s), true;
      return false;
    }
    case String:
      return string_byte(s, b);
    case Escape:
      if (b == 'u') {
        const bool key = s.key;
        set_mode(s, Hex);
        s.key = key, s.aux = 4;
        return true;
      }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't')
        return resume_string(s), true;
      return false;
    case Hex:
      if (!is_hex(b)) return false;
      if (--s.aux == 0) resume_string(s);
      return true;
    case Utf8:
      if (b < s.lo || b > s.hi) return false;
      if (--s.aux == 0) resume_string(s);
      else s.lo = 0x80, s.hi = 0xBF;
      return true;
    case Literal: {
      const char* word = kLiterals[s.aux / 8];
      const int at = s.aux % 8;
      if (b != uint8_t(word[at])) return false;
      if (word[at + 1] == '\0') end_value(s);
      else ++s.aux;
      return true;
    }
    case NumberMinus:
      if (b == '0') return set_mode(s, NumberZero), true;
      if (b >= '1' && b <= '9') return set_mode(s, NumberInt), true;
      return false;
    case NumberInt:
      if (is_digit(b)) return true;
      [[fallthrough]];
    case NumberZero:
      if (b == '.') return set_mode(s, NumberDot), true;
      if (b == 'e' || b == 'E') return set_mode(s, NumberExp), true;
      break;  // the number ended: the byte belongs to what follows
    case NumberDot:
      if (is_digit(b)) return set_mode(s, NumberFrac), true;
      return false;
    case NumberFrac:
      if (is_digit(b)) return true;
      if (b == 'e' || b == 'E') return set_mode(s, NumberExp), true;
      break;
    case NumberExp:
      if (b == '+' || b == '-') return set_mode(s, NumberExpSign), true;
      [[fallthrough]];
    case NumberExpSign:
      if (is_digit(b)) return set_mode(s, NumberExpInt), true;
      return false;
    case NumberExpInt:
      if (is_digit(b)) return true;
      break;
    case Done:
      return false;
  }
  // A number ended at `b` (numbers only live inside containers: the root is one).
  end_value(s);
  return json_step(s, b);
}

bool json_complete(const JsonState& s) { return s.mode == Done; }

size_t JsonVocabulary::StateHash::operator()(const JsonState& s) const {
  uint64_t h = s.objects[0] * 0x9E3779B97F4A7C15ull ^ s.objects[1];
  for (uint8_t v : {s.depth, s.mode, s.aux, s.lo, s.hi, uint8_t(s.key)}) h = (h ^ v) * 0x100000001B3ull;
  return size_t(h ^ (h >> 29));
}

bool JsonVocabulary::accepts(const JsonState& s, int32_t id) const {
  JsonState t = s;
  return tokens_->read(t, id, json_step);
}

JsonState JsonVocabulary::after(const JsonState& s, int32_t id) const {
  JsonState t = s;
  STRATA_CHECK(tokens_->read(t, id, json_step), "JSON answer: token " << id << " cannot come next");
  return t;
}

std::shared_ptr<const std::vector<uint64_t>> JsonVocabulary::allowed(const JsonState& s) const {
  return masks_.get(s, [&] { return tokens_->allowed(s, json_step); });
}

std::unique_ptr<AnswerCursor> JsonVocabulary::start() const {
  return std::make_unique<JsonMatcher>(shared_from_this());
}

int64_t JsonMatcher::mask(float* logits, int64_t vocab) const {
  return apply_token_mask(*vocabulary_->allowed(state_), vocabulary_->size(), logits, vocab);
}

}  // namespace strata
