// UTF-8 validation, lossy decoding and GPT-2's byte<->unicode table.
#include "tokenizer_unicode.h"

#include <vector>

namespace strata::tok {

namespace {

struct ByteMaps {
  std::array<std::string, 256> to_unicode;
  std::array<char32_t, 256> code_points{};
};

ByteMaps build_byte_maps() {
  // Printable Latin-1 bytes map to themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD)
  // are shifted to U+0100.. in byte order, exactly as GPT-2's encoder.py does.
  ByteMaps m;
  int next_shifted = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t cp = printable ? char32_t(b) : char32_t(next_shifted++);
    m.code_points[b] = cp;
    append_utf8(m.to_unicode[b], cp);
  }
  return m;
}

const ByteMaps& byte_maps() {
  static const ByteMaps maps = build_byte_maps();
  return maps;
}

// Length of the well-formed sequence starting at s[i] (1..4), or 0 when ill-formed; on 0,
// `bad_len` is the length of the maximal ill-formed subpart (at least 1) to replace.
size_t well_formed_length(std::string_view s, size_t i, size_t& bad_len) {
  auto b = static_cast<unsigned char>(s[i]);
  bad_len = 1;
  if (b < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    need = 2;
  } else if (b == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (b == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    need = 3;
  } else if (b == 0xF4) {
    need = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;  // C0, C1, F5..FF, or a stray continuation byte
  }
  size_t j = i + 1;
  for (size_t k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) break;
    auto c = static_cast<unsigned char>(s[j]);
    if (c < lo || c > hi) break;
    lo = 0x80, hi = 0xBF;
  }
  if (j - i == need + 1) return need + 1;
  bad_len = j - i;
  return 0;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return byte_maps().to_unicode; }

int unicode_to_byte(char32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(512, -1);  // every mapped code point is below U+0200
    for (int b = 0; b < 256; ++b) inv[byte_maps().code_points[b]] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

std::string bytes_to_unicode_string(std::string_view bytes) {
  const auto& map = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += map[b];
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

char32_t next_code_point(std::string_view s, size_t& pos) {
  auto b = static_cast<unsigned char>(s[pos++]);
  if (b < 0x80) return b;
  int extra = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
  char32_t cp = b & (0x3F >> extra);
  for (int k = 0; k < extra && pos < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[pos++]) & 0x3F);
  return cp;
}

size_t find_invalid_utf8(std::string_view s) {
  size_t bad_len = 0;
  for (size_t i = 0; i < s.size();) {
    size_t n = well_formed_length(s, i, bad_len);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_decode_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t bad_len = 0;
  for (size_t i = 0; i < bytes.size();) {
    size_t n = well_formed_length(bytes, i, bad_len);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad_len;
    }
  }
  return out;
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace strata::tok
