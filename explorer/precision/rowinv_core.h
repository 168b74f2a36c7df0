// The row-invariant kernels on plain arrays (no torch): rowinv.cpp binds them to tensors, rowinv_check.cpp checks
// their bits per SIMD path without torch (natively, and cross-compiled for aarch64 under qemu).
//
// The rule every kernel here keeps: the arithmetic that produces one output element is one fixed sequence of
// floating-point operations, whatever the number of rows M in the call (and whatever the thread that computes it:
// threads split output columns or attention rows, never a sum). A 4-row verify pass therefore gives each row bit for
// bit what a one-row pass gives (torch's own kernels pick a matrix-vector path for M = 1 and blocked gemm paths for
// larger M, which sum in other orders).
//
// With ROWINV_USE_ATEN (rowinv.cpp) ranges are split across torch's threads (at::parallel_for); without it (the check)
// they run in one thread.
#pragma once
#include <stdexcept>
#include <vector>

#include "rowinv_simd.h"

#ifdef ROWINV_USE_ATEN
#include <ATen/Parallel.h>
#endif

namespace {

// fn(b0, b1) over [begin, end): threads split output columns (or attention rows), never a sum, so bits do not change
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
#ifdef ROWINV_USE_ATEN
  at::parallel_for(begin, end, grain, fn);
#else
  (void)grain;
  if (begin < end) fn(begin, end);
#endif
}

// ---- linear, float / bfloat16 / int8 weights: y[m, n] = sum_k x[m, k] w[n, k] in LANES fixed lanes (lane l holds
// k = l, l + LANES, ...), an FMA per step in increasing k, one fixed horizontal sum, then (int8) the channel's scale.
// All M rows are computed while a block of weight rows is in cache, so a k-row pass reads the weights once.
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
  parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
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

// ---- int8 weights x 16-bit integer activations: integer sums, exact whatever their order (so the same on every
// path). Each activation row is rounded to integers of at most a16_level(K) in magnitude with its own scale, so the
// int32 sum over k cannot overflow; y = float(sum) * x_scale[m] * w_scale[n].
inline void quantize_rows(const float* x, int64_t M, int64_t K, int64_t Kp, int16_t* xq, float* xs) {
  const float level = float(a16_level(K));
  for (int64_t m = 0; m < M; ++m) quantize_row(x + m * K, K, Kp, level, xq + m * Kp, xs + m);
}

// The one-row tile is a function of its own and the tiles of several rows are inlined here: of the inlining
// choices timed interleaved (Zen 4, AVX-512 and AVX2 paths, 2026-12-05) the fastest at one row and at several;
// left to GCC, an OpenMP build ran 2-7 rows about 2x slower. Same integers whichever way: the bits do not change.
template <int nb>
__attribute__((noinline)) void tile_a16_row(const int16_t* xq, int64_t Kp, const float* xs, const int8_t* w,
                                            int64_t K, const float* ws, float* y, int64_t ldy) {
  tile_a16<1, nb>(xq, Kp, xs, w, K, ws, y, ldy);
}

template <int nb>
ROWINV_INLINE void rows_a16(const int16_t* xq, int64_t M, int64_t Kp, const float* xs, const int8_t* w, int64_t K,
                            const float* ws, float* y, int64_t N) {
  int64_t m = 0;
  if constexpr (A16_TILE3 && MB == 2) {
    if (M >= 3 && M % 2 == 1) {
      tile_a16<3, nb>(xq, Kp, xs, w, K, ws, y, N);
      m = 3;
    }
  }
  for (; m + MB <= M; m += MB) tile_a16<MB, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N);
  switch (M - m) {
    case 3: tile_a16<3, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N); break;
    case 2: tile_a16<2, nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N); break;
    case 1: tile_a16_row<nb>(xq + m * Kp, Kp, xs + m, w, K, ws, y + m * N, N); break;
    default: break;
  }
}

