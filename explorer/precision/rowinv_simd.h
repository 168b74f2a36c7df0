// SIMD primitives of the row-invariant kernels (rowinv_core.h): a 16-lane float vector, weight loads that widen
// float32 / bfloat16 / int8 exactly, FMA, one fixed horizontal-sum tree, a fixed exp, and the int8 x 16-bit
// integer dot products. One path per instruction set, chosen at build time (kernels.py builds one per ISA):
//
//   ROWINV_PATH_AVX512  AVX-512 F/BW/VL (+ VNNI where present): one __m512 per vector
//   ROWINV_PATH_AVX2    AVX2 + FMA (x86-64-v3): two __m256 per vector
//   ROWINV_PATH_NEON    aarch64 NEON: four float32x4_t per vector
//   ROWINV_PATH_PORTABLE  plain C++: a 16-float array
//
// Every path computes the same thing in the same order: lane l of a vector holds elements l, l + 16, ...; an FMA
// is one rounding (std::fma in the portable path); the horizontal sum is the tree 16 -> 8 -> 4 -> 2 -> 1 over pairs
// (l, l + half); exp is the same range reduction and polynomial, scaled by an exact power of two. So every path
// gives the same bits, and each gives a row the same bits whatever the number of rows in the call. Integer dot
// products are exact, so their grouping is free per path.
#pragma once
// Inlining is stated, not left to GCC (whose choices change with -fopenmp): int8 tiles of several rows go inline
// into rows_a16, the one-row tile is a function of its own (rowinv_core.h); chosen by interleaved timings.
#if defined(__GNUC__)
#define ROWINV_INLINE __attribute__((always_inline)) inline
#else
#define ROWINV_INLINE inline
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if !defined(ROWINV_PATH_AVX512) && !defined(ROWINV_PATH_AVX2) && !defined(ROWINV_PATH_NEON) && \
    !defined(ROWINV_PATH_PORTABLE)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ROWINV_PATH_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define ROWINV_PATH_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define ROWINV_PATH_NEON 1
#else
#define ROWINV_PATH_PORTABLE 1
#endif
#endif

#if defined(ROWINV_PATH_AVX512)
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))
#error "ROWINV_PATH_AVX512 needs -mavx512f -mavx512bw -mavx512vl"
#endif
#include <immintrin.h>
#define ROWINV_PATH_NAME "avx512"
#elif defined(ROWINV_PATH_AVX2)
#if !(defined(__AVX2__) && defined(__FMA__))
#error "ROWINV_PATH_AVX2 needs -mavx2 -mfma"
#endif
#include <immintrin.h>
#define ROWINV_PATH_NAME "avx2"
#elif defined(ROWINV_PATH_NEON)
#if !(defined(__aarch64__) && defined(__ARM_NEON))
#error "ROWINV_PATH_NEON needs an aarch64 target"
#endif
#include <arm_neon.h>
#define ROWINV_PATH_NAME "neon"
#else
#define ROWINV_PATH_NAME "portable"
#endif

