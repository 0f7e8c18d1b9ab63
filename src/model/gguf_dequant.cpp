// Dequantization of ggml block types to float. Block layouts follow ggml's (ggml-common.h);
// each decoder is written from the layout, and tests compare against the python gguf package.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/model/gguf.h"

namespace strata {

namespace {

constexpr int64_t QK = 32;    // block size of the legacy types
constexpr int64_t QK_K = 256; // block size of the k-quants

inline float ld_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// The affine types: every 32 elements share a scale and a minimum, value = code * scale + min,
// so a tensor of them can keep its codes as Strata's own quantized rows (quant.h). A decoder
// writes one block's codes and its sub-blocks' parameters; ggml's (q - 8) * d is q * d + (-8 * d)
// here, and both are exact in fp32 (q * d has at most 15 significant bits), so dequantizing
// through the codes gives ggml's floats bit for bit.
struct AffineBlock {
  uint8_t codes[QK_K];
  float scales[QK_K / QK], mins[QK_K / QK];
};

// Q4_0: {f16 d; u8 qs[16]}; element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of
// qs[j-16]; value (q - 8) * d.
void codes_q4_0(const uint8_t* b, AffineBlock& a) {
  const float d = ld_half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    a.codes[j] = qs[j] & 0xF;
    a.codes[j + 16] = qs[j] >> 4;
  }
  a.scales[0] = d;
  a.mins[0] = -8.0f * d;
}

// Q4_1: {f16 d; f16 m; u8 qs[16]}; value q * d + m.
void codes_q4_1(const uint8_t* b, AffineBlock& a) {
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    a.codes[j] = qs[j] & 0xF;
    a.codes[j + 16] = qs[j] >> 4;
  }
  a.scales[0] = ld_half(b);
  a.mins[0] = ld_half(b + 2);
}

