// Row-invariant kernels for CPU decoding (explorer/precision): Y = X W^T and causal (or token-tree) attention.
//
// The rule every kernel here keeps: the arithmetic that produces one output element is one fixed sequence of
// floating-point operations, whatever the number of rows M in the call. A 4-row verify pass therefore gives
// each row bit for bit what a one-row pass gives (torch's own kernels pick a matrix-vector path for M = 1 and
// blocked gemm paths for larger M, which sum in other orders).
//
// linear: each output element y[m, n] is sum_k x[m, k] * w[n, k] accumulated in LANES fixed lanes (lane l
// holds k = l, l + LANES, ...), an FMA per step in increasing k, then one fixed horizontal sum, then (int8) a
// multiply by the channel's scale. All M rows are computed while a block of weight rows is in cache, so a
// k-row pass reads the weights once. Weights: float32, bfloat16 (exact upcast) or int8 (one scale per row).
// attend: each query row attends to exactly its own keys (the prefix plus earlier rows of the pass) with the
// same dot-product, softmax and weighted-sum sequence as a one-row pass.
//
// Built with -ffp-contract=off (no fused operations the source did not write). AVX-512 when the build machine
// has it (16 lanes), else a portable 16-lane loop: the path is chosen at build time, the same for every M.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

#include "rowinv_simd.h"

namespace {

// One tile: rows m0 .. m0+mb-1 of X against weight rows n0 .. n0+nb-1. Every accumulator acc[i][j] sees the same
// sequence of FMAs whatever mb, nb and the neighbours are.
template <typename W, int mb, int nb>
void tile(const float* x, int64_t ldx, const W* w, int64_t K, const float* scale, float* y, int64_t ldy,
          const W* next) {
  vec acc[mb][nb];
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) acc[i][j] = zero();
  for (int64_t k = 0; k < K; k += LANES) {
    auto m = tail_mask(K - k);
    if (next != nullptr && (k % 64) == 0)
      for (int j = 0; j < nb; ++j) prefetch(next + j * K + k);
    vec wv[nb];
    for (int j = 0; j < nb; ++j) wv[j] = load_w(w + j * K + k, m);
    for (int i = 0; i < mb; ++i) {
      vec xv = load_x(x + i * ldx + k, m);
      for (int j = 0; j < nb; ++j) acc[i][j] = fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < mb; ++i)
    for (int j = 0; j < nb; ++j) {
      float s = hsum(acc[i][j]);
      y[i * ldy + j] = scale != nullptr ? s * scale[j] : s;
    }
}

template <typename W, int nb>
void block_rows(const float* x, int64_t M, int64_t K, const W* w, const float* scale, float* y, int64_t N,
                const W* next) {
  int64_t m = 0;
  for (; m + MB <= M; m += MB) tile<W, MB, nb>(x + m * K, K, w, K, scale, y + m * N, N, m == 0 ? next : nullptr);
  switch (M - m) {
    case 3: tile<W, 3, nb>(x + m * K, K, w, K, scale, y + m * N, N, m == 0 ? next : nullptr); break;
    case 2: tile<W, 2, nb>(x + m * K, K, w, K, scale, y + m * N, N, m == 0 ? next : nullptr); break;
    case 1: tile<W, 1, nb>(x + m * K, K, w, K, scale, y + m * N, N, m == 0 ? next : nullptr); break;
    default: break;
  }
}

template <typename W>
void linear_impl(const float* x, int64_t M, int64_t K, const W* w, int64_t N, const float* scale, float* y) {
  const int64_t blocks = (N + NB - 1) / NB;
  at::parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB;
      const int64_t nb = std::min<int64_t>(NB, N - n0);
      const W* wb = w + n0 * K;
      const W* next = (b + 1 < b1 && n0 + 2 * NB <= N) ? wb + NB * K : nullptr;
      const float* sb = scale != nullptr ? scale + n0 : nullptr;
      switch (nb) {
        case 4: block_rows<W, 4>(x, M, K, wb, sb, y + n0, N, next); break;
        case 3: block_rows<W, 3>(x, M, K, wb, sb, y + n0, N, nullptr); break;
        case 2: block_rows<W, 2>(x, M, K, wb, sb, y + n0, N, nullptr); break;
        default: block_rows<W, 1>(x, M, K, wb, sb, y + n0, N, nullptr); break;
      }
    }
  });
}

