#include "strata/model/model_loader.h"

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/model/gguf.h"
#include "strata/model/lora.h"
#include "strata/model/packed_checkpoint.h"

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string join_presets() {
  std::string s;
  for (const std::string& n : config_preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::optional<json> read_json_if_present(const fs::path& p) {
  if (!fs::exists(p)) return std::nullopt;
  std::ifstream in(p);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    STRATA_FAIL(p.string() << ": invalid JSON: " << e.what());
  }
}

// Whether Hugging Face's tokenizer prepends BOS: tokenizer_config.json's add_bos_token when set,
// else a TemplateProcessing post-processor whose single-sequence template starts with a token.
bool hf_adds_bos(const fs::path& dir) {
  if (auto tc = read_json_if_present(dir / "tokenizer_config.json"))
    if (tc->contains("add_bos_token") && (*tc)["add_bos_token"].is_boolean()) return (*tc)["add_bos_token"].get<bool>();
  if (auto tj = read_json_if_present(dir / "tokenizer.json")) {
    const json& pp = (*tj)["post_processor"];
    if (pp.is_object() && pp.value("type", "") == "TemplateProcessing" && pp["single"].is_array() &&
        !pp["single"].empty())
      return pp["single"][0].contains("SpecialToken");
  }
  return false;
}

// A TemplateProcessing post-processor's SpecialToken piece: the ids its special_tokens list for it.
void append_special_ids(const json& pp, const json& piece, const fs::path& dir, std::vector<int32_t>& ids) {
  const json& name = piece["SpecialToken"]["id"];
  const json& special = pp["special_tokens"];
  if (!name.is_string() || !special.is_object() || !special.contains(name.get<std::string>()))
    STRATA_FAIL((dir / "tokenizer.json").string() << ": post_processor names the special token " << name.dump()
                                                  << " but its special_tokens do not list it");
  for (const json& id : special[name.get<std::string>()]["ids"])
    if (id.is_number_integer()) ids.push_back(id.get<int32_t>());
}

// The ids Hugging Face's tokenizer appends to a text: [EOS] when tokenizer_config.json's
// add_eos_token is true (Llama's tokenizers rebuild their post-processor from it), none when it is
// false, else the special tokens after the text in a TemplateProcessing post-processor's
// single-sequence template (Qwen3-Embedding: "$A <|endoftext|>").
std::vector<int32_t> hf_appended_ids(const fs::path& dir, const ModelConfig& cfg) {
  if (auto tc = read_json_if_present(dir / "tokenizer_config.json"))
    if (tc->contains("add_eos_token") && (*tc)["add_eos_token"].is_boolean()) {
      if (!(*tc)["add_eos_token"].get<bool>() || cfg.eos_ids.empty()) return {};
      return {cfg.eos_ids[0]};
    }
  std::vector<int32_t> ids;
  const std::optional<json> tj = read_json_if_present(dir / "tokenizer.json");
  if (!tj || !tj->is_object()) return ids;
  const json& pp = (*tj)["post_processor"];
  if (!pp.is_object() || pp.value("type", "") != "TemplateProcessing" || !pp["single"].is_array()) return ids;
  bool after_text = false;
  for (const json& piece : pp["single"]) {
    if (piece.contains("Sequence")) after_text = true;
    if (!after_text || !piece.contains("SpecialToken")) continue;
    append_special_ids(pp, piece, dir, ids);
  }
  return ids;
}

// The special tokens of tokenizer(text, text_pair): a TemplateProcessing post-processor's pair
// template; else, where tokenizer_config.json sets add_bos_token / add_eos_token (Llama's
// tokenizers, which rebuild their post-processor from them), "BOS A EOS BOS B EOS" of those set;
// else (a ByteLevel post-processor or none) the two texts' ids one after the other.
ModelBundle::PairTemplate hf_pair_template(const fs::path& dir, const ModelBundle& b) {
  ModelBundle::PairTemplate pair;
  const std::optional<json> tc = read_json_if_present(dir / "tokenizer_config.json");
  auto flag = [&](const char* key) { return tc && tc->contains(key) && (*tc)[key].is_boolean(); };
  if (flag("add_bos_token") || flag("add_eos_token")) {
    const std::vector<int32_t> bos = b.add_bos ? std::vector<int32_t>{b.config.bos_id} : std::vector<int32_t>{};
    pair.lead = bos;
    pair.middle = b.append_ids;
    pair.middle.insert(pair.middle.end(), bos.begin(), bos.end());
    pair.tail = b.append_ids;
    return pair;
  }
  const std::optional<json> tj = read_json_if_present(dir / "tokenizer.json");
  const json pp = tj && tj->is_object() ? tj->value("post_processor", json()) : json();
  if (!pp.is_object() || pp.value("type", "") != "TemplateProcessing" || !pp.contains("pair") || !pp["pair"].is_array()) {
    if (b.add_bos) pair.lead = {b.config.bos_id};
    pair.tail = b.append_ids;
    return pair;
  }
  std::vector<int32_t>* at = &pair.lead;
  for (const json& piece : pp["pair"]) {
    if (piece.contains("Sequence")) {
      const json id = piece["Sequence"].value("id", json());
      if (at == &pair.lead && id == "A") at = &pair.middle;
      else if (at == &pair.middle && id == "B") at = &pair.tail;
      else STRATA_FAIL((dir / "tokenizer.json").string() << ": the post_processor's pair template is not \"A\" then \"B\"");
      continue;
    }
    if (!piece.contains("SpecialToken")) continue;
    append_special_ids(pp, piece, dir, *at);
  }
  if (at != &pair.tail)
    STRATA_FAIL((dir / "tokenizer.json").string() << ": the post_processor's pair template lacks the sequences A and B");
  return pair;
}

// llama.cpp's pooling_type: 1 mean, 2 cls, 3 last (0 none and 4 rank pool nothing Strata serves);
// nullopt without the key. Its embeddings are normalized, as llama-server's.
std::optional<PoolingConfig> gguf_pooling(const GgufFile& file) {
  const std::string key = file.get_string_opt("general.architecture").value_or("") + ".pooling_type";
  const std::optional<int64_t> type = file.get_int_opt(key);
  if (!type) return std::nullopt;
  PoolingConfig p;
  p.source = file.path() + " (" + key + ")";
  if (*type == 1) p.kind = PoolingKind::Mean;
  else if (*type == 2) p.kind = PoolingKind::Cls;
  else if (*type == 3) p.kind = PoolingKind::Last;
  else return std::nullopt;  // none or rank: --pooling decides
  return p;
}

// What a chat template's bos_token / eos_token print: the strings given, else the text of the
// model's BOS and first EOS token (GGUF files carry only the ids).
ChatTokens chat_tokens(const ModelBundle& b, std::string bos, std::string eos) {
  if (b.tokenizer) {
    if (bos.empty() && b.config.bos_id >= 0) bos = b.tokenizer->token_bytes(b.config.bos_id);
    if (eos.empty() && !b.config.eos_ids.empty()) eos = b.tokenizer->token_bytes(b.config.eos_ids[0]);
  }
  return {std::move(bos), std::move(eos)};
}

// Packed codes (GPTQ's or AWQ's `qweight`) need the format that says how to read them; without
// one, the loader would only report a missing `.weight`.
void refuse_unmarked_codes(const WeightSource& weights, const fs::path& dir) {
  for (const std::string& name : weights.names())
    if (name.ends_with(".qweight"))
      STRATA_FAIL(dir.string() << ": tensor '" << name << "' holds packed quantized codes, but config.json has no"
                               << " quantization_config and there is no quantize_config.json or quant_config.json to say how to read them"
                               << " (GPTQ and AWQ checkpoints carry one)");
}

}  // namespace