namespace {

constexpr int LANES = 16;
constexpr int NB = 4;  // weight rows per block
// activation rows per register tile (any value gives the same bits: each accumulator's sequence is its own)
#if defined(ROWINV_PATH_AVX512) || defined(ROWINV_PATH_PORTABLE)
constexpr int MB = 4;
#else
constexpr int MB = 2;
#endif
// the int8 kernel's odd row counts (3, 5, 7) start with a tile of 3 rows rather than paying a one-row tile at the end
#if defined(ROWINV_PATH_AVX2)
constexpr bool A16_TILE3 = true;
#else
constexpr bool A16_TILE3 = false;
#endif

// Constants of exp16 (shared by every path): x = n ln2 + r, |r| <= ln2 / 2, ln2 split in two (an exact first product),
// a degree-6 Taylor polynomial in r (relative error < 2e-7), times 2^n built exactly. Inputs below -87 give 0.
constexpr float EXP_LO = -87.0f, EXP_HI = 88.0f, LOG2E = 1.44269504088896341f;
constexpr float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float EXP_C[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};

// A float rounded to nearest-even integer, saturated to int16 as x86's cvtps_epi32 + a saturating pack does (a NaN
// or a value outside int32 becomes INT32_MIN, then -32768).
inline int16_t sat16(float v) {
  const float r = std::nearbyint(v);
  if (!(r >= -2147483648.0f && r < 2147483648.0f)) return int16_t(-32768);
  const int32_t i = int32_t(r);
  return int16_t(std::min<int32_t>(32767, std::max<int32_t>(-32768, i)));
}

// The most a 16-bit activation may be so that the int32 sum over K cannot overflow (level * 127 * K < 2^31).
inline int32_t a16_level(int64_t K) {
  const int64_t cap = (int64_t(2147483647) / (127 * std::max<int64_t>(K, 1)));
  return int32_t(std::min<int64_t>(32767, cap));
}

inline void prefetch(const void* p) {
#if defined(ROWINV_PATH_AVX512) || defined(ROWINV_PATH_AVX2)
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
#elif defined(__GNUC__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

inline float bf16_to_f(uint16_t w) { uint32_t u = uint32_t(w) << 16; float f; std::memcpy(&f, &u, 4); return f; }

#if defined(ROWINV_PATH_AVX512) || defined(ROWINV_PATH_AVX2)
// The x86 paths' horizontal sum from 8 lanes on (their 16 -> 8 step differs only in where the halves live): 8 -> 4 ->
// 2 -> 1 over pairs (l, l + half), one tree for both.
inline float hsum8(__m256 a) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}
#endif

#if defined(ROWINV_PATH_AVX512)
// ------------------------------------------------------------------------------------------------ AVX-512
using vec = __m512;
using mask_t = __mmask16;

inline mask_t tail_mask(int64_t n) { return n >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }
inline vec load_w(const float* p, mask_t m) { return _mm512_maskz_loadu_ps(m, p); }
inline vec load_w(const uint16_t* p, mask_t m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vec load_w(const int8_t* p, mask_t m) {
  __m128i b = _mm_maskz_loadu_epi8(m, p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
inline vec load_x(const float* p, mask_t m) { return _mm512_maskz_loadu_ps(m, p); }
inline void store_x(float* p, vec v, mask_t m) { _mm512_mask_storeu_ps(p, m, v); }
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec zero() { return _mm512_setzero_ps(); }
inline vec set1(float a) { return _mm512_set1_ps(a); }
inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
inline float hsum(vec v) {
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));  // lane l + lane l + 8
}
inline vec exp16(vec x) {
  const vec lo = _mm512_set1_ps(EXP_LO);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(EXP_HI)), lo);
  const vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
  vec p = _mm512_set1_ps(EXP_C[0]);
  for (int c = 1; c < 7; ++c) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C[c]));
  const vec two_n = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                                           _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mov_ps(~tiny, _mm512_mul_ps(p, two_n));
}

#elif defined(ROWINV_PATH_AVX2)
// ------------------------------------------------------------------------------------------------ AVX2 + FMA
struct vec { __m256 lo, hi; };  // lanes 0..7, 8..15
using mask_t = int64_t;         // how many lanes are real

inline mask_t tail_mask(int64_t n) { return n >= LANES ? LANES : n; }
inline vec full_f32(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline vec full_w(const float* p) { return full_f32(p); }
inline vec full_w(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16))};
}
inline vec full_w(const int8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
}
template <typename W> inline vec load_w(const W* p, mask_t n) {
  if (n >= LANES) return full_w(p);
  W b[LANES] = {};  // a tail: the real lanes, zeros after
  for (int64_t l = 0; l < n; ++l) b[l] = p[l];
  return full_w(b);
}
inline vec load_x(const float* p, mask_t n) { return load_w(p, n); }
inline void store_x(float* p, vec v, mask_t n) {
  if (n >= LANES) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); return; }
  alignas(32) float b[LANES];
  _mm256_store_ps(b, v.lo); _mm256_store_ps(b + 8, v.hi);
  for (int64_t l = 0; l < n; ++l) p[l] = b[l];
}
inline vec fma(vec a, vec b, vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vec set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline vec add(vec a, vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline vec mul(vec a, vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline vec div(vec a, vec b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline float hsum(vec v) {
  return hsum8(_mm256_add_ps(v.lo, v.hi));  // lane l + lane l + 8
}
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(EXP_LO);
  const __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_HI)), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
  __m256 p = _mm256_set1_ps(EXP_C[0]);
  for (int c = 1; c < 7; ++c) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_C[c]));
  const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                              _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, two_n));
}
inline vec exp16(vec x) { return {exp8(x.lo), exp8(x.hi)}; }