// ---- int8 weights x 16-bit integer activations: integer sums, exact whatever their order.
// Each activation row is rounded to integers of at most `level` in magnitude with its own scale, so the int32 sum
// over k cannot overflow (level * 127 * K < 2^31); y = float(sum) * x_scale[m] * w_scale[n].
inline int32_t a16_level(int64_t K) {
  const int64_t cap = (int64_t(2147483647) / (127 * std::max<int64_t>(K, 1)));
  return int32_t(std::min<int64_t>(32767, cap));
}

void quantize_rows(const float* x, int64_t M, int64_t K, int64_t Kp, int16_t* xq, float* xs) {
  const float level = float(a16_level(K));
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * K;
    float amax = 0.0f;
#if defined(ROWINV_AVX512)
    // 16 lanes at a time, the same numbers: a max is a max in any order (a NaN is skipped, as std::max(amax, NaN)
    // skips it: max_ps returns its second operand when either is NaN), and the rounding is nearbyint's (to
    // nearest, ties to even) on the same float products
    __m512 mx = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16)
      mx = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(K - k), r + k)), mx);
    amax = _mm512_reduce_max_ps(mx);
    const float inv = amax > 0.0f ? level / amax : 0.0f;
    xs[m] = amax > 0.0f ? amax / level : 0.0f;
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t k = 0; k < Kp; k += 16) {
      const __mmask16 in = k < K ? tail_mask(K - k) : __mmask16(0);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, r + k), iv);
      const __m512i q = _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      _mm512_mask_cvtsepi32_storeu_epi16(xq + m * Kp + k, tail_mask(Kp - k), q);
    }
#else
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(r[k]));
    const float inv = amax > 0.0f ? level / amax : 0.0f;
    xs[m] = amax > 0.0f ? amax / level : 0.0f;
    for (int64_t k = 0; k < Kp; ++k) xq[m * Kp + k] = k < K ? int16_t(std::nearbyint(r[k] * inv)) : int16_t(0);
#endif
  }
}

#if defined(ROWINV_AVX512)
inline __m512i dp16(__m512i acc, __m512i x, __m512i w) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, x, w);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w));
#endif
}

// rows m .. m+mb-1 (16-bit, padded to Kp) against nb int8 weight rows; integer sums, so any grouping gives the same.
template <int mb, int nb>
void tile_a16(const int16_t* xq, int64_t Kp, const float* xs, const int8_t* w, int64_t K, const float* ws, float* y,
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
    if constexpr (nb == 4) {  // four sums at once (integer sums: any order gives the same)
      __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[i][0], acc[i][1]),
                                     _mm512_unpackhi_epi32(acc[i][0], acc[i][1]));
      __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[i][2], acc[i][3]),
                                     _mm512_unpackhi_epi32(acc[i][2], acc[i][3]));
      __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
      __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
      __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sums), q);  // lanes: acc0, acc1, acc2, acc3
    } else {
      for (int j = 0; j < nb; ++j) sums[j] = _mm512_reduce_add_epi32(acc[i][j]);
    }
    for (int j = 0; j < nb; ++j) y[i * ldy + j] = float(sums[j]) * xs[i] * ws[j];
  }
}

template <int nb>
void rows_a16(const int16_t* xq, int64_t M, int64_t Kp, const float* xs, const int8_t* w, int64_t K, const float* ws,
              float* y, int64_t N) {
  int64_t m = 0;
  for (; m + MB <= M; m += MB) tile_a16<MB, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N);
  switch (M - m) {
    case 3: tile_a16<3, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N); break;
    case 2: tile_a16<2, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N); break;
    case 1: tile_a16<1, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N); break;
    default: break;
  }
}
#endif

