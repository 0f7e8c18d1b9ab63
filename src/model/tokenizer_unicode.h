// UTF-8 and GPT-2 byte<->unicode helpers for the byte-level BPE tokenizer (private to src/model).
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace strata::tok {

// GPT-2's bytes_to_unicode(): every byte gets a printable code point so BPE tokens are text.
// Entry b is that code point encoded as UTF-8.
const std::array<std::string, 256>& byte_to_unicode();
// The inverse map: the byte for a code point, or -1 when the code point is not in the map.
int unicode_to_byte(char32_t cp);
// Maps every byte of `bytes` through byte_to_unicode() and concatenates.
std::string bytes_to_unicode_string(std::string_view bytes);

// Decodes one code point of valid UTF-8 at s[pos] and advances pos.
char32_t next_code_point(std::string_view s, size_t& pos);
// Byte offset of the first ill-formed UTF-8 sequence, or npos when s is valid.
size_t find_invalid_utf8(std::string_view s);
// Like Python's bytes.decode("utf-8", errors="replace") and Rust's from_utf8_lossy: each maximal
// ill-formed subpart becomes one U+FFFD. Hugging Face's ByteLevel decoder does exactly this.
std::string utf8_decode_lossy(std::string_view bytes);
void append_utf8(std::string& out, char32_t cp);

// Rust's char::is_whitespace (the Unicode White_Space property); HF uses it for lstrip/rstrip.
bool is_unicode_whitespace(char32_t cp);

}  // namespace strata::tok