#elif defined(ROWINV_PATH_NEON)
// ------------------------------------------------------------------------------------------------ NEON
struct vec { float32x4_t q[4]; };  // lanes 0..3, 4..7, 8..11, 12..15
using mask_t = int64_t;

inline mask_t tail_mask(int64_t n) { return n >= LANES ? LANES : n; }
inline vec full_w(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
inline vec full_w(const uint16_t* p) {
  const uint16x8_t a = vld1q_u16(p), b = vld1q_u16(p + 8);
  return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16)), vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(a), 16)),
           vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)), vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(b), 16))}};
}
inline vec full_w(const int8_t* p) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t l = vmovl_s8(vget_low_s8(b)), h = vmovl_high_s8(b);
  return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))), vcvtq_f32_s32(vmovl_high_s16(l)),
           vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))}};
}
template <typename W> inline vec load_w(const W* p, mask_t n) {
  if (n >= LANES) return full_w(p);
  W b[LANES] = {};
  for (int64_t l = 0; l < n; ++l) b[l] = p[l];
  return full_w(b);
}
inline vec load_x(const float* p, mask_t n) { return load_w(p, n); }
inline void store_x(float* p, vec v, mask_t n) {
  float b[LANES];
  for (int i = 0; i < 4; ++i) vst1q_f32(b + 4 * i, v.q[i]);
  for (int64_t l = 0; l < std::min<int64_t>(n, LANES); ++l) p[l] = b[l];
}
// vfmaq_f32(c, a, b) = c + a * b with one rounding
inline vec fma(vec a, vec b, vec c) { for (int i = 0; i < 4; ++i) c.q[i] = vfmaq_f32(c.q[i], a.q[i], b.q[i]); return c; }
inline vec zero() { const float32x4_t z = vdupq_n_f32(0.0f); return {{z, z, z, z}}; }
inline vec set1(float a) { const float32x4_t z = vdupq_n_f32(a); return {{z, z, z, z}}; }
inline vec add(vec a, vec b) { for (int i = 0; i < 4; ++i) a.q[i] = vaddq_f32(a.q[i], b.q[i]); return a; }
inline vec mul(vec a, vec b) { for (int i = 0; i < 4; ++i) a.q[i] = vmulq_f32(a.q[i], b.q[i]); return a; }
inline vec div(vec a, vec b) { for (int i = 0; i < 4; ++i) a.q[i] = vdivq_f32(a.q[i], b.q[i]); return a; }
inline float hsum(vec v) {
  const float32x4_t a0 = vaddq_f32(v.q[0], v.q[2]), a1 = vaddq_f32(v.q[1], v.q[3]);  // 16 -> 8: l + l + 8
  const float32x4_t b = vaddq_f32(a0, a1);                                            // 8 -> 4: l + l + 4
  const float32x2_t c = vadd_f32(vget_low_f32(b), vget_high_f32(b));                  // 4 -> 2: l + l + 2
  return vget_lane_f32(c, 0) + vget_lane_f32(c, 1);                                   // 2 -> 1
}
inline float32x4_t exp4(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(EXP_LO), hi = vdupq_n_f32(EXP_HI);
  const uint32x4_t tiny = vcltq_f32(x, lo);
  x = vbslq_f32(vcltq_f32(x, hi), x, hi);  // x86's min(x, hi): x < hi ? x : hi (a NaN gives hi)
  x = vbslq_f32(vcgtq_f32(x, lo), x, lo);  // max(x, lo): x > lo ? x : lo
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(LOG2E)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(LN2_HI));  // x - n * LN2_HI, one rounding
  r = vfmsq_f32(r, n, vdupq_n_f32(LN2_LO));
  float32x4_t p = vdupq_n_f32(EXP_C[0]);
  for (int c = 1; c < 7; ++c) p = vfmaq_f32(vdupq_n_f32(EXP_C[c]), p, r);
  const float32x4_t two_n = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(vmulq_f32(p, two_n)), tiny));
}
inline vec exp16(vec x) { for (int i = 0; i < 4; ++i) x.q[i] = exp4(x.q[i]); return x; }