void linear_i8a16_impl(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, const float* ws, float* y) {
  const int64_t Kp = (K + 31) / 32 * 32;
  std::vector<int16_t> xq(M * Kp);
  std::vector<float> xs(M);
  quantize_rows(x, M, K, Kp, xq.data(), xs.data());
  const int64_t blocks = (N + NB - 1) / NB;
  at::parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB, nb = std::min<int64_t>(NB, N - n0);
      if (b + 1 < b1)
        for (int64_t j = 0; j < nb; ++j) prefetch(w + (n0 + NB + j) * K);
#if defined(ROWINV_AVX512)
      const int8_t* wb = w + n0 * K;
      switch (nb) {
        case 4: rows_a16<4>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
        case 3: rows_a16<3>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
        case 2: rows_a16<2>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
        default: rows_a16<1>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
      }
#else
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < nb; ++j) {
          int64_t acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += int64_t(xq[m * Kp + k]) * int64_t(w[(n0 + j) * K + k]);
          y[m * N + n0 + j] = float(int32_t(acc)) * xs[m] * ws[n0 + j];
        }
#endif
    }
  });
}

// ---- the same integer sums on AMX tiles (Intel Sapphire Rapids and later): a 16-bit activation x is split
// exactly into a signed high byte and an unsigned low byte, x = 256 * hi + lo, so sum_k x w = 256 * sum hi w +
// sum lo w, two int8 tile products (TDPBSSD, TDPBUSD) whose int32 sums are exact. The result is the integer the
// AVX-512 path computes, bit for bit, whatever the number of rows: a verify pass of 17 rows reads each weight
// tile once and costs little more than one row. Weights are packed once (``pack_amx``) into the tiles' layout:
// (N/16, K/64, 16, 64) with packed[b][c][r][4n + i] = W[16b + n][64c + 4r + i], zero-padded.
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define ROWINV_AMX 1
struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void linear_amx_impl(const float* x, int64_t M, int64_t K, const int8_t* packed, int64_t N, const float* ws,
                     float* y) {
  const int64_t KC = (K + 63) / 64, Kp = KC * 64, NBK = (N + 15) / 16;
  // more than 16 rows: padded with zero rows to whole 16-row tiles, all handled in one sweep over the weights
  const int64_t Mp = M <= 16 ? M : (M + 15) / 16 * 16, tr = std::min<int64_t>(16, Mp);
  std::vector<int16_t> xq(M * Kp);
  std::vector<float> xs(M);
  quantize_rows(x, M, K, Kp, xq.data(), xs.data());
  std::vector<int8_t> hi(Mp * Kp, 0);
  std::vector<uint8_t> lo(Mp * Kp, 0);
  for (int64_t t = 0; t < M * Kp; t += 32) {  // Kp is a multiple of 64: whole vectors of 32
    // arithmetic shift: floor(x / 256), in [-128, 127]; and the low byte
    const __m512i v = _mm512_loadu_si512(xq.data() + t);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi.data() + t), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo.data() + t),
                        _mm512_cvtepi16_epi8(_mm512_and_si512(v, _mm512_set1_epi16(0xFF))));
  }
  const int64_t pairs = (NBK + 1) / 2;
  at::parallel_for(0, pairs, 16, [&](int64_t p0, int64_t p1) {
    alignas(64) int32_t c[4][16][16];
    TileConfig cfg;
    for (int t = 0; t < 6; ++t) { cfg.rows[t] = uint8_t(tr); cfg.colsb[t] = 64; }  // C hi/lo x 2, A hi, A lo
    for (int t = 6; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }           // B x 2
    _tile_loadconfig(&cfg);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b0 = 2 * p;
      const bool two = b0 + 1 < NBK;
      for (int64_t m0 = 0; m0 < Mp; m0 += 16) {
        const int64_t mr = std::min<int64_t>(16, M - m0);
        const int8_t* ah = hi.data() + m0 * Kp;
        const uint8_t* al = lo.data() + m0 * Kp;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t kc = 0; kc < KC; ++kc) {
          _tile_loadd(4, ah + kc * 64, Kp);
          _tile_loadd(5, al + kc * 64, Kp);
          _tile_loadd(6, packed + (b0 * KC + kc) * 1024, 64);
          _tile_dpbssd(0, 4, 6);
          _tile_dpbusd(1, 5, 6);
          if (two) {
            _tile_loadd(7, packed + ((b0 + 1) * KC + kc) * 1024, 64);
            _tile_dpbssd(2, 4, 7);
            _tile_dpbusd(3, 5, 7);
          }
        }
        _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
        if (two) { _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64); }
        for (int half = 0; half < (two ? 2 : 1); ++half) {
          const int64_t n0 = (b0 + half) * 16;
          const __mmask16 cols = tail_mask(N - n0);
          const __m512 wsv = _mm512_maskz_loadu_ps(cols, ws + n0);
          for (int64_t i = 0; i < mr; ++i) {
            // 256 * hi + lo in wrapping 32-bit arithmetic: the exact sum, which fits in an int32 (a16_level)
            const __m512i h = _mm512_load_si512(c[2 * half][i]), l = _mm512_load_si512(c[2 * half + 1][i]);
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
            _mm512_mask_storeu_ps(y + (m0 + i) * N + n0, cols,
                                  _mm512_mul_ps(_mm512_mul_ps(sum, _mm512_set1_ps(xs[m0 + i])), wsv));
          }
        }
      }
    }
    _tile_release();
  });
}
#endif

