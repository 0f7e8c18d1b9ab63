#include "strata/runtime/json_schema.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "byte_rules.h"
#include "strata/core/error.h"

namespace strata {

using ordered_json = nlohmann::ordered_json;

namespace {

// Subschemas nested deeper than this are refused.
constexpr int kMaxSchemaDepth = 64;
// minItems and maxItems unroll their items: bounds above this are refused.
constexpr int64_t kMaxCountedItems = 1024;

const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly"};

std::string pointer_child(const std::string& at, const std::string& key) {
  std::string escaped;
  for (char c : key) escaped += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return at + "/" + escaped;
}

class Compiler : RuleBuilder {
public:
  explicit Compiler(const ordered_json& root) : root_(root) {}

  std::shared_ptr<ByteRules> compile() {
    const ordered_json& resolved = resolve(root_, "#");
    const std::string type = single_type(resolved);
    if (type != "object" && type != "array")
      throw JsonSchemaError("the schema's root (#) must be an object or an array, as the answer ends where it closes");
    r_->root = schema_rule(root_, "#");
    refuse_empty_references();
    return r_;
  }

private:
  // ---- the network ----
  // [ \n\r\t]* after `a`: a node that loops on whitespace.
  uint32_t ws(uint32_t a) {
    const uint32_t n = node();
    eps(a, n);
    for (char c : {' ', '\n', '\r', '\t'}) byte(n, c, n);
    return n;
  }

