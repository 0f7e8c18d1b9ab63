#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "strata/core/error.h"
#include "strata/model/model_loader.h"

namespace strata::cli {

void add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string model, text, decode;
    bool skip_special = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text, or the text of ids");
  cmd->add_option("--model", a->model, "model directory (or a directory with tokenizer.json / vocab.json + merges.txt)")
      ->required();
  auto* text = cmd->add_option("--text", a->text, "text to encode; prints a JSON array of ids");
  auto* dec = cmd->add_option("--decode", a->decode, "JSON array of ids to decode; prints the text");
  text->excludes(dec);
  cmd->add_flag("--skip-special", a->skip_special, "with --decode: drop special tokens");
  cmd->callback([a, text, dec] {
    if (text->count() == 0 && dec->count() == 0) throw Error("tokenize: give --text or --decode");
    std::optional<Tokenizer> tok;
    if (std::filesystem::is_directory(a->model) && !std::filesystem::exists(std::filesystem::path(a->model) / "config.json"))
      tok = Tokenizer::from_dir(a->model);  // a bare tokenizer directory
    else
      tok = std::move(open_model(a->model).tokenizer);
    if (!tok) throw Error(a->model + ": no tokenizer files (tokenizer.json, or vocab.json + merges.txt)");
    if (text->count()) {
      std::cout << nlohmann::json(tok->encode(a->text)).dump() << "\n";
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