#else
// ------------------------------------------------------------------------------------------------ portable
struct vec { float v[LANES]; };
using mask_t = int64_t;

inline mask_t tail_mask(int64_t n) { return n >= LANES ? LANES : n; }
inline float to_f(float w) { return w; }
inline float to_f(uint16_t w) { return bf16_to_f(w); }
inline float to_f(int8_t w) { return float(w); }
template <typename W> inline vec load_w(const W* p, mask_t n) {
  vec r; for (int l = 0; l < LANES; ++l) r.v[l] = l < n ? to_f(p[l]) : 0.0f; return r;
}
inline vec load_x(const float* p, mask_t n) { return load_w(p, n); }
inline void store_x(float* p, vec v, mask_t n) { for (int l = 0; l < LANES && l < n; ++l) p[l] = v.v[l]; }
inline vec fma(vec a, vec b, vec c) { for (int l = 0; l < LANES; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]); return c; }
inline vec zero() { vec r; for (int l = 0; l < LANES; ++l) r.v[l] = 0.0f; return r; }
inline vec set1(float a) { vec r; for (int l = 0; l < LANES; ++l) r.v[l] = a; return r; }
inline vec add(vec a, vec b) { for (int l = 0; l < LANES; ++l) a.v[l] = a.v[l] + b.v[l]; return a; }
inline vec mul(vec a, vec b) { for (int l = 0; l < LANES; ++l) a.v[l] = a.v[l] * b.v[l]; return a; }
inline vec div(vec a, vec b) { for (int l = 0; l < LANES; ++l) a.v[l] = a.v[l] / b.v[l]; return a; }
inline float hsum(vec v) {
  for (int half = LANES / 2; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) v.v[l] = v.v[l] + v.v[l + half];
  return v.v[0];
}
inline float exp1(float x) {
  const bool tiny = x < EXP_LO;
  x = x < EXP_HI ? x : EXP_HI;  // x86's min and max: a NaN gives the bound
  x = x > EXP_LO ? x : EXP_LO;
  const float n = std::nearbyint(x * LOG2E);
  float r = std::fma(-n, LN2_HI, x);
  r = std::fma(-n, LN2_LO, r);
  float p = EXP_C[0];
  for (int c = 1; c < 7; ++c) p = std::fma(p, r, EXP_C[c]);
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float two_n; std::memcpy(&two_n, &bits, 4);
  return tiny ? 0.0f : p * two_n;
}
inline vec exp16(vec x) { for (int l = 0; l < LANES; ++l) x.v[l] = exp1(x.v[l]); return x; }
#endif

// ---- one activation row rounded to 16-bit integers (nearest-even, saturating as sat16), scale amax / level.
// The same integers on every path: a max is a max in any order (a NaN is skipped), the product is one rounding.
inline void quantize_row(const float* r, int64_t K, int64_t Kp, float level, int16_t* q, float* scale) {
  float amax = 0.0f;
  int64_t k = 0;
#if defined(ROWINV_PATH_AVX512)
  __m512 mx = _mm512_setzero_ps();
  for (; k < K; k += 16) mx = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(K - k), r + k)), mx);
  amax = _mm512_reduce_max_ps(mx);
#elif defined(ROWINV_PATH_AVX2)
  __m256 mx = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (; k + 8 <= K; k += 8) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(r + k), abs_mask), mx);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  for (float v : lanes) amax = std::max(amax, v);
