// A regex (or a list of choices) into rules over bytes (regex_rules.h): parsed into a tree of
// code point sets, sequences, alternatives and repeats; built into a network with moves
// (Thompson's construction, code point sets as their UTF-8 byte sequences); then the moves taken
// out, each node given the byte edges and the end its moves reach, so that the rules have no loop
// of moves (a pattern such as (a*)* makes one) and a step reads bytes only.
#include "strata/runtime/regex_rules.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "byte_rules.h"

namespace strata {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxBound = 1000;           // {n,m} above this is refused
constexpr size_t kMaxNodes = 200000;      // nodes of the network with moves
constexpr size_t kMaxClosureWork = 20000000;  // nodes reached taking the moves out

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, sorted, disjoint

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.push_back({lo, hi});
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

// xgrammar's classes: \d and \w ASCII, \s Python's Unicode spaces.
const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = normalized({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                  {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                  {0xFEFF, 0xFEFF}});

struct Node {
  enum Kind { Set, Seq, Alt, Repeat };
  explicit Node(Kind k) : kind(k) {}
  Kind kind;
  Ranges set;                  // Set
  std::vector<Node> children;  // Seq, Alt; Repeat: one
  int min = 0, max = 0;        // Repeat: max -1 for no bound
};

class Parser {
public:
  explicit Parser(std::string_view p) : p_(p) {}

  Node parse() {
    size_t end = p_.size();
    if (!p_.empty() && p_[0] == '^') i_ = 1;
    if (end > i_ && p_[end - 1] == '$' && !escaped_at(end - 1)) end_ = end - 1;
    else end_ = end;
    Node n = alternatives();
    if (i_ < end_) fail(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return n;
  }

private:
  [[noreturn]] void fail(const std::string& why) const {
    std::ostringstream o;
    o << "regex at offset " << i_ << ": " << why;
    throw RegexError(o.str());
  }
  // Whether p_[at] is preceded by an odd number of backslashes.
  bool escaped_at(size_t at) const {
    size_t n = 0;
    while (at > n && p_[at - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  bool more() const { return i_ < end_; }
  char peek() const { return p_[i_]; }

  Node alternatives() {
    Node alt(Node::Alt);
    alt.children.push_back(sequence());
    while (more() && peek() == '|') {
      ++i_;
      alt.children.push_back(sequence());
    }
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  Node sequence() {
    Node seq(Node::Seq);
    while (more() && peek() != '|' && peek() != ')') {
      Node atom_node = atom();
      seq.children.push_back(quantified(std::move(atom_node)));
    }
    return seq;
  }

  // An atom and its quantifier, if any: * + ? {n} {n,} {n,m}, each maybe lazy (a trailing ?, the
  // same texts). Another quantifier right after is refused, as xgrammar refuses it.
  Node quantified(Node n) {
    if (!more()) return n;
    int lo = 0, hi = 0;
    const char c = peek();
    if (c == '*') lo = 0, hi = -1, ++i_;
    else if (c == '+') lo = 1, hi = -1, ++i_;
    else if (c == '?') lo = 0, hi = 1, ++i_;
    else if (c == '{') bounds(lo, hi);
    else return n;
    if (more() && peek() == '?') ++i_;
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
      fail("two repetition modifiers in a row");
    Node r(Node::Repeat);
    r.min = lo, r.max = hi;
    r.children.push_back(std::move(n));
    return r;
  }

  // {n}, {n,} or {n,m} at i_, past which i_ moves; anything else after a '{' is refused.
  void bounds(int& lo, int& hi) {
    ++i_;  // {
    auto number = [&](int& v) {
      const size_t start = i_;
      long long x = 0;
      for (; more() && peek() >= '0' && peek() <= '9'; ++i_) x = std::min<long long>(x * 10 + (peek() - '0'), 1LL << 30);
      v = int(x);
      return i_ > start;
    };
    if (!number(lo)) fail("invalid repetition count");
    hi = lo;
    if (more() && peek() == ',') {
      ++i_;
      if (!number(hi)) hi = -1;
    }
    if (!more() || peek() != '}') fail("invalid repetition count");
    ++i_;
    if (lo > kMaxBound || hi > kMaxBound) fail("a repeat bound above " + std::to_string(kMaxBound));
    if (hi != -1 && hi < lo) fail("a bound {m,n} with n < m");
  }

  Node set_of(Ranges r) {
    Node n(Node::Set);
    n.set = normalized(std::move(r));
    return n;
  }

  Node atom() {
    const char c = peek();
    if (c == '(') return group();
    if (c == '[') return set_of(char_class());
    if (c == '.') {
      ++i_;
      return set_of({{0, kMaxCodePoint}});
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("nothing to repeat");
    if (c == '^' || c == '$') fail("anchors other than a leading ^ and a trailing $ are not supported");
    if (c == '\\') {
      Ranges r;
      escape(r, false);
      return set_of(r);
    }
    const uint32_t cp = code_point();
    return set_of({{cp, cp}});
  }

  Node group() {
    ++i_;  // (
    if (more() && peek() == '?') {
      if (p_.substr(i_).starts_with("?:")) i_ += 2;
      else fail("group modifiers other than ?: (lookaround, named groups, inline flags) are not supported");
    }
    Node n = alternatives();
    if (!more() || peek() != ')') fail("a '(' without its ')'");
    ++i_;
    return n;
  }

  // One UTF-8 encoded code point of the pattern at i_.
  uint32_t code_point() {
    const uint8_t b = uint8_t(p_[i_]);
    const int len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || i_ + size_t(len) > end_) fail("the pattern is not valid UTF-8");
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len; ++k) {
      const uint8_t cont = uint8_t(p_[i_ + size_t(k)]);
      if ((cont & 0xC0) != 0x80) fail("the pattern is not valid UTF-8");
      cp = (cp << 6) | (cont & 0x3F);
    }
    i_ += size_t(len);
    return cp;
  }

  // n hex digits at i_.
  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (!more() || !std::isxdigit(static_cast<unsigned char>(peek()))) fail("an escape needs " + std::to_string(n) + " hex digits");
      const char c = peek();
      v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
      ++i_;
    }
    return v;
  }

  // The escape at i_ ('\\'): its code points into `out`; returns whether it was a class (\d ...).
  bool escape(Ranges& out, bool in_class) {
    ++i_;
    if (!more()) fail("a trailing backslash");
    const char c = peek();
    ++i_;
    switch (c) {
      case 'd': out.insert(out.end(), kDigits.begin(), kDigits.end()); return true;
      case 'w': out.insert(out.end(), kWord.begin(), kWord.end()); return true;
      case 's': out.insert(out.end(), kSpace.begin(), kSpace.end()); return true;
      case 'D': { const Ranges r = complement(kDigits); out.insert(out.end(), r.begin(), r.end()); return true; }
      case 'W': { const Ranges r = complement(kWord); out.insert(out.end(), r.begin(), r.end()); return true; }
      case 'S': { const Ranges r = complement(kSpace); out.insert(out.end(), r.begin(), r.end()); return true; }
      case 'n': out.push_back({'\n', '\n'}); return false;
      case 'r': out.push_back({'\r', '\r'}); return false;
      case 't': out.push_back({'\t', '\t'}); return false;
      case 'f': out.push_back({'\f', '\f'}); return false;
      case 'v': out.push_back({'\v', '\v'}); return false;
      case '0': --i_, fail("\\0 is not supported");
      case 'x': { const uint32_t v = hex(2); out.push_back({v, v}); return false; }
      case 'u': { const uint32_t v = hex(4); out.push_back({v, v}); return false; }
      case 'U': {
        const uint32_t v = hex(8);
        if (v > kMaxCodePoint) fail("a code point past U+10FFFF");
        out.push_back({v, v});
        return false;
      }
      case 'b':
        if (in_class) {
          out.push_back({'\b', '\b'});
          return false;
        }
        [[fallthrough]];
      case 'B': --i_, fail("word boundaries are not supported");
      case 'A': case 'Z': case 'z': case 'G': --i_, fail("anchors other than a leading ^ and a trailing $ are not supported");
      default:
        if (c >= '1' && c <= '9') --i_, fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) --i_, fail(std::string("unknown escape \\") + c);
        if (uint8_t(c) >= 0x80) {
          --i_;
          const uint32_t cp = code_point();
          out.push_back({cp, cp});
          return false;
        }
        out.push_back({uint32_t(uint8_t(c)), uint32_t(uint8_t(c))});
        return false;
    }
  }

  Ranges char_class() {
    ++i_;  // [
    bool negate = false;
    if (more() && peek() == '^') negate = true, ++i_;
    Ranges r;
    if (more() && peek() == ']') fail("an empty character class");
    while (true) {
      if (!more()) fail("a '[' without its ']'");
      if (peek() == ']') {
        ++i_;
        break;
      }
      const std::optional<uint32_t> lo = class_item(r);
      if (!lo) continue;
      if (more() && peek() == '-' && i_ + 1 < end_ && p_[i_ + 1] != ']') {
        ++i_;  // -
        const std::optional<uint32_t> hi = class_item(r);
        if (!hi) fail("a range ends in a class");
        if (*hi < *lo) fail("a range out of order");
        r.push_back({*lo, *hi});
      } else {
        r.push_back({*lo, *lo});
      }
    }
    return negate ? complement(r) : normalized(r);
  }
  // One item of a class at i_: its code point, or none when it is a class itself (\d ...), whose
  // code points go into `r`.
  std::optional<uint32_t> class_item(Ranges& r) {
    if (peek() != '\\') return code_point();
    Ranges one;
    if (!escape(one, true)) return one[0].first;
    r.insert(r.end(), one.begin(), one.end());
    return std::nullopt;
  }

  std::string_view p_;
  size_t i_ = 0, end_ = 0;
};

// The UTF-8 byte ranges of [lo, hi] (all of one encoded length n): sequences of n byte ranges
// whose products are exactly those code points.
void encode(uint32_t cp, int n, uint8_t* out) {
  if (n == 1) {
    out[0] = uint8_t(cp);
    return;
  }
  static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int k = n - 1; k > 0; --k, cp >>= 6) out[k] = uint8_t(0x80 | (cp & 0x3F));
  out[0] = uint8_t(lead[n] | cp);
}
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;
void same_length(uint32_t lo, uint32_t hi, int n, std::vector<ByteSeq>& out) {
  for (int k = 1; k < n; ++k) {
    const uint32_t m = (uint32_t(1) << (6 * k)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        same_length(lo, lo | m, n, out);
        same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        same_length(lo, (hi & ~m) - 1, n, out);
        same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, n, a), encode(hi, n, b);
  ByteSeq seq;
  for (int k = 0; k < n; ++k) seq.push_back({a[k], b[k]});
  out.push_back(std::move(seq));
}
std::vector<ByteSeq> utf8_sequences(const Ranges& set) {
  static const uint32_t last[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  std::vector<ByteSeq> out;
  for (auto [lo, hi] : set)
    for (int n = 1; n <= 4 && lo <= hi; ++n) {
      if (lo > last[n - 1]) continue;
      const uint32_t top = std::min(hi, last[n - 1]);
      same_length(lo, top, n, out);
      lo = top + 1;
    }
  return out;
}

// A network with moves, then without them (the header's comment).
class Builder : RuleBuilder {
public:
  std::shared_ptr<const ByteRules> from_tree(const Node& tree) {
    const uint32_t start = add(), end = emit(tree, start);
    return without_moves(start, end);
  }
  std::shared_ptr<const ByteRules> from_choices(const std::vector<std::string>& choices) {
    const uint32_t start = add(), end = add();
    for (const std::string& c : choices) {
      uint32_t a = add();
      moves_[start].push_back(a);
      for (char ch : c) {
        const uint32_t b = add();
        reads_[a].push_back({uint8_t(ch), uint8_t(ch), b});
        a = b;
      }
      moves_[a].push_back(end);
    }
    return without_moves(start, end);
  }

private:
  struct Read {
    uint8_t lo, hi;
    uint32_t target;
    auto operator<=>(const Read&) const = default;
  };
  uint32_t add() {
    if (reads_.size() >= kMaxNodes) throw RegexError("the pattern is too large (more than 200000 nodes)");
    reads_.emplace_back();
    moves_.emplace_back();
    return uint32_t(reads_.size() - 1);
  }
  // The fragment of `n` from node a; returns its end node.
  uint32_t emit(const Node& n, uint32_t a) {
    switch (n.kind) {
      case Node::Set: {
        const uint32_t b = add();
        for (const ByteSeq& seq : utf8_sequences(n.set)) {
          uint32_t at = a;
          for (size_t k = 0; k < seq.size(); ++k) {
            const uint32_t next = k + 1 == seq.size() ? b : add();
            reads_[at].push_back({seq[k].first, seq[k].second, next});
            at = next;
          }
        }
        return b;
      }
      case Node::Seq:
        for (const Node& c : n.children) a = emit(c, a);
        return a;
      case Node::Alt: {
        const uint32_t b = add();
        for (const Node& c : n.children) {
          const uint32_t s = add();
          moves_[a].push_back(s);
          moves_[emit(c, s)].push_back(b);
        }
        return b;
      }
      case Node::Repeat: {
        for (int k = 0; k < n.min; ++k) a = emit(n.children[0], a);
        if (n.max == -1) {
          const uint32_t loop = add();
          moves_[a].push_back(loop);
          moves_[emit(n.children[0], loop)].push_back(loop);
          return loop;
        }
        const uint32_t b = add();
        for (int k = n.min; k < n.max; ++k) {
          moves_[a].push_back(b);
          a = emit(n.children[0], a);
        }
        moves_[a].push_back(b);
        return b;
      }
    }
    return a;
  }
  // Each node reachable by reads gets the reads and the end of the nodes its moves reach.
  std::shared_ptr<const ByteRules> without_moves(uint32_t start, uint32_t end) {
    std::map<uint32_t, uint32_t> index;  // network node -> rule node
    std::vector<uint32_t> todo;
    auto rule_node = [&](uint32_t n) {
      auto [it, fresh] = index.emplace(n, 0);
      if (fresh) {
        it->second = node();
        todo.push_back(n);
      }
      return it->second;
    };
    r_->root = 0;  // one rule, no calls
    r_->starts.push_back(rule_node(start));
    std::vector<uint32_t> stack;
    std::vector<uint32_t> seen(reads_.size(), 0);  // the walk that last reached each node
    uint32_t walk = 0;
    size_t work = 0;  // nodes reached over all walks: (a?){1000} reaches a thousand from each
    while (!todo.empty()) {
      const uint32_t n = todo.back();
      todo.pop_back();
      std::vector<Read> reads;
      bool is_end = false;
      ++walk;
      stack = {n};
      seen[n] = walk;
      while (!stack.empty()) {
        const uint32_t m = stack.back();
        stack.pop_back();
        if (++work > kMaxClosureWork) throw RegexError("the pattern is too large (its moves reach too far)");
        is_end |= m == end;
        reads.insert(reads.end(), reads_[m].begin(), reads_[m].end());
        for (uint32_t t : moves_[m])
          if (seen[t] != walk) seen[t] = walk, stack.push_back(t);
      }
      std::sort(reads.begin(), reads.end());
      reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
      const uint32_t self = index.at(n);
      for (const Read& e : reads) bytes(self, e.lo, e.hi, rule_node(e.target));
      r_->nodes[self].end = is_end;
    }
    return r_;
  }

  std::vector<std::vector<Read>> reads_;
  std::vector<std::vector<uint32_t>> moves_;
};

}  // namespace

std::shared_ptr<const ByteRules> compile_regex(std::string_view pattern) {
  const Node tree = Parser(pattern).parse();
  return Builder().from_tree(tree);
}

std::shared_ptr<const ByteRules> compile_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) throw RegexError("no choices");
  return Builder().from_choices(choices);
}

}  // namespace strata
