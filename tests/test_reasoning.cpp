// Answers that reason first (job/reasoning.h): split into the answer and the reasoning, stop strings
// looked for in the answer only, JSON held to the answer. GPT-OSS's harmony answers are written as
// harmony text (OpenAI's format: a header <|channel|>NAME ... <|message|>, the text, then <|end|>,
// <|return|> or <|call|>) and tokenized with the o200k-style fixture, whose added tokens are the
// harmony special tokens; Qwen3's as "<think>...</think>" text with a Llama-3-style tokenizer to
// which <think> and </think> are added as Qwen3's tokenizer has them (not special).
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/job/answers.h"
#include "strata/job/reasoning.h"
#include "strata/job/output.h"
#include "test_paths.h"

using namespace strata;
using json = nlohmann::json;

namespace {

const Tokenizer& o200k() {
  static const Tokenizer tok = Tokenizer::from_dir(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/o200k-style");
  return tok;
}

const HarmonyTokens& harmony() {
  static const HarmonyTokens h = *HarmonyTokens::of(o200k());
  return h;
}

std::vector<int32_t> ids(const std::string& text) { return o200k().encode(text); }

const Tokenizer& qwen3_like() {
  static const Tokenizer tok = [] {
    std::ifstream in(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/llama3-style/tokenizer.json");
    json t = json::parse(in);
    int id = 1006;
    for (const char* text : {"<think>", "</think>"})
      t["added_tokens"].push_back({{"id", id++}, {"content", text}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", false}});
    return Tokenizer::from_tokenizer_json_text(t.dump(), "llama3-style + think");
  }();
  return tok;
}

const ThinkTokens& think() {
  static const ThinkTokens t = *ThinkTokens::of(qwen3_like());
  return t;
}

ReasonedAnswer split(const std::string& text) { return split_harmony(o200k(), harmony(), ids(text)); }

}  // namespace

TEST_CASE("harmony special tokens are found by their text, or the tokenizer is not harmony's", "[reasoning]") {
  const HarmonyTokens& h = harmony();
  CHECK(o200k().token_bytes(h.start) == "<|start|>");
  CHECK(o200k().token_bytes(h.end) == "<|end|>");
  CHECK(o200k().token_bytes(h.message) == "<|message|>");
  CHECK(o200k().token_bytes(h.channel) == "<|channel|>");
  CHECK(o200k().token_bytes(h.constrain) == "<|constrain|>");
  CHECK(o200k().token_bytes(h.return_) == "<|return|>");
  CHECK(o200k().token_bytes(h.call) == "<|call|>");
  CHECK_FALSE(HarmonyTokens::of(Tokenizer::from_dir(std::string(STRATA_FIXTURES_DIR) + "/tokenizer/gpt2")));
}

TEST_CASE("a harmony answer splits into its final text and its reasoning", "[reasoning]") {
  auto check = [](const std::string& text, const std::string& content, const std::string& reasoning) {
    INFO(text);
    const ReasonedAnswer a = split(text);
    CHECK(a.content == content);
    CHECK(a.reasoning == reasoning);
  };
  check("<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>"
        "Hello there!<|return|>",
        "Hello there!", "The user greets.");
  // Cut by the token limit: in the reasoning, in the final text, in a header.
  check("<|channel|>analysis<|message|>Thinking about", "", "Thinking about");
  check("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>Par", "Par", "a");
  check("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>fin", "", "a");
  check("<|channel|>anal", "", "");
  // A final answer at once; a channel name ends at a space; a recipient before the channel and a
  // constraint after it; messages of a channel one a line.
  check("<|channel|>final<|message|>été ☃ \"q\"<|return|>", "été ☃ \"q\"", "");
  check("<|channel|>final json<|message|>{}<|return|>", "{}", "");
  check(" to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>", "",
        "{\"city\": \"Oslo\"}");
  check("<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|>"
        "<|start|>assistant<|channel|>final<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y",
        "x\ny", "one\ntwo");
  // A message without a channel is not final; neither is one whose header starts anew.
  check("<|channel|>final<|message|>a<|end|><|start|>assistant<|message|>b<|return|>", "a", "b");
  // No header at all: the text is the answer, special tokens left out.
  check("plain words<|return|>", "plain words", "");
  check("", "", "");
}

TEST_CASE("stop strings end a harmony answer in its final text only", "[reasoning]") {
  const std::string reasoning = "<|channel|>analysis<|message|>I could say STOP here.<|end|>";
  const std::string answer = "<|start|>assistant<|channel|>final<|message|>Go, then STOP and rest";
  const std::vector<int32_t> tokens = ids(reasoning + answer);
  const StopCheck plain = make_stop_check(o200k(), {"STOP"});
  const StopCheck check = make_harmony_stop_check(o200k(), harmony(), {"STOP"});
  size_t plain_at = 0, harmony_at = 0;
  for (size_t n = 1; n <= tokens.size(); ++n) {
    const std::span<const int32_t> prefix(tokens.data(), n);
    if (!plain_at && plain(prefix)) plain_at = n;
    if (!harmony_at && check(prefix)) harmony_at = n;
  }
  REQUIRE(plain_at > 0);
  CHECK(o200k().decode(std::span(tokens).first(plain_at), true).ends_with("I could say STOP"));
  REQUIRE(harmony_at > 0);
  const ReasonedAnswer cut = split_harmony(o200k(), harmony(), std::span(tokens).first(harmony_at));
  CHECK(cut.content == "Go, then STOP");
  CHECK(cut.reasoning == "I could say STOP here.");
  // Where the check looks: the final text since its <|message|>, nothing else.
  const std::vector<int32_t> header_only = ids("<|channel|>final<|message|>");
  CHECK_FALSE(final_text_begin(o200k(), harmony(), header_only));
  const std::vector<int32_t> in_final = ids("<|channel|>final<|message|>Hi");
  CHECK(final_text_begin(o200k(), harmony(), in_final) == std::optional<size_t>(header_only.size()));
  CHECK_FALSE(final_text_begin(o200k(), harmony(), ids("<|channel|>analysis<|message|>Hi")));
  CHECK(final_text_begin(o200k(), harmony(), ids("no header")) == std::optional<size_t>(0));
  CHECK_FALSE(make_harmony_stop_check(o200k(), harmony(), {}));
}

TEST_CASE("a JSON answer of a harmony model is held to its final channel", "[reasoning][json]") {
  const auto vocabulary = json_vocabulary(o200k());
  const auto grammar = harmony_final_grammar(vocabulary, vocabulary->tokens(), harmony(), o200k().vocab_size());
  std::unique_ptr<AnswerCursor> c = grammar->start();
  const int64_t vocab = o200k().vocab_size() + 24;  // the model's rows past the tokenizer's
  std::vector<float> logits(size_t(vocab), 0.0f);
  auto allowed = [&](const AnswerCursor& cursor) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const int64_t n = cursor.mask(logits.data(), vocab);
    int64_t finite = 0;
    for (float l : logits) finite += std::isfinite(l) ? 1 : 0;
    CHECK(finite == n);
    return n;
  };
  // The reasoning runs free: every token of the tokenizer, none past it.
  const int64_t all = allowed(*c);
  CHECK(all == o200k().vocab_size());
  for (int32_t t : ids("<|channel|>analysis<|message|>Think: not JSON at all.<|end|><|start|>assistant")) {
    REQUIRE(c->accepts(t));
    c->advance(t);
    CHECK_FALSE(c->complete());
  }
  CHECK(allowed(*c) == all);
  CHECK_FALSE(c->accepts(int32_t(o200k().vocab_size())));
  // A commentary header's <|message|> does not start the document; the final one's does.
  for (int32_t t : ids("<|channel|>commentary<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>")) {
    REQUIRE(c->accepts(t));
    c->advance(t);
  }
  const int64_t in_json = allowed(*c);
  CHECK(in_json < all);
  CHECK_FALSE(c->accepts(ids("Sure")[0]));
  CHECK_FALSE(c->accepts(harmony().return_));
  for (int32_t t : ids("{\"a\": [1, 2]}")) {
    CHECK_FALSE(c->complete());
    REQUIRE(c->accepts(t));
    c->advance(t);
  }
  CHECK(c->complete());
  // Clones keep their own place.
  std::unique_ptr<AnswerCursor> fresh = grammar->start();
  std::unique_ptr<AnswerCursor> copy = fresh->clone();
  copy->advance(harmony().channel);
  CHECK(allowed(*fresh) == all);
}

TEST_CASE("harmony answers in both output formats: reasoning beside the final text", "[reasoning][batch]") {
  AnswerSettings s = answer_settings(o200k(), {}, "gpt-oss", 1700000000, ResponseFormat::Text);
  s.harmony = harmony();
  const std::vector<int32_t> answer =
      ids("<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>Yes. END more");
  GenResult g;
  g.tokens = answer;
  g.finish = FinishReason::Length;

  PromptRecord chat;
  chat.id = "q1";
  chat.format = InputFormat::OpenAIBatch;
  chat.endpoint = Endpoint::ChatCompletions;
  chat.messages = {{"user", "Is it?"}};
  chat.stop = std::vector<std::string>{"END"};
  const json line = answer_line(chat, 12, std::span(&g, 1), s);
  const json& choice = line["response"]["body"]["choices"][0];
  CHECK(choice["message"]["content"] == "Yes. ");
  CHECK(choice["message"]["reasoning_content"] == "Short.");
  CHECK(choice["finish_reason"] == "stop");  // cut at the stop string
  CHECK(line["response"]["body"]["usage"]["completion_tokens"] == answer.size());

  PromptRecord strata;
  strata.id = 7;
  strata.messages = {{"user", "Is it?"}};
  const json plain = answer_line(strata, 12, std::span(&g, 1), s);
  CHECK(plain["completion"] == "Yes. END more");
  CHECK(plain["reasoning"] == "Short.");
  CHECK(plain["finish_reason"] == "length");
  CHECK(plain["tokens"] == answer);

  // A raw prompt's answer is text (its prompt need not be harmony), and so is every answer of a
  // job whose template is not GPT-OSS's.
  PromptRecord raw;
  raw.id = 8;
  raw.prompt = "<|start|>user<|message|>Is it?<|end|><|start|>assistant";
  const json raw_line = answer_line(raw, 12, std::span(&g, 1), s);
  CHECK(raw_line["completion"] == o200k().decode(answer, true));
  CHECK_FALSE(raw_line.contains("reasoning"));
  s.harmony.reset();
  CHECK_FALSE(answer_line(strata, 12, std::span(&g, 1), s).contains("reasoning"));
  CHECK_FALSE(answer_line(chat, 12, std::span(&g, 1), s)["response"]["body"]["choices"][0]["message"].contains(
      "reasoning_content"));
}

TEST_CASE("a harmony chat request's JSON answer and stop strings are held to the final text", "[reasoning][batch]") {
  AnswerSettings s = answer_settings(o200k(), {"STOP"}, "gpt-oss", 1700000000, ResponseFormat::JsonObject);
  s.harmony = harmony();
  PromptRecord chat;
  chat.id = 1;
  chat.messages = {{"user", "JSON please"}};
  const GenRequest g = make_gen_request(chat, ids("x"), s);
  REQUIRE(g.grammar);
  std::unique_ptr<AnswerCursor> c = g.grammar->start();
  CHECK(c->accepts(harmony().channel));  // the reasoning first: not a JSON document's first token
  REQUIRE(g.stop);
  CHECK_FALSE(g.stop(ids("<|channel|>analysis<|message|>STOP")));
  CHECK(g.stop(ids("<|channel|>final<|message|>STOP")));
  PromptRecord raw;
  raw.id = 2;
  raw.prompt = "x";
  const GenRequest r = make_gen_request(raw, ids("x"), s);
  CHECK_FALSE(r.grammar->start()->accepts(harmony().channel));  // a raw prompt's answer is the document
  CHECK(r.stop(ids("<|channel|>analysis<|message|>STOP")));
}

TEST_CASE("a Qwen3 answer splits at its </think>", "[reasoning]") {
  auto check = [](const std::string& text, const std::string& content, const std::string& reasoning) {
    INFO(text);
    const ReasonedAnswer a = split_think(qwen3_like(), think(), qwen3_like().encode(text));
    CHECK(a.content == content);
    CHECK(a.reasoning == reasoning);
  };
  CHECK(qwen3_like().token_bytes(think().start) == "<think>");
  CHECK(qwen3_like().token_bytes(think().end) == "</think>");
  check("<think>\nThe user asks.\n\n</think>\n\nParis.\n", "Paris.\n", "The user asks.");
  check("<think>\ncut short", "", "cut short");
  check("<think>\n\n</think>\n\nNo reasoning.", "No reasoning.", "");
  check("Plain answer, thinking off.<|im_end|>", "Plain answer, thinking off.", "");
  check("reasoning without its opening tag</think>answer", "answer", "reasoning without its opening tag");
  check("\n<think>a</think>b</think>c", "b</think>c", "a");  // the first close ends the reasoning
  CHECK_FALSE(ThinkTokens::of(o200k()));
}

TEST_CASE("stop strings and JSON answers of a Qwen3 answer are held to the text after </think>", "[reasoning][json]") {
  const Tokenizer& tok = qwen3_like();
  const StopCheck check = make_think_stop_check(tok, think(), {"END"});
  CHECK_FALSE(check(tok.encode("<think>\nI will END it")));
  CHECK(check(tok.encode("<think>\nI will END it</think>\n\nDone. END")));
  CHECK(check(tok.encode("No think: END")));
  CHECK(think_answer_begin(think(), tok.encode("<think>x")) == std::nullopt);
  const std::vector<int32_t> closed = tok.encode("<think>x</think>");
  CHECK(think_answer_begin(think(), closed) == std::optional<size_t>(closed.size()));
  CHECK(think_answer_begin(think(), tok.encode("y")) == std::optional<size_t>(0));

  const auto vocabulary = json_vocabulary(tok);
  const auto grammar = think_answer_grammar(vocabulary, think(), tok.vocab_size());
  const int64_t vocab = tok.vocab_size();
  std::vector<float> logits(size_t(vocab), 0.0f);
  auto allowed = [&](const AnswerCursor& c) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    return c.mask(logits.data(), vocab);
  };
  {  // thinking first: free until </think>, then a document from its first token
    std::unique_ptr<AnswerCursor> c = grammar->start();
    const int64_t at_start = allowed(*c);
    CHECK(std::isfinite(logits[size_t(think().start)]));
    CHECK(c->accepts(think().start));
    CHECK_FALSE(c->accepts(tok.encode("Sure")[0]));
    c->advance(think().start);
    CHECK(allowed(*c) == vocab);
    for (int32_t t : tok.encode("\nJSON? {not yet\n")) {
      REQUIRE(c->accepts(t));
      c->advance(t);
    }
    CHECK_FALSE(c->complete());
    c->advance(think().end);
    CHECK(allowed(*c) == at_start - 1);  // the document's first tokens, <think> no more
    CHECK_FALSE(std::isfinite(logits[size_t(think().start)]));
    CHECK_FALSE(c->accepts(tok.encode("\n")[0]));
    for (int32_t t : tok.encode("[1]")) {
      CHECK_FALSE(c->complete());
      REQUIRE(c->accepts(t));
      c->advance(t);
    }
    CHECK(c->complete());
  }
  {  // no thinking (enable_thinking false): the document from the first token
    std::unique_ptr<AnswerCursor> c = grammar->start();
    for (int32_t t : tok.encode("{}")) {
      REQUIRE(c->accepts(t));
      c->advance(t);
    }
    CHECK(c->complete());
    CHECK_FALSE(c->accepts(think().start));
  }
}

TEST_CASE("Qwen3 chat answers carry their reasoning in both output formats", "[reasoning][batch]") {
  AnswerSettings s = answer_settings(qwen3_like(), {}, "qwen3", 1700000000, ResponseFormat::Text);
  s.think = think();
  GenResult g;
  g.tokens = qwen3_like().encode("<think>\nHmm.\n</think>\n\nYes.");
  g.finish = FinishReason::Eos;
  PromptRecord chat;
  chat.id = "q";
  chat.format = InputFormat::OpenAIBatch;
  chat.endpoint = Endpoint::ChatCompletions;
  chat.messages = {{"user", "?"}};
  const json line = answer_line(chat, 5, std::span(&g, 1), s);
  CHECK(line["response"]["body"]["choices"][0]["message"]["content"] == "Yes.");
  CHECK(line["response"]["body"]["choices"][0]["message"]["reasoning_content"] == "Hmm.");
  PromptRecord strata;
  strata.id = 1;
  strata.messages = {{"user", "?"}};
  const json plain = answer_line(strata, 5, std::span(&g, 1), s);
  CHECK(plain["completion"] == "Yes.");
  CHECK(plain["reasoning"] == "Hmm.");
  CHECK(plain["finish_reason"] == "eos");

  // With tools: the calls are read from the answer after the reasoning, as vLLM runs its reasoning
  // parser before its tool parser.
  s.tool_calls = ToolCallFormat::Hermes;
  chat.tools = {R"({"type": "function", "function": {"name": "f"}})"};
  g.tokens = qwen3_like().encode(
      "<think>\nCall f.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  const json called = answer_line(chat, 5, std::span(&g, 1), s)["response"]["body"]["choices"][0];
  CHECK(called["message"]["reasoning_content"] == "Call f.");
  CHECK(called["message"]["content"].is_null());
  CHECK(called["message"]["tool_calls"][0]["function"] == json{{"name", "f"}, {"arguments", "{\"x\": 1}"}});
  CHECK(called["finish_reason"] == "tool_calls");
}

TEST_CASE("a Qwen3 answer with thinking off is all content, its JSON held from the first token", "[reasoning][batch]") {
  AnswerSettings s = answer_settings(qwen3_like(), {}, "qwen3", 1700000000, ResponseFormat::JsonObject);
  s.think = think();
  PromptRecord chat;
  chat.id = "q";
  chat.messages = {{"user", "?"}};
  // Thinking on (the template's default): the answer may reason first.
  CHECK(make_gen_request(chat, {1}, s).grammar->start()->accepts(think().start));
  // Off, by the record or by --no-thinking where the record says nothing: the prompt closed the
  // think block, so the answer is the document from its first token, as vLLM's guided decoding holds it.
  chat.enable_thinking = false;
  CHECK_FALSE(make_gen_request(chat, {1}, s).grammar->start()->accepts(think().start));
  chat.enable_thinking.reset();
  s.thinking_off = true;
  CHECK_FALSE(make_gen_request(chat, {1}, s).grammar->start()->accepts(think().start));
  chat.enable_thinking = true;  // the record's own setting wins
  CHECK(make_gen_request(chat, {1}, s).grammar->start()->accepts(think().start));

  s.default_response_format = ResponseFormat::Text;
  chat.enable_thinking = false;
  GenResult g;
  g.tokens = qwen3_like().encode("<think>\nHmm.\n</think>\n\nYes.");
  g.finish = FinishReason::Eos;
  const json plain = answer_line(chat, 5, std::span(&g, 1), s);
  CHECK(plain["completion"] == qwen3_like().decode(g.tokens, true));
  CHECK_FALSE(plain.contains("reasoning"));
}

TEST_CASE("a prompt that opens <think> (QwQ, R1 distills) starts the answer in its reasoning", "[reasoning][json]") {
  const Tokenizer& tok = qwen3_like();
  ThinkTokens t = think();
  t.opened = true;
  auto check = [&](const std::string& text, const std::string& content, const std::string& reasoning) {
    INFO(text);
    const ReasonedAnswer a = split_think(tok, t, tok.encode(text));
    CHECK(a.content == content);
    CHECK(a.reasoning == reasoning);
  };
  check("The user asks.\n</think>\n\nParis.", "Paris.", "The user asks.");
  check("cut short in the reasoning", "", "cut short in the reasoning");
  check("<think>\nwritten again\n</think>\n\nyes", "yes", "written again");  // a leading one is skipped
  check("a<think>b</think>c", "c", "a<think>b");                               // a later one is text

  const StopCheck stop = make_think_stop_check(tok, t, {"END"});
  CHECK_FALSE(stop(tok.encode("I will END it")));
  CHECK(stop(tok.encode("I will END it</think>\n\nDone. END")));
  CHECK(think_answer_begin(t, tok.encode("y")) == std::nullopt);
  const std::vector<int32_t> closed = tok.encode("x</think>");
  CHECK(think_answer_begin(t, closed) == std::optional<size_t>(closed.size()));

  // JSON held after the reasoning only: free text, then the document from </think>.
  const auto grammar = think_answer_grammar(json_vocabulary(tok), t, tok.vocab_size());
  std::unique_ptr<AnswerCursor> c = grammar->start();
  for (int32_t id : tok.encode("Not JSON {yet")) {
    REQUIRE(c->accepts(id));
    c->advance(id);
  }
  CHECK_FALSE(c->complete());
  c->advance(t.end);
  CHECK_FALSE(c->accepts(tok.encode("Sure")[0]));
  for (int32_t id : tok.encode("[1]")) {
    REQUIRE(c->accepts(id));
    c->advance(id);
  }
  CHECK(c->complete());
}

TEST_CASE("an interpreted template's reasoning: <think> blocks found in its source and its generation prompt",
          "[reasoning][chat]") {
  const Tokenizer& tok = qwen3_like();
  const std::string turns =
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}";
  const ChatTemplate opens = ChatTemplate::parse(  // QwQ's and the R1 distills' way
      "{# strips </think> from earlier answers #}" + turns +
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}");
  REQUIRE(opens.format() == ChatFormat::Jinja);
  const std::optional<ThinkTokens> t = ThinkTokens::of(opens, tok);
  REQUIRE(t);
  CHECK(t->opened);
  CHECK(t->start == think().start);
  // Writes </think> back but leaves the model to open its block (Qwen3's way).
  const std::optional<ThinkTokens> later = ThinkTokens::of(
      ChatTemplate::parse("{# <think> and </think> are the model's #}" + turns +
                          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
      tok);
  REQUIRE(later);
  CHECK_FALSE(later->opened);
  // No </think> anywhere: answers are read as text; nor without the tokens.
  CHECK_FALSE(ThinkTokens::of(ChatTemplate::parse(turns), tok));
  CHECK_FALSE(ThinkTokens::of(opens, o200k()));
}
