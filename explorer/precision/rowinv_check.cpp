// The row-invariant kernels (rowinv_core.h) checked without torch, one SIMD path per build (kernels.check_path):
// for every kernel and every row count M = 1 .. 16, each row of the M-row call must equal, bit for bit, the one-row
// call on that row alone; a line "<kernel> <digest>" gives a digest of the outputs, the same on every path.
// Exit code 1 when a row differs. "--negative" runs the same checker on a kernel made to sum in another order when
// it has several rows (a negative control: the checker must catch it, and says so).
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "rowinv_core.h"

namespace {

struct Rng {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  float next(float lo, float hi) {  // xorshift64*: the same numbers on every machine
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    const uint64_t r = s * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * float(r >> 40) / float(1 << 24);
  }
  std::vector<float> floats(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = next(lo, hi);
    return v;
  }
};

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

int failures = 0;

// fn(M, out): the M-row call into out (M * width); one(i, out): row i alone into out (width)
void check(const char* name, int64_t width, const std::function<void(int64_t, float*)>& fn,
           const std::function<void(int64_t, float*)>& one, bool quiet = false) {
  std::vector<float> single(16 * width), many(16 * width);
  for (int64_t i = 0; i < 16; ++i) one(i, single.data() + i * width);
  uint64_t digest = fnv(single.data(), single.size() * sizeof(float));
  int bad = 0;
  for (int64_t M = 1; M <= 16; ++M) {
    fn(M, many.data());
    for (int64_t i = 0; i < M; ++i)
      if (std::memcmp(many.data() + i * width, single.data() + i * width, width * sizeof(float)) != 0) {
        if (!quiet) std::printf("FAIL %s: row %" PRId64 " of a %" PRId64 "-row call differs from its one-row call\n",
                                name, i, M);
        ++bad;
        break;
      }
    digest = fnv(many.data(), M * width * sizeof(float), digest);
  }
  failures += bad;
  std::printf("%s %016" PRIx64 "%s\n", name, digest, bad ? " rows-differ" : "");
}

template <typename W>
void check_linear(const char* name, int64_t K, int64_t N, const std::vector<W>& w, const float* scale, Rng& rng) {
  const auto x = rng.floats(16 * K);
  check(name, N,
        [&](int64_t M, float* y) { linear_impl<W>(x.data(), M, K, w.data(), N, scale, y); },
        [&](int64_t i, float* y) { linear_impl<W>(x.data() + i * K, 1, K, w.data(), N, scale, y); });
}

void check_a16(const char* name, int64_t K, int64_t N, Rng& rng) {
  std::vector<int8_t> w(N * K);
  for (auto& v : w) v = int8_t(int(rng.next(-127.0f, 128.0f)));
  const auto ws = rng.floats(N, 0.001f, 0.01f);
  auto x = rng.floats(16 * K, -3.0f, 3.0f);
  for (int64_t k = 0; k < K; ++k) x[7 * K + k] = 0.0f;
  check(name, N,
        [&](int64_t M, float* y) { linear_i8a16_impl(x.data(), M, K, w.data(), N, ws.data(), y); },
        [&](int64_t i, float* y) { linear_i8a16_impl(x.data() + i * K, 1, K, w.data(), N, ws.data(), y); });
}

void check_attention(const char* name, int64_t H, int64_t Hkv, int64_t D, int64_t P, bool tree, Rng& rng) {
  const int64_t Lmax = P + 16;
  const auto q = rng.floats(16 * H * D), k = rng.floats(Hkv * Lmax * D, -2.0f, 2.0f), v = rng.floats(Hkv * Lmax * D);
  // a tree's mask: row i sees the prefix, itself and the earlier rows i' with (i - i') % 3 == 0 (not contiguous)
  auto sees = [&](int64_t i, int64_t j) { return j < P || (j - P <= i && (tree ? (i - (j - P)) % 3 == 0 : true)); };
  // (H, M, D) queries of rows 0..M-1; keys and values of positions 0..P+M-1, (Hkv, L, D)
  auto run = [&](const std::vector<int64_t>& rows, const std::vector<int64_t>& keys, const bool* vis, float* out) {
    const int64_t M = int64_t(rows.size()), L = int64_t(keys.size());
    std::vector<float> qq(H * M * D), kk(Hkv * L * D), vv(Hkv * L * D), o(M * H * D);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < M; ++i) std::memcpy(&qq[(h * M + i) * D], &q[(rows[i] * H + h) * D], D * 4);
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t j = 0; j < L; ++j) {
        std::memcpy(&kk[(g * L + j) * D], &k[(g * Lmax + keys[j]) * D], D * 4);
        std::memcpy(&vv[(g * L + j) * D], &v[(g * Lmax + keys[j]) * D], D * 4);
      }
    attend_impl(qq.data(), kk.data(), vv.data(), H, M, D, Hkv, L, 0.125f, vis, o.data());
    std::memcpy(out, o.data(), o.size() * 4);
  };
  check(name, H * D,
        [&](int64_t M, float* out) {
          std::vector<int64_t> rows(M), keys(P + M);
          for (int64_t i = 0; i < M; ++i) rows[i] = i;
          for (int64_t j = 0; j < P + M; ++j) keys[j] = j;
          std::vector<char> vis(M * (P + M));
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < P + M; ++j) vis[i * (P + M) + j] = sees(i, j);
          run(rows, keys, tree ? reinterpret_cast<const bool*>(vis.data()) : nullptr, out);
        },
        [&](int64_t i, float* out) {  // row i over its own keys laid out contiguously, causal
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < P + 16; ++j)
            if (sees(i, j)) keys.push_back(j);
          run({i}, keys, nullptr, out);
        });
}

