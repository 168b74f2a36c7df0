// SIMD primitives of the row-invariant kernels (rowinv.cpp): a 16-lane float vector, weight loads that widen
// float32 / bfloat16 / int8 exactly, FMA, and one fixed horizontal-sum tree. AVX-512 when the build machine has it,
// else a portable 16-lane emulation; either way the same sequence for every row count.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define ROWINV_AVX512 1
#endif

namespace {

constexpr int LANES = 16;
constexpr int NB = 4;  // weight rows per block
constexpr int MB = 4;  // activation rows per register tile

#ifdef ROWINV_AVX512
using vec = __m512;

inline vec load_w(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline vec load_w(const uint16_t* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vec load_w(const int8_t* p, __mmask16 m) {
  __m128i b = _mm_maskz_loadu_epi8(m, p);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
inline vec load_x(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec zero() { return _mm512_setzero_ps(); }
// A fixed tree: 16 -> 8 -> 4 -> 2 -> 1 lanes, pairs (l, l + half).
inline float hsum(vec v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(d);
}
inline __mmask16 tail_mask(int64_t n) { return n >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }
// exp(x) for 16 lanes, one fixed sequence per element (so the same for every row count): x = n ln2 + r with
// |r| <= ln2 / 2, a degree-6 Taylor polynomial in r (relative error < 2e-7), times 2^n. Inputs below -87 give 0.
inline vec exp16(vec x) {
  const vec lo = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), lo);
  const vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 split in two: exact first product
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  vec p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, n));
}
inline vec set1(float a) { return _mm512_set1_ps(a); }
inline void store_x(float* p, vec v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
inline void prefetch(const void* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
#else
struct vec { float v[LANES]; };
using mask_t = int64_t;
inline float to_f(float w) { return w; }
inline float to_f(uint16_t w) { uint32_t u = uint32_t(w) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline float to_f(int8_t w) { return float(w); }
template <typename W> inline vec load_w(const W* p, int64_t n) {
  vec r; for (int l = 0; l < LANES; ++l) r.v[l] = l < n ? to_f(p[l]) : 0.0f; return r;
}
inline vec load_x(const float* p, int64_t n) { vec r; for (int l = 0; l < LANES; ++l) r.v[l] = l < n ? p[l] : 0.0f; return r; }
inline vec fma(vec a, vec b, vec c) { for (int l = 0; l < LANES; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]); return c; }
inline vec zero() { vec r; for (int l = 0; l < LANES; ++l) r.v[l] = 0.0f; return r; }
inline float hsum(vec v) {
  for (int half = LANES / 2; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) v.v[l] = v.v[l] + v.v[l + half];
  return v.v[0];
}
inline int64_t tail_mask(int64_t n) { return n >= LANES ? LANES : n; }
inline vec exp16(vec x) { for (int l = 0; l < LANES; ++l) x.v[l] = std::exp(x.v[l]); return x; }
inline vec set1(float a) { vec r; for (int l = 0; l < LANES; ++l) r.v[l] = a; return r; }
inline void store_x(float* p, vec v, int64_t n) { for (int l = 0; l < LANES && l < n; ++l) p[l] = v.v[l]; }
inline vec add(vec a, vec b) { for (int l = 0; l < LANES; ++l) a.v[l] = a.v[l] + b.v[l]; return a; }
inline vec mul(vec a, vec b) { for (int l = 0; l < LANES; ++l) a.v[l] = a.v[l] * b.v[l]; return a; }
inline vec div(vec a, vec b) { for (int l = 0; l < LANES; ++l) a.v[l] = a.v[l] / b.v[l]; return a; }
inline void prefetch(const void*) {}
#endif

}  // namespace
