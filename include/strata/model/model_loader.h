// Opens what a --model argument names: "dummy:PRESET", a Hugging Face model directory
// (config.json, safetensors, tokenizer files), or a .gguf file. Nothing is loaded to a device here.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strata/model/chat_template.h"
#include "strata/model/classifier.h"
#include "strata/model/config.h"
#include "strata/model/packed_checkpoint.h"
#include "strata/model/pooling.h"
#include "strata/model/tokenizer.h"
#include "strata/model/weight_source.h"

namespace strata {

struct ModelBundle {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::optional<Tokenizer> tokenizer;  // absent when the model directory has none
  bool add_bos = false;                // prepend config.bos_id to prompts, as the HF tokenizer does
  // Ids the HF tokenizer appends to a text it encodes with its special tokens (its post-processor's
  // template after the text, or add_eos_token): Qwen3-Embedding's EOS. Embedding inputs get them,
  // as vLLM's embeddings endpoint and sentence-transformers tokenize; prompts do not.
  std::vector<int32_t> append_ids;
  // The special tokens the HF tokenizer puts around one text it encodes with them: BOS and the
  // appended ids.
  int64_t special_tokens() const { return (add_bos ? 1 : 0) + int64_t(append_ids.size()); }
  // A text's ids (`body`) with those special tokens, its last ids kept so that the whole is at
  // most `keep` long (0: not cut): Hugging Face's tokenizer(text) truncating on the left, which
  // keeps the special tokens. A `keep` that leaves no room beside them cuts nothing: callers refuse it
  // first, naming their field.
  std::vector<int32_t> with_special_tokens(std::vector<int32_t> body, int64_t keep = 0) const {
    const int64_t specials = special_tokens();
    if (keep > specials && int64_t(body.size()) > keep - specials)
      body.erase(body.begin(), body.end() - std::ptrdiff_t(keep - specials));
    if (add_bos) body.insert(body.begin(), config.bos_id);
    body.insert(body.end(), append_ids.begin(), append_ids.end());
    return body;
  }
  // The special tokens the HF tokenizer puts around a pair of texts (tokenizer(text, text_pair),
  // its post-processor's pair template): before the first, between the two, after the second. A
  // cross-encoder's score and rerank inputs are encoded so (model/classifier.h, pair_separator).
  struct PairTemplate {
    std::vector<int32_t> lead, middle, tail;
  };
  PairTemplate pair_template;
  // An embedding model's pooling (modules.json, a GGUF's pooling_type); nullopt: none given.
  std::optional<PoolingConfig> pooling;
  // A sequence classifier's head (config.num_labels > 0); nullopt for any other model.
  std::optional<ClassifierHead> classifier;
  std::string chat_template;           // empty when the model has none
  ChatTokens chat_tokens;              // the template's bos_token / eos_token strings
  std::optional<PackedFormat> packed;  // set for a GPTQ or AWQ checkpoint (packed_checkpoint.h)
  // A line for the job's log on how the checkpoint's codes load (GPTQ/AWQ, MXFP4 experts): which
  // compress_weights keeps them. Empty for other checkpoints.
  std::string load_note;
  RecommendedSampling sampling;        // generation_config.json's or the GGUF's; none for dummy models
};

// tokenizer_dir, when given, replaces the model's own tokenizer (or the byte stand-in of dummy models).
// lora_dir, when given, is a PEFT LoRA adapter merged into the weights as they load (lora.h); its
// line for the job's log goes into load_note. The tokenizer and chat template stay the model's.
// hf_overrides, when given, is a JSON object whose keys replace config.json's (vLLM's
// --hf-overrides: a reranker's classifier_from_token, a longer max_position_embeddings); a model
// directory only. An empty spec means the default model, SmolLM2-135M-Instruct, at default_model_path().
ModelBundle open_model(const std::string& spec, const std::filesystem::path& tokenizer_dir = {},
                       const std::filesystem::path& lora_dir = {}, const std::string& hf_overrides = {});

// config.json with the keys of `overrides` (a JSON object's text, vLLM's --hf-overrides) put in
// place of its own: `config` unchanged when overrides is empty. Throws strata::Error naming
// --hf-overrides when it is not a JSON object.
nlohmann::json override_config(nlohmann::json config, const std::string& overrides);

// A tokenizer directory's tokenizer_config.json: its chat_template and the bos_token / eos_token
// strings (empty where absent). open_model fills missing tokens from the model's BOS / EOS ids.
struct HfChat {
  std::string chat_template;
  ChatTokens tokens;
};
HfChat hf_chat(const std::filesystem::path& dir);

// A chat template given apart from the model (--chat-template, as vLLM's): the file's text, a
// Jinja template. Throws strata::Error naming the file when it cannot be read or holds no template.
std::string read_chat_template(const std::filesystem::path& file);

// Where scripts/fetch_model.sh puts the default model: $STRATA_CACHE (else ~/.cache/strata)/models/.
std::filesystem::path default_model_path();

}  // namespace strata
