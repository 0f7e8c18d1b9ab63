// Loading the tokenizer from Hugging Face files: tokenizer.json, or GPT-2's vocab.json + merges.txt.
// Anything that would make encode() disagree with Hugging Face is refused with the file and field.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/error.h"
#include "tokenizer_impl.h"

namespace strata {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string read_file(const fs::path& file) {
  if (!fs::exists(file)) STRATA_FAIL("tokenizer file " << file << " does not exist");
  std::ifstream in(file, std::ios::binary);
  if (!in) STRATA_FAIL("cannot open tokenizer file " << file);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Ids index tables of (largest id + 1) entries, so one id near 2^30 in a hostile file would ask for
// gigabytes. Real vocabularies are dense (a few holes at most): allow four slots per token.
constexpr int64_t kMaxIdsPerToken = 4, kMinIdSlots = 1024;

bool id_in_range(const json& id, size_t tokens) {
  return id.is_number_integer() && id.get<int64_t>() >= 0 &&
         id.get<int64_t>() < std::min<int64_t>(1 << 30, int64_t(tokens) * kMaxIdsPerToken + kMinIdSlots);
}

// vocab: {"token": id, ...}; ids may leave holes, which stay empty strings.
void load_vocab(const json& vocab, TokenizerModel& m, const std::string& where) {
  if (!vocab.is_object()) STRATA_FAIL(m.source << ": " << where << " is not a JSON object of token -> id");
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_in_range(id_json, vocab.size())) {
      STRATA_FAIL(m.source << ": " << where << " gives token '" << token << "' the id " << id_json.dump()
                           << "; ids must be non-negative integers below " << kMaxIdsPerToken
                           << " x the number of tokens + " << kMinIdSlots);
    }
    auto id = id_json.get<size_t>();
    if (m.vocab.size() <= id) m.vocab.resize(id + 1);
    m.vocab[id] = token;
    m.vocab_ids[token] = int(id);
  }
}

void add_merge_line(TokenizerModel& m, const std::string& line, int rank, const std::string& where) {
  size_t space = line.find(' ');
  if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
    STRATA_FAIL(m.source << ": " << where << " '" << line << "' is not two tokens separated by one space");
  }
  m.add_merge(line.substr(0, space), line.substr(space + 1), rank, where);
}

void load_merges(const json& merges, TokenizerModel& m) {
  if (!merges.is_array()) STRATA_FAIL(m.source << ": model.merges is not an array");
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string where = "model.merges[" + std::to_string(i) + "]";
    const json& merge = merges[i];
    if (merge.is_string()) {
      add_merge_line(m, merge.get<std::string>(), int(i), where);  // legacy "a b" form
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      m.add_merge(merge[0].get<std::string>(), merge[1].get<std::string>(), int(i), where);
    } else {
      STRATA_FAIL(m.source << ": " << where << " is " << merge.dump() << "; expected \"a b\" or [\"a\", \"b\"]");
    }
  }
}

void load_added_tokens(const json& added, TokenizerModel& m) {
  if (added.is_null()) return;
  if (!added.is_array()) STRATA_FAIL(m.source << ": added_tokens is not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    if (!a.is_object() || !a.contains("id") || !a.contains("content")) {
      STRATA_FAIL(m.source << ": added_tokens[" << i << "] needs an \"id\" and a \"content\"");
    }
    AddedTokenRule rule;
    if (!id_in_range(a["id"], m.vocab_ids.size() + added.size()))
      STRATA_FAIL(m.source << ": added_tokens[" << i << "] has the id " << a["id"].dump()
                           << "; ids must be non-negative integers below " << kMaxIdsPerToken
                           << " x the number of tokens + " << kMinIdSlots);
    rule.token.id = a["id"].get<int>();
    rule.token.content = a.at("content").get<std::string>();
    rule.token.special = a.value("special", false);
    rule.lstrip = a.value("lstrip", false);
    rule.rstrip = a.value("rstrip", false);
    rule.single_word = a.value("single_word", false);
    rule.normalized = a.value("normalized", !rule.token.special);  // HF's default
    m.added.push_back(std::move(rule));
  }
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string("?")) : j.dump(); }

// Hugging Face matches a normalized added token in the normalized text. Where normalization only
// writes spaces "\u2581" (Gemma's Replace, no Prepend), a token holding neither, and stripping no
// whitespace around it (the normalized text has none), matches where it matches in the raw text.
bool matches_as_normalized(const AddedTokenRule& rule, const MetaspaceOptions& metaspace) {
  const std::string& s = rule.token.content;
  return metaspace.prepend == MetaspaceOptions::Prepend::Never && s.find(' ') == std::string::npos &&
         s.find("\u2581") == std::string::npos && !rule.lstrip && !rule.rstrip && !rule.single_word;
}