std::string read_chat_template(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) STRATA_FAIL(file.string() << ": cannot read the chat template");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) STRATA_FAIL(file.string() << ": cannot read the chat template");
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) STRATA_FAIL(file.string() << ": the chat template is empty");
  return text;
}

HfChat hf_chat(const fs::path& dir) {
  HfChat c;
  // transformers 4.50 and later save the template beside the config, as chat_template.jinja.
  if (std::ifstream jinja(dir / "chat_template.jinja"); jinja)
    c.chat_template.assign(std::istreambuf_iterator<char>(jinja), std::istreambuf_iterator<char>());
  const std::optional<json> tc = read_json_if_present(dir / "tokenizer_config.json");
  if (!tc || !tc->is_object()) return c;
  const json& t = tc->contains("chat_template") ? (*tc)["chat_template"] : json();
  if (c.chat_template.empty() && t.is_string()) c.chat_template = t.get<std::string>();
  if (c.chat_template.empty() && t.is_array())  // named templates ("default", "tool_use", ...)
    for (const json& named : t)
      if (named.is_object() && named.value("name", json()) == "default" && named.value("template", json()).is_string())
        c.chat_template = named["template"].get<std::string>();
  // bos_token / eos_token: a string, or an AddedToken object's "content".
  auto special = [&](const char* key) -> std::string {
    const json& v = tc->contains(key) ? (*tc)[key] : json();
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return {};
  };
  c.tokens = {special("bos_token"), special("eos_token")};
  return c;
}