bool amx_ready() {
#ifdef ROWINV_AMX
  static const bool ok = [] {  // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace

// (N, K) int8 -> the AMX tiles' layout (N/16, K/64, 16, 64), zero-padded (see linear_amx_impl).
torch::Tensor pack_amx(torch::Tensor w) {
  TORCH_CHECK(w.scalar_type() == torch::kChar && w.dim() == 2, "rowinv.pack_amx: (N, K) int8");
  w = w.contiguous();
  const int64_t N = w.size(0), K = w.size(1), NBK = (N + 15) / 16, KC = (K + 63) / 64;
  auto out = torch::zeros({NBK, KC, 16, 64}, w.options());
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = out.data_ptr<int8_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      dst[(((n / 16) * KC + k / 64) * 16 + (k % 64) / 4) * 64 + 4 * (n % 16) + k % 4] = src[n * K + k];
  return out;
}

// x (..., K) float32, w (N, K) int8 (or packed by pack_amx: (N/16, K/64, 16, 64)), scale (N,): y = X W^T with each
// row of X rounded to 16-bit integers. Both layouts give the same integers, bit for bit.
torch::Tensor linear_a16(torch::Tensor x, torch::Tensor w, torch::Tensor scale) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kChar && w.is_contiguous() &&
              (w.dim() == 2 || w.dim() == 4), "rowinv.linear_a16: float32 x and contiguous int8 w");
  const int64_t K = x.size(-1), N = scale.numel();
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32, "rowinv.linear_a16: float32 scale");
  TORCH_CHECK(w.dim() == 2 ? (w.size(0) == N && w.size(1) == K)
                           : (w.size(0) == (N + 15) / 16 && w.size(1) == (K + 63) / 64 && w.size(2) == 16 &&
                              w.size(3) == 64), "rowinv.linear_a16: bad shapes");
  auto x2 = x.reshape({-1, K}).contiguous();
  auto s = scale.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  auto y = torch::empty({x2.size(0), N}, x.options());
  if (w.dim() == 4) {
#ifdef ROWINV_AMX
    TORCH_CHECK(amx_ready(), "rowinv.linear_a16: AMX weights, but the OS gave no AMX tile state");
    linear_amx_impl(x2.data_ptr<float>(), x2.size(0), K, w.data_ptr<int8_t>(), N, s.data_ptr<float>(),
                    y.data_ptr<float>());
#else
    TORCH_CHECK(false, "rowinv.linear_a16: AMX weights on a build without AMX");
#endif
  } else {
    linear_i8a16_impl(x2.data_ptr<float>(), x2.size(0), K, w.data_ptr<int8_t>(), N, s.data_ptr<float>(),
                      y.data_ptr<float>());
  }
  return y.view(shape);
}

bool has_amx() { return amx_ready(); }