inline void linear_i8a16_impl(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, const float* ws,
                              float* y) {
  const int64_t Kp = (K + 31) / 32 * 32;
  std::vector<int16_t> xq(M * Kp);
  std::vector<float> xs(M);
  quantize_rows(x, M, K, Kp, xq.data(), xs.data());
  const int64_t blocks = (N + NB - 1) / NB;
  parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NB, nb = std::min<int64_t>(NB, N - n0);
      if (b + 1 < b1)  // the next block's every cache line: its rows are short streams the hardware misses
        for (int64_t off = 0; off < NB * K; off += 64) prefetch(w + (n0 + NB) * K + off);
      const int8_t* wb = w + n0 * K;
      switch (nb) {
        case 4: rows_a16<4>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
        case 3: rows_a16<3>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
        case 2: rows_a16<2>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
        default: rows_a16<1>(xq.data(), M, Kp, xs.data(), wb, K, ws + n0, y + n0, N); break;
      }
    }
  });
}

// One query row's softmax-weighted sum of values, D = 64: its keys, how many, 1 / the denominator, the values of its
// head group and where the output goes.
struct Row {
  const int64_t* js;
  int64_t seen;
  float inv;
  const float* vh;
  float* o;
};

// Such a sum in four registers, one key at a time: the row's key t adds one FMA a lane.
struct Sum64 {
  vec o0 = zero(), o1 = zero(), o2 = zero(), o3 = zero();
  ROWINV_INLINE void add(const Row& r, const float* p, int64_t t) {
    const auto full = tail_mask(LANES);
    const vec w = set1(p[t] * r.inv);
    const float* v = r.vh + r.js[t] * 4 * LANES;
    o0 = fma(w, load_x(v, full), o0);
    o1 = fma(w, load_x(v + LANES, full), o1);
    o2 = fma(w, load_x(v + 2 * LANES, full), o2);
    o3 = fma(w, load_x(v + 3 * LANES, full), o3);
  }
  ROWINV_INLINE void store(float* o) const {
    const auto full = tail_mask(LANES);
    store_x(o, o0, full);
    store_x(o + LANES, o1, full);
    store_x(o + 2 * LANES, o2, full);
    store_x(o + 3 * LANES, o3, full);
  }
};

// The weighted sums of rows a (scores pa) and b (scores pb; nullptr: a alone), interleaved: eight FMA chains instead
// of four. Each row's sum still adds its keys in the row's own order, one FMA each: the same bits as alone.
inline void head64_pair(const Row& a, const float* pa, const Row& b, const float* pb) {
  Sum64 sa, sb;
  const int64_t both = pb == nullptr ? 0 : std::min(a.seen, b.seen);
  for (int64_t t = 0; t < both; ++t) {
    sa.add(a, pa, t);
    sb.add(b, pb, t);
  }
  for (int64_t t = both; t < a.seen; ++t) sa.add(a, pa, t);
  sa.store(a.o);
  if (pb == nullptr) return;
  for (int64_t t = both; t < b.seen; ++t) sb.add(b, pb, t);
  sb.store(b.o);
}

