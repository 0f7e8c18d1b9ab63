#include "strata/job/answers.h"

#include <algorithm>
#include <cstdio>

#include "strata/job/output.h"
#include "strata/job/tool_calls.h"
#include "strata/runtime/json_schema.h"
#include "strata/runtime/regex_rules.h"

namespace strata {
using json = nlohmann::json;

namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) len = 1, cp = c;
    else if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Characters (code points) of valid UTF-8 text: Python's len(), which OpenAI's offsets count.
int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

json byte_list(const std::string& bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(int(c));
  return out;
}

// The generated tokens that logprobs report: all, but an EOS that ended the choice (it is no
// part of the text).
size_t reported_tokens(const GenResult& g) {
  const size_t n = std::min(g.tokens.size(), g.logprobs.size());
  return g.finish == FinishReason::Eos && n == g.tokens.size() && n > 0 ? n - 1 : n;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
json chat_logprobs(const Tokenizer& tok, const GenResult& g) {
  json content = json::array();
  auto entry = [&](const TokenLogprob& t) {
    return json{{"token", token_text(tok, t.token)}, {"logprob", t.logprob}, {"bytes", byte_list(tok.token_bytes(t.token))}};
  };
  for (size_t i = 0; i < reported_tokens(g); ++i) {
    const StepLogprobs& s = g.logprobs[i];
    json e = entry(s.sampled);
    e["top_logprobs"] = json::array();
    for (const TokenLogprob& t : s.top) e["top_logprobs"].push_back(entry(t));
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

// The least logprob an answer writes: -inf (a token the model rules out) as vLLM clamps it, so the
// line stays JSON.
constexpr double kLeastLogprob = -9999.0;

// Completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
// "text_offset"}; each top_logprobs dict holds the k most probable tokens and the sampled one, as
// OpenAI's (up to k + 1 entries). Offsets count characters from the start of the prompt.
json completion_logprobs(const Tokenizer& tok, const GenResult& g, const std::string& prompt) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t offset = code_points(prompt);
  for (size_t i = 0; i < reported_tokens(g); ++i) {
    const StepLogprobs& s = g.logprobs[i];
    const std::string text = token_text(tok, s.sampled.token);
    tokens.push_back(text);
    lps.push_back(s.sampled.logprob);
    json top = json::object();
    for (const TokenLogprob& t : s.top) top[token_text(tok, t.token)] = t.logprob;
    top[text] = s.sampled.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += tok.is_special(s.sampled.token) ? 0 : code_points(text);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// OpenAI's legacy echo: the prompt's tokens before the generated ones, the first with no logprob
// (null), each other one's from prompt_logprobs (its top tokens and itself, as generated tokens'),
// offsets counting characters from the start of the prompt.
json echo_logprobs(const Tokenizer& tok, std::span<const int32_t> prompt, const GenResult& g, bool prompt_only) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string text = token_text(tok, prompt[i]);
    tokens.push_back(text);
    offsets.push_back(offset);
    offset += tok.is_special(prompt[i]) ? 0 : code_points(text);
    if (i == 0 || i - 1 >= g.prompt_logprobs.size()) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    const StepLogprobs& s = g.prompt_logprobs[i - 1];
    lps.push_back(std::max(s.sampled.logprob, kLeastLogprob));
    json top = json::object();
    for (const TokenLogprob& t : s.top) top[token_text(tok, t.token)] = std::max(t.logprob, kLeastLogprob);
    top[text] = std::max(s.sampled.logprob, kLeastLogprob);
    tops.push_back(std::move(top));
  }
  if (!prompt_only) {
    json after = completion_logprobs(tok, g, "");
    for (size_t i = 0; i < after["tokens"].size(); ++i) {
      tokens.push_back(after["tokens"][i]);
      lps.push_back(after["token_logprobs"][i]);
      tops.push_back(after["top_logprobs"][i]);
      offsets.push_back(offset + after["text_offset"][i].get<int64_t>());
    }
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// vLLM's prompt_logprobs: null for the first prompt token, then for each other one a dict by token
// id of {"logprob", "rank", "decoded_token"}: the token itself with its rank, and the top tokens
// with theirs (1 .. k; the token's own, when it is among them, as vLLM overwrites it).
json vllm_prompt_logprobs(const Tokenizer& tok, const GenResult& g) {
  json out = json::array({nullptr});
  auto entry = [&](const TokenLogprob& t, int64_t rank) {
    return json{{"logprob", std::max(t.logprob, kLeastLogprob)}, {"rank", rank}, {"decoded_token", token_text(tok, t.token)}};
  };
  for (const StepLogprobs& s : g.prompt_logprobs) {
    json d = json::object();
    d[std::to_string(s.sampled.token)] = entry(s.sampled, s.sampled_rank);
    for (size_t i = 0; i < s.top.size(); ++i) d[std::to_string(s.top[i].token)] = entry(s.top[i], int64_t(i) + 1);
    out.push_back(std::move(d));
  }
  return out;
}

// The strata format's prompt_logprobs: null for the first prompt token, then one entry per prompt
// token as "logprobs" writes a generated one, with its rank.
json strata_prompt_logprobs(const Tokenizer& tok, const GenResult& g) {
  json out = json::array({nullptr});
  auto entry = [&](const TokenLogprob& t) {
    return json{{"id", t.token}, {"token", token_text(tok, t.token)}, {"logprob", std::max(t.logprob, kLeastLogprob)}};
  };
  for (const StepLogprobs& s : g.prompt_logprobs) {
    json e = entry(s.sampled);
    e["rank"] = s.sampled_rank;
    e["top_logprobs"] = json::array();
    for (const TokenLogprob& t : s.top) e["top_logprobs"].push_back(entry(t));
    out.push_back(std::move(e));
  }
  return out;
}

// The strata format's: one entry per generated token, parallel to "tokens".
json strata_logprobs(const Tokenizer& tok, const GenResult& g) {
  json out = json::array();
  auto entry = [&](const TokenLogprob& t) {
    return json{{"id", t.token}, {"token", token_text(tok, t.token)}, {"logprob", t.logprob}};
  };
  for (const StepLogprobs& s : g.logprobs) {
    json e = entry(s.sampled);
    e["top_logprobs"] = json::array();
    for (const TokenLogprob& t : s.top) e["top_logprobs"].push_back(entry(t));
    out.push_back(std::move(e));
  }
  return out;
}

struct ChoiceText {
  std::string text;
  bool stopped = false;  // cut at a stop string
  std::optional<std::string> reasoning;  // a reasoning answer's (job/reasoning.h)
};

// How a chat record's answer reasons (job/reasoning.h): GPT-OSS's harmony channels, Qwen3's
// <think> block, or not at all (raw prompts' answers are read as text).
struct Reasoning {
  const HarmonyTokens* harmony = nullptr;
  const ThinkTokens* think = nullptr;
};

// The answer's text (the part after its reasoning) and reasoning, from its first `tokens`.
ChoiceText answer_text(const Tokenizer& tok, const Reasoning& how, std::span<const int32_t> tokens) {
  if (!how.harmony && !how.think) return {tok.decode(tokens, /*skip_special=*/true), false, std::nullopt};
  ReasonedAnswer a = how.harmony ? split_harmony(tok, *how.harmony, tokens) : split_think(tok, *how.think, tokens);
  return {std::move(a.content), false, std::move(a.reasoning)};
}

// min_tokens: the answer's first min_tokens - 1 tokens hold no stop string (as the generator's
// stop check, which waits for min_tokens tokens). A reasoning answer's stop strings are looked for
// in the answer after its reasoning only.
ChoiceText choice_text(const Tokenizer& tok, const GenResult& g, const std::vector<std::string>& stops,
                       int min_tokens, const Reasoning& how) {
  ChoiceText c = answer_text(tok, how, g.tokens);
  const size_t held = std::min(g.tokens.size(), size_t(std::max(min_tokens - 1, 0)));
  const size_t ends_after = held == 0 ? 0 : answer_text(tok, how, std::span(g.tokens).first(held)).text.size();
  const size_t cut = first_stop(c.text, stops, ends_after);
  if (cut != std::string::npos) {
    c.text.resize(cut);
    c.stopped = true;
  }
  return c;
}

const std::vector<std::string>& stops_of(const PromptRecord& r, const AnswerSettings& s) {
  return r.stop ? *r.stop : s.default_stop;
}

Reasoning reasoning_of(const PromptRecord& r, const AnswerSettings& s) {
  if (r.messages.empty()) return {};
  const bool thinking = r.enable_thinking.value_or(!s.thinking_off);
  return {s.harmony ? &*s.harmony : nullptr, s.think && thinking ? &*s.think : nullptr};
}

// tool_choice named a function or was "required": the answer was held to its calls.
bool calls_forced(const PromptRecord& r) { return !r.named_tool.empty() || r.tool_calls_required; }

// OpenAI's tool call `k` of a request's choice.
json tool_call_json(const PromptRecord& r, size_t choice, size_t k, const std::string& name, const std::string& arguments) {
  return {{"id", tool_call_id(r, choice, k)},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", arguments}}}};
}

// OpenAI's tool_calls of a choice's calls.
json calls_json(const PromptRecord& r, size_t choice, const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) out.push_back(tool_call_json(r, choice, k, calls[k].name, calls[k].arguments));
  return out;
}

// The tool calls in a choice's text (after its reasoning and any stop string), for a chat record
// that offers tools: OpenAI's tool_calls, and the text before them left in `text`; null when
// nothing was called. A named tool_choice's answer is its one call's arguments, and "required"'s
// a JSON array of calls, the text then empty (as vLLM writes them). Otherwise the answer is read
// for calls, in its template's format, when the model may call tools.
json take_tool_calls(const PromptRecord& r, const AnswerSettings& s, size_t choice, std::string& text) {
  if (r.messages.empty() || r.tools.empty()) return nullptr;
  if (!r.named_tool.empty()) {
    json calls = json::array({tool_call_json(r, choice, 0, r.named_tool, text)});
    text.clear();
    return calls;
  }
  if (r.tool_calls_required) {
    const std::optional<std::vector<ToolCall>> read = read_required_tool_calls(text);
    if (!read) return nullptr;  // cut by the token limit: the text is the answer
    text.clear();
    return calls_json(r, choice, *read);
  }
  if (!r.read_tool_calls || s.tool_calls == ToolCallFormat::None) return nullptr;
  ToolCallAnswer a =
      s.tool_calls == ToolCallFormat::Hermes ? read_hermes_tool_calls(text) : read_llama3_json_tool_calls(text);
  if (a.calls.empty()) return nullptr;
  if (!r.parallel_tool_calls) a.calls.resize(1);  // vLLM's filter: the first call only
  text = a.content.value_or("");
  return calls_json(r, choice, a.calls);
}

}  // namespace

size_t first_stop(std::string_view text, const std::vector<std::string>& stops, size_t ends_after) {
  size_t best = std::string::npos;
  for (const std::string& s : stops)
    if (!s.empty()) best = std::min(best, text.find(s, ends_after >= s.size() ? ends_after - s.size() + 1 : 0));
  return best;
}

namespace {

// Whether the text of `generated` holds one of `stops` ending in its last token (earlier matches
// would have stopped it already): that token's bytes and at most longest - 1 bytes before them.
bool ends_in_stop(const Tokenizer& tokenizer, const std::vector<std::string>& stops, size_t longest,
                  std::span<const int32_t> generated) {
  if (generated.empty() || tokenizer.is_special(generated.back())) return false;  // no new text
  size_t first = generated.size() - 1, before = 0;
  while (first > 0 && before + 1 < longest) {
    --first;
    if (!tokenizer.is_special(generated[first])) before += tokenizer.token_bytes(generated[first]).size();
  }
  // From the start, the text as the answer will read it: a SentencePiece decoder drops the
  // first token's leading space, which the tokens' bytes still hold.
  std::string bytes = first == 0 ? tokenizer.decode(generated, /*skip_special=*/true) : std::string();
  for (size_t i = first; first > 0 && i < generated.size(); ++i)
    if (!tokenizer.is_special(generated[i])) bytes += tokenizer.token_bytes(generated[i]);
  for (const std::string& s : stops)
    if (bytes.find(s) != std::string::npos) return true;
  return false;
}

// A stop check over the answer's text from the token `answer_begin(generated)` names (nullopt: the
// last token is no answer text, so no check).
template <class AnswerBegin>
StopCheck stop_check(const Tokenizer& tokenizer, std::vector<std::string> stops, AnswerBegin answer_begin) {
  std::erase_if(stops, [](const std::string& s) { return s.empty(); });
  if (stops.empty()) return {};
  size_t longest = 0;
  for (const std::string& s : stops) longest = std::max(longest, s.size());
  return [&tokenizer, stops = std::move(stops), longest, answer_begin](std::span<const int32_t> generated) {
    const std::optional<size_t> begin = answer_begin(generated);
    return begin && ends_in_stop(tokenizer, stops, longest, generated.subspan(*begin));
  };
}

}  // namespace

StopCheck make_stop_check(const Tokenizer& tokenizer, std::vector<std::string> stops) {
  return stop_check(tokenizer, std::move(stops), [](std::span<const int32_t>) { return std::optional<size_t>(0); });
}

StopCheck make_think_stop_check(const Tokenizer& tokenizer, const ThinkTokens& t, std::vector<std::string> stops) {
  return stop_check(tokenizer, std::move(stops),
                    [t](std::span<const int32_t> generated) { return think_answer_begin(t, generated); });
}

StopCheck make_harmony_stop_check(const Tokenizer& tokenizer, const HarmonyTokens& h, std::vector<std::string> stops) {
  return stop_check(tokenizer, std::move(stops), [&tokenizer, h](std::span<const int32_t> generated) {
    return final_text_begin(tokenizer, h, generated);
  });
}

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const std::string bytes = tokenizer.token_bytes(id);
  if (valid_utf8(bytes)) return bytes;
  std::string out = "bytes:";
  char buf[5];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  }
  return out;
}

GenRequest make_gen_request(const PromptRecord& r, std::vector<int32_t> prompt, const AnswerSettings& s) {
  GenRequest g;
  g.prompt = std::move(prompt);
  g.sampling = r.sampling;
  g.n = r.n;
  g.logprobs = r.logprobs;
  g.prompt_logprobs = r.prompt_logprobs;
  const Reasoning how = reasoning_of(r, s);
  g.stop = how.harmony ? make_harmony_stop_check(*s.tokenizer, *how.harmony, stops_of(r, s))
           : how.think ? make_think_stop_check(*s.tokenizer, *how.think, stops_of(r, s))
                       : make_stop_check(*s.tokenizer, stops_of(r, s));
  const ResponseFormat format = r.response_format.value_or(s.default_response_format);
  if (format == ResponseFormat::JsonObject) {
    STRATA_CHECK(s.json_vocabulary, "a JSON answer asked for without the job's JSON vocabulary");
    g.grammar = s.json_vocabulary;
  } else if (format == ResponseFormat::JsonSchema) {
    STRATA_CHECK(s.schema_grammars, "a JSON schema answer asked for without the job's schema grammars");
    g.grammar = s.schema_grammars->get(r.response_format ? r.json_schema : s.default_json_schema);
  } else if (format == ResponseFormat::Regex || format == ResponseFormat::Choice) {
    STRATA_CHECK(s.schema_grammars, "a regex or choice answer asked for without the job's grammars");
    g.grammar = s.schema_grammars->get_pattern(format, r.response_format ? r.pattern : s.default_pattern, s.end_ids);
  }
  // The document is the answer after the reasoning, which runs free.
  if (g.grammar && how.harmony)
    g.grammar = harmony_final_grammar(std::move(g.grammar), s.json_vocabulary->tokens(), *how.harmony,
                                      s.tokenizer->vocab_size());
  else if (g.grammar && how.think)
    g.grammar = think_answer_grammar(std::move(g.grammar), *how.think, s.tokenizer->vocab_size());
  return g;
}

std::shared_ptr<const AnswerGrammar> SchemaGrammars::get(const std::string& schema) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<const AnswerGrammar>& g = grammars_[schema];
  if (!g)
    g = std::make_shared<const RuleGrammar>(compile_json_schema(nlohmann::ordered_json::parse(schema)), tokens_);
  return g;
}

