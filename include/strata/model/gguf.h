// GGUF (llama.cpp's single-file model format, versions 2 and 3): a bounds-checked reader that maps
// the file, typed metadata lookup, tensor infos, and dequantization of ggml block types to float.
// Every malformed input ends in a strata::Error naming the file (and the key or tensor); nothing
// is allocated from a count before the count is checked against the bytes that remain.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/config.h"
#include "strata/model/tokenizer.h"
#include "strata/model/weight_source.h"

namespace strata {

// Metadata value types, numbered as in the GGUF spec.
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Strings and numeric arrays point into the file mapping (no copies), so a
// GgufValue lives as long as its GgufFile.
struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalars: signed integers in i, unsigned integers and bool in u, F32/F64 in f.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string_view str;                 // String
  // Array: elem_type and count; numeric/bool elements are raw little-endian bytes at `raw`,
  // string elements are in strs, nested arrays in items.
  GgufType elem_type = GgufType::U8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;
  std::vector<std::string_view> strs;
  std::vector<GgufValue> items;

  bool is_integer() const;              // any of U8..I64 (not Bool)
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
  // Numeric element k of a numeric array, widened.
  int64_t int_at(uint64_t k) const;     // throws for float elements or u64 > INT64_MAX
  double float_at(uint64_t k) const;    // integer elements convert
};

// ggml tensor element types, numbered as in ggml.h.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// Block geometry of a ggml type: block_size elements take type_size bytes.
struct GgmlTypeInfo {
  const char* name = nullptr;
  int64_t block_size = 0;
  int64_t type_size = 0;
  bool dequantizable = false;  // this build can turn it into floats
};
// nullptr for ids ggml does not define (or that were removed, like Q4_2).
const GgmlTypeInfo* ggml_type_info(uint32_t type);

// Dequantizes n elements (a multiple of the type's block size) from src to float.
// Throws for types this build cannot dequantize.
void ggml_dequantize(GgmlType type, const void* src, float* dst, int64_t n);

// The affine types, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K, give every 32 elements one
// scale and one minimum: value = code * scale + min. Their codes can be kept as Strata's own
// quantized rows (quant.h) instead of being quantized a second time. The bits a code of `type`
// needs (4, 5 or 8), or 0 for a type that is not affine.
int ggml_affine_code_bits(GgmlType type);
// Decodes n elements (whole blocks) of an affine type: codes[n], and scales[n / 32] and
// mins[n / 32] in fp32 as ggml computes them (a K-quant's d * sc and -dmin * m), such that
// code * scale + min is ggml_dequantize's value bit for bit.
void ggml_affine_decode(GgmlType type, const void* src, int64_t n, uint8_t* codes, float* scales, float* mins);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;   // ggml order: ne[0] is the fastest-varying (row length)
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to the data section
  uint64_t nbytes = 0;
  int64_t numel = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class GgufFile {
public:
  static GgufFile open(const std::filesystem::path& path);
  // Parses bytes already in memory (tests, fuzzing); `name` stands in for the path in errors.
  static GgufFile from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const;
  uint32_t version() const;
  uint64_t alignment() const;
  uint64_t data_offset() const;       // absolute file offset of the tensor data section
  uint64_t file_size() const;

  // Metadata, keys in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const;
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed getters throw naming the file and key when the key is missing or of another type.
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;      // any integer type
  double get_float(std::string_view key) const;     // F32/F64, or an integer type
  bool get_bool(std::string_view key) const;
  std::optional<std::string> get_string_opt(std::string_view key) const;
  std::optional<int64_t> get_int_opt(std::string_view key) const;
  std::optional<double> get_float_opt(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const;
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufTensorInfo& tensor(std::string_view name) const;  // throws naming the tensor
  // Dequantizes a whole tensor into dst (numel floats). Throws naming tensor and type when the
  // type is not supported.
  void dequantize(const GgufTensorInfo& t, float* dst) const;

private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- LLaMA-architecture and Gemma models stored as GGUF ---

// Maps <arch>.* and tokenizer.ggml.* metadata onto a ModelConfig (Arch::Llama, RMSNorm, RoPE,
// SwiGLU, or Gemma's layer for gemma2 / gemma3, with llama.cpp's rules where the file is silent:
// Gemma's layer patterns and attention scale, SmolLM3's layers without RoPE; tied embeddings when
// the file has no output.weight).
ModelConfig config_from_gguf(const GgufFile& file);
// The sampling settings the file recommends (general.sampling.temp, top_p, top_k, min_p,
// penalty_repeat, as llama.cpp reads them), each checked against the sampler's range.
RecommendedSampling recommended_sampling_from_gguf(const GgufFile& file);
// Tensors under Hugging Face names and layouts, with llama.cpp's q/k row permutation undone.
// The source refers to `file`, which must outlive it.
std::unique_ptr<WeightSource> make_gguf_source(const GgufFile& file);
// Owning variant: opens the path and keeps the mapping alive with the source.
std::unique_ptr<WeightSource> make_gguf_source(const std::filesystem::path& path);
// The tokenizer stored in tokenizer.ggml.*: byte-level BPE (model "gpt2") or SentencePiece
// (model "llama").
Tokenizer tokenizer_from_gguf(const GgufFile& file);
// The byte-level pre-tokenizer llama.cpp names tokenizer.ggml.pre (nullopt: not one Strata has).
std::optional<PreTokenizer> gguf_pre_tokenizer(std::string_view name);
// Whether llama.cpp encodes a pre-tokenized word that is itself a token as that one token, whatever
// the merges would make of it (its ignore_merges: llama-bpe and its aliases, as Llama 3's
// tokenizer.json says, and glm4).
bool gguf_ignores_merges(std::string_view name);

}  // namespace strata
