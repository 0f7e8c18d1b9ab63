// Answers held to a JSON schema (OpenAI's response_format json_schema), as xgrammar compiles one
// (Grammar.from_json_schema with its defaults, what vLLM enforces): the schema becomes rules over
// bytes (rule_grammar.h), and the answer ends where its root object or array closes.
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

#include "strata/runtime/rule_grammar.h"

namespace strata {

// A schema Strata does not hold answers to; the message names the keyword and its JSON pointer.
struct JsonSchemaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Compiles `schema` (its object keys in the order they were written: properties keep it) into the
// rules a RuleGrammar holds answers to (rule_grammar.h); throws JsonSchemaError.
std::shared_ptr<const ByteRules> compile_json_schema(const nlohmann::ordered_json& schema);

}  // namespace strata
