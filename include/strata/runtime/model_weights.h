// A model's weights resident on one backend. Each layer is one Buffer (the unit that will move
// between tiers) with named views into it; the embeddings, final norm and head form one more.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/model/weight_source.h"
#include "strata/model/weight_specs.h"
#include "strata/quant/quant.h"

namespace strata {

class ThreadPool;

// One expert of a mixture-of-experts layer: a SwiGLU MLP of width f, its gate and up rows stacked.
struct ExpertWeights {
  Tensor gate_w, up_w;  // [f, h]
  Tensor down_w;        // [h, f]
  Tensor gate_up_w;     // [2f, h], the view of gate_w and up_w as one matrix
  Tensor gate_b, up_b, down_b, gate_up_b;  // [f], [f], [h], [2f]: GPT-OSS's biases (expert_bias)
};

struct LayerWeights {
  Buffer block;
  Tensor attn_norm_w, attn_norm_b;   // [h]
  Tensor q_w, q_b, k_w, k_b, v_w, v_b;  // [q_dim | kv_dim, h], [q_dim | kv_dim]
  Tensor q_norm_w, k_norm_w;         // [head_dim], qk_norm only
  Tensor o_w, o_b;                   // [h, q_dim], [h]
  Tensor mlp_norm_w, mlp_norm_b;     // [h]
  Tensor fc1_w, fc1_b, up_w;         // [f, h] (fc1 = gate_proj for SwiGLU), [f]
  Tensor fc2_w, fc2_b;               // [h, f], [h]
  Tensor post_attn_norm_w, post_mlp_norm_w;  // [h], sandwich_norms only
  // Views of the stacked projections, one GEMM each (the block lays their rows back to back):
  // qkv_w = [q_w; k_w; v_w] [q_dim + 2 kv_dim, h], qkv_b likewise where there are biases, and
  // SwiGLU's gate_up_w = [fc1_w; up_w] [2f, h]. Empty where a part is absent.
  Tensor qkv_w, qkv_b, gate_up_w;
  // A sparse (mixture-of-experts) layer's MLP in place of fc1/up/fc2: the router and the experts.
  Tensor router_w;  // [experts, h]
  Tensor router_b;  // [experts], router_bias only
  std::vector<ExpertWeights> experts;
  bool sparse() const { return !router_w.empty(); }
};

struct ModelWeights {
  Buffer globals;
  Tensor embed;          // [V, h]
  Tensor pos_embed;      // [max_positions + offset, h], learned positions only
  Tensor final_norm_w, final_norm_b;
  Tensor lm_head;        // [V, h]; a view of embed when tied
  Tensor inv_freq;       // F32 [head_dim / 2], RoPE only
  // GPT-OSS's attention sinks, F32 [layers, heads] (attn_sinks only): on the backend for its
  // attention, and on the host for attention delegated to the CPU.
  Tensor attn_sinks;
  std::vector<float> attn_sinks_host;
  std::vector<LayerWeights> layers;
  Buffer rope_buffer;    // owns inv_freq
  Buffer sinks_buffer;   // owns attn_sinks
};

// Reads every tensor the config implies from `source`, checks shapes, converts to the backend's
// dtype and uploads. Missing, misshapen or unexpected extra tensors are errors naming them.
// `threads` host threads convert (0: all cores; GGUF block types dequantize at 1-3 G elements a
// second on one, bench_load).
ModelWeights load_model_weights(const ModelConfig& cfg, const WeightSource& source, Backend& backend, int threads = 0);

// The byte layout of one block of tensors (a layer, or the globals) as stored in a Buffer, in
// pinned memory or on disk: each tensor 256-byte aligned, in weight_specs order, except that a
// layer's k and v rows follow its q rows, and up's rows follow gate's, with no gap (one matrix). All layers of a
// model share one layout, so a layer can move between tiers as one contiguous copy.
//
// A compressed layer block keeps its projection matrices (q, k, v, o, fc1/gate, up, fc2/down) as
// group-wise quantized rows (groups along `in`, quant.h) and its norms and biases, a few KB, in
// `dtype`: the matrices are >99.9% of a layer's bytes, and the small tensors are read in place
// by every op.
struct BlockLayout {
  std::vector<WeightSpec> specs;
  std::vector<size_t> offsets;
  std::vector<DType> dtypes;  // per spec: `dtype`, or Q4/Q8 for a compressed matrix
  size_t bytes = 0;
  DType dtype = DType::F32;
  std::optional<quant::QuantSpec> compression;  // of the quantized specs
};
BlockLayout layer_block_layout(const ModelConfig& cfg, int layer, DType dtype,
                               const std::optional<quant::QuantSpec>& compression = std::nullopt);
BlockLayout global_block_layout(const ModelConfig& cfg, DType dtype);
// Whether a layer tensor is one of the projection matrices a compressed layer quantizes.
bool is_projection(WeightRole role);

// A layer's block as the offloading engine streams it, half by half: the attention tensors from
// 0, the MLP tensors from `mlp_offset` (rounded up to `align`, the disk's page), so either half
// moves alone as one aligned range.
struct HalvedLayout {
  BlockLayout layout;
  size_t mlp_offset = 0;
  size_t attn_bytes = 0, mlp_bytes = 0;  // each rounded up to `align`; layout.bytes is their sum
};
HalvedLayout halved_layer_layout(const ModelConfig& cfg, int layer, DType dtype, size_t align,
                                 const std::optional<quant::QuantSpec>& compression = std::nullopt);
// One half's own layout (0 attention, 1 MLP): its tensors, offsets from the half's start, so a
// buffer holding just that half gets views with layer_views().
BlockLayout half_block_layout(const HalvedLayout& halves, int half);

// How a block's compressed matrices were made: from the codes the file stores them with
// (WeightSource::read_codes), or quantized at load by the host reference.
struct CodesTally {
  int kept_codes = 0;
  int quantized = 0;
};
// Reads a block's tensors from `source` into host memory laid out as `layout` (shape-checked,
// converted to layout.dtype; a compressed matrix keeps the file's codes where they fit, else it
// is quantized by the host reference); records the stored names it used in `used`, and counts
// the compressed matrices in `tally`. The source's conversions and a matrix quantized here have
// their rows spread over `pool` (one core quantizes about 0.55 G elements/s and dequantizes GGUF
// K-quants at 1-3 G, slower than a fast disk delivers them), else the calling thread does them all.
void read_block(const BlockLayout& layout, const WeightSource& source, void* host_dst, std::set<std::string>& used,
                CodesTally* tally = nullptr, ThreadPool* pool = nullptr);
// Views of a layer block at `base` on `device`; no copy.
LayerWeights layer_views(const BlockLayout& layout, void* base, Device device);
// Views of `w` whose quantized matrices are dequantized into `base`, laid out as `fp_layout`
// (the same tensors uncompressed: a half_block_layout or layer layout without compression); its
// other tensors stay views of w. Enqueued on `backend`'s compute stream.
LayerWeights dequantized_views(const LayerWeights& w, const BlockLayout& fp_layout, void* base, Backend& backend);
// The view of `spec`'s tensor in a layer's weights (grown to hold an expert it names).
Tensor& layer_tensor(LayerWeights& w, const WeightSpec& spec);
const Tensor& layer_tensor(const LayerWeights& w, const WeightSpec& spec);
// Sets the global views of `mw` (embeddings, norms, head) on a globals block at `base`.
void set_global_views(const ModelConfig& cfg, const BlockLayout& layout, void* base, Device device, ModelWeights& mw);
// The attention sinks of every layer (attention_sink_specs), F32 [layers, heads], shape-checked,
// their names recorded in `used`; empty without attn_sinks.
std::vector<float> read_attention_sinks(const ModelConfig& cfg, const WeightSource& source, std::set<std::string>& used);
// Fails naming the first tensor of `source` that no block used (and that is not ignorable).
void check_no_extra_tensors(const ModelConfig& cfg, const WeightSource& source, const std::set<std::string>& used);

}  // namespace strata
