// The Jinja lexer and parser: Jinja2 3.1's lexer rules with transformers' trim_blocks and
// lstrip_blocks, and its recursive-descent grammar (jinja2/lexer.py, jinja2/parser.py), building
// the tree of jinja_ast.h.
#include <charconv>
#include <cstring>

#include "jinja_ast.h"
#include "strata/model/jinja.h"

namespace strata::jinja {

namespace {

// Nesting (of blocks and of expressions) beyond this is refused rather than risking the stack.
constexpr int kMaxParseDepth = 200;

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string value;  // Text, Name, String (decoded), Op
  int64_t ival = 0;
  double fval = 0;
  int line = 0;
};

[[noreturn]] void fail(int line, const std::string& why) { throw JinjaError("line " + std::to_string(line) + ": " + why); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
public:
  explicit Lexer(std::string_view source) {
    // Jinja makes every line break "\n" and drops one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = src_.find('{', pos_);
      while (tag != std::string::npos && (tag + 1 >= src_.size() || std::strchr("{%#", src_[tag + 1]) == nullptr))
        tag = src_.find('{', tag + 1);
      if (tag == std::string::npos) {
        text(src_.substr(pos_), src_.size());
        break;
      }
      const char kind = src_[tag + 1];
      const char marker = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      std::string data = src_.substr(pos_, tag - pos_);
      const size_t raw_end = kind == '%' ? raw_begin(tag + 2 + (marker ? 1 : 0)) : 0;
      strip_before(data, marker, kind != '{');
      text(std::move(data), tag);
      const size_t body = tag + 2 + (marker ? 1 : 0);
      if (raw_end) {
        raw(raw_end);
      } else if (kind == '#') {
        comment(body);
      } else {
        tokens_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, line_});
        advance_to(body);
        tag_tokens(kind == '{');
      }
    }
    tokens_.push_back({Tok::Eof, "", 0, 0, line_});
    return std::move(tokens_);
  }