// x (..., K) float32; w (N, K) float32 | bfloat16 | int8; scale (N,) float32 (int8 only). Returns (..., N) float32.
torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> scale) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "rowinv.linear: x must be float32");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "rowinv.linear: w must be a contiguous (N, K) matrix");
  const int64_t K = w.size(1), N = w.size(0);
  TORCH_CHECK(x.size(-1) == K, "rowinv.linear: x's last dimension must equal w's K");
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  auto y = torch::empty({M, N}, x.options());
  const float* sp = nullptr;
  torch::Tensor s;
  if (w.scalar_type() == torch::kChar) {
    TORCH_CHECK(scale.has_value(), "rowinv.linear: int8 weights need a scale per row");
    s = scale->contiguous();
    TORCH_CHECK(s.scalar_type() == torch::kFloat32 && s.numel() == N, "rowinv.linear: scale must be (N,) float32");
    sp = s.data_ptr<float>();
  }
  const float* xp = x2.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (w.scalar_type()) {
    case torch::kFloat32: linear_impl<float>(xp, M, K, w.data_ptr<float>(), N, nullptr, yp); break;
    case torch::kBFloat16:
      linear_impl<uint16_t>(xp, M, K, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), N, nullptr, yp);
      break;
    case torch::kChar: linear_impl<int8_t>(xp, M, K, w.data_ptr<int8_t>(), N, sp, yp); break;
    default: TORCH_CHECK(false, "rowinv.linear: weights must be float32, bfloat16 or int8");
  }
  return y.view(shape);
}

// q (H, M, D), k and v (Hkv, L, D), float32; query row i sits at position L - M + i and sees keys 0 .. L - M + i,
// or, with ``visible`` (bool (M, L): a token tree's mask), the keys j where visible[i, j]. Either way a row's keys
// are taken in increasing j, so a tree node over [prefix, its ancestors] sums exactly as the one-row pass over the
// same keys laid out contiguously. Query head h reads kv head h / (H / Hkv). Returns (M, H, D).
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scaling,
                     c10::optional<torch::Tensor> visible = c10::nullopt) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
              v.scalar_type() == torch::kFloat32, "rowinv.attend: float32 only");
  q = q.contiguous(); k = k.contiguous(); v = v.contiguous();
  const int64_t H = q.size(0), M = q.size(1), D = q.size(2), Hkv = k.size(0), L = k.size(1);
  TORCH_CHECK(H % Hkv == 0 && L >= M && k.size(2) == D && v.sizes() == k.sizes(), "rowinv.attend: bad shapes");
  auto out = torch::empty({M, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scaling);
  const int64_t group = H / Hkv;
  // each query row's keys, in increasing order: causal, or the rows of ``visible``
  std::vector<std::vector<int64_t>> keys(M);
  torch::Tensor vis;
  if (visible.has_value()) {
    vis = visible->to(torch::kBool).contiguous();
    TORCH_CHECK(vis.dim() == 2 && vis.size(0) == M && vis.size(1) == L, "rowinv.attend: visible must be (M, L)");
  }
  for (int64_t i = 0; i < M; ++i) {
    if (vis.defined()) {
      const bool* row = vis.data_ptr<bool>() + i * L;
      for (int64_t j = 0; j < L; ++j)
        if (row[j]) keys[i].push_back(j);
    } else {
      for (int64_t j = 0; j < L - M + i + 1; ++j) keys[i].push_back(j);
    }
    TORCH_CHECK(!keys[i].empty(), "rowinv.attend: a query row sees no key");
  }
  // keys transposed, (Hkv, D, Lp) with Lp = L rounded up to 16 lanes: a row's scores come 16 keys at a time,
  // each score one FMA per d in increasing d (the same sequence for a key whichever 16 it is computed with)
  const int64_t Lp = (L + LANES - 1) / LANES * LANES;
  std::vector<float> kt(Hkv * D * Lp, 0.0f);
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t j = 0; j < L; ++j)
      for (int64_t d = 0; d < D; ++d) kt[(g * D + d) * Lp + j] = kp[(g * L + j) * D + d];
  at::parallel_for(0, H * M, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(Lp), kg(D * LANES);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t h = r / M, i = r % M;
      const std::vector<int64_t>& js = keys[i];
      const int64_t seen = static_cast<int64_t>(js.size());
      const float* qr = qp + (h * M + i) * D;
      const float* kh = kt.data() + (h / group) * D * Lp;
      const float* vh = vp + (h / group) * L * D;
      float mx = -INFINITY;
      for (int64_t t = 0; t < seen; t += LANES) {
        const int64_t n = std::min<int64_t>(LANES, seen - t);
        auto m = tail_mask(n);
        const float* base = kh + js[t];
        int64_t stride = Lp;
        if (js[t + n - 1] - js[t] != n - 1) {  // not contiguous (a tree's ancestors): gather these keys first
          for (int64_t d = 0; d < D; ++d)
            for (int64_t l = 0; l < LANES; ++l) kg[d * LANES + l] = l < n ? kh[d * Lp + js[t + l]] : 0.0f;
          base = kg.data();
          stride = LANES;
        }
        vec acc = zero();
        for (int64_t d = 0; d < D; ++d) acc = fma(set1(qr[d]), load_x(base + d * stride, m), acc);
        store_x(p.data() + t, mul(acc, set1(sc)), m);
        for (int64_t l = 0; l < n; ++l) mx = p[t + l] > mx ? p[t + l] : mx;
      }
      const vec vmx = set1(mx);
      for (int64_t t = 0; t < seen; t += LANES) {  // 16 keys at a time, in the row's own key order
        auto m = tail_mask(seen - t);
        store_x(p.data() + t, exp16(add(load_x(p.data() + t, m), mul(vmx, set1(-1.0f)))), m);
      }
      float total = 0.0f;
      for (int64_t t = 0; t < seen; ++t) total = total + p[t];
      const float inv = 1.0f / total;
      float* o = op + (i * H + h) * D;
      constexpr int64_t DV = 8;  // D <= 128 in 16-lane registers
      TORCH_CHECK(D <= DV * LANES, "rowinv.attend: head_dim > 128");
      vec ov[DV];
      for (int64_t c = 0; c < DV; ++c) ov[c] = zero();
      for (int64_t t = 0; t < seen; ++t) {
        const vec pj = set1(p[t] * inv);
        const float* vr = vh + js[t] * D;
        for (int64_t c = 0; c * LANES < D; ++c) ov[c] = fma(pj, load_x(vr + c * LANES, tail_mask(D - c * LANES)), ov[c]);
      }
      for (int64_t c = 0; c * LANES < D; ++c) store_x(o + c * LANES, ov[c], tail_mask(D - c * LANES));
    }
  });
  return out;
}

