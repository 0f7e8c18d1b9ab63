// A model's weights resident on one backend. Each layer is one Buffer (the unit that will move
// between tiers) with named views into it; the embeddings, final norm and head form one more.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "strata/backend/backend.h"
#include "strata/model/config.h"
#include "strata/model/weight_source.h"
#include "strata/model/weight_specs.h"

namespace strata {

struct LayerWeights {
  Buffer block;
  Tensor attn_norm_w, attn_norm_b;   // [h]
  Tensor q_w, q_b, k_w, k_b, v_w, v_b;  // [q_dim | kv_dim, h], [q_dim | kv_dim]
  Tensor o_w, o_b;                   // [h, q_dim], [h]
  Tensor mlp_norm_w, mlp_norm_b;     // [h]
  Tensor fc1_w, fc1_b, up_w;         // [f, h] (fc1 = gate_proj for SwiGLU), [f]
  Tensor fc2_w, fc2_b;               // [h, f], [h]
};

struct ModelWeights {
  Buffer globals;
  Tensor embed;          // [V, h]
  Tensor pos_embed;      // [max_positions + offset, h], learned positions only
  Tensor final_norm_w, final_norm_b;
  Tensor lm_head;        // [V, h]; a view of embed when tied
  Tensor inv_freq;       // F32 [head_dim / 2], RoPE only
  std::vector<LayerWeights> layers;
  Buffer rope_buffer;    // owns inv_freq
};

// Reads every tensor the config implies from `source`, checks shapes, converts to the backend's
// dtype and uploads. Missing, misshapen or unexpected extra tensors are errors naming them.
ModelWeights load_model_weights(const ModelConfig& cfg, const WeightSource& source, Backend& backend);

// The byte layout of one block of tensors (a layer, or the globals) as stored in a Buffer, in
// pinned memory or on disk: each tensor 256-byte aligned, in weight_specs order. All layers of a
// model share one layout, so a layer can move between tiers as one contiguous copy.
struct BlockLayout {
  std::vector<WeightSpec> specs;
  std::vector<size_t> offsets;
  size_t bytes = 0;
  DType dtype = DType::F32;
};
BlockLayout layer_block_layout(const ModelConfig& cfg, int layer, DType dtype);
BlockLayout global_block_layout(const ModelConfig& cfg, DType dtype);

// A layer's block as the offloading engine streams it, half by half: the attention tensors from
// 0, the MLP tensors from `mlp_offset` (rounded up to `align`, the disk's page), so either half
// moves alone as one aligned range.
struct HalvedLayout {
  BlockLayout layout;
  size_t mlp_offset = 0;
  size_t attn_bytes = 0, mlp_bytes = 0;  // each rounded up to `align`; layout.bytes is their sum
};
HalvedLayout halved_layer_layout(const ModelConfig& cfg, int layer, DType dtype, size_t align);
// One half's own layout (0 attention, 1 MLP): its tensors, offsets from the half's start, so a
// buffer holding just that half gets views with layer_views().
BlockLayout half_block_layout(const HalvedLayout& halves, int half);

// Reads a block's tensors from `source` into host memory laid out as `layout` (shape-checked,
// converted to layout.dtype); records the stored names it used in `used`.
void read_block(const BlockLayout& layout, const WeightSource& source, void* host_dst, std::set<std::string>& used);
// Views of a layer block at `base` on `device`; no copy.
LayerWeights layer_views(const BlockLayout& layout, void* base, Device device);
// Sets the global views of `mw` (embeddings, norms, head) on a globals block at `base`.
void set_global_views(const ModelConfig& cfg, const BlockLayout& layout, void* base, Device device, ModelWeights& mw);
// Fails naming the first tensor of `source` that no block used (and that is not ignorable).
void check_no_extra_tensors(const ModelConfig& cfg, const WeightSource& source, const std::set<std::string>& used);

}  // namespace strata