void load_split(const json& split, TokenizerModel& m, const std::string& where) {
  const json& pattern = split.at("pattern");
  bool literal = false;
  std::string text;
  if (pattern.contains("Regex")) {
    text = pattern.at("Regex").get<std::string>();
  } else if (pattern.contains("String")) {
    text = pattern.at("String").get<std::string>();
    literal = true;
  } else {
    STRATA_FAIL(m.source << ": " << where << ".pattern is " << pattern.dump() << "; expected {\"Regex\": ...} or {\"String\": ...}");
  }
  std::string behavior = split.value("behavior", std::string("Isolated"));
  if (behavior != "Isolated") {
    STRATA_FAIL(m.source << ": " << where << ".behavior is '" << behavior << "'; only 'Isolated' is supported");
  }
  if (split.value("invert", false)) STRATA_FAIL(m.source << ": " << where << ".invert is true; only false is supported");
  m.splits.emplace_back(text, literal, m.source + ": " + where + ".pattern");
}

void load_byte_level(const json& bl, TokenizerModel& m) {
  m.add_prefix_space = bl.value("add_prefix_space", false);
  if (bl.value("use_regex", true)) m.byte_level_split = std::make_unique<tok::SplitRegex>(tok::kGpt2Pattern, false, m.source);
}

// ByteLevel(use_regex=true), or Sequence[Split..., ByteLevel]: what GPT-2, LLaMA-3 and Qwen2 use.
void load_pre_tokenizer(const json& pre, TokenizerModel& m) {
  const char* expected = "; expected ByteLevel, or a Sequence of Split(Isolated) steps ending in ByteLevel";
  std::string type = type_of(pre);
  if (type == "ByteLevel") {
    load_byte_level(pre, m);
    return;
  }
  if (type != "Sequence") STRATA_FAIL(m.source << ": pre_tokenizer.type is '" << type << "'" << expected);
  const json& steps = pre.at("pretokenizers");
  for (size_t i = 0; i < steps.size(); ++i) {
    std::string where = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
    std::string step = type_of(steps[i]);
    bool last = i + 1 == steps.size();
    if (step == "Split" && !last) {
      load_split(steps[i], m, where);
    } else if (step == "ByteLevel" && last) {
      load_byte_level(steps[i], m);
    } else {
      STRATA_FAIL(m.source << ": " << where << ".type is '" << step << "'" << expected);
    }
  }
  if (steps.empty() || type_of(steps.back()) != "ByteLevel") {
    STRATA_FAIL(m.source << ": pre_tokenizer is a Sequence without a final ByteLevel" << expected);
  }
}

// Replace(" " -> "\u2581").
bool is_space_replace(const json& r) {
  return type_of(r) == "Replace" && r.contains("pattern") && r["pattern"].value("String", std::string()) == " " &&
         r.value("content", std::string()) == "\u2581";
}

// Gemma's pre-tokenizer, Split(" ", merged_with_previous): after its normalizer wrote every space
// "\u2581" there is no " " left to split at.
bool is_space_split(const json& p) {
  return type_of(p) == "Split" && p.contains("pattern") && p["pattern"].value("String", std::string()) == " " &&
         p.value("behavior", std::string()) == "MergedWithPrevious" && !p.value("invert", false);
}

// SentencePiece-style tokenizers: LLaMA-2's normalizer, Sequence[Prepend("\u2581"), Replace(" ", "\u2581")].
bool is_metaspace_normalizer(const json& n) {
  if (type_of(n) != "Sequence" || !n.contains("normalizers") || n["normalizers"].size() != 2) return false;
  const json& prepend = n["normalizers"][0];
  const json& replace = n["normalizers"][1];
  return type_of(prepend) == "Prepend" && prepend.value("prepend", std::string()) == "\u2581" &&
         type_of(replace) == "Replace" && replace.contains("pattern") &&
         replace["pattern"].value("String", std::string()) == " " &&
         replace.value("content", std::string()) == "\u2581";
}

TokenizerModel::Metaspace::Prepend prepend_scheme(const json& metaspace, TokenizerModel& m, const std::string& where) {
  using Prepend = TokenizerModel::Metaspace::Prepend;
  if (metaspace.value("replacement", std::string("\u2581")) != "\u2581")
    STRATA_FAIL(m.source << ": " << where << ".replacement is " << metaspace["replacement"].dump()
                         << "; only \"\u2581\" is supported");
  if (!metaspace.contains("prepend_scheme"))  // older files: add_prefix_space
    return metaspace.value("add_prefix_space", true) ? Prepend::Always : Prepend::Never;
  const std::string scheme = metaspace["prepend_scheme"].get<std::string>();
  if (scheme == "first") return Prepend::First;
  if (scheme == "always") return Prepend::Always;
  if (scheme == "never") return Prepend::Never;
  STRATA_FAIL(m.source << ": " << where << ".prepend_scheme is '" << scheme << "'; expected first, always or never");
}