// A kernel that sums in lanes for one row and in plain order for several (as torch's kernels switch paths by the
// number of rows): the checker must catch it.
void broken_linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  if (M == 1) return linear_impl<float>(x, 1, K, w, N, nullptr, y);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s = s + x[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
}

}  // namespace

int main(int argc, char** argv) {
  Rng rng;
  if (argc > 1 && std::string(argv[1]) == "--negative") {
    const int64_t K = 200, N = 13;
    const auto w = rng.floats(N * K), x = rng.floats(16 * K);
    check("broken_linear", N, [&](int64_t M, float* y) { broken_linear(x.data(), M, K, w.data(), N, y); },
          [&](int64_t i, float* y) { broken_linear(x.data() + i * K, 1, K, w.data(), N, y); }, true);
    std::printf("negative control: %s\n", failures ? "caught" : "NOT caught");
    return failures ? 0 : 1;
  }
  std::printf("path %s\n", ROWINV_PATH_NAME);
  for (const int64_t K : {200, 576}) {
    const int64_t N = K == 200 ? 13 : 64;
    const std::string tag = "K" + std::to_string(K);
    const auto wf = rng.floats(N * K);
    std::vector<uint16_t> wb(N * K);
    for (size_t i = 0; i < wb.size(); ++i) { uint32_t u; std::memcpy(&u, &wf[i], 4); wb[i] = uint16_t(u >> 16); }
    std::vector<int8_t> wi(N * K);
    for (auto& v : wi) v = int8_t(int(rng.next(-127.0f, 128.0f)));
    const auto scale = rng.floats(N, 0.001f, 0.01f);
    check_linear<float>(("linear_f32_" + tag).c_str(), K, N, wf, nullptr, rng);
    check_linear<uint16_t>(("linear_bf16_" + tag).c_str(), K, N, wb, nullptr, rng);
    check_linear<int8_t>(("linear_i8_" + tag).c_str(), K, N, wi, scale.data(), rng);
    check_a16(("linear_a16_" + tag).c_str(), K, N, rng);
  }
  check_attention("attend_causal", 4, 2, 24, 21, false, rng);
  check_attention("attend_causal_d64", 9, 3, 64, 40, false, rng);
  check_attention("attend_tree", 4, 2, 24, 21, true, rng);
  check_attention("attend_causal_p100", 9, 3, 64, 100, false, rng);  // 64 keys at a time, then 16, then the tail
  check_attention("attend_tree_p60", 4, 2, 24, 60, true, rng);  // alone: 64 at a time; batched: 16, gathered
  check_attention("attend_tree_p28", 4, 2, 24, 28, true, rng);  // alone: 32 at a time; batched: 16, gathered
  {
    const int64_t H = 200;
    const auto x = rng.floats(16 * H, -4.0f, 4.0f), w = rng.floats(H);
    check("rms_norm", H, [&](int64_t M, float* o) { rms_norm_impl(x.data(), M, H, w.data(), 1e-5f, o); },
          [&](int64_t i, float* o) { rms_norm_impl(x.data() + i * H, 1, H, w.data(), 1e-5f, o); });
  }
  {
    const int64_t I = 100;  // gates from -100 to 100: exp's clamp, its underflow to 0 and its polynomial
    const auto g = rng.floats(16 * 2 * I, -100.0f, 100.0f);
    check("silu_mul", I, [&](int64_t M, float* o) { silu_mul_impl(g.data(), M, I, o); },
          [&](int64_t i, float* o) { silu_mul_impl(g.data() + i * 2 * I, 1, I, o); });
  }
  {
    const int64_t D = 64;
    const auto a = rng.floats(16 * D), c = rng.floats(16 * D), s = rng.floats(16 * D);
    check("rotary", D, [&](int64_t M, float* o) { for (int64_t i = 0; i < M; ++i) rotary_impl(&a[i * D], &c[i * D], &s[i * D], D, o + i * D); },
          [&](int64_t i, float* o) { rotary_impl(&a[i * D], &c[i * D], &s[i * D], D, o); });
  }
  std::printf("%s\n", failures ? "rows differ" : "every row equals its one-row call");
  return failures ? 1 : 0;
}
