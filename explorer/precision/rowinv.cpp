// Row-invariant kernels for CPU decoding (explorer/precision), bound to torch tensors: Y = X W^T, causal (or
// token-tree) attention, and one Llama decoder layer in two calls. The kernels themselves, and the rule they keep
// (one fixed sequence of operations per output element whatever the number of rows), are in rowinv_core.h; the SIMD
// path (AVX-512, AVX2 + FMA, NEON or portable: rowinv_simd.h) is chosen when kernels.py builds this file, and every
// path gives the same bits. int8 weights can also run on Intel's AMX tiles (below), with the same integers.
//
// Built with -ffp-contract=off (no fused operations the source did not write).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

#define ROWINV_USE_ATEN 1  // threads split output columns (or attention rows) through torch's pool
#include "rowinv_core.h"

#if defined(ROWINV_WITH_AMX) && !defined(ROWINV_PATH_AVX512)
#error "the AMX build is an AVX-512 build"
#endif

namespace {

// ---- the same integer sums on AMX tiles (Intel Sapphire Rapids and later): a 16-bit activation x is split
// exactly into a signed high byte and an unsigned low byte, x = 256 * hi + lo, so sum_k x w = 256 * sum hi w +
// sum lo w, two int8 tile products (TDPBSSD, TDPBUSD) whose int32 sums are exact. The result is the integer the
// AVX-512 path computes, bit for bit, whatever the number of rows: a verify pass of 17 rows reads each weight
// tile once and costs little more than one row. Weights are packed once (``pack_amx``) into the tiles' layout:
// (N/16, K/64, 16, 64) with packed[b][c][r][4n + i] = W[16b + n][64c + 4r + i], zero-padded.
#if defined(ROWINV_WITH_AMX) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
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
  torch::Tensor vis;
  if (visible.has_value()) {
    vis = visible->to(torch::kBool).contiguous();
    TORCH_CHECK(vis.dim() == 2 && vis.size(0) == M && vis.size(1) == L, "rowinv.attend: visible must be (M, L)");
  }
  try {
    attend_impl(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), H, M, D, Hkv, L,
                static_cast<float>(scaling), vis.defined() ? vis.data_ptr<bool>() : nullptr, out.data_ptr<float>());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, e.what());
  }
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
  auto wc = w.contiguous();
  auto out = torch::empty_like(x2);
  rms_norm_impl(x2.data_ptr<float>(), x2.size(0), H, wc.data_ptr<float>(), float(eps), out.data_ptr<float>());
  return out.view(x.sizes());
}

// x (1, M, hidden) -> q (1, H, M, D), k and v (1, Hkv, M, D): norm, one q|k|v product, rotary (Llama's half split).
std::vector<torch::Tensor> pre_attention(torch::Tensor x, torch::Tensor ln_w, double eps, torch::Tensor qkv_w,
                                         c10::optional<torch::Tensor> qkv_s, torch::Tensor cos, torch::Tensor sin,
                                         int64_t heads, int64_t kv_heads) {
  auto qkv = lin(rms_norm(x, ln_w, eps), qkv_w, qkv_s).contiguous();  // (1, M, (H + 2 Hkv) D)
  const int64_t M = x.size(1), D = qkv.size(2) / (heads + 2 * kv_heads);
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
      rotary_impl(a, cp + m * D, sp + m * D, D, dst);
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
  silu_mul_impl(gu.data_ptr<float>(), M, I, act.data_ptr<float>());
  return h + lin(act, d_w, d_s);
}

// How many threads the kernels' parallel ranges reach at the caller's torch thread count: n items, one per chunk.
int64_t threads_used(int64_t n) {
  std::mutex lock;
  std::set<std::thread::id> ids;
  parallel_for(0, n, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // every chunk long enough for the team to split it
    std::lock_guard<std::mutex> guard(lock);
    ids.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(ids.size());
}

std::string path() {
#ifdef ROWINV_AMX
  return "amx";
#else
  return ROWINV_PATH_NAME;
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
  m.def("threads_used", &threads_used, "threads a parallel range of n items reaches", nogil());
}