// The decoder of a SentencePiece-style tokenizer: Sequence[Replace("\u2581", " "), ByteFallback,
// Fuse, Strip(" ", n, 0)] (as LLaMA-2's; Strip optional), or Metaspace.
void load_metaspace_decoder(const json& d, TokenizerModel& m) {
  const char* expected =
      "; expected Metaspace, or a Sequence of Replace(\"\u2581\" -> \" \"), ByteFallback, Fuse, Strip";
  if (type_of(d) == "Metaspace") {
    m.metaspace->metaspace_decoder = true;
    using Prepend = TokenizerModel::Metaspace::Prepend;
    if (prepend_scheme(d, m, "decoder") != m.metaspace->prepend && m.metaspace->prepend != Prepend::EveryPiece)
      STRATA_FAIL(m.source << ": decoder.prepend_scheme differs from the pre-tokenizer's; not supported");
    return;
  }
  const json steps = type_of(d) == "Sequence" ? d.value("decoders", json::array()) : json::array();
  const bool shape = (steps.size() == 3 || steps.size() == 4) && type_of(steps[0]) == "Replace" &&
                     steps[0].contains("pattern") && steps[0]["pattern"].value("String", std::string()) == "\u2581" &&
                     steps[0].value("content", std::string()) == " " && type_of(steps[1]) == "ByteFallback" &&
                     type_of(steps[2]) == "Fuse";
  if (!shape) STRATA_FAIL(m.source << ": decoder is " << d.dump().substr(0, 200) << expected);
  if (steps.size() == 4) {
    const json& strip = steps[3];
    if (type_of(strip) != "Strip" || strip.value("content", std::string()) != " " || strip.value("stop", 0) != 0)
      STRATA_FAIL(m.source << ": decoder.decoders[3] is " << strip.dump() << expected);
    m.metaspace->strip_leading = strip.value("start", 0);
  }
}

void check_model_options(const json& model, TokenizerModel& m) {
  std::string type = model.value("type", std::string(model.contains("merges") ? "BPE" : "?"));
  if (type != "BPE")
    STRATA_FAIL(m.source << ": model.type is '" << type << "'; only BPE (byte-level or SentencePiece-style) is supported");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
    STRATA_FAIL(m.source << ": model.dropout is " << model["dropout"].dump() << "; BPE dropout is not supported");
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(field) && !model[field].is_null() && !model[field].get<std::string>().empty()) {
      STRATA_FAIL(m.source << ": model." << field << " is " << model[field].dump() << "; byte-level BPE needs none");
    }
  }
  m.ignore_merges = model.value("ignore_merges", false);
  m.fuse_unk = model.value("fuse_unk", false);
  m.byte_fallback = model.value("byte_fallback", false);
}

// Byte-level tokenizers (no normalizer, a ByteLevel pre-tokenizer and decoder) or SentencePiece-
// style ones (LLaMA-2's Prepend + Replace normalizer without a pre-tokenizer, or a Metaspace
// pre-tokenizer; their decoder). Anything else would not encode as Hugging Face does.
void load_normalizer_pre_tokenizer_decoder(const json& j, TokenizerModel& m) {
  using Prepend = TokenizerModel::Metaspace::Prepend;
  const json none;
  const json& n = j.contains("normalizer") ? j["normalizer"] : none;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : none;
  const json& decoder = j.contains("decoder") ? j["decoder"] : none;
  const bool no_normalizer = n.is_null() || (type_of(n) == "Sequence" && n.value("normalizers", json::array()).empty());
  if (!no_normalizer && is_metaspace_normalizer(n)) {
    if (!pre.is_null())
      STRATA_FAIL(m.source << ": pre_tokenizer is '" << type_of(pre) << "' beside the Prepend + Replace normalizer; "
                           << "only none is supported there");
    m.metaspace.emplace();
    m.metaspace->prepend = Prepend::EveryPiece;
  } else if (!no_normalizer && is_space_replace(n)) {  // Gemma's: no dummy prefix
    if (!pre.is_null() && !is_space_split(pre))
      STRATA_FAIL(m.source << ": pre_tokenizer is " << pre.dump().substr(0, 200) << " beside the Replace normalizer; "
                           << "only none or Split(\" \", merged_with_previous) is supported there");
    m.metaspace.emplace();
    m.metaspace->prepend = Prepend::Never;
  } else if (!no_normalizer) {
    STRATA_FAIL(m.source << ": normalizer.type is '" << type_of(n) << "'; only none, SentencePiece's Sequence["
                         << "Prepend(\"\u2581\"), Replace(\" \" -> \"\u2581\")], or Gemma's Replace alone is "
                         << "supported");
  } else if (type_of(pre) == "Metaspace") {
    m.metaspace.emplace();
    m.metaspace->prepend = prepend_scheme(pre, m, "pre_tokenizer");
    m.metaspace->split = pre.value("split", true);
  }
  if (!m.metaspace) {
    if (!j.contains("pre_tokenizer")) STRATA_FAIL(m.source << ": no pre_tokenizer field");
    load_pre_tokenizer(pre, m);
    if (!decoder.is_null() && type_of(decoder) != "ByteLevel")
      STRATA_FAIL(m.source << ": decoder.type is '" << type_of(decoder) << "'; only ByteLevel is supported");
    return;
  }
  if (decoder.is_null()) STRATA_FAIL(m.source << ": a SentencePiece-style tokenizer needs its decoder; there is none");
  load_metaspace_decoder(decoder, m);
}

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json(const fs::path& file) {
  return from_tokenizer_json_text(read_file(file), file.string());
}