// ---- one decoder layer in two calls (the KV cache is appended in Python between them): fewer Python-level ops
torch::Tensor lin(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& s) {
  return w.scalar_type() == torch::kChar ? linear_a16(x, w, *s) : ::linear(x, w, s);  // int8: either layout
}

// Llama's RMSNorm, row by row: weight * (x * 1/sqrt(mean(x^2) + eps)), the mean a fixed 16-lane sum.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  const int64_t H = x.size(-1);
  auto x2 = x.reshape({-1, H}).contiguous();
  auto out = torch::empty_like(x2);
  const float* xp = x2.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t m = 0; m < x2.size(0); ++m) {
    const float* r = xp + m * H;
    vec acc = zero();
    for (int64_t k = 0; k < H; k += LANES) {
      auto mk = tail_mask(H - k);
      vec xv = load_x(r + k, mk);
      acc = fma(xv, xv, acc);
    }
    const float inv = 1.0f / std::sqrt(hsum(acc) / float(H) + float(eps));
    for (int64_t k = 0; k < H; ++k) op[m * H + k] = wp[k] * (r[k] * inv);
  }
  return out.view(x.sizes());
}

// x (1, M, hidden) -> q (1, H, M, D), k and v (1, Hkv, M, D): norm, one q|k|v product, rotary (Llama's half split).
std::vector<torch::Tensor> pre_attention(torch::Tensor x, torch::Tensor ln_w, double eps, torch::Tensor qkv_w,
                                         c10::optional<torch::Tensor> qkv_s, torch::Tensor cos, torch::Tensor sin,
                                         int64_t heads, int64_t kv_heads) {
  auto qkv = lin(rms_norm(x, ln_w, eps), qkv_w, qkv_s).contiguous();  // (1, M, (H + 2 Hkv) D)
  const int64_t M = x.size(1), D = qkv.size(2) / (heads + 2 * kv_heads), half = D / 2;
  auto c = cos.reshape({M, D}).contiguous(), sn = sin.reshape({M, D}).contiguous();
  auto q = torch::empty({1, heads, M, D}, x.options());
  auto k = torch::empty({1, kv_heads, M, D}, x.options());
  auto v = torch::empty({1, kv_heads, M, D}, x.options());
  const float* src = qkv.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = sn.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t h = 0; h < heads + 2 * kv_heads; ++h) {
      const float* a = src + (m * (heads + 2 * kv_heads) + h) * D;
      float* dst = h < heads ? q.data_ptr<float>() + (h * M + m) * D
                 : h < heads + kv_heads ? k.data_ptr<float>() + ((h - heads) * M + m) * D
                 : v.data_ptr<float>() + ((h - heads - kv_heads) * M + m) * D;
      if (h >= heads + kv_heads) {
        std::memcpy(dst, a, D * sizeof(float));
        continue;
      }
      for (int64_t d = 0; d < D; ++d) {
        const float rot = d < half ? -a[d + half] : a[d - half];
        dst[d] = a[d] * cp[m * D + d] + rot * sp[m * D + d];
      }
    }
  }
  return {q, k, v};
}