  // ---- xgrammar's basic rules ----
  uint32_t string_rule() {
    if (string_) return *string_;
    const Rule r = new_rule();
    const uint32_t body = node(), esc = node(), c1 = node(), c2 = node();
    byte(r.start, '"', body);
    byte(body, '"', r.end);
    bytes(body, 0x20, 0x21, body);
    bytes(body, 0x23, 0x5B, body);
    bytes(body, 0x5D, 0x7F, body);
    byte(body, '\\', esc);
    for (char c : std::string("\"\\/bfnrt")) byte(esc, c, body);
    uint32_t hex = node();
    byte(esc, 'u', hex);
    for (int i = 0; i < 4; ++i) {
      const uint32_t next = i == 3 ? body : node();
      bytes(hex, '0', '9', next), bytes(hex, 'a', 'f', next), bytes(hex, 'A', 'F', next);
      hex = next;
    }
    // UTF-8 as RFC 3629 writes it, the surrogates' ED A0..BF let through (xgrammar's decoding).
    bytes(c1, 0x80, 0xBF, body);
    bytes(c2, 0x80, 0xBF, c1);
    bytes(body, 0xC2, 0xDF, c1);
    const uint32_t e0 = node(), f0 = node(), f13 = node(), f4 = node();
    byte(body, char(0xE0), e0), bytes(e0, 0xA0, 0xBF, c1);
    bytes(body, 0xE1, 0xEF, c2);
    byte(body, char(0xF0), f0), bytes(f0, 0x90, 0xBF, c2);
    bytes(body, 0xF1, 0xF3, f13), bytes(f13, 0x80, 0xBF, c2);
    byte(body, char(0xF4), f4), bytes(f4, 0x80, 0x8F, c2);
    string_ = r.id;
    return r.id;
  }
  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  uint32_t number_rule() {
    if (number_) return *number_;
    const Rule r = new_rule();
    const uint32_t sign = node(), digits = node(), integer = node(), frac1 = node(), frac = node(), expo = node(),
                   exp1 = node(), exp2 = node(), exp3 = node();
    byte(r.start, '-', sign);
    eps(r.start, sign);
    byte(sign, '0', integer);
    bytes(sign, '1', '9', digits);
    bytes(digits, '0', '9', digits);
    eps(digits, integer);
    byte(integer, '.', frac1);
    bytes(frac1, '0', '9', frac);
    bytes(frac, '0', '9', frac);
    eps(integer, expo), eps(frac, expo);
    byte(expo, 'e', exp1), byte(expo, 'E', exp1);
    byte(exp1, '+', exp2), byte(exp1, '-', exp2);
    eps(exp1, exp2);
    bytes(exp2, '0', '9', exp3);
    bytes(exp3, '0', '9', exp3);
    eps(expo, r.end), eps(exp3, r.end);
    number_ = r.id;
    return r.id;
  }
  // 0 | -?[1-9][0-9]*
  uint32_t integer_rule() {
    if (integer_) return *integer_;
    const Rule r = new_rule();
    const uint32_t minus = node(), digits = node();
    byte(r.start, '0', r.end);
    byte(r.start, '-', minus);
    bytes(r.start, '1', '9', digits);
    bytes(minus, '1', '9', digits);
    bytes(digits, '0', '9', digits);
    eps(digits, r.end);
    integer_ = r.id;
    return r.id;
  }
  uint32_t literals_rule(const std::vector<std::string>& texts) {
    const Rule r = new_rule();
    for (const std::string& t : texts) eps(literal(r.start, t), r.end);
    return r.id;
  }
  uint32_t boolean_rule() {
    if (!boolean_) boolean_ = literals_rule({"true", "false"});
    return *boolean_;
  }
  uint32_t null_rule() {
    if (!null_) null_ = literals_rule({"null"});
    return *null_;
  }
  // "[" ws (item (ws "," ws item)*)? ws "]" with at least min_items items and at most max_items
  // (-1: any number), xgrammar's minItems and maxItems: the items a bound counts are unrolled.
  uint32_t array_rule(uint32_t item, int64_t min_items = 0, int64_t max_items = -1) {
    const Rule r = new_rule();
    const uint32_t open = node();
    byte(r.start, '[', open);
    uint32_t before = ws(open);  // where the next item starts
    if (min_items == 0) byte(before, ']', r.end);
    // Items 1..last are unrolled; without an upper bound the last one loops.
    const int64_t last = max_items >= 0 ? max_items : std::max<int64_t>(min_items, 1);
    for (int64_t k = 1; k <= last; ++k) {
      const uint32_t after = node();
      call(before, item, after);
      const uint32_t between = ws(after);
      if (k >= min_items) byte(between, ']', r.end);
      if (k == last && max_items >= 0) break;
      const uint32_t comma = node();
      byte(between, ',', comma);
      if (k == last) {
        call(ws(comma), item, after);
        break;
      }
      before = ws(comma);
    }
    return r.id;
  }
  // "{" ws (string ws ":" ws value (ws "," ws string ws ":" ws value)*)? ws "}"
  uint32_t object_rule(uint32_t value) {
    const Rule r = new_rule();
    const uint32_t open = node(), key = node(), after = node();
    byte(r.start, '{', open);
    const uint32_t first = ws(open);
    byte(first, '}', r.end);
    call(first, string_rule(), key);
    const uint32_t colon = node();
    byte(ws(key), ':', colon);
    call(ws(colon), value, after);
    const uint32_t between = ws(after);
    byte(between, '}', r.end);
    const uint32_t comma = node();
    byte(between, ',', comma);
    call(ws(comma), string_rule(), key);
    return r.id;
  }
  uint32_t any_rule() {
    if (any_) return *any_;
    const Rule r = new_rule();
    any_ = r.id;  // arrays and objects of any values call it back
    const uint32_t alternatives[] = {number_rule(),      string_rule(),      boolean_rule(),
                                     null_rule(),        array_rule(r.id),   object_rule(r.id)};
    for (uint32_t alt : alternatives) call(r.start, alt, r.end);
    return r.id;
  }

  // ---- schemas ----
  const ordered_json& resolve(const ordered_json& s, const std::string& at) const {
    if (!s.is_object() || !s.contains("$ref")) return s;
    const ordered_json& ref = s["$ref"];
    if (!ref.is_string()) throw JsonSchemaError("'$ref' at " + at + " must be a string");
    const std::string text = ref.get<std::string>();
    for (const char* section : {"$defs", "definitions"}) {
      const std::string prefix = std::string("#/") + section + "/";
      if (text.rfind(prefix, 0) != 0) continue;
      const std::string name = text.substr(prefix.size());
      if (root_.contains(section) && root_[section].is_object() && root_[section].contains(name))
        return root_[section][name];
      throw JsonSchemaError("'$ref' at " + at + ": " + text + " is not in the schema");
    }
    throw JsonSchemaError("'$ref' at " + at + ": only references into #/$defs/ or #/definitions/ are supported, got " +
                          text);
  }