#endif
  for (; k < K; ++k) amax = std::max(amax, std::fabs(r[k]));  // std::max(a, NaN) keeps a
  const float inv = amax > 0.0f ? level / amax : 0.0f;
  *scale = amax > 0.0f ? amax / level : 0.0f;
  k = 0;
#if defined(ROWINV_PATH_AVX512)
  const __m512 iv = _mm512_set1_ps(inv);
  for (; k < Kp; k += 16) {
    const __mmask16 in = k < K ? tail_mask(K - k) : __mmask16(0);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, r + k), iv);
    const __m512i t = _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_mask_cvtsepi32_storeu_epi16(q + k, tail_mask(Kp - k), t);
  }
#elif defined(ROWINV_PATH_AVX2)
  const __m256 iv = _mm256_set1_ps(inv);
  for (; k + 16 <= K; k += 16) {
    const __m256 a = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(r + k), iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 b = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(r + k + 8), iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // saturating pack interleaves 128-bit halves: a0-3 b0-3 a4-7 b4-7 -> reorder to a0-7 b0-7
    const __m256i t = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), t);
  }
#endif
  for (; k < Kp; ++k) q[k] = k < K ? sat16(r[k] * inv) : int16_t(0);
}

// ---- int8 weights x 16-bit activations for rows 0..mb-1 (each padded to Kp, a multiple of 32) against nb weight rows:
// the exact integer sums, then y = float(sum) * xs * ws. Integer sums: any grouping gives the same.
#if defined(ROWINV_PATH_AVX512)
inline __m512i dp16(__m512i acc, __m512i x, __m512i w) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, x, w);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w));
#endif
}

template <int mb, int nb>
ROWINV_INLINE void tile_a16(const int16_t* xq, int64_t Kp, const float* xs, const int8_t* w, int64_t K, const float* ws, float* y,
              int64_t ldy) {
  __m512i acc[mb][nb];
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) acc[i][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t n = K - k;
    const __mmask32 m = n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
    __m512i wv[nb];
    for (int j = 0; j < nb; ++j) wv[j] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, w + j * K + k));
    for (int i = 0; i < mb; ++i) {
      __m512i xv = _mm512_loadu_si512(xq + i * Kp + k);
      for (int j = 0; j < nb; ++j) acc[i][j] = dp16(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < mb; ++i) {
    int32_t sums[nb];
    if constexpr (nb == 4) {  // four sums at once
      __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[i][0], acc[i][1]),
                                     _mm512_unpackhi_epi32(acc[i][0], acc[i][1]));
      __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[i][2], acc[i][3]),
                                     _mm512_unpackhi_epi32(acc[i][2], acc[i][3]));
      __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
      __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
      __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sums), q);
    } else {
      for (int j = 0; j < nb; ++j) sums[j] = _mm512_reduce_add_epi32(acc[i][j]);
    }
    for (int j = 0; j < nb; ++j) y[i * ldy + j] = float(sums[j]) * xs[i] * ws[j];
  }
}

#elif defined(ROWINV_PATH_AVX2)
inline int32_t hsum_epi32(__m256i a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 16 weights widened to int16 (vpmovsxbw), 16 activations, vpmaddwd: 8 int32 pair sums added to the accumulator.
// wk points at the first weight row's 16 values, ldw apart. Three or more rows take the weight rows two at a time
// (12 accumulators, 2 weights and an activation fit the 16 ymm registers; all four weights would spill them).
template <int mb, int nb>
inline void step_a16(const int16_t* xq, int64_t Kp, const int8_t* wk, int64_t ldw, __m256i (&acc)[mb][nb]) {
  constexpr int js = mb >= 3 && nb > 2 ? 2 : nb;
  for (int j0 = 0; j0 < nb; j0 += js) {
    __m256i wv[js];
    for (int j = 0; j < js && j0 + j < nb; ++j)
      wv[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wk + (j0 + j) * ldw)));
    for (int i = 0; i < mb; ++i) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * Kp));
      for (int j = 0; j < js && j0 + j < nb; ++j)
        acc[i][j0 + j] = _mm256_add_epi32(acc[i][j0 + j], _mm256_madd_epi16(xv, wv[j]));
    }
  }
}