fs::path default_model_path() {
  const char* cache = std::getenv("STRATA_CACHE");
  const char* home = std::getenv("HOME");
  const fs::path root = cache && *cache ? fs::path(cache) : fs::path(home ? home : ".") / ".cache" / "strata";
  return root / "models" / "smollm2-135m-instruct-q4_1.gguf";
}

namespace {
// A checkpoint's tensors (in LLaMA's names, any adapter merged) as the forward pass reads them:
// fused projections cut into parts, q/k rows laid out for its RoPE, Granite's residual multiplier
// folded into the projections that write the residual stream.
std::unique_ptr<WeightSource> as_forward_reads(std::unique_ptr<WeightSource> weights, const ModelConfig& cfg) {
  return residual_scale_source(rotary_layout_source(split_fused_projections(std::move(weights), cfg), cfg), cfg);
}

// The checkpoint's tensors seen through the --lora adapter, if any, and its line for the job's log.
std::unique_ptr<WeightSource> with_lora(std::unique_ptr<WeightSource> weights, const fs::path& lora_dir,
                                        ModelBundle& b) {
  if (lora_dir.empty()) return weights;
  LoraSummary summary;
  weights = lora_source(std::move(weights), lora_dir, b.config, &summary);
  const std::string note = lora_load_note(lora_dir, summary);
  b.load_note = b.load_note.empty() ? note : b.load_note + "\n" + note;
  return weights;
}
}  // namespace

json override_config(json config, const std::string& overrides) {
  if (overrides.empty()) return config;
  json patch;
  try {
    patch = json::parse(overrides);
  } catch (const json::exception& e) {
    STRATA_FAIL("--hf-overrides: invalid JSON: " << e.what());
  }
  if (!patch.is_object()) STRATA_FAIL("--hf-overrides must be a JSON object of config.json keys, got " << patch.type_name());
  for (const auto& [key, value] : patch.items()) config[key] = value;
  return config;
}

