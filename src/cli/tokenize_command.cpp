#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "strata/core/error.h"
#include "strata/model/chat_json.h"
#include "strata/model/chat_template.h"
#include "strata/model/model_loader.h"

namespace strata::cli {

namespace {

// --messages: what a batch job's strata-format line takes as "messages".
std::vector<ChatMessage> parse_messages(const std::string& text) {
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("--messages: invalid JSON: ") + e.what());
  }
  return read_chat_messages(v, "--messages", /*text_parts=*/false);  // a ChatMessageError is a strata::Error
}

// --tools: a request's "tools", each kept in its keys' order.
std::vector<std::string> parse_tools(const std::string& text) {
  nlohmann::ordered_json v;
  try {
    v = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("--tools: invalid JSON: ") + e.what());
  }
  return read_chat_tools(v, "--tools");
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string model, text, decode, messages, reasoning_effort, tools, chat_template;
    bool skip_special = false, render = false, no_generation_prompt = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text, or the text of ids");
  cmd->add_option("--model", a->model, "model directory (or a directory with tokenizer.json / vocab.json + merges.txt)")
      ->required();
  auto* text = cmd->add_option("--text", a->text, "text to encode; prints a JSON array of ids");
  auto* dec = cmd->add_option("--decode", a->decode, "JSON array of ids to decode; prints the text");
  auto* msgs = cmd->add_option("--messages", a->messages,
                                "JSON array of chat messages [{\"role\", \"content\"}]: prints the ids of the chat "
                                "rendered with the model's template, as apply_chat_template(tokenize=True)");
  text->excludes(dec);
  msgs->excludes(text)->excludes(dec);
  cmd->add_flag("--skip-special", a->skip_special, "with --decode: drop special tokens");
  cmd->add_flag("--render", a->render, "with --messages: print the rendered text instead of ids");
  cmd->add_flag("--no-generation-prompt", a->no_generation_prompt,
                "with --messages: leave out the assistant turn's opening (add_generation_prompt=False)");
  auto* effort = cmd->add_option("--reasoning-effort", a->reasoning_effort,
                                 "with --messages: low, medium or high, as a request's reasoning_effort (GPT-OSS)")
                     ->check(CLI::IsMember({"low", "medium", "high"}));
  auto* tools = cmd->add_option("--tools", a->tools,
                                "with --messages: JSON array of tools [{\"type\": \"function\", \"function\": {...}}], "
                                "as a request's tools (Qwen2.5, Qwen3, Llama 3.1 / 3.2 and interpreted templates that read them)");
  auto* chat_file = cmd->add_option("--chat-template", a->chat_template,
                                    "with --messages: Jinja chat template file to use instead of the model's")
                        ->check(CLI::ExistingFile);
  cmd->callback([a, text, dec, msgs, effort, tools, chat_file] {
    if (text->count() == 0 && dec->count() == 0 && msgs->count() == 0)
      throw Error("tokenize: give --text, --decode or --messages");
    if ((a->render || a->no_generation_prompt || effort->count() > 0 || tools->count() > 0 || chat_file->count() > 0) &&
        msgs->count() == 0)
      throw Error(
          "tokenize: --render, --no-generation-prompt, --reasoning-effort, --tools and --chat-template go with "
          "--messages");
    // Malformed messages are refused before the model is opened (a large model takes seconds).
    const std::vector<ChatMessage> messages = msgs->count() ? parse_messages(a->messages) : std::vector<ChatMessage>{};
    ChatOptions options{a->reasoning_effort};
    if (tools->count()) options.tools = parse_tools(a->tools);
    std::optional<Tokenizer> tok;
    std::string chat_template;
    ChatTokens chat_tokens;
    const std::filesystem::path dir(a->model);
    if (std::filesystem::is_directory(dir) && !std::filesystem::exists(dir / "config.json")) {
      tok = Tokenizer::from_dir(dir);  // a bare tokenizer directory
      HfChat chat = hf_chat(dir);
      chat_template = std::move(chat.chat_template), chat_tokens = std::move(chat.tokens);
    } else {
      ModelBundle model = open_model(a->model);
      tok = std::move(model.tokenizer);
      chat_template = std::move(model.chat_template), chat_tokens = std::move(model.chat_tokens);
    }
    if (!tok) throw Error(a->model + ": no tokenizer files (tokenizer.json, or vocab.json + merges.txt)");
    if (chat_file->count()) chat_template = read_chat_template(a->chat_template);
    if (text->count()) {
      std::cout << nlohmann::json(tok->encode(a->text)).dump() << "\n";
      return;
    }
    if (msgs->count()) {
      if (chat_template.empty()) throw Error(a->model + ": no chat template");
      const std::string rendered =
          ChatTemplate::parse(chat_template, chat_tokens)
              .render(messages, !a->no_generation_prompt, options);
      if (a->render) std::cout << rendered;  // as it is: a chat's text often ends in a newline
      else std::cout << nlohmann::json(tok->encode(rendered)).dump() << "\n";
      return;
    }
    nlohmann::json ids;
    try {
      ids = nlohmann::json::parse(a->decode);
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("--decode: invalid JSON: ") + e.what());
    }
    if (!ids.is_array()) throw Error("--decode: expected a JSON array of integers");
    std::vector<int32_t> v;
    for (const auto& x : ids) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok->vocab_size())
        throw Error("--decode: " + x.dump() + " is not a token id of this tokenizer");
      v.push_back(x.get<int32_t>());
    }
    std::cout << tok->decode(v, a->skip_special) << "\n";
  });
}

}  // namespace strata::cli