std::shared_ptr<const AnswerGrammar> SchemaGrammars::get_pattern(ResponseFormat kind, const std::string& pattern,
                                                                 const std::vector<int32_t>& end_ids) {
  STRATA_CHECK(kind == ResponseFormat::Regex || kind == ResponseFormat::Choice, "not a regex or choice format");
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<const AnswerGrammar>& g = grammars_[(kind == ResponseFormat::Regex ? "regex:" : "choice:") + pattern];
  if (!g) {
    auto rules = kind == ResponseFormat::Regex
                     ? compile_regex(pattern)
                     : compile_choices(nlohmann::json::parse(pattern).get<std::vector<std::string>>());
    g = std::make_shared<const RuleGrammar>(std::move(rules), tokens_, end_ids);
  }
  return g;
}

AnswerSettings answer_settings(const Tokenizer& tokenizer, std::vector<std::string> default_stop,
                               std::string model_name, int64_t created, ResponseFormat default_response_format,
                               std::string default_json_schema) {
  AnswerSettings s;
  s.tokenizer = &tokenizer;
  s.default_stop = std::move(default_stop);
  s.model_name = std::move(model_name);
  s.created = created;
  s.default_response_format = default_response_format;
  s.default_json_schema = std::move(default_json_schema);
  s.json_vocabulary = json_vocabulary(tokenizer);
  s.schema_grammars = std::make_shared<SchemaGrammars>(s.json_vocabulary->tokens());
  return s;
}

