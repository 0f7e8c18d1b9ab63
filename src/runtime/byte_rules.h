// The network both answer compilers build (json_schema.cpp from a JSON schema, regex_rules.cpp
// from a regex or a list of choices) and rule_grammar.cpp walks: rules of nodes whose edges read a
// byte range, move without reading, or call another rule (a recursive transition network).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/runtime/rule_grammar.h"

namespace strata {

// An edge reads a byte in [lo, hi], or moves without reading (Eps), or calls a rule and comes back
// to its target when the rule reaches an end node.
struct RuleEdge {
  enum Kind : uint8_t { Bytes, Eps, Call };
  Kind kind = Eps;
  uint8_t lo = 0, hi = 0;
  uint32_t target = 0;
  uint32_t rule = 0;  // Call: the rule called
};
struct RuleNode {
  std::vector<RuleEdge> edges;
  bool end = false;    // the rule returns here
  bool reads = false;  // has a Bytes edge
  bool moves = false;  // has an Eps or Call edge
};
struct ByteRules {
  std::vector<RuleNode> nodes;
  std::vector<uint32_t> starts;  // rule -> its first node
  uint32_t root = 0;             // the root's rule
};

// A stack deeper than this (nested calls) is dropped: documents nest at most about this deep.
inline constexpr size_t kMaxRuleStack = 256;

// Every position the stack reaches without reading a byte: `reads` gets each stack whose node
// reads; returns whether the root's rule returned (the text is whole). The rules must have no
// loop of Eps edges (regex_rules.cpp removes its moves; the schema compiler makes none).
template <class Reads>
bool close_stack(const ByteRules& r, const std::vector<uint32_t>& stack, Reads reads) {
  bool whole = false;
  std::vector<std::vector<uint32_t>> work{stack};
  while (!work.empty()) {
    std::vector<uint32_t> s = std::move(work.back());
    work.pop_back();
    const RuleNode& n = r.nodes[s.back()];
    if (n.reads) reads(s);
    if (n.end) {
      if (s.size() == 1) whole = true;
      else {
        s.pop_back();
        work.push_back(std::move(s));
        continue;  // an end node has no edges of its own
      }
    }
    for (const RuleEdge& e : n.edges) {
      if (e.kind == RuleEdge::Eps) {
        std::vector<uint32_t> t = s;
        t.back() = e.target;
        work.push_back(std::move(t));
      } else if (e.kind == RuleEdge::Call && s.size() < kMaxRuleStack) {
        std::vector<uint32_t> t = s;
        t.back() = e.target;
        t.push_back(r.starts[e.rule]);
        work.push_back(std::move(t));
      }
    }
  }
  return whole;
}

// Builds a ByteRules: nodes, edges and rules.
class RuleBuilder {
public:
  RuleBuilder() : r_(std::make_shared<ByteRules>()) {}

protected:
  uint32_t node() {
    r_->nodes.emplace_back();
    return uint32_t(r_->nodes.size() - 1);
  }
  void bytes(uint32_t a, uint8_t lo, uint8_t hi, uint32_t b) {
    r_->nodes[a].edges.push_back({RuleEdge::Bytes, lo, hi, b, 0});
    r_->nodes[a].reads = true;
  }
  void byte(uint32_t a, char c, uint32_t b) { bytes(a, uint8_t(c), uint8_t(c), b); }
  void eps(uint32_t a, uint32_t b) {
    r_->nodes[a].edges.push_back({RuleEdge::Eps, 0, 0, b, 0});
    r_->nodes[a].moves = true;
  }
  void call(uint32_t a, uint32_t rule, uint32_t b) {
    r_->nodes[a].edges.push_back({RuleEdge::Call, 0, 0, b, rule});
    r_->nodes[a].moves = true;
  }
  // The text `s` read from `a`; returns the node after it.
  uint32_t literal(uint32_t a, const std::string& s) {
    for (char c : s) {
      const uint32_t n = node();
      byte(a, c, n);
      a = n;
    }
    return a;
  }
  struct Rule {
    uint32_t id, start, end;
  };
  Rule new_rule() {
    const uint32_t start = node(), end = node();
    r_->nodes[end].end = true;
    r_->starts.push_back(start);
    return {uint32_t(r_->starts.size() - 1), start, end};
  }

  std::shared_ptr<ByteRules> r_;
};

}  // namespace strata