Tokenizer Tokenizer::from_tokenizer_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    STRATA_FAIL("tokenizer file " << source << " is not valid JSON: " << e.what());
  }
  auto m = std::make_unique<Impl>();
  m->source = source;
  try {
    if (!j.is_object() || !j.contains("model")) STRATA_FAIL(m->source << ": no \"model\" field");
    const json& model = j["model"];
    check_model_options(model, *m);
    if (!model.contains("vocab")) STRATA_FAIL(m->source << ": no model.vocab field");
    if (!model.contains("merges")) STRATA_FAIL(m->source << ": no model.merges field");
    load_vocab(model["vocab"], *m, "model.vocab");
    load_merges(model["merges"], *m);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = m->vocab_ids.find(model["unk_token"].get<std::string>());
      if (it == m->vocab_ids.end()) STRATA_FAIL(m->source << ": model.unk_token " << model["unk_token"].dump() << " is not in the vocab");
      m->unk_id = it->second;
    }
    load_normalizer_pre_tokenizer_decoder(j, *m);
    if (j.contains("added_tokens")) load_added_tokens(j["added_tokens"], *m);
    if (m->metaspace)
      for (const AddedTokenRule& rule : m->added)
        if (rule.normalized && !matches_as_normalized(rule, *m->metaspace))
          STRATA_FAIL(m->source << ": added token '" << rule.token.content << "' is normalized; with a "
                                << "SentencePiece-style tokenizer only unnormalized added tokens are supported (and, "
                                << "beside Gemma's Replace normalizer, normalized ones without spaces or strip flags)");
  } catch (const json::exception& e) {
    // A field of the wrong JSON type (e.g. a string where an id should be).
    STRATA_FAIL(m->source << ": unexpected tokenizer.json structure: " << e.what());
  }
  m->finish();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt) {
  return from_vocab_merges_text(read_file(vocab_json), read_file(merges_txt), vocab_json.string(), merges_txt.string());
}

Tokenizer Tokenizer::from_vocab_merges_text(const std::string& vocab_text, const std::string& merges_text,
                                            const std::string& vocab_source, const std::string& merges_source) {
  json vocab;
  try {
    vocab = json::parse(vocab_text);
  } catch (const json::exception& e) {
    STRATA_FAIL("tokenizer file " << vocab_source << " is not valid JSON: " << e.what());
  }
  auto m = std::make_unique<Impl>();
  m->source = vocab_source;
  load_vocab(vocab, *m, "the vocab");
  m->source = merges_source;
  std::istringstream lines(merges_text);
  std::string line;
  int rank = 0;
  for (int line_no = 1; std::getline(lines, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    add_merge_line(*m, line, rank++, "line " + std::to_string(line_no));
  }
  // GPT-2's only special token lives in vocab.json; tokenizer.json lists it as added and special.
  if (auto it = m->vocab_ids.find("<|endoftext|>"); it != m->vocab_ids.end()) {
    AddedTokenRule eot;
    eot.token = {it->second, "<|endoftext|>", true};
    m->added.push_back(eot);
  }
  m->byte_level_split = std::make_unique<tok::SplitRegex>(tok::kGpt2Pattern, false, m->source);
  m->finish();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_dir(const fs::path& dir) {
  if (!fs::is_directory(dir)) STRATA_FAIL("tokenizer directory " << dir << " does not exist");
  if (fs::exists(dir / "tokenizer.json")) return from_tokenizer_json(dir / "tokenizer.json");
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    return from_vocab_merges(dir / "vocab.json", dir / "merges.txt");
  }
  STRATA_FAIL("tokenizer directory " << dir << " has neither tokenizer.json nor vocab.json + merges.txt");
}

}  // namespace strata
