// A request's structured-output fields as vLLM reads them (docs/batch-format.md, "Regex and choice
// answers"): `structured_outputs` ({"choice": [...]}, {"regex": "..."}, {"json": schema},
// {"json_object": true}) and the older `guided_choice`, `guided_regex`, `guided_json`, in both
// input formats.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "strata/job/prompts.h"

namespace strata {

// Sets r.response_format (and r.pattern for a regex or a choice) from the fields of `obj` (a strata
// line or an OpenAI body), after response_format was read. A JSON schema given here is read in
// its keys' order by structured_json_schema. `field(key)` names a field in messages.
std::optional<ServeError> read_structured_outputs(const nlohmann::json& obj,
                                                  const std::function<std::string(const char*)>& field,
                                                  PromptRecord& r);

// Where a JSON-schema record's schema is in its line (`obj`: the strata line or the OpenAI body,
// with keys in the order written), and its field's name: response_format's, structured_outputs'
// json or guided_json (a schema given as a string is parsed).
struct SchemaSource {
  nlohmann::ordered_json schema;
  std::string field, within;  // "response_format" and ".json_schema.schema", "guided_json" and ""
};
SchemaSource structured_json_schema(const nlohmann::ordered_json& obj);

}  // namespace strata