ModelBundle open_model(const std::string& spec_arg, const fs::path& tokenizer_dir, const fs::path& lora_dir,
                       const std::string& hf_overrides) {
  std::string spec = spec_arg;
  if (spec.empty()) {
    spec = default_model_path().string();
    if (!fs::exists(spec))
      STRATA_FAIL("no --model given and the default model is not in the cache (" << spec
                                                                                 << "); run scripts/fetch_model.sh");
  }
  ModelBundle b;
  if (!hf_overrides.empty() && (spec.rfind("dummy:", 0) == 0 || !fs::is_directory(spec)))
    STRATA_FAIL("--hf-overrides edits a model directory's config.json; " << spec << " is not a model directory");
  if (spec.rfind("dummy:", 0) == 0) {
    const std::string name = spec.substr(6);
    auto cfg = config_preset(name);
    if (!cfg) STRATA_FAIL("unknown preset '" << name << "' in --model " << spec << " (presets: " << join_presets() << ")");
    b.config = *cfg;
    if (!lora_dir.empty())
      STRATA_FAIL("--lora needs a model with weights (a directory or .gguf file), not the dummy " << spec);
    b.weights = make_dummy_source(b.config);
    b.tokenizer = tokenizer_dir.empty() ? Tokenizer::bytes_only() : Tokenizer::from_dir(tokenizer_dir);
    return b;
  }
  const fs::path path(spec);
  if (!fs::exists(path)) STRATA_FAIL("model '" << spec << "' not found (a directory, a .gguf file, or dummy:PRESET)");
  if (fs::is_directory(path)) {
    if (!fs::exists(path / "config.json")) STRATA_FAIL(spec << ": no config.json in the model directory");
    const json config = override_config(*read_json_if_present(path / "config.json"), hf_overrides);
    b.config = config_from_hf_json_text(config.dump(), path / "config.json");
    b.sampling = read_generation_config(path / "generation_config.json", b.config);
    b.packed = read_packed_format(path);
    bool mxfp4 = false;
    std::unique_ptr<WeightSource> weights = b.packed ? make_packed_source(path, *b.packed)
                                            : b.config.moe_naming == MoeNaming::GptOss
                                                ? gpt_oss_source(path, b.config, &mxfp4)
                                                : make_safetensors_source(path);
    b.load_note = b.packed ? packed_load_note(*b.packed) : mxfp4 ? mxfp4_load_note() : "";
    if (!b.packed) refuse_unmarked_codes(*weights, path);
    weights = with_lora(std::move(weights), lora_dir, b);  // in the checkpoint's names, as PEFT's keys
    if (b.config.norm_plus_one) weights = gemma_source(std::move(weights));
    b.weights = as_forward_reads(std::move(weights), b.config);
    const fs::path tok = tokenizer_dir.empty() ? path : tokenizer_dir;
    if (fs::exists(tok / "tokenizer.json") || fs::exists(tok / "vocab.json")) b.tokenizer = Tokenizer::from_dir(tok);
    b.add_bos = b.config.bos_id >= 0 && hf_adds_bos(tok);
    b.append_ids = hf_appended_ids(tok, b.config);
    b.pair_template = hf_pair_template(tok, b);
    b.pooling = read_pooling_config(path);
    if (b.config.num_labels > 0)
      b.classifier = read_classifier_head(config, path / "config.json", b.config, *b.weights,
                                          b.tokenizer ? &*b.tokenizer : nullptr);
    // Embedding models ship the decoder alone: an untied checkpoint may have no LM head.
    if (!b.config.tied_embeddings && !b.weights->contains("lm_head.weight")) b.config.lm_head = false;
    HfChat chat = hf_chat(tok);
    b.chat_template = std::move(chat.chat_template);
    b.chat_tokens = chat_tokens(b, std::move(chat.tokens.bos), std::move(chat.tokens.eos));
    return b;
  }
  if (path.extension() == ".gguf") {
    const GgufFile file = GgufFile::open(path);
    b.config = config_from_gguf(file);
    b.sampling = recommended_sampling_from_gguf(file);
    b.tokenizer = tokenizer_dir.empty() ? tokenizer_from_gguf(file) : Tokenizer::from_dir(tokenizer_dir);
    // Without the flag llama.cpp adds BOS for a SentencePiece vocabulary, not for byte-level BPE;
    // never for GLM's pre-tokenizers (their BOS id is <|endoftext|>; the chat template opens with
    // [gMASK]<sop>).
    const std::string pre = file.get_string_opt("tokenizer.ggml.pre").value_or("");
    b.add_bos = pre == "glm4" || pre == "chatglm-bpe" ? false
                : file.has("tokenizer.ggml.add_bos_token") ? file.get_bool("tokenizer.ggml.add_bos_token")
                                                           : file.get_string_opt("tokenizer.ggml.model") == "llama";
    b.chat_template = file.get_string_opt("tokenizer.chat_template").value_or("");
    if (file.has("tokenizer.ggml.add_eos_token") && file.get_bool("tokenizer.ggml.add_eos_token") &&
        !b.config.eos_ids.empty())
      b.append_ids = {b.config.eos_ids[0]};
    b.pooling = gguf_pooling(file);
    b.chat_tokens = chat_tokens(b, {}, {});
    b.weights = as_forward_reads(with_lora(make_gguf_source(path), lora_dir, b), b.config);
    return b;
  }
  STRATA_FAIL("model '" << spec << "': unsupported file type (expected a model directory, a .gguf file, or dummy:PRESET)");
}

}  // namespace strata