private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the last thing lexed ended with a newline (or nothing was yet)
  std::vector<Token> tokens_;

  void advance_to(size_t p) {
    for (; pos_ < p; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  void text(std::string data, size_t end) {
    const int line = line_;
    advance_to(end);
    if (!data.empty()) tokens_.push_back({Tok::Text, std::move(data), 0, 0, line});
  }

  // '-' strips all whitespace before the tag; lstrip_blocks the spaces and tabs between a line's
  // start and a block or comment tag, unless the tag says '+'.
  void strip_before(std::string& data, char marker, bool block_or_comment) const {
    if (marker == '-') {
      while (!data.empty() && is_space(data.back())) data.pop_back();
    } else if (marker != '+' && block_or_comment) {
      const size_t nl = data.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        bool blank = l_pos < data.size();
        for (size_t k = l_pos; k < data.size(); ++k) blank = blank && is_space(data[k]);
        if (blank) data.resize(l_pos);
      }
    }
  }

  // After a tag's end: '-' strips all whitespace, trim_blocks one newline after %} and #}.
  void after_end(size_t p, char marker, bool trim_newline) {
    advance_to(p);
    if (marker == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
    } else if (marker != '+' && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  // `{% raw %}` at p (after "{%" and its marker): where its end "%}" ends, or 0.
  size_t raw_begin(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return 0;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_space(src_[p])) ++p;
      return p;
    }
    return src_.compare(p, 2, "%}") == 0 ? p + 2 : 0;
  }

  void raw(size_t body) {
    advance_to(body);
    line_starting_ = src_[pos_ - 1] == '\n';
    for (size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t p = q + 2;
      const char marker = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (marker) ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char end_marker = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_marker = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) continue;
      std::string data = src_.substr(body, q - body);
      strip_before(data, marker, true);
      text(std::move(data), q);
      after_end(p + 2, end_marker, true);
      return;
    }
    fail(line_, "missing end of raw directive");
  }

  void comment(size_t body) {
    for (size_t q = src_.find("#}", body); q != std::string::npos; q = src_.find("#}", q + 1)) {
      const char marker = q > body && (src_[q - 1] == '-' || src_[q - 1] == '+') ? src_[q - 1] : 0;
      after_end(q + 2, marker, true);
      return;
    }
    fail(line_, "missing end of comment tag");
  }

  void tag_tokens(bool variable) {
    std::string balance;  // the closing brackets expected, innermost last
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) fail(line_, variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      const std::string_view rest = std::string_view(src_).substr(pos_);
      if (balance.empty()) {
        const Tok end = variable ? Tok::VarEnd : Tok::BlockEnd;
        const char* close = variable ? "}}" : "%}";
        if (rest.size() >= 3 && (rest[0] == '-' || (rest[0] == '+' && !variable)) && rest.substr(1, 2) == close) {
          tokens_.push_back({end, "", 0, 0, line_});
          after_end(pos_ + 3, rest[0], !variable);
          return;
        }
        if (rest.starts_with(close)) {
          tokens_.push_back({end, "", 0, 0, line_});
          after_end(pos_ + 2, 0, !variable);
          return;
        }
      }
      const char c = rest[0];
      if (is_digit(c)) {
        number(rest);
      } else if (is_name_start(c)) {
        size_t n = 1;
        while (n < rest.size() && is_name_char(rest[n])) ++n;
        tokens_.push_back({Tok::Name, std::string(rest.substr(0, n)), 0, 0, line_});
        advance_to(pos_ + n);
      } else if (c == '\'' || c == '"') {
        string_literal(rest);
      } else {
        static constexpr const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                               "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (rest.starts_with(o)) {
            op = o;
            break;
          }
        if (!op) fail(line_, std::string("unexpected char '") + c + "'");
        if (*op == '(' || *op == '[' || *op == '{') {
          // The parser refuses such nesting anyway; refusing it here spares lexing the rest.
          if (balance.size() >= size_t(kMaxParseDepth)) fail(line_, "template nested too deeply");
          balance += *op == '(' ? ')' : *op == '[' ? ']' : '}';
        } else if (*op == ')' || *op == ']' || *op == '}') {
          if (balance.empty()) fail(line_, std::string("unexpected '") + op + "'");
          if (balance.back() != *op) fail(line_, std::string("unexpected '") + op + "', expected '" + balance.back() + "'");
          balance.pop_back();
        }
        tokens_.push_back({Tok::Op, op, 0, 0, line_});
        advance_to(pos_ + std::strlen(op));
      }
    }
  }

  // Jinja's integer_re / float_re: underscores between digits, 0b/0o/0x, a float needs a
  // fraction or an exponent.
  void number(std::string_view rest) {
    auto digits = [&](size_t p, auto ok) {
      while (p < rest.size() && (ok(rest[p]) || (rest[p] == '_' && p + 1 < rest.size() && ok(rest[p + 1])))) ++p;
      return p;
    };
    auto dec = [](char ch) { return is_digit(ch); };
    std::string clean;
    size_t n = 0;
    if (rest[0] == '0' && rest.size() > 2 && std::strchr("bBoOxX", rest[1]) && rest[1] != 0) {
      const char r = static_cast<char>(rest[1] | 0x20);
      const int base = r == 'b' ? 2 : r == 'o' ? 8 : 16;
      auto ok = [base](char ch) { const int v = hex_value(ch); return v >= 0 && v < base; };
      size_t p = 2;
      if (p < rest.size() && rest[p] == '_') ++p;
      n = digits(p, ok);
      if (n > p) {
        for (size_t k = 2; k < n; ++k)
          if (rest[k] != '_') clean += rest[k];
        int64_t v = 0;
        const auto res = std::from_chars(clean.data(), clean.data() + clean.size(), v, base);
        if (res.ec != std::errc()) fail(line_, "integer literal out of range");
        tokens_.push_back({Tok::Int, "", v, 0, line_});
        advance_to(pos_ + n);
        return;
      }
    }
    n = digits(0, dec);
    bool is_float = false;
    if (n + 1 < rest.size() && rest[n] == '.' && is_digit(rest[n + 1])) {
      n = digits(n + 1, dec);
      is_float = true;
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t p = n + 1;
      if (p < rest.size() && (rest[p] == '+' || rest[p] == '-')) ++p;
      if (p < rest.size() && is_digit(rest[p])) {
        n = digits(p, dec);
        is_float = true;
      }
    }
    for (size_t k = 0; k < n; ++k)
      if (rest[k] != '_') clean += rest[k];
    Token t{is_float ? Tok::Float : Tok::Int, "", 0, 0, line_};
    if (is_float) {
      t.fval = std::strtod(clean.c_str(), nullptr);
    } else if (std::from_chars(clean.data(), clean.data() + clean.size(), t.ival).ec != std::errc()) {
      fail(line_, "integer literal out of range (64-bit)");
    }
    tokens_.push_back(std::move(t));
    advance_to(pos_ + n);
  }

  // A quoted literal, its escapes decoded as Python's unicode-escape codec does.
  void string_literal(std::string_view rest) {
    const char quote = rest[0];
    std::string out;
    size_t p = 1;
    const int line = line_;
    while (true) {
      if (p >= rest.size()) fail(line, "unterminated string");
      const char c = rest[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= rest.size()) fail(line, "unterminated string");
      const char e = rest[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < width; ++k) {
            const int v = p + k < rest.size() ? hex_value(rest[p + k]) : -1;
            if (v < 0) fail(line, std::string("truncated \\") + e + " escape in a string");
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          if (cp > 0x10ffff) fail(line, "illegal Unicode character in a string");
          append_utf8(out, cp);
          p += width;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < rest.size() && rest[p] >= '0' && rest[p] <= '7'; ++k, ++p)
              cp = cp * 8 + static_cast<uint32_t>(rest[p] - '0');
            append_utf8(out, cp);
          } else {  // Python keeps an unknown escape as written
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({Tok::String, std::move(out), 0, 0, line});
    advance_to(pos_ + p + 1);
  }
};

