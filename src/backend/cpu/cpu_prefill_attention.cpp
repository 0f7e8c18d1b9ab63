#include "cpu_prefill_attention.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/quant/quant.h"
#include "cpu_quant.h"
#include "cpu_simd.h"

namespace strata::cpu {
namespace {

// A work item is one kv head of a run's next few tokens: all of their query rows (the tokens'
// query heads of that kv head) attend together. Keys come in tiles of kKeys: the tile's key rows
// are widened to fp32 and transposed once ([d, kKeys]), its value rows widened ([kKeys, d]), and
// every query row of the item reads them from L1. About kItemRows query rows per item amortize
// the widening; more would add little and cut the parallelism of short prefills.
constexpr int64_t kKeys = 64, kItemRows = 64;

int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

// One cache's stored rows, read as fp32.
struct CacheRows {
  const uint8_t* base;
  DType dtype;
  quant::QuantSpec spec;
  size_t row_bytes;
  int64_t C, kv_heads, d;

  explicit CacheRows(const Tensor& cache)
      : base(cache.ptr<uint8_t>()), dtype(cache.dtype), C(cache.dim(1)), kv_heads(cache.dim(2)), d(cache.dim(3)) {
    if (cache.quantized()) {
      spec = quant::spec_of(cache);
      row_bytes = quant::row_bytes(spec, d);
    } else {
      row_bytes = size_t(d) * dtype_size(dtype);
    }
  }
  // Row (slot, position, head) as d floats: the reference's dequantization for quantized rows.
  void widen(int32_t slot, int64_t position, int64_t head, float* dst) const {
    const uint8_t* row = base + ((size_t(slot) * size_t(C) + size_t(position)) * size_t(kv_heads) + size_t(head)) * row_bytes;
    if (is_quantized(dtype)) dequantize_row_f32(row, spec.bits, spec.group_size, d, dst);
    else to_f32(row, dtype, dst, d);
  }
};

// c[r][0, cols) (+)= sum_{i < k} a[r][i] * b[i][0, cols) for R rows (b: k rows `b_stride` apart,
// cols a multiple of 8): the scores (a = queries, b = the transposed keys, [d, kKeys]) and the
// weighted values (a = the softmax weights, b = the values, [kKeys, dp]). Vectors run along b's
// rows, so there are no horizontal sums; blocks of R rows x 32 columns keep 4R accumulators in
// registers and load each vector of b once for all R rows.
template <int R>
void multiply_rows(const float* const* a, const float* b, int64_t b_stride, int64_t k, int64_t cols, bool accumulate,
                   float* const* c) {
#if defined(__AVX2__) && defined(__FMA__)
  auto block = [&](auto width, int64_t c0) {
    constexpr int W = decltype(width)::value;
    __m256 acc[R][W];
    for (int r = 0; r < R; ++r)
      for (int w = 0; w < W; ++w) acc[r][w] = accumulate ? _mm256_loadu_ps(c[r] + c0 + 8 * w) : _mm256_setzero_ps();
    for (int64_t i = 0; i < k; ++i) {
      __m256 bi[W];
      for (int w = 0; w < W; ++w) bi[w] = _mm256_loadu_ps(b + i * b_stride + c0 + 8 * w);
      for (int r = 0; r < R; ++r) {
        const __m256 ai = _mm256_broadcast_ss(a[r] + i);
        for (int w = 0; w < W; ++w) acc[r][w] = _mm256_fmadd_ps(ai, bi[w], acc[r][w]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int w = 0; w < W; ++w) _mm256_storeu_ps(c[r] + c0 + 8 * w, acc[r][w]);
  };
  int64_t c0 = 0;
  for (; c0 + 32 <= cols; c0 += 32) block(std::integral_constant<int, 4>(), c0);
  for (; c0 < cols; c0 += 8) block(std::integral_constant<int, 1>(), c0);
#else
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float acc = accumulate ? c[r][j] : 0.0f;
      for (int64_t i = 0; i < k; ++i) acc = std::fma(a[r][i], b[i * b_stride + j], acc);
      c[r][j] = acc;
    }
#endif
}

struct Item {
  int64_t first_token, tokens, kv_head;
  int32_t slot, first_position;
  int64_t cost() const { return tokens * (int64_t(first_position) + tokens); }
};

}  // namespace

std::vector<QueryRun> query_runs(const int32_t* slots, const int32_t* positions, int64_t tokens) {
  std::vector<QueryRun> runs;
  for (int64_t t = 0; t < tokens; ++t) {
    if (!runs.empty()) {
      QueryRun& last = runs.back();
      if (slots[t] == last.slot && int64_t(positions[t]) == int64_t(last.first_position) + last.tokens) {
        ++last.tokens;
        continue;
      }
    }
    runs.push_back({t, 1, slots[t], positions[t]});
  }
  return runs;
}

bool has_prefill_run(const std::vector<QueryRun>& runs) {
  return std::any_of(runs.begin(), runs.end(), [](const QueryRun& r) { return r.tokens > 1; });
}

void attend_runs(ThreadPool& pool, const Tensor& q, const Tensor& cache_k, const Tensor& cache_v,
                 const std::vector<QueryRun>& runs, const AttentionSpec& spec, const Tensor& out) {
  const CacheRows keys(cache_k), values(cache_v);
  const int64_t heads = q.dim(1), d = q.dim(2), S = cache_k.dim(0), C = keys.C, kv_heads = keys.kv_heads;
  const int64_t group = heads / kv_heads, dp = round_up8(d);
  const int64_t item_tokens = std::max<int64_t>(1, kItemRows / group);
  std::vector<Item> items;
  for (const QueryRun& run : runs) {
    STRATA_CHECK(run.slot >= 0 && run.slot < S && run.first_position >= 0 && run.first_position + run.tokens <= C,
                 "attention: slot " << run.slot << " positions " << run.first_position << ".."
                                    << run.first_position + run.tokens - 1 << " outside cache " << cache_k.shape_str());
    for (int64_t t0 = 0; t0 < run.tokens; t0 += item_tokens)
      for (int64_t h = 0; h < kv_heads; ++h)
        items.push_back({run.first_token + t0, std::min(item_tokens, run.tokens - t0), h, run.slot,
                         int32_t(run.first_position + t0)});
  }
  // The costliest items first, so the pool's last chunks are short and the threads finish together.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost() > b.cost(); });
  // q and out as bytes: rows of F32, F16 or BF16.
  const char* q_bytes = q.ptr<char>();
  char* out_bytes = out.ptr<char>();
  const size_t es = dtype_size(q.dtype);

  pool.parallel_for(int64_t(items.size()), [&](int64_t i0, int64_t i1) {
    const int64_t max_rows = item_tokens * group;
    auto floats = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
    std::vector<float> qs = floats(max_rows * d), o = floats(max_rows * dp), sc = floats(max_rows * kKeys),
                       m = floats(max_rows), l = floats(max_rows), kt = floats(d * kKeys), vt = floats(kKeys * dp),
                       row = floats(d);
    for (int64_t it = i0; it < i1; ++it) {
      const Item& item = items[size_t(it)];
      const int64_t rows = item.tokens * group, p0 = item.first_position, p_last = p0 + item.tokens - 1;
      // The item's query rows: for each token, the group query heads of its kv head, adjacent in q.
      for (int64_t t = 0; t < item.tokens; ++t) {
        const int64_t at = ((item.first_token + t) * heads + item.kv_head * group) * d;
        to_f32(q_bytes + size_t(at) * es, q.dtype, qs.data() + t * group * d, group * d);
      }
      std::fill(o.begin(), o.begin() + rows * dp, 0.0f);
      std::fill(m.begin(), m.begin() + rows, -INFINITY);
      std::fill(l.begin(), l.begin() + rows, 0.0f);
      // Keys from the first that the item's first token sees (a sliding window starts later).
      for (int64_t start = spec.first_key(int(p0)); start <= p_last; start += kKeys) {
        const int64_t n = std::min(kKeys, p_last + 1 - start);
        for (int64_t j = 0; j < n; ++j) {
          keys.widen(item.slot, start + j, item.kv_head, row.data());
          for (int64_t i = 0; i < d; ++i) kt[size_t(i * kKeys + j)] = row[size_t(i)];
          values.widen(item.slot, start + j, item.kv_head, vt.data() + j * dp);
        }
        // Rows before start see none of this tile's keys; they are the first rows of the item.
        const int64_t r0 = std::max<int64_t>(0, start - p0) * group;
        // multiply_rows over rows [r0, rows) of a (stride a_stride) into c (stride c_stride), two at a time.
        auto multiply_item_rows = [&](const std::vector<float>& a, int64_t a_stride, const float* b, int64_t b_stride,
                                      int64_t k, int64_t cols, bool accumulate, std::vector<float>& c, int64_t c_stride) {
          for (int64_t r = r0; r < rows; r += 2) {
            const float* ar[2] = {a.data() + r * a_stride, a.data() + (r + 1) * a_stride};
            float* cr[2] = {c.data() + r * c_stride, c.data() + (r + 1) * c_stride};
            if (r + 1 < rows) multiply_rows<2>(ar, b, b_stride, k, cols, accumulate, cr);
            else multiply_rows<1>(ar, b, b_stride, k, cols, accumulate, cr);
          }
        };
        multiply_item_rows(qs, d, kt.data(), kKeys, d, round_up8(n), false, sc, kKeys);
        for (int64_t r = r0; r < rows; ++r) {  // online softmax over the keys [first, seen) row r may see
          float* s = sc.data() + r * kKeys;
          const int64_t position = p0 + r / group;
          const int64_t seen = std::min(n, position + 1 - start);
          const int64_t first = std::clamp<int64_t>(spec.first_key(int(position)) - start, 0, seen);
          std::fill(s, s + first, 0.0f);  // keys behind the window weigh nothing
          std::fill(s + seen, s + n, 0.0f);  // nor do keys after the token
          if (first == seen) continue;  // the whole tile is behind this token's window
          for (int64_t j = first; j < seen; ++j) s[j] = spec.cap(s[j] * spec.scale);
          const float mx = std::max(m[size_t(r)], *std::max_element(s + first, s + seen));
          const float alpha = std::exp(m[size_t(r)] - mx);  // 0 on the first tile
          l[size_t(r)] = l[size_t(r)] * alpha + exp_shifted_sum(s + first, seen - first, mx);
          m[size_t(r)] = mx;
          if (alpha != 1.0f)
            for (float* x = o.data() + r * dp; x != o.data() + (r + 1) * dp; ++x) *x *= alpha;
        }
        multiply_item_rows(sc, kKeys, vt.data(), dp, n, dp, true, o, dp);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float* sink = spec.sinks ? spec.sinks + item.kv_head * group + r % group : nullptr;
        const float inv = softmax_normalizer(m[size_t(r)], l[size_t(r)], sink);
        float* x = o.data() + r * dp;
        for (int64_t i = 0; i < d; ++i) x[i] *= inv;
        const int64_t at = ((item.first_token + r / group) * heads + item.kv_head * group + r % group) * d;
        from_f32(x, out_bytes + size_t(at) * es, out.dtype, d);
      }
    }
  });
}

}  // namespace strata::cpu