// The rest of the layer: attention over the cache, o_proj, residual, norm, SwiGLU MLP (gate|up in one product), residual.
torch::Tensor post_attention(torch::Tensor x, torch::Tensor q, torch::Tensor k, torch::Tensor v, double scaling,
                             torch::Tensor o_w, c10::optional<torch::Tensor> o_s, torch::Tensor ln_w, double eps,
                             torch::Tensor gu_w, c10::optional<torch::Tensor> gu_s, torch::Tensor d_w,
                             c10::optional<torch::Tensor> d_s, c10::optional<torch::Tensor> visible) {
  const int64_t M = x.size(1);
  auto a = attend(q[0], k[0], v[0], scaling, visible).reshape({1, M, -1});
  auto h = x + lin(a, o_w, o_s);
  auto gu = lin(rms_norm(h, ln_w, eps), gu_w, gu_s).contiguous();  // (1, M, 2I)
  const int64_t I = gu.size(2) / 2;
  auto act = torch::empty({1, M, I}, x.options());
  const float* g = gu.data_ptr<float>();
  float* ap = act.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)  // SiLU(gate) * up, 16 lanes at a time: gate / (1 + exp(-gate)) * up
    for (int64_t i = 0; i < I; i += LANES) {
      auto mk = tail_mask(I - i);
      const vec gate = load_x(g + m * 2 * I + i, mk), up = load_x(g + m * 2 * I + I + i, mk);
      const vec one = set1(1.0f);
      store_x(ap + m * I + i, mul(div(gate, add(one, exp16(mul(gate, set1(-1.0f))))), up), mk);
    }
  return h + lin(act, d_w, d_s);
}

std::string path() {
#ifdef ROWINV_AVX512
  return "avx512";
#else
  return "portable";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels touch tensors only: they run without the GIL, so lanes decoding in threads side by side (the app's
  // live Playback) overlap in them instead of taking turns
  using nogil = py::call_guard<py::gil_scoped_release>;
  m.def("linear", &linear, "row-invariant Y = X W^T", py::arg("x"), py::arg("w"), py::arg("scale") = py::none(),
        nogil());
  m.def("linear_a16", &linear_a16, "Y = X W^T, int8 W (plain or AMX-packed), X rounded to 16-bit integers per row",
        nogil());
  m.def("pack_amx", &pack_amx, "int8 (N, K) -> the AMX tile layout linear_a16 also takes");
  m.def("has_amx", &has_amx, "AMX int8 compiled in and granted by the OS");
  m.def("rms_norm", &rms_norm, "row-wise RMSNorm", nogil());
  m.def("pre_attention", &pre_attention, "norm, q|k|v, rotary", nogil());
  m.def("post_attention", &post_attention, "attention, o_proj, residual, norm, MLP, residual",
        py::arg("x"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scaling"), py::arg("o_w"), py::arg("o_s"),
        py::arg("ln_w"), py::arg("eps"), py::arg("gu_w"), py::arg("gu_s"), py::arg("d_w"), py::arg("d_s"),
        py::arg("visible") = py::none(), nogil());
  m.def("attend", &attend, "row-invariant attention, causal or over a tree's visible keys", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("scaling"), py::arg("visible") = py::none(), nogil());
  m.def("path", &path, "the SIMD path compiled in");
}
