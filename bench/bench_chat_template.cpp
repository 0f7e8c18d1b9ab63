// The reader thread's cost of a chat prompt: a batch job renders each JSONL line's messages with
// the model's chat template, then tokenizes the text. For the fixture templates
// (tests/fixtures/chat/chat_cases.json), times one-off parsing, then a render of two conversations
// in C++ (ChatTemplate::parse, where the template is a family Strata knows) and in the Jinja
// interpreter (ChatTemplate::interpreted, any template), and tokenizing the rendered text.
//   bench_chat_template [--cases PATH] [--tokenizer PATH] [--templates a,b,...] [--repeat N]
// Defaults: the fixture file, the tiny-qwen3 tokenizer (tests/fixtures/models/tiny-qwen3; a
// directory or a tokenizer.json), qwen3,llama3.1,gemma3,qwq-style,r1-distill-style, 11 repetitions.
// Figures are medians of the repetitions, each the mean of enough calls for 20 ms, the calls timed
// in turn within each repetition; one thread.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "strata/model/chat_template.h"
#include "strata/model/tokenizer.h"

using namespace strata;
using namespace strata::bench;

namespace {

const char* format_name(ChatFormat f) {
  static const char* const names[] = {"ChatML", "Qwen2.5", "Qwen3", "Llama3", "Llama3.1", "Llama2", "Mistral",
                                      "Zephyr", "Phi3.5", "Gemma", "Gemma3", "Harmony", "Jinja"};
  return names[static_cast<int>(f)];
}

// Timed calls, interleaved: each repetition times every one in turn, so that a burst of other work
// on the machine (the VM is shared) lands in one repetition of each rather than in all of one.
class Timings {
public:
  // Adds fn; returns its index. Calls it once (warm-up) and counts the calls that last 20 ms.
  size_t add(std::function<void()> fn) {
    fn();
    int calls = 1;
    for (auto t0 = Clock::now(); seconds_since(t0) < 0.02; ++calls) fn();
    fns_.push_back({std::move(fn), calls, {}});
    return fns_.size() - 1;
  }
  void run(int repeat) {
    for (int r = 0; r < repeat; ++r)
      for (Timed& t : fns_) {
        const auto t0 = Clock::now();
        for (int i = 0; i < t.calls; ++i) t.fn();
        t.per_call.push_back(seconds_since(t0) / t.calls);
      }
  }
  // The median seconds a call of fn `i` took.
  double median(size_t i) {
    std::vector<double> v = fns_[i].per_call;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

private:
  struct Timed {
    std::function<void()> fn;
    int calls;
    std::vector<double> per_call;
  };
  std::vector<Timed> fns_;
};

// About 2 KB of prose for a user message, as a summarization job's prompt carries.
std::string long_user_message() {
  const char* const sentences[] = {
      "The committee met on Tuesday to review the quarterly figures for the northern region. ",
      "Revenue rose by 4.2% against the same quarter last year, driven mostly by the new contracts in logistics. ",
      "Costs, however, grew faster than expected: fuel prices climbed and two warehouses needed urgent repairs. ",
      "The finance team proposed delaying the planned hiring round until the second half of the year. ",
      "Several members objected, arguing that the support backlog already exceeds three weeks in some districts. ",
      "A compromise was reached: four positions will be filled now, the remaining six after the September review. ",
      "The meeting closed with a request for a detailed breakdown of maintenance spending by site. "};
  std::string text = "Summarize the following meeting notes in three bullet points, then list any open questions.\n\n";
  for (size_t i = 0; text.size() < 2048; ++i) {
    text += sentences[i % std::size(sentences)];
    if (i % 7 == 6) text += "\n\n";
  }
  return text;
}

struct Conversation {
  std::string name;
  std::vector<ChatMessage> messages;
};

std::vector<Conversation> conversations() {
  const std::string system = "You are a careful assistant. Answer concisely and say so when you are unsure.";
  std::vector<Conversation> out;
  out.push_back({"system + 2 KB user", {{"system", system}, {"user", long_user_message()}}});
  // A multi-turn chat: three user/assistant exchanges (6 turns), then the next question.
  std::vector<ChatMessage> chat = {{"system", system}};
  const char* const turns[][2] = {
      {"What is the difference between a process and a thread?",
       "A process has its own address space; threads within a process share it. Switching between threads is "
       "cheaper, but a bug in one thread can corrupt memory that the others use."},
      {"So when should I prefer processes?",
       "When isolation matters more than the cost of communication: a crash or a leak stays in one process, and "
       "the operating system can limit each one's memory and CPU separately."},
      {"And how do they communicate, then?",
       "Through pipes, sockets, shared memory segments or files. Shared memory is the fastest but needs its own "
       "synchronization, for example a mutex placed in the shared segment."}};
  for (const auto& t : turns) {
    chat.push_back({"user", t[0]});
    chat.push_back({"assistant", t[1]});
  }
  chat.push_back({"user", "Can you give me a short example in C of two processes sharing a counter?"});
  out.push_back({"system + 6 turns + question", std::move(chat)});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases_path = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/chat/chat_cases.json";
  std::string tokenizer_path = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/tiny-qwen3";
  std::string names = "qwen3,llama3.1,gemma3,qwq-style,r1-distill-style";
  int repeat = 11;
  try {
    for_each_option(argc, argv, [&](const std::string& k, const std::string& v) {
      if (k == "--cases") cases_path = v;
      else if (k == "--tokenizer") tokenizer_path = v;
      else if (k == "--templates") names = v;
      else if (k == "--repeat") repeat = std::max(1, std::stoi(v));
      else STRATA_FAIL("unknown option " << k << "\nusage: bench_chat_template [--cases PATH] [--tokenizer PATH] "
                                                 "[--templates a,b,...] [--repeat N]");
    });
    std::ifstream in(cases_path);
    if (!in) STRATA_FAIL("cannot read " << cases_path);
    const auto fixture = nlohmann::ordered_json::parse(in);
    const std::string today = fixture.value("today", "");
    const Tokenizer tokenizer = tokenizer_path.ends_with(".json") ? Tokenizer::from_tokenizer_json(tokenizer_path)
                                                                  : Tokenizer::from_dir(tokenizer_path);
    const std::vector<Conversation> convs = conversations();
    std::printf("templates: %s\ntokenizer: %s (%d tokens)\n", cases_path.c_str(), tokenizer_path.c_str(),
                tokenizer.vocab_size());
    std::printf("median of %d repetitions, one thread\n\n", repeat);

    // First every template parsed and every conversation rendered both ways (and checked), each
    // call to time registered; then the repetitions; then the tables.
    struct ParseRow {
      std::string name;
      ChatFormat format;
      size_t bytes, parse, interpreted;  // the last two: indices into timings
    };
    struct RenderRow {
      std::string name, conversation;
      bool known;
      size_t bytes = 0, tokens = 0, cpp = 0, interpreted = 0, tokenize = 0;
      std::string refused;  // the template's refusal of the conversation (raise_exception)
    };
    std::vector<ParseRow> parse_rows;
    std::vector<RenderRow> render_rows;
    std::deque<ChatTemplate> templates;  // the timed calls hold pointers to them
    Timings timings;
    size_t sink = 0;
    std::stringstream list(names);
    for (std::string name; std::getline(list, name, ',');) {
      if (!fixture["templates"].contains(name)) STRATA_FAIL("no template '" << name << "' in " << cases_path);
      const auto& t = fixture["templates"][name];
      const std::string source = t["source"].get<std::string>();
      const ChatTokens tokens{t["bos_token"].get<std::string>(), t["eos_token"].get<std::string>()};
      ChatTemplate& cpp = templates.emplace_back(ChatTemplate::parse(source, tokens));
      ChatTemplate& interp = templates.emplace_back(ChatTemplate::interpreted(source, tokens));
      if (!today.empty()) cpp.set_today(today), interp.set_today(today);  // the fixture's Llama 3.2 date
      const bool known = cpp.format() != ChatFormat::Jinja;
      const size_t parse = timings.add([source, tokens] { (void)ChatTemplate::parse(source, tokens); });
      const size_t interpreted = timings.add([source, tokens] { (void)ChatTemplate::interpreted(source, tokens); });
      parse_rows.push_back({name, cpp.format(), source.size(), parse, interpreted});
      for (const Conversation& c : convs) {
        std::string text;
        try {
          text = interp.render(c.messages);
        } catch (const ChatTemplateError& e) {  // e.g. Gemma 2 and Mistral v0.1 take no system message
          bool cpp_refuses = !known;
          try {
            if (known) (void)cpp.render(c.messages);
          } catch (const ChatTemplateError&) {
            cpp_refuses = true;
          }
          if (!cpp_refuses)
            STRATA_FAIL(name << ", " << c.name << ": the interpreter refuses what C++ renders: " << e.what());
          render_rows.push_back({name, c.name, known, 0, 0, 0, 0, 0, e.what()});
          continue;
        }
        if (known) {
          const std::string expected = cpp.render(c.messages);
          if (expected != text) {
            const auto diff = std::mismatch(expected.begin(), expected.end(), text.begin(), text.end());
            STRATA_FAIL(name << ", " << c.name << ": the C++ renderer and the interpreter differ at byte "
                             << (diff.first - expected.begin()) << "\nC++:\n"
                             << expected << "\ninterpreter:\n"
                             << text);
          }
        }
        const auto* m = &c.messages;
        render_rows.push_back(
            {name, c.name, known, text.size(), tokenizer.encode(text).size(),
             known ? timings.add([&cpp, m, &sink] { sink += cpp.render(*m).size(); }) : 0,
             timings.add([&interp, m, &sink] { sink += interp.render(*m).size(); }),
             timings.add([&tokenizer, text, &sink] { sink += tokenizer.encode(text).size(); }), ""});
      }
    }
    timings.run(repeat);
    if (sink == 0) STRATA_FAIL("nothing rendered");

    std::printf("one-off parse (once per job):\n\n"
                "| template | family | source bytes | parse() us | interpreted() us |\n|---|---|---|---|---|\n");
    for (const ParseRow& r : parse_rows)
      std::printf("| %s | %s | %zu | %.1f | %.1f |\n", r.name.c_str(), format_name(r.format), r.bytes,
                  timings.median(r.parse) * 1e6, timings.median(r.interpreted) * 1e6);
    std::printf("\nper render (once per JSONL line):\n\n| template | conversation | bytes | tokens | C++ us | "
                "interpreter us | interpreter / C++ | C++ renders/s | interpreter renders/s | tokenize us |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n");
    for (const RenderRow& r : render_rows) {
      if (!r.refused.empty()) {
        std::printf("| %s | %s | refused: %s |\n", r.name.c_str(), r.conversation.c_str(), r.refused.c_str());
        continue;
      }
      const double interp_s = timings.median(r.interpreted);
      char cpp_us[32] = "-", ratio[32] = "-", cpp_rate[32] = "-";
      if (r.known) {
        const double cpp_s = timings.median(r.cpp);
        std::snprintf(cpp_us, sizeof cpp_us, "%.1f", cpp_s * 1e6);
        std::snprintf(ratio, sizeof ratio, "%.1fx", interp_s / cpp_s);
        std::snprintf(cpp_rate, sizeof cpp_rate, "%.0f", 1 / cpp_s);
      }
      std::printf("| %s | %s | %zu | %zu | %s | %.1f | %s | %s | %.0f | %.1f |\n", r.name.c_str(),
                  r.conversation.c_str(), r.bytes, r.tokens, cpp_us, interp_s * 1e6, ratio, cpp_rate, 1 / interp_s,
                  timings.median(r.tokenize) * 1e6);
    }
    std::printf("\nThe C++ and interpreter texts are equal for every known family above; tokens: the rendered "
                "text encoded by the tokenizer.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_chat_template: %s\n", e.what());
    return 1;
  }
  return 0;
}