class Parser {
public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Parsed run() {
    Parsed out;
    out.body = subparse({}, nullptr);
    out.names = std::move(names_);
    return out;
  }

private:
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // for loops around the current position (break/continue need one)
  std::set<std::string, std::less<>> names_;

  struct Nest {  // counts the parser's recursion
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxParseDepth) fail(p.cur().line, "template nested too deeply");
    }
    ~Nest() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::Name && cur().value == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "template data";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::Name: return "'" + t.value + "'";
      case Tok::String: return "string";
      case Tok::Int: return "integer";
      case Tok::Float: return "float";
      case Tok::Op: return "'" + t.value + "'";
      case Tok::Eof: return "end of template";
    }
    return "token";
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail(cur().line, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("end of statement block");
    next();
  }

  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements up to one of the `ends` tags (whose name is left in *which, the tag's remaining
  // tokens unread), or the end of the template when `ends` is empty.
  Body subparse(std::initializer_list<std::string_view> ends, std::string* which) {
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.size() == 0) return body;
        std::string expected;
        for (const std::string_view e : ends) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
        fail(t.line, "unexpected end of template, expected " + expected);
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->line = t.line;
        s->expr = parse_tuple(true, false, {});
        if (cur().type != Tok::VarEnd) unexpected("end of print statement");
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) unexpected("a tag name");
        const std::string tag = cur().value;
        for (const std::string_view e : ends)
          if (tag == e) {
            next();
            *which = tag;
            return body;
          }
        body.push_back(statement(tag));
      } else {
        unexpected("template data or a tag");
      }
    }
  }

  std::unique_ptr<Stmt> statement(const std::string& tag) {
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    next();
    std::string which;
    if (tag == "if") {
      s->kind = StmtKind::If;
      ExprPtr cond = parse_tuple(false, false, {});
      expect_block_end();
      while (true) {
        Body body = subparse({"elif", "else", "endif"}, &which);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (which == "elif") {
          cond = parse_tuple(false, false, {});
          expect_block_end();
        } else if (which == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, subparse({"endif"}, &which));
          break;
        } else {
          break;
        }
      }
      expect_block_end();
    } else if (tag == "for") {
      s->kind = StmtKind::For;
      s->target = assign_target(false, "in");
      if (!skip_name("in")) unexpected("'in'");
      s->expr = parse_tuple(false, false, {"recursive", "if"});
      if (skip_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) fail(cur().line, "recursive loops are not supported");
      expect_block_end();
      ++loops_;
      s->body = subparse({"endfor", "else"}, &which);
      --loops_;
      if (which == "else") {
        expect_block_end();
        s->else_body = subparse({"endfor"}, &which);
      }
      expect_block_end();
    } else if (tag == "set") {
      s->target = assign_target(true, "");
      if (skip_op("=")) {
        s->kind = StmtKind::Set;
        s->expr = parse_tuple(true, false, {});
        expect_block_end();
      } else {
        if (!s->target.attr.empty() || s->target.tuple) unexpected("'='");
        s->kind = StmtKind::SetBlock;
        expect_block_end();
        s->body = subparse({"endset"}, &which);
        expect_block_end();
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::Macro;
      s->text = expect_name();
      params(s->params);
      expect_block_end();
      const int loops = std::exchange(loops_, 0);
      s->body = subparse({"endmacro"}, &which);
      loops_ = loops;
      expect_block_end();
    } else if (tag == "call") {
      s->kind = StmtKind::CallBlock;
      if (is_op("(")) params(s->params);
      s->expr = parse_expression(true);
      if (s->expr->kind != ExprKind::Call) fail(s->line, "expected a call after 'call'");
      expect_block_end();
      const int loops = std::exchange(loops_, 0);
      s->body = subparse({"endcall"}, &which);
      loops_ = loops;
      expect_block_end();
    } else if (tag == "filter") {
      s->kind = StmtKind::FilterBlock;
      s->expr = filter_chain(nullptr, true);
      expect_block_end();
      s->body = subparse({"endfilter"}, &which);
      expect_block_end();
    } else if (tag == "with") {
      s->kind = StmtKind::With;
      while (cur().type != Tok::BlockEnd) {
        if (!s->assigns.empty()) expect_op(",");
        Target target = assign_target(false, "");
        expect_op("=");
        s->assigns.emplace_back(std::move(target), parse_expression(true));
      }
      expect_block_end();
      s->body = subparse({"endwith"}, &which);
      expect_block_end();
    } else if (tag == "generation") {  // transformers' AssistantTracker: the body, as a call block renders it
      s->kind = StmtKind::Scope;
      expect_block_end();
      s->body = subparse({"endgeneration"}, &which);
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) fail(s->line, "'" + tag + "' outside a loop");
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
      expect_block_end();
    } else {
      fail(s->line, "unknown tag '" + tag + "'");
    }
    return s;
  }

  void params(std::vector<Param>& out) {
    expect_op("(");
    while (!is_op(")")) {
      if (!out.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      else if (!out.empty() && out.back().default_value) fail(cur().line, "non-default argument follows default argument");
      out.push_back(std::move(p));
    }
    next();
  }

  // A for loop's or set's target: a name, names (a tuple, parenthesized or not), or ns.attr.
  Target assign_target(bool with_namespace, std::string_view end_name) {
    Target target;
    if (with_namespace && cur().type == Tok::Name && peek().type == Tok::Op && peek().value == ".") {
      target.names.push_back(expect_name());
      next();
      target.attr = expect_name();
      return target;
    }
    const bool parens = skip_op("(");
    while (true) {
      target.names.push_back(expect_name());
      if (!is_op(",")) break;
      next();
      target.tuple = true;
      if ((parens && is_op(")")) || (!parens && (is_name(end_name) || is_op("=")))) break;
    }
    if (parens) {
      expect_op(")");
      target.tuple = target.tuple || target.names.size() > 1;
    }
    return target;
  }

  bool tuple_end(std::initializer_list<std::string_view> extra) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::Eof) return true;
    if (t.type == Tok::Op && t.value == ")") return true;
    for (const std::string_view e : extra)
      if (t.type == Tok::Name && t.value == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, std::initializer_list<std::string_view> extra) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    ExprPtr e = node(ExprKind::Tuple, line);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this);
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprPtr cond = node(ExprKind::Cond, line);
      cond->b = parse_or();
      if (skip_name("else")) cond->c = parse_expression(true);
      cond->a = std::move(e);
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(ExprKind kind, std::string op, ExprPtr a, ExprPtr b, int line) {
    ExprPtr e = node(kind, line);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      e = binary(ExprKind::Or, "or", std::move(e), parse_and(), line);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      e = binary(ExprKind::And, "and", std::move(e), parse_not(), line);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      const int line = cur().line;
      next();
      ExprPtr e = node(ExprKind::Unary, line);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == "<=" ||
           cur().value == ">" || cur().value == ">=")) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().value == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::Compare, line);
        cmp->a = std::move(first);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      e = binary(ExprKind::Binary, op, std::move(e), parse_concat(), line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      next();
      e = binary(ExprKind::Binary, "~", std::move(e), parse_math2(), line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      e = binary(ExprKind::Binary, op, std::move(e), parse_pow(), line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      e = binary(ExprKind::Binary, "**", std::move(e), parse_unary(true), line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    const int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const std::string op = cur().value;
      next();
      e = node(ExprKind::Unary, line);
      e->name = op;
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    ExprPtr e = node(ExprKind::Literal, t.line);
    switch (t.type) {
      case Tok::Name:
        if (t.value == "true" || t.value == "True") e->value = Value::boolean(true);
        else if (t.value == "false" || t.value == "False") e->value = Value::boolean(false);
        else if (t.value == "none" || t.value == "None") e->value = Value::none();
        else {
          e->kind = ExprKind::Name;
          e->name = t.value;
          names_.insert(t.value);
        }
        next();
        return e;
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) {  // adjacent literals are one, as in Python
          s += cur().value;
          next();
        }
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::Int:
        e->value = Value::integer(t.ival);
        next();
        return e;
      case Tok::Float:
        e->value = Value::number(t.fval);
        next();
        return e;
      case Tok::Op:
        if (t.value == "(") {
          next();
          e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          next();
          e->kind = ExprKind::List;
          while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        if (t.value == "{") {
          next();
          e->kind = ExprKind::Dict;
          while (!is_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("}")) break;
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    unexpected("an expression");
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (is_op(".")) {
        next();
        if (cur().type == Tok::Name) {
          ExprPtr a = node(ExprKind::Attr, line);
          a->name = cur().value;
          a->a = std::move(e);
          e = std::move(a);
          next();
        } else if (cur().type == Tok::Int) {
          ExprPtr item = node(ExprKind::Item, line);
          item->a = std::move(e);
          item->b = node(ExprKind::Literal, line);
          item->b->value = Value::integer(cur().ival);
          e = std::move(item);
          next();
        } else {
          unexpected("an attribute name");
        }
      } else if (is_op("[")) {
        next();
        e = subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj, int line) {
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (skip_op("]")) {
        ExprPtr item = node(ExprKind::Item, line);
        item->a = std::move(obj);
        item->b = std::move(start);
        return item;
      }
    }
    ExprPtr slice = node(ExprKind::Slice, line);
    slice->a = std::move(obj);
    expect_op(":");
    slice->items.push_back(std::move(start));
    slice->items.push_back(is_op("]") || is_op(":") ? nullptr : parse_expression(true));
    if (skip_op(":")) slice->items.push_back(is_op("]") ? nullptr : parse_expression(true));
    else slice->items.push_back(nullptr);
    expect_op("]");
    return slice;
  }

  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.items.empty() || !e.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur().line, "*args and **kwargs are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
        std::string key = cur().value;
        next();
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail(cur().line, "positional argument follows keyword argument");
        e.items.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr call(ExprPtr callee) {
    ExprPtr e = node(ExprKind::Call, cur().line);
    e->a = std::move(callee);
    call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      name += '.';
      name += expect_name();
    }
    return name;
  }

  // |name(args) |name ...; `inline_start`: a filter block's chain, without a leading '|'.
  ExprPtr filter_chain(ExprPtr e, bool inline_start) {
    while (is_op("|") || inline_start) {
      if (!inline_start) next();
      inline_start = false;
      const int line = cur().line;
      ExprPtr f = node(ExprKind::Filter, line);
      f->name = dotted_name();
      if (!is_filter(f->name)) fail(line, "no filter named '" + f->name + "'");
      if (is_op("(")) call_args(*f);
      f->a = std::move(e);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = filter_chain(std::move(e), false);
      } else if (is_name("is")) {
        const int line = cur().line;
        next();
        ExprPtr t = node(ExprKind::Test, line);
        t->negated = skip_name("not");
        t->name = dotted_name();
        if (!is_test(t->name)) fail(line, "no test named '" + t->name + "'");
        if (is_op("(")) {
          call_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur().line, "you cannot chain multiple tests with is");
          Nest nest(*this);
          t->items.push_back(postfix(parse_primary()));
        }
        t->a = std::move(e);
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Parsed parse_template(std::string_view source) {
  return Parser(Lexer(source).run()).run();
}

}  // namespace strata::jinja
