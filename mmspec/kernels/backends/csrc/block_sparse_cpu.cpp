// Fused block-sparse attention forward for x86 CPUs (fp32), the fast path of the "torch" backend.
//
// One task per (batch, head, query block): walk the full then the partial key blocks of its row in
// chunks of up to kChunk blocks packed side by side (one large gemm beats many 128x128 ones: BLAS
// call overhead dominated the first version), S = scale * Q K^T, an online softmax across chunks
// with ATen's vectorised exp_u20 (the fast exp PyTorch's own CPU flash attention uses), and
// acc += P V with a second gemm. Scores stay in cache.
// With softcap > 0 the scores are soft-capped, S -> softcap * tanh(S / softcap) (Gemma 2).
// Rows with no kept key give out = 0 and lse = -inf.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Fortran BLAS sgemm, exported by libtorch_cpu (MKL on x86 wheels); column-major.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
using Vec = at::vec::Vectorized<float>;

namespace {

inline void gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kChunk = 16;  // key blocks per gemm: 16 x 128 keys keep the tiles in L2

// Online-softmax update of one score row s[0..n); returns the row's new max.
inline void softmax_row(float* s, int64_t n, float& m, float& l, float* acc, int64_t d) {
  float row_max = kNegInf;
  int64_t j = 0;
  if (n >= Vec::size()) {
    Vec vmax(kNegInf);
    for (; j + Vec::size() <= n; j += Vec::size()) vmax = at::vec::maximum(vmax, Vec::loadu(s + j));
    row_max = at::vec::vec_reduce_all<float>(
        [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vmax);
  }
  for (; j < n; ++j) row_max = std::max(row_max, s[j]);
  const float m_new = std::max(m, row_max);
  if (m_new == kNegInf) {  // nothing attended yet in this row: p = 0
    std::fill(s, s + n, 0.f);
    return;
  }
  const float alpha = std::exp(m - m_new);  // exp(-inf) = 0 on the first kept block
  Vec vm(m_new), vsum(0.f);
  for (j = 0; j + Vec::size() <= n; j += Vec::size()) {
    Vec p = (Vec::loadu(s + j) - vm).exp_u20();
    p.store(s + j);
    vsum = vsum + p;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, vsum);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - m_new);
    sum += s[j];
  }
  l = l * alpha + sum;
  if (alpha != 1.f) {
    Vec va(alpha);
    int64_t c = 0;
    for (; c + Vec::size() <= d; c += Vec::size()) (Vec::loadu(acc + c) * va).store(acc + c);
    for (; c < d; ++c) acc[c] *= alpha;
  }
  m = m_new;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> block_sparse_forward(
    const at::Tensor& q,           // [B, Hq, Mq*bq, D] fp32, contiguous, padded to whole blocks
    const at::Tensor& k,           // [B, Hkv, Nk*bk, D]
    const at::Tensor& v,           // [B, Hkv, Nk*bk, D]
    // mask tensors, contiguous, batch/head dims MB in {1, B} and MH in {1, Hq} (broadcast)
    const at::Tensor& full_num,    // [MB, MH, Mq] int32
    const at::Tensor& full_idx,    // [MB, MH, Mq, F] int32
    const at::Tensor& part_num,    // [MB, MH, Mq] int32
    const at::Tensor& part_idx,    // [MB, MH, Mq, P] int32
    const at::Tensor& part_mask,   // [MB, MH, Mq, P, bq, bk] uint8
    int64_t bq, int64_t bk, int64_t kv_len, double scale, double softcap) {
  const int64_t B = q.size(0), H = q.size(1), NQ = q.size(2), D = q.size(3);
  const int64_t HKV = k.size(1), NK = k.size(2), MQ = NQ / bq, group = H / HKV;
  const int64_t F = full_idx.size(3), P = part_idx.size(3);
  const int64_t MB = full_num.size(0), MH = full_num.size(1);
  auto out = at::zeros_like(q);
  auto lse = at::full({B, H, NQ}, kNegInf, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const int32_t* fn = full_num.data_ptr<int32_t>();
  const int32_t* fi = full_idx.data_ptr<int32_t>();
  const int32_t* pn = part_num.data_ptr<int32_t>();
  const int32_t* pi = part_idx.data_ptr<int32_t>();
  const uint8_t* pm = part_mask.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const float fscale = static_cast<float>(scale), fcap = static_cast<float>(softcap);

  at::parallel_for(0, B * H * MQ, 1, [&](int64_t begin, int64_t end) {
    // per task: up to kChunk kept blocks packed side by side, so each chunk is two large gemms
    std::vector<float> kbuf(kChunk * bk * D), vbuf(kChunk * bk * D), s(bq * kChunk * bk);
    std::vector<float> acc(bq * D), m(bq), l(bq);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * MQ), h = (row / MQ) % H, mb = row % MQ;
      const float* qrow = qp + ((b * H + h) * NQ + mb * bq) * D;
      const int64_t kv_off = (b * HKV + h / group) * NK * D;
      const int64_t mrow = ((b % MB) * MH + h % MH) * MQ + mb;  // the mask's row (broadcast)
      const int n_full = fn[mrow], n_part = pn[mrow], total = n_full + n_part;
      if (total == 0) continue;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      for (int c0 = 0; c0 < total; c0 += kChunk) {
        const int nb = std::min<int>(kChunk, total - c0);
        const int64_t w = nb * bk;  // keys in this chunk
        bool masked = false;
        for (int j = 0; j < nb; ++j) {
          const int t = c0 + j;
          const int64_t blk = t >= n_full ? pi[mrow * P + (t - n_full)] : fi[mrow * F + t];
          std::memcpy(kbuf.data() + j * bk * D, kp + kv_off + blk * bk * D, bk * D * sizeof(float));
          std::memcpy(vbuf.data() + j * bk * D, vp + kv_off + blk * bk * D, bk * D * sizeof(float));
          masked = masked || t >= n_full || (blk + 1) * bk > kv_len;
        }
        // S^T (col-major w x bq) = Kbuf (w x D) . Q^T: S row-major [bq, w]
        gemm('T', 'N', w, bq, D, fscale, kbuf.data(), D, qrow, D, 0.f, s.data(), w);
        // soft cap before the masks below: tanh(-inf) would turn a dropped key into -softcap
        if (fcap > 0.f) {
          const Vec vcap(fcap), vinv(1.f / fcap);
          int64_t e = 0;
          for (; e + Vec::size() <= bq * w; e += Vec::size()) {
            ((Vec::loadu(s.data() + e) * vinv).tanh() * vcap).store(s.data() + e);
          }
          for (; e < bq * w; ++e) s[e] = fcap * std::tanh(s[e] / fcap);
        }
        if (masked) {  // the ragged key tail and the element masks of partial blocks
          for (int j = 0; j < nb; ++j) {
            const int t = c0 + j;
            const int64_t blk = t >= n_full ? pi[mrow * P + (t - n_full)] : fi[mrow * F + t];
            const int64_t valid = std::min(bk, kv_len - blk * bk);
            const uint8_t* em = t >= n_full ? pm + (mrow * P + (t - n_full)) * bq * bk : nullptr;
            for (int64_t r = 0; r < bq; ++r) {
              float* sr = s.data() + r * w + j * bk;
              for (int64_t c = valid; c < bk; ++c) sr[c] = kNegInf;
              if (em) {
                for (int64_t c = 0; c < valid; ++c) if (!em[r * bk + c]) sr[c] = kNegInf;
              }
            }
          }
        }
        for (int64_t r = 0; r < bq; ++r) {
          softmax_row(s.data() + r * w, w, m[r], l[r], acc.data() + r * D, D);
        }
        // acc^T (col-major D x bq) += Vbuf^T (D x w) . P^T (w x bq)
        gemm('N', 'N', D, bq, w, 1.f, vbuf.data(), D, s.data(), w, 1.f, acc.data(), D);
      }
      float* orow = op + ((b * H + h) * NQ + mb * bq) * D;
      float* lrow = lp + (b * H + h) * NQ + mb * bq;
      for (int64_t r = 0; r < bq; ++r) {
        if (l[r] == 0.f) continue;
        const float inv = 1.f / l[r];
        for (int64_t c = 0; c < D; ++c) orow[r * D + c] = acc[r * D + c] * inv;
        lrow[r] = m[r] + std::log(l[r]);
      }
    }
  });
  return {out, lse};
}

TORCH_LIBRARY(mmspec_cpu, lib) {
  lib.def("block_sparse_forward(Tensor q, Tensor k, Tensor v, Tensor full_num, Tensor full_idx, "
          "Tensor part_num, Tensor part_idx, Tensor part_mask, int bq, int bk, int kv_len, "
          "float scale, float softcap) -> (Tensor, Tensor)");
  lib.impl("block_sparse_forward", c10::DispatchKey::CPU, &block_sparse_forward);
}
