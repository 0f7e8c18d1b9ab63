// Answers held to a JSON schema (OpenAI's response_format json_schema), as xgrammar compiles one
// (Grammar.from_json_schema with its defaults, what vLLM enforces): the schema becomes rules over
// bytes, a recursive transition network, and a state is the set of stacks of rule positions the
// text so far can be at. A mask walks the vocabulary from a state as json_grammar.h's does.
//
// What is enforced, as xgrammar's rules write it (docs/batch-format.md, "JSON answers"):
// - objects: the `properties` in the schema's order, each `required` one present, the optional
//   ones skippable, nothing else (additionalProperties false, xgrammar's strict default); an
//   object schema without `properties` takes any object;
// - arrays of `items` (any value without it), with minItems and maxItems (up to 1024; either
//   needs `items`, whose absence xgrammar then reads as no items);
// - strings, numbers, integers (no "-0"), booleans, null; `enum` and `const` of scalars;
//   `anyOf`/`oneOf`; a `type` list; `$ref` into `$defs` or `definitions`, recursion included; a
//   schema without a type: any value;
// - whitespace between tokens of JSON as in the json_object grammar; the root is an object or an
//   array, and the answer ends where it closes.
// Any other keyword (minLength, pattern, minimum, uniqueItems, additionalProperties true, allOf, ...)
// is refused, naming it and where it is: a constraint we did not enforce would pass for one we did.
// Annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored.
// Subschemas nest at most 64 deep.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "strata/runtime/answer_grammar.h"

namespace strata {

// A schema Strata does not hold answers to; the message names the keyword and its JSON pointer.
struct JsonSchemaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The rules a schema compiles to (json_schema.cpp).
struct JsonSchemaRules;

// Compiles `schema` (its object keys in the order they were written: properties keep it);
// throws JsonSchemaError.
std::shared_ptr<const JsonSchemaRules> compile_json_schema(const nlohmann::ordered_json& schema);

// Where a text stands in the rules: each stack holds rule return positions, then the node the
// text has reached. Sorted and without duplicates, so that equal positions compare equal.
struct JsonSchemaState {
  std::vector<std::vector<uint32_t>> stacks;
  bool operator==(const JsonSchemaState&) const = default;
};

// A compiled schema over a tokenizer's vocabulary. Made with make_shared (its cursors share it).
class JsonSchemaGrammar : public AnswerGrammar, public std::enable_shared_from_this<JsonSchemaGrammar> {
public:
  JsonSchemaGrammar(std::shared_ptr<const JsonSchemaRules> rules, std::shared_ptr<const SortedVocabulary> tokens);

  JsonSchemaState start_state() const;
  // Advances by one byte; false when it cannot come next.
  bool step(JsonSchemaState& s, uint8_t byte) const;
  // Whether the text is a whole document (the root's rule has returned).
  bool complete(const JsonSchemaState& s) const;
  bool accepts(const JsonSchemaState& s, int32_t token) const;
  JsonSchemaState after(const JsonSchemaState& s, int32_t token) const;
  std::shared_ptr<const std::vector<uint64_t>> allowed(const JsonSchemaState& s) const;
  int64_t size() const { return tokens_->size(); }

  std::unique_ptr<AnswerCursor> start() const override;

private:
  struct StateHash {
    size_t operator()(const JsonSchemaState& s) const;
  };
  std::shared_ptr<const JsonSchemaRules> rules_;
  std::shared_ptr<const SortedVocabulary> tokens_;
  MaskCache<JsonSchemaState, StateHash> masks_;
};

}  // namespace strata