// ---- attention. q (H, M, D), k and v (Hkv, L, D); query row i sits at position L - M + i and sees keys 0 .. L - M + i,
// or, with ``visible`` (M x L booleans: a token tree's mask), the keys j where visible[i, j]. Either way a row's keys
// are taken in increasing j, so a tree node over [prefix, its ancestors] sums exactly as the one-row pass over the
// same keys laid out contiguously. Query head h reads kv head h / (H / Hkv). out (M, H, D).
inline void attend_impl(const float* qp, const float* kp, const float* vp, int64_t H, int64_t M, int64_t D,
                        int64_t Hkv, int64_t L, float sc, const bool* visible, float* op) {
  constexpr int64_t DV = 8;  // D <= 128 in 16-lane registers
  if (D > DV * LANES) throw std::invalid_argument("rowinv.attend: head_dim > 128");
  if (H % Hkv != 0 || L < M) throw std::invalid_argument("rowinv.attend: bad shapes");
  const int64_t group = H / Hkv;
  std::vector<std::vector<int64_t>> keys(M);  // each query row's keys, in increasing order
  for (int64_t i = 0; i < M; ++i) {
    if (visible != nullptr) {
      for (int64_t j = 0; j < L; ++j)
        if (visible[i * L + j]) keys[i].push_back(j);
    } else {
      for (int64_t j = 0; j < L - M + i + 1; ++j) keys[i].push_back(j);
    }
    if (keys[i].empty()) throw std::invalid_argument("rowinv.attend: a query row sees no key");
  }
  // keys transposed, (Hkv, D, Lp) with Lp = L rounded up to 16 lanes: a row's scores come 64, 32 or 16 keys at a
  // time, each score one FMA per d in increasing d (the same sequence for a key whichever group it is computed in)
  const int64_t Lp = (L + LANES - 1) / LANES * LANES;
  std::vector<float> kt(Hkv * D * Lp);  // zeros past L
  for (int64_t g = 0; g < Hkv; ++g)  // 16 keys at a time: each d's 16 scores-to-be written as one line
    for (int64_t j0 = 0; j0 < L; j0 += LANES) {
      const int64_t n = std::min<int64_t>(LANES, L - j0);
      for (int64_t d = 0; d < D; ++d) {
        float* dst = kt.data() + (g * D + d) * Lp + j0;
        const float* src = kp + (g * L + j0) * D + d;
        for (int64_t l = 0; l < n; ++l) dst[l] = src[l * D];
      }
    }
  parallel_for(0, H * M, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(Lp), p2(Lp), kg(D * LANES);
    Row held{};
    bool waiting = false;  // a 64-wide row whose weighted sum waits for a second row to run beside it
    for (int64_t r = r0; r < r1; ++r) {
      float* pr = waiting ? p2.data() : p.data();  // this row's scores
      const int64_t h = r / M, i = r % M;
      const std::vector<int64_t>& js = keys[i];
      const int64_t seen = static_cast<int64_t>(js.size());
      const float* qr = qp + (h * M + i) * D;
      const float* kh = kt.data() + (h / group) * D * Lp;
      const float* vh = vp + (h / group) * L * D;
      float mx = -INFINITY;
      int64_t t = 0;
      // 64 (then 32) contiguous keys at a time: four (two) FMA chains side by side, where one chain waits on its own
      // latency. Each key's score is still one FMA per d in increasing d: its bits do not depend on the grouping.
      for (; t + 4 * LANES <= seen && js[t + 4 * LANES - 1] - js[t] == 4 * LANES - 1; t += 4 * LANES) {
        const auto full = tail_mask(LANES);
        const float* base = kh + js[t];
        vec a0 = zero(), a1 = zero(), a2 = zero(), a3 = zero();
        for (int64_t d = 0; d < D; ++d) {
          const vec qd = set1(qr[d]);
          const float* kd = base + d * Lp;
          a0 = fma(qd, load_x(kd, full), a0);
          a1 = fma(qd, load_x(kd + LANES, full), a1);
          a2 = fma(qd, load_x(kd + 2 * LANES, full), a2);
          a3 = fma(qd, load_x(kd + 3 * LANES, full), a3);
        }
        const vec s = set1(sc);
        store_x(pr + t, mul(a0, s), full);
        store_x(pr + t + LANES, mul(a1, s), full);
        store_x(pr + t + 2 * LANES, mul(a2, s), full);
        store_x(pr + t + 3 * LANES, mul(a3, s), full);
      }
      for (; t + 2 * LANES <= seen && js[t + 2 * LANES - 1] - js[t] == 2 * LANES - 1; t += 2 * LANES) {  // 32
        const auto full = tail_mask(LANES);
        const float* base = kh + js[t];
        vec a0 = zero(), a1 = zero();
        for (int64_t d = 0; d < D; ++d) {
          const vec qd = set1(qr[d]);
          a0 = fma(qd, load_x(base + d * Lp, full), a0);
          a1 = fma(qd, load_x(base + d * Lp + LANES, full), a1);
        }
        store_x(pr + t, mul(a0, set1(sc)), full);
        store_x(pr + t + LANES, mul(a1, set1(sc)), full);
      }
      for (; t < seen; t += LANES) {
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
        store_x(pr + t, mul(acc, set1(sc)), m);
      }
      float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;  // four chains; the maximum is exact
      int64_t u = 0;
      for (; u + 4 <= seen; u += 4) {
        m0 = pr[u] > m0 ? pr[u] : m0;
        m1 = pr[u + 1] > m1 ? pr[u + 1] : m1;
        m2 = pr[u + 2] > m2 ? pr[u + 2] : m2;
        m3 = pr[u + 3] > m3 ? pr[u + 3] : m3;
      }
      for (; u < seen; ++u) m0 = pr[u] > m0 ? pr[u] : m0;
      m0 = m1 > m0 ? m1 : m0;
      m2 = m3 > m2 ? m3 : m2;
      mx = m2 > m0 ? m2 : m0;
      const vec vmx = set1(mx);
      vec tot = zero();  // the denominator: lane l sums keys l, l + 16, ... in order, then a fixed 16-lane sum
      for (int64_t t = 0; t < seen; t += LANES) {  // 16 keys at a time, in the row's own key order
        auto m = tail_mask(seen - t);
        store_x(pr + t, exp16(add(load_x(pr + t, m), mul(vmx, set1(-1.0f)))), m);
        tot = add(tot, load_x(pr + t, m));
      }
      const float inv = 1.0f / hsum(tot);
      float* o = op + (i * H + h) * D;
      if (D == 4 * LANES) {  // the common head size: two rows' sums side by side, each in its own registers
        const Row cur{js.data(), seen, inv, vh, o};
        if (!waiting) {
          held = cur;
          waiting = true;
          continue;
        }
        head64_pair(held, p.data(), cur, pr);
        waiting = false;
        continue;
      }
      vec ov[DV];
      for (int64_t c = 0; c < DV; ++c) ov[c] = zero();
      for (int64_t t = 0; t < seen; ++t) {
        const vec pj = set1(pr[t] * inv);
        const float* vr = vh + js[t] * D;
        for (int64_t c = 0; c * LANES < D; ++c) ov[c] = fma(pj, load_x(vr + c * LANES, tail_mask(D - c * LANES)), ov[c]);
      }
      for (int64_t c = 0; c * LANES < D; ++c) store_x(o + c * LANES, ov[c], tail_mask(D - c * LANES));
    }
    if (waiting) head64_pair(held, p.data(), held, nullptr);
  });
}