  // The schema's one type: its "type" when a string, else "object" or "array" where properties or
  // items say so; "" otherwise.
  static std::string single_type(const ordered_json& s) {
    if (!s.is_object()) return "";
    if (s.contains("type") && s["type"].is_string()) return s["type"].get<std::string>();
    if (s.contains("type")) return "";
    if (s.contains("properties") || s.contains("required")) return "object";
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return "array";
    return "";
  }

  uint32_t schema_rule(const ordered_json& s, const std::string& at) {
    // Subschemas nest in the compiler's own stack: a line's schema cannot overflow it.
    if (++depth_ > kMaxSchemaDepth)
      throw JsonSchemaError("the schema at " + at + " nests deeper than " + std::to_string(kMaxSchemaDepth) +
                            " levels");
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_rule();
      throw JsonSchemaError("the schema at " + at + " is false: no value can match it");
    }
    if (!s.is_object()) throw JsonSchemaError("the schema at " + at + " must be an object, got " + s.dump());
    if (s.contains("$ref")) {
      for (const auto& [key, value] : s.items())
        if (key != "$ref" && !kAnnotations.count(key) && key != "$defs" && key != "definitions")
          throw JsonSchemaError("keyword '" + key + "' beside '$ref' at " + at + " is not supported");
      const ordered_json& target = resolve(s, at);
      const std::string ref = s["$ref"].get<std::string>();
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      // A rule stands for the reference before its schema is compiled, so that it may recurse.
      const Rule r = new_rule();
      refs_[ref] = r.id;
      call(r.start, schema_rule(target, ref), r.end);
      return r.id;
    }
    static const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties", "items",
                                                 "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "$defs",
                                                 "definitions"};
    for (const auto& [key, value] : s.items())
      if (!kKnown.count(key) && !kAnnotations.count(key))
        throw JsonSchemaError("keyword '" + key + "' at " + at + " is not supported");
    if (s.contains("enum") || s.contains("const")) return constants_rule(s, at);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const ordered_json& alts = s[key];
      if (!alts.is_array() || alts.empty())
        throw JsonSchemaError("'" + std::string(key) + "' at " + at + " must be a non-empty array of schemas");
      for (const auto& [k, v] : s.items())
        if (k != key && !kAnnotations.count(k) && k != "$defs" && k != "definitions")
          throw JsonSchemaError("keyword '" + k + "' beside '" + key + "' at " + at + " is not supported");
      const Rule r = new_rule();
      for (size_t i = 0; i < alts.size(); ++i)
        call(r.start, schema_rule(alts[i], pointer_child(pointer_child(at, key), std::to_string(i))), r.end);
      return r.id;
    }
    if (s.contains("type") && s["type"].is_array()) {
      const Rule r = new_rule();
      for (const ordered_json& t : s["type"]) {
        if (!t.is_string()) throw JsonSchemaError("'type' at " + at + " must name types, got " + t.dump());
        call(r.start, typed_rule(s, t.get<std::string>(), at, /*listed=*/true), r.end);
      }
      return r.id;
    }
    if (s.contains("type") && !s["type"].is_string())
      throw JsonSchemaError("'type' at " + at + " must be a string or an array of strings");
    const std::string type = single_type(s);
    if (type.empty()) return any_rule();
    return typed_rule(s, type, at);
  }

  // A value of `type` under the schema's other keywords. In a type list (`listed`) each type takes
  // the keywords that apply to it (["object", "null"] with properties: an object of those, or
  // null); alone, keywords of another type are refused.
  uint32_t typed_rule(const ordered_json& s, const std::string& type, const std::string& at, bool listed = false) {
    if (!listed && type != "object" &&
        (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")))
      throw JsonSchemaError("object keywords at " + at + " on a schema of type '" + type + "' are not supported");
    for (const char* key : {"items", "minItems", "maxItems"})
      if (!listed && type != "array" && s.contains(key))
        throw JsonSchemaError("'" + std::string(key) + "' at " + at + " on a schema of type '" + type +
                              "' is not supported");
    if (type == "string") return string_rule();
    if (type == "number") return number_rule();
    if (type == "integer") return integer_rule();
    if (type == "boolean") return boolean_rule();
    if (type == "null") return null_rule();
    if (type == "array") {
      const int64_t min_items = item_count(s, "minItems", at, 0), max_items = item_count(s, "maxItems", at, -1);
      if (max_items >= 0 && min_items > max_items)
        throw JsonSchemaError("'minItems' at " + at + " (" + std::to_string(min_items) + ") exceeds 'maxItems' (" +
                              std::to_string(max_items) + "): no array can match");
      // xgrammar reads an array without items but with a bound as one of no items (strict mode):
      // refused rather than read either way.
      if (!s.contains("items") && (s.contains("minItems") || s.contains("maxItems")))
        throw JsonSchemaError("'" + std::string(s.contains("minItems") ? "minItems" : "maxItems") + "' at " + at +
                              " without 'items' is not supported");
      return array_rule(s.contains("items") ? schema_rule(s["items"], pointer_child(at, "items")) : any_rule(),
                        min_items, max_items);
    }
    if (type == "object") return properties_rule(s, at);
    throw JsonSchemaError("'type' at " + at + ": unknown type '" + type + "'");
  }

  // minItems or maxItems: a count up to kMaxCountedItems; `absent` where the schema has none.
  static int64_t item_count(const ordered_json& s, const char* key, const std::string& at, int64_t absent) {
    if (!s.contains(key)) return absent;
    const ordered_json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw JsonSchemaError("'" + std::string(key) + "' at " + at + " must be a non-negative integer, got " + v.dump());
    if (v.get<int64_t>() > kMaxCountedItems)
      throw JsonSchemaError("'" + std::string(key) + "' at " + at + " above " + std::to_string(kMaxCountedItems) +
                            " is not supported, got " + v.dump());
    return v.get<int64_t>();
  }

  // enum / const of scalars: their JSON texts.
  uint32_t constants_rule(const ordered_json& s, const std::string& at) {
    std::vector<std::string> texts;
    auto add = [&](const ordered_json& v, const std::string& where) {
      if (v.is_object() || v.is_array())
        throw JsonSchemaError("'" + where + "' at " + at + " holds an object or array; only scalars are supported");
      texts.push_back(v.dump());
    };
    if (s.contains("const")) add(s["const"], "const");
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        throw JsonSchemaError("'enum' at " + at + " must be a non-empty array");
      for (const ordered_json& v : s["enum"]) add(v, "enum");
    }
    for (const auto& [key, value] : s.items())
      if (key != "enum" && key != "const" && key != "type" && !kAnnotations.count(key))
        throw JsonSchemaError("keyword '" + key + "' beside 'enum' or 'const' at " + at + " is not supported");
    return literals_rule(texts);
  }

  // xgrammar's strict object: the properties in order, each required one present, optional ones
  // skippable, no other key.
  uint32_t properties_rule(const ordered_json& s, const std::string& at) {
    if (s.contains("additionalProperties") && s["additionalProperties"] != ordered_json(false))
      throw JsonSchemaError("'additionalProperties' at " + at + " is supported only as false (the default)");
    if (!s.contains("properties")) {
      if (s.contains("required") && !s["required"].empty())
        throw JsonSchemaError("'required' at " + at + " names properties the schema does not define");
      return s.contains("additionalProperties") ? empty_object_rule() : object_rule(any_rule());
    }
    const ordered_json& props = s["properties"];
    if (!props.is_object()) throw JsonSchemaError("'properties' at " + at + " must be an object");
    std::vector<std::string> names;
    std::vector<uint32_t> values;
    for (const auto& [name, sub] : props.items()) {
      names.push_back(name);
      values.push_back(schema_rule(sub, pointer_child(pointer_child(at, "properties"), name)));
    }
    std::vector<bool> required(names.size(), false);
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw JsonSchemaError("'required' at " + at + " must be an array of names");
      for (const ordered_json& n : s["required"]) {
        const auto it = n.is_string() ? std::find(names.begin(), names.end(), n.get<std::string>()) : names.end();
        if (it == names.end())
          throw JsonSchemaError("'required' at " + at + " names " + n.dump() + ", which 'properties' does not define");
        required[size_t(it - names.begin())] = true;
      }
    }
    const size_t n = names.size();
    const Rule r = new_rule();
    if (n == 0) {
      call(r.start, empty_object_rule(), r.end);
      return r.id;
    }
    // after[i]: the node after property i's value.
    std::vector<uint32_t> after(n);
    for (uint32_t& a : after) a = node();
    // From `from` (whitespace read), property j's key, colon and value, to after[j].
    auto member = [&](uint32_t from, size_t j) {
      const uint32_t key_end = literal(from, ordered_json(names[j]).dump());
      const uint32_t colon = node();
      byte(ws(key_end), ':', colon);
      call(ws(colon), values[j], after[j]);
    };
    // The properties that may come first after property i (i = n: the start): up to and
    // including the next required one.
    auto next_members = [&](size_t first) {
      std::vector<size_t> out;
      for (size_t j = first; j < n; ++j) {
        out.push_back(j);
        if (required[j]) break;
      }
      return out;
    };
    auto none_required_from = [&](size_t first) {
      return std::none_of(required.begin() + int64_t(first), required.end(), [](bool b) { return b; });
    };
    const uint32_t open = node();
    byte(r.start, '{', open);
    const uint32_t first = ws(open);
    for (size_t j : next_members(0)) member(first, j);
    if (none_required_from(0)) byte(first, '}', r.end);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t between = ws(after[i]);
      if (none_required_from(i + 1)) byte(between, '}', r.end);
      const std::vector<size_t> next = next_members(i + 1);
      if (next.empty()) continue;
      const uint32_t comma = node();
      byte(between, ',', comma);
      const uint32_t key_at = ws(comma);
      for (size_t j : next) member(key_at, j);
    }
    return r.id;
  }

  // A reference that can reach no value ({"$ref": "#/$defs/A"} as A itself, or through others
  // like it) would leave an answer that takes it with no token to draw: refused. A rule reaches a
  // value when a path from its start to its end reads bytes and calls only rules that do (the
  // fixpoint over all rules; every rule but a reference's reads by construction).
  void refuse_empty_references() const {
    const ByteRules& r = *r_;
    std::vector<char> reaches(r.starts.size(), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t rule = 0; rule < r.starts.size(); ++rule) {
        if (reaches[rule]) continue;
        std::vector<uint32_t> work{r.starts[rule]};
        std::set<uint32_t> seen(work.begin(), work.end());
        while (!work.empty() && !reaches[rule]) {
          const uint32_t at = work.back();
          work.pop_back();
          if (r.nodes[at].end) reaches[rule] = 1;
          for (const RuleEdge& e : r.nodes[at].edges) {
            const bool passes = e.kind != RuleEdge::Call || reaches[e.rule];
            if (passes && seen.insert(e.target).second) work.push_back(e.target);
          }
        }
        changed |= reaches[rule] != 0;
      }
    }
    for (const auto& [ref, rule] : refs_)
      if (!reaches[rule]) throw JsonSchemaError("'$ref' " + ref + " reaches no value: it refers back to itself");
  }

  uint32_t empty_object_rule() {
    const Rule r = new_rule();
    const uint32_t open = node();
    byte(r.start, '{', open);
    byte(ws(open), '}', r.end);
    return r.id;
  }

  const ordered_json& root_;
  std::optional<uint32_t> string_, number_, integer_, boolean_, null_, any_;
  std::map<std::string, uint32_t> refs_;
  int depth_ = 0;
};

}  // namespace

std::shared_ptr<const ByteRules> compile_json_schema(const ordered_json& schema) {
  return Compiler(schema).compile();
}

}  // namespace strata
