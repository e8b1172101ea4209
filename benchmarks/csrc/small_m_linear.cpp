// A weight-streaming fp32 linear for a few rows (M <= 12 per pass), AVX2 + FMA: the experiment of
// benchmarks/small_m_linear.py (not part of mmspec). Each panel of 8 output columns is read once
// from a packed copy of the weight and multiplied with every row, so verifying k tokens reads the
// weights once, as a GPU does; MKL's sgemm reads them about once per row at this size. Every
// output element sums over k in the same order whatever M is, so a row's result does not depend
// on how many rows share the call.
#include <torch/extension.h>
#include <immintrin.h>

// W [N, K] fp32 -> panels [ceil(N/8)][K][8] (zero-padded)
torch::Tensor pack(torch::Tensor w) {
  auto wc = w.contiguous();
  int64_t N = wc.size(0), K = wc.size(1), P = (N + 7) / 8;
  auto out = torch::zeros({P, K, 8}, wc.options());
  const float* src = wc.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t p = 0; p < P; ++p)
    for (int64_t c = 0; c < 8 && p * 8 + c < N; ++c)
      for (int64_t k = 0; k < K; ++k) dst[(p * K + k) * 8 + c] = src[(p * 8 + c) * K + k];
  return out;
}

template <int MR>
static void panel(const float* x, int64_t K, const float* pw, float* acc_out) {
  __m256 acc[MR];
  for (int j = 0; j < MR; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 w = _mm256_loadu_ps(pw + k * 8);
    for (int j = 0; j < MR; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + j * K + k), w, acc[j]);
  }
  for (int j = 0; j < MR; ++j) _mm256_storeu_ps(acc_out + j * 8, acc[j]);
}

typedef void (*panel_fn)(const float*, int64_t, const float*, float*);
static const panel_fn PANELS[12] = {panel<1>, panel<2>, panel<3>, panel<4>, panel<5>, panel<6>,
                                    panel<7>, panel<8>, panel<9>, panel<10>, panel<11>, panel<12>};

// x [M, K], packed [P, K, 8], bias [N] or empty -> out [M, N]
torch::Tensor skinny_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, int64_t N) {
  auto xc = x.contiguous();
  int64_t M = xc.size(0), K = xc.size(1), P = packed.size(0);
  auto out = torch::empty({M, N}, xc.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  for (int64_t m0 = 0; m0 < M; m0 += 12) {
    int mr = (int)std::min<int64_t>(12, M - m0);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < P; ++p) {
      float tile[12 * 8];
      PANELS[mr - 1](xp + m0 * K, K, wp + p * K * 8, tile);
      int64_t cols = std::min<int64_t>(8, N - p * 8);
      for (int j = 0; j < mr; ++j)
        for (int64_t c = 0; c < cols; ++c)
          op[(m0 + j) * N + p * 8 + c] = tile[j * 8 + c] + (bp ? bp[p * 8 + c] : 0.f);
    }
  }
  return out;
}

TORCH_LIBRARY(mmspec_small_m, m) {
  m.def("pack(Tensor w) -> Tensor");
  m.def("skinny_linear(Tensor x, Tensor packed, Tensor bias, int N) -> Tensor");
  m.impl("pack", torch::kCPU, &pack);
  m.impl("skinny_linear", torch::kCPU, &skinny_linear);
}