template <int mb, int nb>
ROWINV_INLINE void tile_a16(const int16_t* xq, int64_t Kp, const float* xs, const int8_t* w, int64_t K, const float* ws, float* y,
              int64_t ldy) {
  __m256i acc[mb][nb];
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) acc[i][j] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) step_a16<mb, nb>(xq + k, Kp, w + k, K, acc);
  if (k < K) {  // a tail: the real weights, zeros after (the activations are zero-padded to Kp already)
    alignas(16) int8_t b[nb][16] = {};
    for (int j = 0; j < nb; ++j)
      for (int64_t l = 0; l < K - k; ++l) b[j][l] = w[j * K + k + l];
    step_a16<mb, nb>(xq + k, Kp, &b[0][0], 16, acc);
  }
  for (int i = 0; i < mb; ++i) {
    int32_t sums[nb];
    if constexpr (nb == 4) {  // four sums at once: hadd pairs, then the two 128-bit halves
      const __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[i][0], acc[i][1]),
                                          _mm256_hadd_epi32(acc[i][2], acc[i][3]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sums),
                       _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
    } else {
      for (int j = 0; j < nb; ++j) sums[j] = hsum_epi32(acc[i][j]);
    }
    for (int j = 0; j < nb; ++j) y[i * ldy + j] = float(sums[j]) * xs[i] * ws[j];
  }
}

#elif defined(ROWINV_PATH_NEON)
// 16 weights widened to int16 (sxtl), multiply-accumulate long into int32 lanes (smlal / smlal2)
template <int mb, int nb>
ROWINV_INLINE void tile_a16(const int16_t* xq, int64_t Kp, const float* xs, const int8_t* w, int64_t K, const float* ws, float* y,
              int64_t ldy) {
  int32x4_t acc[mb][nb];
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) acc[i][j] = vdupq_n_s32(0);
  for (int64_t k = 0; k < K; k += 16) {
    int16x8_t wl[nb], wh[nb];
    for (int j = 0; j < nb; ++j) {
      int8x16_t b;
      if (K - k >= 16) {
        b = vld1q_s8(w + j * K + k);
      } else {
        int8_t t[16] = {};
        for (int64_t l = 0; l < K - k; ++l) t[l] = w[j * K + k + l];
        b = vld1q_s8(t);
      }
      wl[j] = vmovl_s8(vget_low_s8(b));
      wh[j] = vmovl_high_s8(b);
    }
    for (int i = 0; i < mb; ++i) {
      const int16x8_t x0 = vld1q_s16(xq + i * Kp + k), x1 = vld1q_s16(xq + i * Kp + k + 8);
      for (int j = 0; j < nb; ++j) {
        acc[i][j] = vmlal_s16(acc[i][j], vget_low_s16(x0), vget_low_s16(wl[j]));
        acc[i][j] = vmlal_high_s16(acc[i][j], x0, wl[j]);
        acc[i][j] = vmlal_s16(acc[i][j], vget_low_s16(x1), vget_low_s16(wh[j]));
        acc[i][j] = vmlal_high_s16(acc[i][j], x1, wh[j]);
      }
    }
  }
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) y[i * ldy + j] = float(vaddvq_s32(acc[i][j])) * xs[i] * ws[j];
}

#else
// one int64 sum per element, cast to int32 (the exact sum fits: a16_level)
template <int mb, int nb>
ROWINV_INLINE void tile_a16(const int16_t* xq, int64_t Kp, const float* xs, const int8_t* w, int64_t K, const float* ws, float* y,
              int64_t ldy) {
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) {
      int64_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += int64_t(xq[i * Kp + k]) * int64_t(w[j * K + k]);
      y[i * ldy + j] = float(int32_t(acc)) * xs[i] * ws[j];
    }
}
#endif

}  // namespace