std::shared_ptr<const JsonVocabulary> json_vocabulary(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(size_t(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (!tokenizer.is_special(id)) bytes[size_t(id)] = tokenizer.token_bytes(id);
  return std::make_shared<const JsonVocabulary>(std::move(bytes));
}

json answer_line(const PromptRecord& r, int64_t prompt_tokens, std::span<const GenResult> choices,
                 const AnswerSettings& s, std::span<const int32_t> prompt_ids) {
  const Tokenizer& tok = *s.tokenizer;
  const std::vector<std::string>& stops = stops_of(r, s);
  const Reasoning how = reasoning_of(r, s);
  if (r.format == InputFormat::OpenAIBatch) {
    Completion c;
    c.prompt_tokens = prompt_tokens;
    c.model = r.model.empty() ? s.model_name : r.model;
    c.created = s.created;
    // Echo: the prompt as given (token ids: their text, special tokens left out, as in answers).
    const std::string prompt_text = r.prompt_ids.empty() ? r.prompt : tok.decode(r.prompt_ids, /*skip_special=*/true);
    for (const GenResult& full : choices) {
      // echo with max_tokens 0: the one token drawn is dropped, as vLLM drops it.
      GenResult dropped;
      if (r.prompt_only) dropped.prompt_logprobs = full.prompt_logprobs;
      const GenResult& g = r.prompt_only ? dropped : full;
      ChoiceText t = choice_text(tok, g, stops, r.sampling.min_tokens, how);
      CompletionChoice choice;
      choice.tool_calls = take_tool_calls(r, s, c.choices.size(), t.text);
      choice.text = r.echo ? prompt_text + t.text : t.text;
      choice.reasoning = std::move(t.reasoning);
      // As vLLM's: an answer whose calls were read finishes with "tool_calls", however it ended; a
      // named function's or "required"'s finishes as the answer did (OpenAI's too).
      choice.finish_reason = !choice.tool_calls.is_null() && !calls_forced(r) ? "tool_calls"
                             : t.stopped || g.finish != FinishReason::Length ? "stop"
                                                                            : "length";
      if (r.logprobs >= 0)
        choice.logprobs = r.endpoint == Endpoint::ChatCompletions ? chat_logprobs(tok, g)
                          : r.echo ? echo_logprobs(tok, prompt_ids, full, r.prompt_only)
                                   : completion_logprobs(tok, g, prompt_text);
      if (r.prompt_logprobs >= 0) choice.prompt_logprobs = vllm_prompt_logprobs(tok, full);
      c.completion_tokens += int64_t(g.tokens.size());
      c.choices.push_back(std::move(choice));
    }
    return openai_response_line(r, c);
  }

  // The strata format: one choice in the top-level fields, as before n existed; n > 1 in "choices".
  auto choice_json = [&](const GenResult& g, size_t index) {
    ChoiceText t = choice_text(tok, g, stops, r.sampling.min_tokens, how);
    const json calls = take_tool_calls(r, s, index, t.text);
    json j;
    j["completion"] = t.text;
    if (t.reasoning) j["reasoning"] = *t.reasoning;
    if (!calls.is_null()) j["tool_calls"] = calls;
    j["tokens"] = g.tokens;
    j["completion_tokens"] = g.tokens.size();
    j["finish_reason"] = !calls.is_null() && !calls_forced(r) ? "tool_calls"
                         : t.stopped                          ? "stop"
                                                              : finish_reason_name(g.finish);
    if (r.logprobs >= 0) j["logprobs"] = strata_logprobs(tok, g);
    if (r.prompt_logprobs >= 0) j["prompt_logprobs"] = strata_prompt_logprobs(tok, g);
    return j;
  };
  json line;
  line["id"] = r.id;
  if (choices.size() == 1) {
    json c = choice_json(choices[0], 0);
    line["completion"] = std::move(c["completion"]);
    if (c.contains("reasoning")) line["reasoning"] = std::move(c["reasoning"]);
    if (c.contains("tool_calls")) line["tool_calls"] = std::move(c["tool_calls"]);
    line["tokens"] = std::move(c["tokens"]);
    line["prompt_tokens"] = prompt_tokens;
    line["completion_tokens"] = std::move(c["completion_tokens"]);
    line["finish_reason"] = std::move(c["finish_reason"]);
    if (c.contains("logprobs")) line["logprobs"] = std::move(c["logprobs"]);
    if (c.contains("prompt_logprobs")) line["prompt_logprobs"] = std::move(c["prompt_logprobs"]);
    return line;
  }
  line["prompt_tokens"] = prompt_tokens;
  int64_t total = 0;
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json c = choice_json(choices[i], i);
    c["index"] = i;
    total += int64_t(choices[i].tokens.size());
    list.push_back(std::move(c));
  }
  line["completion_tokens"] = total;
  line["choices"] = std::move(list);
  return line;
}

}  // namespace strata