// The 5-bit codes of Q5_0 and Q5_1: bit j of qh is the fifth bit of element j.
void five_bit_codes(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* codes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    codes[j] = uint8_t((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
    codes[j + 16] = uint8_t((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

// Q5_0: {f16 d; u32 qh; u8 qs[16]}; value (q - 16) * d.
void codes_q5_0(const uint8_t* b, AffineBlock& a) {
  const float d = ld_half(b);
  five_bit_codes(b + 2, b + 6, a.codes);
  a.scales[0] = d;
  a.mins[0] = -16.0f * d;
}

// Q5_1: {f16 d; f16 m; u32 qh; u8 qs[16]}; value q * d + m.
void codes_q5_1(const uint8_t* b, AffineBlock& a) {
  five_bit_codes(b + 4, b + 8, a.codes);
  a.scales[0] = ld_half(b);
  a.mins[0] = ld_half(b + 2);
}

// Q8_0: {f16 d; i8 qs[32]}; value q * d, so code q + 128 with minimum -128 * d.
void codes_q8_0(const uint8_t* b, AffineBlock& a) {
  const float d = ld_half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) a.codes[j] = uint8_t(int(qs[j]) + 128);
  a.scales[0] = d;
  a.mins[0] = -128.0f * d;
}

// MXFP4 (GPT-OSS's experts): {u8 e; u8 qs[16]}, element j < 16 the low nibble of qs[j], j >= 16 the
// high nibble of qs[j-16]; value kvalues[q] * 2^(e - 128), ggml's e2m1 table doubled (0, 1, 2, 3, 4,
// 6, 8, 12, then the same negated) against a halved E8M0 scale. As codes: kvalues[q] + 12 (0 .. 24)
// with minimum -12 * 2^(e - 128), exact in fp32 up to e = 251 (past it the values leave fp32's range
// in ggml's arithmetic too).
void codes_mxfp4(const uint8_t* b, AffineBlock& a) {
  static constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const float d = std::ldexp(1.0f, int(b[0]) - 128);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < 16; ++j) {
    a.codes[j] = uint8_t(kValues[qs[j] & 0xF] + 12);
    a.codes[j + 16] = uint8_t(kValues[qs[j] >> 4] + 12);
  }
  a.scales[0] = d;
  a.mins[0] = -12.0f * d;
}

// Q2_K: {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}. Element e = h*128 + s*32 + l takes bits 2s..2s+1
// of qs[h*32 + l]; sub-block e/16 has scale (low nibble) * d and min (high nibble) * dmin.
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  float d = ld_half(b + 80), dmin = ld_half(b + 82);
  // In runs of 16 elements (one scale and min, a fixed shift) that the compiler vectorizes.
  for (int e0 = 0; e0 < QK_K; e0 += 16) {
    const int h = e0 / 128, s = (e0 % 128) / 32, l0 = e0 % 32;
    const uint8_t k = sc[e0 / 16];
    const float dl = d * float(k & 0xF), ml = dmin * float(k >> 4);
    for (int l = 0; l < 16; ++l) y[e0 + l] = dl * float((qs[h * 32 + l0 + l] >> (2 * s)) & 3) - ml;
  }
}

// Q3_K: {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}. Low two bits as in Q2_K; bit j = e/32 of
// hmask[e%32] set means no offset, clear means subtract 4. Sixteen 6-bit scales, biased by 32:
// low nibble from scales[i%8] (shift 4*(i/8)), high two bits from scales[8 + i%4] (shift 2*(i/4)).
void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  float d = ld_half(b + 108);
  // In runs of 16 elements (one scale, fixed shifts) that the compiler vectorizes.
  for (int e0 = 0; e0 < QK_K; e0 += 16) {
    const int h = e0 / 128, s = (e0 % 128) / 32, l0 = e0 % 32, bit = e0 / 32, i = e0 / 16;
    const int scale = ((sc[i % 8] >> (4 * (i / 8))) & 0xF) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
    const float ds = d * float(scale - 32);
    for (int l = 0; l < 16; ++l) {
      int q = (qs[h * 32 + l0 + l] >> (2 * s)) & 3;
      if (!((hm[l0 + l] >> bit) & 1)) q -= 4;
      y[e0 + l] = ds * float(q);
    }
  }
}

// Six-bit scale and min j (0..7) packed in 12 bytes, shared by Q4_K and Q5_K.
inline void k4_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The eight sub-block scales d*sc_j and minimums -dmin*m_j of Q4_K and Q5_K.
void k_scales_mins(const uint8_t* b, AffineBlock& a) {
  const float d = ld_half(b), dmin = ld_half(b + 2);
  for (int j = 0; j < 8; ++j) {
    int s, m;
    k4_scale_min(b + 4, j, s, m);
    a.scales[j] = d * float(s);
    a.mins[j] = -(dmin * float(m));
  }
}

// Q4_K: {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}. Sub-block j (32 elements) takes nibble j%2 of
// qs[(j/2)*32 + l]; value d*sc_j*q - dmin*m_j.
void codes_q4_k(const uint8_t* b, AffineBlock& a) {
  k_scales_mins(b, a);
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) a.codes[j * 32 + l] = uint8_t((qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF);
}

// Q5_K: {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}; as Q4_K with bit j of qh[l] as the
// fifth bit of element j*32 + l.
void codes_q5_k(const uint8_t* b, AffineBlock& a) {
  k_scales_mins(b, a);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l)
      a.codes[j * 32 + l] = uint8_t(((qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF) | (((qh[l] >> j) & 1) << 4));
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}. Element e = h*128 + r: low nibble r/64 of
// ql[h*64 + r%64], high two bits (shift 2*(r/32)) of qh[h*32 + r%32]; value d*scales[e/16]*(q-32).
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = ld_half(b + 208);
  // In runs of 16 elements (one scale, fixed shifts) that the compiler vectorizes.
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 4; ++q)  // r / 32
      for (int half = 0; half < 2; ++half) {
        const int r0 = q * 32 + half * 16, e0 = h * 128 + r0;
        const uint8_t* lo_bytes = ql + h * 64 + r0 % 64;
        const uint8_t* hi_bytes = qh + h * 32 + half * 16;
        const float ds = d * float(sc[e0 / 16]);
        for (int l = 0; l < 16; ++l) {
          const int lo = (lo_bytes[l] >> (4 * (q / 2))) & 0xF;
          const int hi = (hi_bytes[l] >> (2 * q)) & 3;
          y[e0 + l] = ds * float((lo | (hi << 4)) - 32);
        }
      }
}

using BlockFn = void (*)(const uint8_t*, float*);
using AffineFn = void (*)(const uint8_t*, AffineBlock&);

struct Entry {
  uint32_t id;
  GgmlTypeInfo info;
  BlockFn fn = nullptr;          // the other decodable types
  AffineFn affine = nullptr;     // the affine types
  int code_bits = 0;             // of an affine type's codes
};

