// Dequantization of ggml block types to float. Block layouts follow ggml's (ggml-common.h);
// each decoder is written from the layout, and tests compare against the python gguf package.
#include <cstring>

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

// Q4_0: {f16 d; u8 qs[16]}; element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of
// qs[j-16]; value (q - 8) * d.
void deq_q4_0(const uint8_t* b, float* y) {
  float d = ld_half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(int(qs[j] & 0xF) - 8) * d;
    y[j + 16] = float(int(qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: {f16 d; f16 m; u8 qs[16]}; value q * d + m.
void deq_q4_1(const uint8_t* b, float* y) {
  float d = ld_half(b), m = ld_half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 0xF) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

// Q5_0: {f16 d; u32 qh; u8 qs[16]}; bit j of qh is the fifth bit of element j; value (q - 16) * d.
void deq_q5_0(const uint8_t* b, float* y) {
  float d = ld_half(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    int lo = int(qs[j] & 0xF) | int(((qh >> j) & 1) << 4);
    int hi = int(qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
    y[j] = float(lo - 16) * d;
    y[j + 16] = float(hi - 16) * d;
  }
}

// Q5_1: {f16 d; f16 m; u32 qh; u8 qs[16]}; value q * d + m.
void deq_q5_1(const uint8_t* b, float* y) {
  float d = ld_half(b), m = ld_half(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    int lo = int(qs[j] & 0xF) | int(((qh >> j) & 1) << 4);
    int hi = int(qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
    y[j] = float(lo) * d + m;
    y[j + 16] = float(hi) * d + m;
  }
}

// Q8_0: {f16 d; i8 qs[32]}; value q * d.
void deq_q8_0(const uint8_t* b, float* y) {
  float d = ld_half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = float(qs[j]) * d;
}

// Q2_K: {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}. Element e = h*128 + s*32 + l takes bits 2s..2s+1
// of qs[h*32 + l]; sub-block e/16 has scale (low nibble) * d and min (high nibble) * dmin.
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  float d = ld_half(b + 80), dmin = ld_half(b + 82);
  for (int e = 0; e < QK_K; ++e) {
    int h = e / 128, s = (e % 128) / 32, l = e % 32;
    int q = (qs[h * 32 + l] >> (2 * s)) & 3;
    uint8_t k = sc[e / 16];
    y[e] = d * float(k & 0xF) * float(q) - dmin * float(k >> 4);
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
  for (int e = 0; e < QK_K; ++e) {
    int h = e / 128, s = (e % 128) / 32, l = e % 32;
    int q = (qs[h * 32 + l] >> (2 * s)) & 3;
    if (!((hm[l] >> (e / 32)) & 1)) q -= 4;
    int i = e / 16;
    int scale = ((sc[i % 8] >> (4 * (i / 8))) & 0xF) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
    y[e] = d * float(scale - 32) * float(q);
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

// Q4_K: {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}. Sub-block j (32 elements) takes nibble j%2 of
// qs[(j/2)*32 + l]; value d*sc_j*q - dmin*m_j.
void deq_q4_k(const uint8_t* b, float* y) {
  float d = ld_half(b), dmin = ld_half(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int s, m;
    k4_scale_min(sc, j, s, m);
    float dl = d * float(s), ml = dmin * float(m);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF;
      y[j * 32 + l] = dl * float(q) - ml;
    }
  }
}

// Q5_K: {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}; as Q4_K with bit j of qh[l] as the
// fifth bit of element j*32 + l.
void deq_q5_k(const uint8_t* b, float* y) {
  float d = ld_half(b), dmin = ld_half(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int s, m;
    k4_scale_min(sc, j, s, m);
    float dl = d * float(s), ml = dmin * float(m);
    for (int l = 0; l < 32; ++l) {
      int q = ((qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF) | (((qh[l] >> j) & 1) << 4);
      y[j * 32 + l] = dl * float(q) - ml;
    }
  }
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}. Element e = h*128 + r: low nibble r/64 of
// ql[h*64 + r%64], high two bits (shift 2*(r/32)) of qh[h*32 + r%32]; value d*scales[e/16]*(q-32).
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = ld_half(b + 208);
  for (int e = 0; e < QK_K; ++e) {
    int h = e / 128, r = e % 128;
    int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
    int hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
    y[e] = d * float(sc[e / 16]) * float((lo | (hi << 4)) - 32);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

struct Entry {
  uint32_t id;
  GgmlTypeInfo info;
  BlockFn fn;  // nullptr: geometry known (so files parse) but no decoder
};

// Sizes from ggml's type traits; names as ggml_type_name prints them.
const Entry kTypes[] = {
    {0, {"f32", 1, 4, true}, nullptr},
    {1, {"f16", 1, 2, true}, nullptr},
    {2, {"q4_0", QK, 18, true}, deq_q4_0},
    {3, {"q4_1", QK, 20, true}, deq_q4_1},
    {6, {"q5_0", QK, 22, true}, deq_q5_0},
    {7, {"q5_1", QK, 24, true}, deq_q5_1},
    {8, {"q8_0", QK, 34, true}, deq_q8_0},
    {9, {"q8_1", QK, 36, false}, nullptr},
    {10, {"q2_K", QK_K, 84, true}, deq_q2_k},
    {11, {"q3_K", QK_K, 110, true}, deq_q3_k},
    {12, {"q4_K", QK_K, 144, true}, deq_q4_k},
    {13, {"q5_K", QK_K, 176, true}, deq_q5_k},
    {14, {"q6_K", QK_K, 210, true}, deq_q6_k},
    {15, {"q8_K", QK_K, 292, false}, nullptr},
    {16, {"iq2_xxs", QK_K, 66, false}, nullptr},
    {17, {"iq2_xs", QK_K, 74, false}, nullptr},
    {18, {"iq3_xxs", QK_K, 98, false}, nullptr},
    {19, {"iq1_s", QK_K, 50, false}, nullptr},
    {20, {"iq4_nl", QK, 18, false}, nullptr},
    {21, {"iq3_s", QK_K, 110, false}, nullptr},
    {22, {"iq2_s", QK_K, 82, false}, nullptr},
    {23, {"iq4_xs", QK_K, 136, false}, nullptr},
    {24, {"i8", 1, 1, false}, nullptr},
    {25, {"i16", 1, 2, false}, nullptr},
    {26, {"i32", 1, 4, false}, nullptr},
    {27, {"i64", 1, 8, false}, nullptr},
    {28, {"f64", 1, 8, false}, nullptr},
    {29, {"iq1_m", QK_K, 56, false}, nullptr},
    {30, {"bf16", 1, 2, true}, nullptr},
    {34, {"tq1_0", QK_K, 54, false}, nullptr},
    {35, {"tq2_0", QK_K, 66, false}, nullptr},
    {39, {"mxfp4", QK, 17, false}, nullptr},
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
      for (int64_t k = 0; k < n; ++k) dst[k] = ld_half(p + 2 * k);
      return;
    case GgmlType::BF16:
      for (int64_t k = 0; k < n; ++k) {
        uint16_t b;
        std::memcpy(&b, p + 2 * k, 2);
        dst[k] = bf16_to_float(b);
      }
      return;
    default: break;
  }
  const int64_t bs = e->info.block_size, ts = e->info.type_size;
  for (int64_t blk = 0; blk < n / bs; ++blk) e->fn(p + blk * ts, dst + blk * bs);
}

}  // namespace strata
