// How an embedding model turns a text's hidden states into one vector: sentence-transformers'
// modules.json (a Transformer, then a Pooling module, then an optional Normalize), or a GGUF
// file's pooling_type, as vLLM and llama.cpp read them.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace strata {

// Last: the last token's state (causal models see the whole text there; Qwen3-Embedding,
// e5-mistral). Mean: the mean over the sequence's tokens. Cls: the first token's.
enum class PoolingKind : uint8_t { Last, Mean, Cls };
const char* pooling_name(PoolingKind kind);  // "last", "mean", "cls"
// "last" (or "lasttoken"), "mean", "cls"; throws strata::Error naming `what` otherwise.
PoolingKind parse_pooling_kind(const std::string& name, const std::string& what);

struct PoolingConfig {
  PoolingKind kind = PoolingKind::Last;  // without a config: vLLM's default for a decoder
  bool normalize = true;
  std::string source;  // where it was read ("DIR/modules.json"); empty: the defaults
};

// The model directory's sentence-transformers pooling; nullopt without a modules.json. Throws
// strata::Error naming the file and field for what Strata does not compute: a module other than
// Transformer, Pooling and Normalize (a Dense projection), max / weighted / sqrt-length pooling or
// several modes at once, include_prompt false, a Transformer module in a subdirectory.
std::optional<PoolingConfig> read_pooling_config(const std::filesystem::path& model_dir);

}  // namespace strata