// Sizes from ggml's type traits; names as ggml_type_name prints them. A type with neither
// decoder has its geometry known (so files parse) but cannot be read.
const Entry kTypes[] = {
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", QK, 18, true}, nullptr, codes_q4_0, 4},
    {3, {"q4_1", QK, 20, true}, nullptr, codes_q4_1, 4},
    {6, {"q5_0", QK, 22, true}, nullptr, codes_q5_0, 5},
    {7, {"q5_1", QK, 24, true}, nullptr, codes_q5_1, 5},
    {8, {"q8_0", QK, 34, true}, nullptr, codes_q8_0, 8},
    {9, {"q8_1", QK, 36, false}},
    {10, {"q2_K", QK_K, 84, true}, deq_q2_k},
    {11, {"q3_K", QK_K, 110, true}, deq_q3_k},
    {12, {"q4_K", QK_K, 144, true}, nullptr, codes_q4_k, 4},
    {13, {"q5_K", QK_K, 176, true}, nullptr, codes_q5_k, 5},
    {14, {"q6_K", QK_K, 210, true}, deq_q6_k},
    {15, {"q8_K", QK_K, 292, false}},
    {16, {"iq2_xxs", QK_K, 66, false}},
    {17, {"iq2_xs", QK_K, 74, false}},
    {18, {"iq3_xxs", QK_K, 98, false}},
    {19, {"iq1_s", QK_K, 50, false}},
    {20, {"iq4_nl", QK, 18, false}},
    {21, {"iq3_s", QK_K, 110, false}},
    {22, {"iq2_s", QK_K, 82, false}},
    {23, {"iq4_xs", QK_K, 136, false}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {29, {"iq1_m", QK_K, 56, false}},
    {30, {"bf16", 1, 2, true}},
    {34, {"tq1_0", QK_K, 54, false}},
    {35, {"tq2_0", QK_K, 66, false}},
    {39, {"mxfp4", QK, 17, true}, nullptr, codes_mxfp4, 5},
};

const Entry* find_entry(uint32_t id) {
  for (const Entry& e : kTypes)
    if (e.id == id) return &e;
  return nullptr;
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  const Entry* e = find_entry(type);
  return e ? &e->info : nullptr;
}

void ggml_dequantize(GgmlType type, const void* src, float* dst, int64_t n) {
  const Entry* e = find_entry(uint32_t(type));
  if (!e || !e->info.dequantizable)
    STRATA_FAIL("cannot dequantize ggml type " << (e ? e->info.name : "?") << " (id " << uint32_t(type) << ")");
  STRATA_CHECK(n % e->info.block_size == 0, n << " elements is not a whole number of " << e->info.name << " blocks");
  if (n == 0) return;  // zero-element tensors: dst may be null (the fuzzer found memcpy(nullptr, .., 0))
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, p, size_t(n) * 4); return;
    case GgmlType::F16:
    case GgmlType::BF16:
      if (reinterpret_cast<uintptr_t>(p) % 2 == 0) {  // vectorized where the halves are aligned
        convert_elements(p, type == GgmlType::F16 ? DType::F16 : DType::BF16, dst, DType::F32, size_t(n));
        return;
      }
      if (type == GgmlType::F16) {
        for (int64_t k = 0; k < n; ++k) dst[k] = ld_half(p + 2 * k);
        return;
      }
      for (int64_t k = 0; k < n; ++k) {
        uint16_t b;
        std::memcpy(&b, p + 2 * k, 2);
        dst[k] = bf16_to_float(b);
      }
      return;
    default: break;
  }
  const int64_t bs = e->info.block_size, ts = e->info.type_size;
  if (e->fn) {
    for (int64_t blk = 0; blk < n / bs; ++blk) e->fn(p + blk * ts, dst + blk * bs);
    return;
  }
  AffineBlock a;
  for (int64_t blk = 0; blk < n / bs; ++blk) {
    e->affine(p + blk * ts, a);
    float* y = dst + blk * bs;
    for (int64_t g = 0; g < bs / QK; ++g) {  // a group's scale and minimum, hoisted
      const float scale = a.scales[g], min = a.mins[g];
      for (int64_t i = g * QK; i < (g + 1) * QK; ++i) y[i] = float(a.codes[i]) * scale + min;
    }
  }
}

int ggml_affine_code_bits(GgmlType type) {
  const Entry* e = find_entry(uint32_t(type));
  return e && e->affine ? e->code_bits : 0;
}

void ggml_affine_decode(GgmlType type, const void* src, int64_t n, uint8_t* codes, float* scales, float* mins) {
  const Entry* e = find_entry(uint32_t(type));
  STRATA_CHECK(e && e->affine, "internal: ggml type " << (e ? e->info.name : "?") << " is not affine");
  STRATA_CHECK(n % e->info.block_size == 0, n << " elements is not a whole number of " << e->info.name << " blocks");
  const int64_t bs = e->info.block_size, ts = e->info.type_size, groups = bs / QK;
  const uint8_t* p = static_cast<const uint8_t*>(src);
  AffineBlock a;
  for (int64_t blk = 0; blk < n / bs; ++blk) {
    e->affine(p + blk * ts, a);
    std::memcpy(codes + blk * bs, a.codes, size_t(bs));
    std::memcpy(scales + blk * groups, a.scales, size_t(groups) * sizeof(float));
    std::memcpy(mins + blk * groups, a.mins, size_t(groups) * sizeof(float));
  }
}

}  // namespace strata