// ---- Llama's RMSNorm, row by row: weight * (x * 1/sqrt(mean(x^2) + eps)), the mean a fixed 16-lane sum.
inline void rms_norm_impl(const float* xp, int64_t rows, int64_t H, const float* wp, float eps, float* op) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* r = xp + m * H;
    vec acc = zero();
    for (int64_t k = 0; k < H; k += LANES) {
      auto mk = tail_mask(H - k);
      vec xv = load_x(r + k, mk);
      acc = fma(xv, xv, acc);
    }
    const float inv = 1.0f / std::sqrt(hsum(acc) / float(H) + eps);
    for (int64_t k = 0; k < H; ++k) op[m * H + k] = wp[k] * (r[k] * inv);
  }
}

// ---- SwiGLU's SiLU(gate) * up for rows of [gate | up] (2I wide), 16 lanes at a time: gate / (1 + exp(-gate)) * up
inline void silu_mul_impl(const float* g, int64_t rows, int64_t I, float* ap) {
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t i = 0; i < I; i += LANES) {
      auto mk = tail_mask(I - i);
      const vec gate = load_x(g + m * 2 * I + i, mk), up = load_x(g + m * 2 * I + I + i, mk);
      const vec one = set1(1.0f);
      store_x(ap + m * I + i, mul(div(gate, add(one, exp16(mul(gate, set1(-1.0f))))), up), mk);
    }
}

// ---- rotary embedding, Llama's half split, on one head vector: dst = a * cos + rotate_half(a) * sin
inline void rotary_impl(const float* a, const float* cp, const float* sp, int64_t D, float* dst) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) {
    const float rot = d < half ? -a[d + half] : a[d - half];
    dst[d] = a[d] * cp[d] + rot * sp[d];
  }
}

}  // namespace
