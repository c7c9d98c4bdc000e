// Fused CPU attention with a relative bias computed inside the kernel: forward and backward.
//
// Forward: softmax_j(q_i k_j / sqrt(d) + PE(i, j) [+ causal mask]) v_j, one block of query
// rows against one block of keys at a time, with an online softmax (running maximum and sum
// per row), so that no q_len x k_len tensor exists. PE(i, j) is added to each block of
// scores as it is computed:
//   OffsetBias: PE(i, j) = table[h, i - j - lowest], read from the reversed table
//     rtable[h, m] = PE(hi - m) (hi = the highest offset), so that the bias of a row is a
//     contiguous run of rtable: PE(i, j) = rtable[h, hi - i + j];
//   FireBias: FIRE's f(psi(|i - j|) / psi(max(L, i))), with psi(|i - j|) read the same way
//     from a reversed table shared by the heads and f the MLP with its non-switching hidden
//     units folded into slope * x + intercept;
//   ForgettingBias: the Forgetting Transformer's PE(i, j) = F_i - F_j, F the cumulative sum of
//     the log forget gates of one sequence and head, read as two float32 parts hi + lo of the
//     float64 F, PE = (hi_i - hi_j) + (lo_i - lo_j) (hi_i - hi_j is exact where it matters).
// The forward also returns each row's log-sum-exp, which is all the backward keeps of it.
//
// Small weights are dropped, exactly: a weight below 2^-64 of its row's largest adds less
// than k_len * 2^-64 of the row's sum, far below float32's rounding (2^-24), so it is set to
// zero instead of being computed. That keeps denormal floats (slow on x86 unless the process
// flushes them) out of every product, and lets a whole block of keys be skipped when a bound
// on its scores (|q_i| |k_j| / sqrt(d) + the largest bias of its offsets) lies 64 * ln 2
// below the running maximum of every row: the key blocks are visited in the order of their
// bounds, the most promising first, so steep biases skip most far blocks.
//
// Backward (FlashAttention-2's, in the transposed layout): per head, for each block of keys
// and block of queries, recompute S^T = K Q^T / sqrt(d) + PE^T, P^T = exp(S^T - lse), then
// dP^T = V dO^T, dS^T = P^T (dP^T - rowsum(dO o O)), dV += P^T dO, dK += dS^T Q / sqrt(d),
// dQ^T += K^T dS^T. A column of dS^T is one key against consecutive queries, i.e.
// consecutive offsets: the bias's gradient is reduced per offset with vector adds
// (OffsetBias), through FIRE's MLP per score (FireBias), or per key and per query
// (ForgettingBias: dF_j -= sum_r dS^T[r], dF_i += dS^T[r]). Threads take whole (batch, head)
// pairs, whichever is next; each pair's gradient of the bias goes into a buffer of its own,
// and the buffers are summed in the order of the pairs: the same bits on every run, with
// any number of threads.
// Matrix products go through oneDNN's batch-reduce GEMM (at::native::cpublas::brgemm).
// Every op takes float32 or bfloat16 q, k, v (bfloat16 is read into float32: the arithmetic
// is float32's). The forward returns its output in float32 (the caller rounds it to q's
// dtype; the backward reads the float32 output); the backward returns the gradients of
// q, k, v in their dtype. Built on first use by relbias/attention/fused.py.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();
// ln(2^-64): a weight exp(s - max) below exp(kDropLog) is set to zero (see the top).
constexpr float kDropLog = -44.3614195558365f;

// s[c] += run[c] for c < n
inline void add_run(float* s, const float* run, int64_t n) {
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    (Vec::loadu(s + c) + Vec::loadu(run + c)).store(s + c);
  }
  for (; c < n; ++c) s[c] += run[c];
}

// s[c] += run[c] for c < n; returns the largest s[c] after the addition
inline float add_run_max(float* s, const float* run, int64_t n);

// the lanes of v folded with op, starting from init
template <typename Op>
inline float fold_lanes(const Vec& v, Op op, float init) {
  float lanes[Vec::size()];
  v.store(lanes);
  for (int64_t k = 0; k < Vec::size(); ++k) init = op(init, lanes[k]);
  return init;
}

inline float lane_sum(const Vec& v) {
  return fold_lanes(v, [](float a, float b) { return a + b; }, 0.f);
}

inline float add_run_max(float* s, const float* run, int64_t n) {
  Vec vmax(kNegInf);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    const Vec sum = Vec::loadu(s + c) + Vec::loadu(run + c);
    sum.store(s + c);
    vmax = at::vec::maximum(vmax, sum);
  }
  float m = fold_lanes(vmax, [](float a, float b) { return std::max(a, b); }, kNegInf);
  for (; c < n; ++c) {
    s[c] += run[c];
    m = std::max(m, s[c]);
  }
  return m;
}

// exp(x), or 0 where x < kDropLog (the weight is dropped: no denormal is ever formed)
inline Vec exp_or_zero(const Vec& x) {
  const Vec floor(kDropLog);
  return (x >= floor) & at::vec::maximum(x, floor).exp_u20();
}

inline float exp_or_zero(float x) { return x >= kDropLog ? std::exp(x) : 0.f; }

// s[c] = exp(s[c] - m) (dropped below kDropLog), returns the sum
inline float exp_sum(float* s, int64_t n, float m) {
  const Vec vm(m);
  Vec vsum(0.f);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    Vec e = exp_or_zero(Vec::loadu(s + c) - vm);
    e.store(s + c);
    vsum = vsum + e;
  }
  float sum = lane_sum(vsum);
  for (; c < n; ++c) {
    s[c] = exp_or_zero(s[c] - m);
    sum += s[c];
  }
  return sum;
}

// ---- the biases ----------------------------------------------------------------------------
// Each bias adds PE to a run of scores in the forward's layout (one query, consecutive keys:
// add_row, which also returns the run's largest score) and in the backward's (one key,
// consecutive queries: add_col), bounds PE over a
// block of queries and keys from above (bound), and accumulates its gradient from a run of
// dS^T (grad_col) into the Grad of one (batch, head) pair (the caller sums those in the order
// of the pairs, so that the sum is the same on every run). Each takes bh, the index of the
// (batch, head) pair, and reads what it needs of it (the head bh % heads, or the sequence's
// own tensors).

struct OffsetBias {
  const float* rtable;  // [heads, width]: rtable[h, m] = PE(hi - m)
  int64_t heads, width, hi, lowest;
  std::vector<float> table;      // [heads, width] in offset order: table[h, t] = PE(lowest + t)
  std::vector<float> chunk_max;  // [heads, chunks]: the largest PE of each kChunk offsets
  static constexpr int64_t kChunk = 64;
  int64_t chunks;

  OffsetBias(const float* rtable_, int64_t heads_, int64_t width_, int64_t hi_)
      : rtable(rtable_), heads(heads_), width(width_), hi(hi_), lowest(hi_ - width_ + 1),
        table(heads_ * width_), chunks((width_ + kChunk - 1) / kChunk) {
    chunk_max.assign(heads * chunks, kNegInf);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < width; ++t) {
        const float pe = rtable[h * width + width - 1 - t];
        table[h * width + t] = pe;
        float& m = chunk_max[h * chunks + t / kChunk];
        m = std::max(m, pe);
      }
    }
  }

  // s[c] += PE(i, c0 + c) for c < n; returns the largest s[c]
  float add_row(int64_t bh, int64_t i, int64_t /*row*/, int64_t c0, int64_t n, float* s) const {
    return add_run_max(s, rtable + bh % heads * width + (hi - i + c0), n);
  }
  void add_col(int64_t bh, int64_t i0, int64_t /*row0*/, int64_t j, int64_t n, float* s) const {
    add_run(s, table.data() + bh % heads * width + (i0 - j - lowest), n);
  }
  // an upper bound of PE(i, j) for queries i0 .. i1 and keys c0 .. c1: the largest PE of
  // the offsets i0 - c1 .. i1 - c0 (the whole chunks they touch)
  float bound(int64_t bh, int64_t i0, int64_t i1, int64_t c0, int64_t c1) const {
    const int64_t h = bh % heads, lo = i0 - c1, hi_offset = i1 - c0;
    const int64_t first = std::max<int64_t>(lo - lowest, 0) / kChunk;
    const int64_t last = std::min<int64_t>(hi_offset - lowest, width - 1) / kChunk;
    float m = kNegInf;
    for (int64_t c = first; c <= last; ++c) m = std::max(m, chunk_max[h * chunks + c]);
    return m;
  }

  struct Grad {
    std::vector<float> table;  // [width] in offset order: one (batch, head) pair's
    explicit Grad(const OffsetBias& b) : table(b.width, 0.f) {}
  };
  // grad.table[offset(i0 + r, j)] += ds[r] for r < n
  void grad_col(int64_t /*bh*/, int64_t i0, int64_t /*row0*/, int64_t j, int64_t n,
                const float* ds, Grad& g) const {
    add_run(g.table.data() + (i0 - j - lowest), ds, n);
  }
};

struct FireBias {
  const float* rpsi;  // [width]: psi(|hi - m|), reversed offset order as OffsetBias's rtable
  int64_t width, hi, lowest;
  const float* inv_den;  // [q_len] or [batch, q_len]: 1 / (psi(max(L, i)) + eps) per query row
  int64_t inv_stride;    // 0, or q_len where each sequence has its own rows
  int64_t heads, units;
  const float *w1, *b1, *w2;       // [units], [units], [heads, units]
  const float *slope, *intercept;  // [heads]
  std::vector<float> psi;          // [width] in offset order

  FireBias(const float* rpsi_, int64_t width_, int64_t hi_, const float* inv_den_,
           int64_t inv_stride_, int64_t heads_, int64_t units_, const float* w1_,
           const float* b1_, const float* w2_, const float* slope_, const float* intercept_)
      : rpsi(rpsi_), width(width_), hi(hi_), lowest(hi_ - width_ + 1), inv_den(inv_den_),
        inv_stride(inv_stride_), heads(heads_), units(units_), w1(w1_), b1(b1_), w2(w2_),
        slope(slope_),
        intercept(intercept_), psi(width_) {
    for (int64_t t = 0; t < width; ++t) psi[t] = rpsi[width - 1 - t];
  }

  // f_h(x[c]) added to s[c], x[c] = xnum[c] * (inv ? inv[c] : inv_one); returns the
  // largest s[c]
  float add_mlp(int64_t h, const float* xnum, const float* inv, float inv_one, int64_t n,
                float* s) const {
    const float* w2h = w2 + h * units;
    const Vec vslope(slope[h]), vicpt(intercept[h]), zero(0.f);
    Vec vmax(kNegInf);
    for (int64_t c = 0; c < n; c += Vec::size()) {
      const int64_t lanes = std::min<int64_t>(Vec::size(), n - c);
      const Vec vinv = inv ? Vec::loadu(inv + c, lanes) : Vec(inv_one);
      const Vec x = Vec::loadu(xnum + c, lanes) * vinv;
      Vec out = at::vec::fmadd(x, vslope, vicpt);
      for (int64_t u = 0; u < units; ++u) {
        Vec hidden = at::vec::maximum(at::vec::fmadd(x, Vec(w1[u]), Vec(b1[u])), zero);
        out = at::vec::fmadd(hidden, Vec(w2h[u]), out);
      }
      const Vec sum = Vec::loadu(s + c, lanes) + out;
      sum.store(s + c, lanes);
      // lanes past n hold 0 + f(0): keep them out of the maximum
      vmax = at::vec::maximum(vmax, lanes == Vec::size() ? sum : Vec::set(Vec(kNegInf), sum, lanes));
    }
    return fold_lanes(vmax, [](float a, float b) { return std::max(a, b); }, kNegInf);
  }
  // the denominators of pair bh's sequence
  const float* inv_of(int64_t bh) const { return inv_den + bh / heads * inv_stride; }
  float add_row(int64_t bh, int64_t i, int64_t row, int64_t c0, int64_t n, float* s) const {
    return add_mlp(bh % heads, rpsi + (hi - i + c0), nullptr, inv_of(bh)[row], n, s);
  }
  void add_col(int64_t bh, int64_t i0, int64_t row0, int64_t j, int64_t n, float* s) const {
    add_mlp(bh % heads, psi.data() + (i0 - j - lowest), inv_of(bh) + row0, 0.f, n, s);
  }
  // never skips a block
  float bound(int64_t, int64_t, int64_t, int64_t, int64_t) const { return kInf; }

  // one (batch, head) pair's: the gradients of w2, slope and intercept are its head's
  struct Grad {
    std::vector<float> psi, inv;  // [width] in offset order, [q_len]
    std::vector<Vec> w1, b1, w2;  // per-lane sums: [units] each (w2: the head's row)
    Vec slope{0.f}, intercept{0.f};
    Grad(const FireBias& b, int64_t q_len)
        : psi(b.width, 0.f), inv(q_len, 0.f), w1(b.units, Vec(0.f)), b1(b.units, Vec(0.f)),
          w2(b.units, Vec(0.f)) {}
  };
  // The gradient of sum_r ds[r] f_h(x_r), x_r = psi(|i0 + r - j|) * inv_den[row0 + r]
  void grad_col(int64_t bh, int64_t i0, int64_t row0, int64_t j, int64_t n, const float* ds,
                Grad& g) const {
    const int64_t h = bh % heads, t0 = i0 - j - lowest;
    const float* p = psi.data() + t0;
    const float* inv = inv_of(bh) + row0;
    float* dpsi = g.psi.data() + t0;
    float* dinv = g.inv.data() + row0;
    const float* w2h = w2 + h * units;
    Vec* gw2 = g.w2.data();
    const Vec zero(0.f);
    for (int64_t c = 0; c < n; c += Vec::size()) {
      const int64_t lanes = std::min<int64_t>(Vec::size(), n - c);
      const Vec d = Vec::loadu(ds + c, lanes), pv = Vec::loadu(p + c, lanes);
      const Vec iv = Vec::loadu(inv + c, lanes), x = pv * iv;
      g.slope = at::vec::fmadd(d, x, g.slope);
      g.intercept = g.intercept + d;
      Vec dx = d * Vec(slope[h]);
      for (int64_t u = 0; u < units; ++u) {
        const Vec a = at::vec::fmadd(x, Vec(w1[u]), Vec(b1[u]));
        gw2[u] = at::vec::fmadd(d, at::vec::maximum(a, zero), gw2[u]);
        const Vec through = (a > zero) & (d * Vec(w2h[u]));  // d f / d a_u, where a_u > 0
        g.w1[u] = at::vec::fmadd(through, x, g.w1[u]);
        g.b1[u] = g.b1[u] + through;
        dx = at::vec::fmadd(through, Vec(w1[u]), dx);
      }
      at::vec::fmadd(dx, iv, Vec::loadu(dpsi + c, lanes)).store(dpsi + c, lanes);
      at::vec::fmadd(dx, pv, Vec::loadu(dinv + c, lanes)).store(dinv + c, lanes);
    }
  }
};


// The Forgetting Transformer (Lin et al., ICLR 2025): PE(i, j) = F_i - F_j, F_t the
// cumulative sum of log f_t of one (batch, head) pair, given as float32 hi + lo per key
// ([batch * heads, width], width = k_len; queries sit at positions i < width). Causal only.
struct ForgettingBias {
  const float *hi, *lo;  // [batch * heads, width]
  int64_t width;

  // s[c] += (hi_i - hi_j) + (lo_i - lo_j), j = c0 + c, for c < n; returns the largest s[c]
  float add_row(int64_t bh, int64_t i, int64_t /*row*/, int64_t c0, int64_t n, float* s) const {
    const float* h = hi + bh * width;
    const float* l = lo + bh * width;
    const float hi_i = h[i], lo_i = l[i];
    const Vec vhi(hi_i), vlo(lo_i);
    Vec vmax(kNegInf);
    int64_t c = 0;
    for (; c + Vec::size() <= n; c += Vec::size()) {
      const Vec pe = (vhi - Vec::loadu(h + c0 + c)) + (vlo - Vec::loadu(l + c0 + c));
      const Vec sum = Vec::loadu(s + c) + pe;
      sum.store(s + c);
      vmax = at::vec::maximum(vmax, sum);
    }
    float m = fold_lanes(vmax, [](float a, float b) { return std::max(a, b); }, kNegInf);
    for (; c < n; ++c) {
      s[c] += (hi_i - h[c0 + c]) + (lo_i - l[c0 + c]);
      m = std::max(m, s[c]);
    }
    return m;
  }
  // s[r] += (hi_i - hi_j) + (lo_i - lo_j), i = i0 + r, for r < n
  void add_col(int64_t bh, int64_t i0, int64_t /*row0*/, int64_t j, int64_t n, float* s) const {
    const float* h = hi + bh * width + i0;
    const float* l = lo + bh * width + i0;
    const Vec vhj(hi[bh * width + j]), vlj(lo[bh * width + j]);
    for (int64_t r = 0; r < n; r += Vec::size()) {
      const int64_t lanes = std::min<int64_t>(Vec::size(), n - r);
      const Vec pe = (Vec::loadu(h + r, lanes) - vhj) + (Vec::loadu(l + r, lanes) - vlj);
      (Vec::loadu(s + r, lanes) + pe).store(s + r, lanes);
    }
  }
  // F is non-increasing, so PE(i, j) <= F_i0 - F_c1 for queries i0 .. i1 and keys c0 .. c1
  // before them all; a block that reaches the diagonal (c1 >= i0) sees PE <= 0 (PE(i, i) = 0
  // and causal attention never adds PE to a key after its query).
  float bound(int64_t bh, int64_t i0, int64_t /*i1*/, int64_t /*c0*/, int64_t c1) const {
    if (c1 >= i0) return 0.f;
    const float* h = hi + bh * width;
    const float* l = lo + bh * width;
    return (h[i0] - h[c1]) + (l[i0] - l[c1]);
  }

  // The gradient of lo, [batch * heads, width]: each (batch, head) pair writes its own row
  // (the backward hands out whole pairs), straight into it.
  struct Grad {
    float* dlo;
  };
  // d/dlo of sum_r ds[r] PE(i0 + r, j): +ds[r] at query i0 + r, -sum_r ds[r] at key j
  void grad_col(int64_t bh, int64_t i0, int64_t /*row0*/, int64_t j, int64_t n, const float* ds,
                Grad& g) const {
    float* d = g.dlo + bh * width;
    Vec vsum(0.f);
    int64_t r = 0;
    for (; r + Vec::size() <= n; r += Vec::size()) vsum = vsum + Vec::loadu(ds + r);
    float sum = lane_sum(vsum);
    for (; r < n; ++r) sum += ds[r];
    d[j] -= sum;
    add_run(d + i0, ds, n);
  }
};

// ---- one call -----------------------------------------------------------------------------

// The shapes and data of one call: q is [batch * heads, q_len, dim] (scaled as it is read),
// k [batch * heads, k_len, dim], v [batch * heads, k_len, v_dim], all float32.
struct Problem {
  int64_t heads, q_len, k_len, dim, v_dim, q_start;
  bool causal;
  float scale;
  const float *q, *k, *v;
  int64_t q_block, kv_block;
  // Grouped keys: k and v are [batch * kv_heads, k_len, dim], query head h reads key head
  // h / group (group = heads / kv_heads; 1: a key head per query head).
  int64_t kv_heads = 0, group = 1;
  // Per-row bias positions: query row r of sequence b sits at bias position starts[b] + r
  // (keys at j), or q_start + r where starts is null. The causal rule reads slots: query
  // slot q_start + r sees key slots j <= q_start + r, whatever the bias positions.
  const int64_t* starts = nullptr;
  // An external mask (true: the query may read the key), element (b, h, r, j) at
  // b * mask_b + h * mask_h + r * mask_q + j * mask_k (a stride 0 broadcasts), or null.
  const bool* mask = nullptr;
  int64_t mask_b = 0, mask_h = 0, mask_q = 0, mask_k = 0;

  // how many keys query rows r0 .. r0 + rows - 1 see (causal: up to the last of them)
  int64_t keys_seen(int64_t r0, int64_t rows) const {
    return causal ? std::min(k_len, q_start + r0 + rows) : k_len;
  }
  int64_t kv_blocks() const { return (k_len + kv_block - 1) / kv_block; }
  // the bias position of query row 0 of pair bh
  int64_t bias_start(int64_t bh) const { return starts ? starts[bh / heads] : q_start; }
  // the key and value pair that query pair bh reads
  int64_t kv(int64_t bh) const { return bh / heads * kv_heads + bh % heads / group; }
  // the mask of pair bh's query row r: element j at [j * mask_k], or null (every key seen)
  const bool* mask_row(int64_t bh, int64_t r) const {
    return mask ? mask + bh / heads * mask_b + bh % heads * mask_h + r * mask_q : nullptr;
  }
};

// |q_r| / sqrt(d) per row and the largest |k_j| of each block of keys, per head: the bound
// |q_i k_j| / sqrt(d) <= |q_i| |k_j| / sqrt(d) that decides which blocks can be skipped.
struct Norms {
  std::vector<float> q, k_block;  // [bh, q_len], [bh, kv_blocks]

  explicit Norms(const Problem& p, int64_t batch_heads)
      : q(batch_heads * p.q_len), k_block(batch_heads * p.kv_blocks(), 0.f) {
    at::parallel_for(0, batch_heads, 1, [&](int64_t first, int64_t last) {
      for (int64_t bh = first; bh < last; ++bh) {
        for (int64_t r = 0; r < p.q_len; ++r) {
          q[bh * p.q_len + r] = p.scale * norm(p.q + (bh * p.q_len + r) * p.dim, p.dim);
        }
        for (int64_t c = 0; c < p.k_len; ++c) {
          float& m = k_block[bh * p.kv_blocks() + c / p.kv_block];
          m = std::max(m, norm(p.k + (p.kv(bh) * p.k_len + c) * p.dim, p.dim));
        }
      }
    });
  }
  static float norm(const float* x, int64_t n) {
    float s = 0.f;
    for (int64_t e = 0; e < n; ++e) s += x[e] * x[e];
    return std::sqrt(s) * (1.f + 1e-5f);  // a hair above the float32 rounding of the norm
  }
  // an upper bound of the scores of rows r0 .. r0 + rows - 1 against key block b of head bh
  template <typename Bias>
  float bound(const Problem& p, const Bias& bias, int64_t bh, int64_t r0, int64_t rows,
              int64_t b) const {
    const float* qn = q.data() + bh * p.q_len + r0;
    const float q_max = *std::max_element(qn, qn + rows);
    const int64_t c0 = b * p.kv_block, c1 = std::min(p.k_len, c0 + p.kv_block) - 1;
    const int64_t i0 = p.bias_start(bh) + r0;
    const float pe = bias.bound(bh, i0, i0 + rows - 1, c0, c1);
    return q_max * k_block[bh * p.kv_blocks() + b] + pe;
  }
};

// How many (query block, key block) pairs were computed and skipped: the op's third output.
struct Counts {
  std::atomic<int64_t> computed{0}, skipped{0};
};

// A run of blocks of query rows of one head (blocks first .. last - 1): a thread's unit of
// work in the forward.
struct Unit {
  int64_t bh, first, last, cost;
};

// Every head's blocks cut into runs of about equal cost (scores computed), enough runs to
// keep every thread busy, the costliest first.
std::vector<Unit> units_of_work(const Problem& p, int64_t batch_heads) {
  const int64_t q_blocks = (p.q_len + p.q_block - 1) / p.q_block;
  const int64_t threads = at::get_num_threads();
  const int64_t runs = std::min(q_blocks, (2 * threads + batch_heads - 1) / batch_heads);
  std::vector<int64_t> cost(q_blocks);
  int64_t total = 0;
  for (int64_t b = 0; b < q_blocks; ++b) {
    const int64_t rows = std::min(p.q_block, p.q_len - b * p.q_block);
    cost[b] = rows * p.keys_seen(b * p.q_block, rows);
    total += cost[b];
  }
  std::vector<Unit> units;
  for (int64_t bh = 0; bh < batch_heads; ++bh) {
    Unit unit{bh, 0, 0, 0};
    for (int64_t b = 0, made = 0; b < q_blocks; ++b) {
      unit.last = b + 1;
      unit.cost += cost[b];
      if (b + 1 == q_blocks || (made + 1 < runs && unit.cost * runs >= total)) {
        units.push_back(unit);
        ++made;
        unit = Unit{bh, b + 1, b + 1, 0};
      }
    }
  }
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    return a.cost > b.cost;
  });
  return units;
}

// q, k, v (and more) read as contiguous float32 [batch * heads, len, dim]
at::Tensor as_float(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "q, k, v must be [batch, heads, len, dim]");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "q, k, v must be CPU tensors");
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
                  v.scalar_type() == dtype,
              "q, k, v must all be float32 or all bfloat16");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 &&
                  k.size(3) == q.size(3) && v.sizes().slice(0, 3) == k.sizes().slice(0, 3),
              "q, k, v must agree in batch, q's heads be a multiple of k's, q and k agree in "
              "dim, k and v in heads and length");
}

// Where the queries' bias positions and the mask come from (optional: none, the slots).
struct Layout {
  std::optional<at::Tensor> starts, mask;
};

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     int64_t q_start, bool causal, int64_t q_block, int64_t kv_block,
                     const Layout& layout) {
  TORCH_CHECK(q_block > 0 && kv_block > 0, "q_block and kv_block must be positive");
  TORCH_CHECK(k.size(2) > 0 || q.size(2) == 0, "k_len must be positive");
  Problem p{q.size(1), q.size(2), k.size(2), q.size(3), v.size(3), q_start, causal,
            1.f / std::sqrt(static_cast<float>(q.size(3))), q.data_ptr<float>(),
            k.data_ptr<float>(), v.data_ptr<float>(), q_block, kv_block};
  p.kv_heads = k.size(1);
  p.group = q.size(1) / k.size(1);
  if (layout.starts) p.starts = layout.starts->data_ptr<int64_t>();
  if (layout.mask) {
    const at::Tensor& m = *layout.mask;
    p.mask = m.data_ptr<bool>();
    p.mask_b = m.size(0) == 1 ? 0 : m.stride(0);
    p.mask_h = m.size(1) == 1 ? 0 : m.stride(1);
    p.mask_q = m.size(2) == 1 ? 0 : m.stride(2);
    p.mask_k = m.size(3) == 1 ? 0 : m.stride(3);
  }
  return p;
}

// The layout's tensors checked against q and k: starts int64 [batch], the mask bool and
// broadcastable to [batch, heads, q_len, k_len].
void check_layout(const at::Tensor& q, const at::Tensor& k, const Layout& layout) {
  if (layout.starts) {
    const at::Tensor& s = *layout.starts;
    TORCH_CHECK(s.scalar_type() == at::kLong && s.dim() == 1 && s.size(0) == q.size(0) &&
                    s.is_contiguous() && s.device().is_cpu(),
                "starts must be a contiguous int64 CPU tensor [batch]");
  }
  if (layout.mask) {
    const at::Tensor& m = *layout.mask;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 4 && m.device().is_cpu(),
                "mask must be a 4-D bool CPU tensor");
    const int64_t want[4] = {q.size(0), q.size(1), q.size(2), k.size(2)};
    for (int d = 0; d < 4; ++d) {
      TORCH_CHECK(m.size(d) == 1 || m.size(d) == want[d],
                  "mask must broadcast to [batch, heads, q_len, k_len]");
    }
  }
}

// The lowest and highest bias position of query row 0 over the rows (the slots: q_start).
std::pair<int64_t, int64_t> start_range(const Layout& layout, int64_t q_start) {
  if (!layout.starts || layout.starts->numel() == 0) return {q_start, q_start};
  const int64_t* s = layout.starts->data_ptr<int64_t>();
  const int64_t n = layout.starts->numel();
  return {*std::min_element(s, s + n), *std::max_element(s, s + n)};
}

// ---- forward ----------------------------------------------------------------------------

// A forward thread's buffers: one block of q_block query rows and kv_block keys, and the
// keys of one head transposed ([dim, k_len]), the layout the product q k^T reads.
struct ForwardWorkspace {
  std::vector<float> q, scores, acc, row_max, row_sum, kt;
  std::vector<std::pair<float, int64_t>> order;  // (bound, key block), visited in this order
  int64_t kt_head = -1, kt_keys = 0;  // kt holds the first kt_keys keys of head kt_head

  explicit ForwardWorkspace(const Problem& p)
      : q(p.q_block * p.dim), scores(p.q_block * p.kv_block), acc(p.q_block * p.v_dim),
        row_max(p.q_block), row_sum(p.q_block), kt(p.dim * p.k_len) {}

  const float* keys_transposed(const Problem& p, int64_t bh, int64_t keys) {
    bh = p.kv(bh);  // the key pair it reads (shared by a group of query heads)
    if (kt_head != bh || kt_keys < keys) {
      const float* k = p.k + bh * p.k_len * p.dim;
      for (int64_t c = 0; c < keys; ++c) {
        for (int64_t d = 0; d < p.dim; ++d) kt[d * p.k_len + c] = k[c * p.dim + d];
      }
      kt_head = bh;
      kt_keys = keys;
    }
    return kt.data();
  }
};

// Query rows r0 .. r0 + rows - 1 of head bh against every key they see, kv_block keys at a
// time, the blocks with the highest bound first: scores = q k^T (one matrix product),
// + bias, folded into a running maximum and sum per row (the online softmax);
// acc += weights v (a second product). A block whose bound lies kDropLog below every row's
// running maximum is skipped.
template <typename Bias>
void attend_block(const Problem& p, const Bias& bias, const Norms& norms, int64_t bh,
                  int64_t r0, int64_t rows, ForwardWorkspace& w, float* out, float* lse,
                  Counts& counts) {
  const int64_t kv_block = p.kv_block;
  const int64_t i0 = p.bias_start(bh) + r0;  // the bias position of the block's first query
  const int64_t slot0 = p.q_start + r0;       // ... and its slot (the causal rule's)
  const int64_t kv_end = p.keys_seen(r0, rows);
  const float* kt = w.keys_transposed(p, bh, kv_end);
  const float* q = p.q + (bh * p.q_len + r0) * p.dim;
  for (int64_t e = 0; e < rows * p.dim; ++e) w.q[e] = q[e] * p.scale;
  std::fill(w.row_max.begin(), w.row_max.end(), kNegInf);
  std::fill(w.row_sum.begin(), w.row_sum.end(), 0.f);
  std::fill(w.acc.begin(), w.acc.end(), 0.f);
  w.order.clear();
  for (int64_t b = 0; b * kv_block < kv_end; ++b) {
    w.order.emplace_back(norms.bound(p, bias, bh, r0, rows, b), b);
  }
  std::sort(w.order.begin(), w.order.end(), std::greater<>());
  int64_t computed = 0, skipped = 0;
  for (const auto& [bound, b] : w.order) {
    const float lowest_max = *std::min_element(w.row_max.begin(), w.row_max.begin() + rows);
    if (bound < lowest_max + kDropLog) {  // every weight of the block would be dropped
      ++skipped;
      continue;
    }
    ++computed;
    const int64_t c0 = b * kv_block, cols = std::min(kv_block, kv_end - c0);
    at::native::cpublas::brgemm(rows, cols, p.dim, p.dim, p.k_len, kv_block, false, w.q.data(),
                                kt + c0, w.scores.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* s = w.scores.data() + r * kv_block;
      const int64_t i = i0 + r;
      const int64_t seen = p.causal ? std::clamp<int64_t>(slot0 + r - c0 + 1, 0, cols) : cols;
      std::fill(s + seen, s + cols, 0.f);  // future keys: weight 0
      if (seen == 0) continue;
      float block_max = bias.add_row(bh, i, r0 + r, c0, seen, s);
      if (const bool* m = p.mask_row(bh, r0 + r)) {  // hidden keys: -inf
        block_max = kNegInf;
        for (int64_t c = 0; c < seen; ++c) {
          if (!m[(c0 + c) * p.mask_k]) s[c] = kNegInf;
          block_max = std::max(block_max, s[c]);
        }
      }
      const float old_max = w.row_max[r];
      const float new_max = std::max(old_max, block_max);
      if (new_max == kNegInf) {  // every score so far is -inf: nothing to weigh yet
        std::fill(s, s + seen, 0.f);
        continue;
      }
      const float sum = exp_sum(s, seen, new_max);  // s becomes exp(s - new_max)
      const float rescale = old_max == kNegInf ? 0.f : exp_or_zero(old_max - new_max);
      w.row_sum[r] = w.row_sum[r] * rescale + sum;
      w.row_max[r] = new_max;
      if (rescale != 1.f) {
        float* acc = w.acc.data() + r * p.v_dim;
        for (int64_t d = 0; d < p.v_dim; ++d) acc[d] *= rescale;
      }
    }
    at::native::cpublas::brgemm(rows, p.v_dim, cols, kv_block, p.v_dim, p.v_dim, true,
                                w.scores.data(), p.v + (p.kv(bh) * p.k_len + c0) * p.v_dim,
                                w.acc.data());
  }
  counts.computed += computed;
  counts.skipped += skipped;
  float* o = out + (bh * p.q_len + r0) * p.v_dim;
  for (int64_t r = 0; r < rows; ++r) {
    if (w.row_sum[r] == 0.f) {  // a query that sees no key (the mask hides them all): 0
      std::fill(o + r * p.v_dim, o + (r + 1) * p.v_dim, 0.f);
      lse[bh * p.q_len + r0 + r] = kNegInf;
      continue;
    }
    const float inv_sum = 1.f / w.row_sum[r];
    for (int64_t d = 0; d < p.v_dim; ++d) o[r * p.v_dim + d] = w.acc[r * p.v_dim + d] * inv_sum;
    lse[bh * p.q_len + r0 + r] = w.row_max[r] + std::log(w.row_sum[r]);
  }
}

// Every block of query rows of every head, shared out to the threads. Returns the output
// [batch, heads, q_len, v_dim] (float32, whatever q's dtype: the caller rounds it, and the
// backward reads the float32 one), the log-sum-exp of each row [batch, heads, q_len]
// (float32) and the (computed, skipped) counts of blocks.
template <typename Bias>
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& q_in,
                                                       const at::Tensor& k_in,
                                                       const at::Tensor& v_in, const Bias& bias,
                                                       int64_t q_start, bool causal,
                                                       int64_t q_block, int64_t kv_block,
                                                       const Layout& layout) {
  const auto q = as_float(q_in), k = as_float(k_in), v = as_float(v_in);
  const int64_t batch_heads = q.size(0) * q.size(1), q_len = q.size(2);
  auto out = at::empty({q.size(0), q.size(1), q_len, v.size(3)}, q.options());
  auto lse = at::empty({q.size(0), q.size(1), q_len}, q.options());
  auto counts_out = at::zeros({2}, q.options().dtype(at::kLong));
  if (q_len == 0) return {out, lse, counts_out};
  const Problem p = make_problem(q, k, v, q_start, causal, q_block, kv_block, layout);
  const Norms norms(p, batch_heads);
  const std::vector<Unit> units = units_of_work(p, batch_heads);
  Counts counts;
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    ForwardWorkspace w(p);
    for (size_t u = next++; u < units.size(); u = next++) {  // whichever thread is free
      for (int64_t b = units[u].last - 1; b >= units[u].first; --b) {
        const int64_t r0 = b * q_block;
        attend_block(p, bias, norms, units[u].bh, r0, std::min(q_block, q_len - r0), w,
                     out.data_ptr<float>(), lse.data_ptr<float>(), counts);
      }
    }
    at::native::cpublas::brgemm_release(false);
  });
  counts_out[0] = counts.computed.load();
  counts_out[1] = counts.skipped.load();
  return {out, lse, counts_out};
}

// ---- backward ---------------------------------------------------------------------------

// A backward thread's buffers for one head: q / sqrt(d) in both layouts, dO and K
// transposed, dQ^T accumulated, rowsum(dO o O), and one block of S^T and dP^T.
struct BackwardWorkspace {
  std::vector<float> qs, qs_t, dout_t, k_t, dq_t, delta, st, dpt;

  explicit BackwardWorkspace(const Problem& p)
      : qs(p.q_len * p.dim), qs_t(p.dim * p.q_len), dout_t(p.v_dim * p.q_len),
        k_t(p.dim * p.k_len), dq_t(p.dim * p.q_len), delta(p.q_len),
        st(p.kv_block * p.q_block), dpt(p.kv_block * p.q_block) {}
};

// One column of the backward, in place: p[r] = exp(s[r] - lse[r]) (dropped below kDropLog),
// ds[r] = p[r] (dp[r] - delta[r]) (dp arrives in ds).
inline void weights_and_grad(float* s, float* ds, const float* lse, const float* delta,
                             int64_t n) {
  for (int64_t r = 0; r < n; r += Vec::size()) {
    const int64_t lanes = std::min<int64_t>(Vec::size(), n - r);
    const Vec p = exp_or_zero(Vec::loadu(s + r, lanes) - Vec::loadu(lse + r, lanes));
    p.store(s + r, lanes);
    (p * (Vec::loadu(ds + r, lanes) - Vec::loadu(delta + r, lanes))).store(ds + r, lanes);
  }
}

// The gradients of head bh: dq, dk, dv written, the bias's gradient added to grad.
template <typename Bias>
void backward_head(const Problem& p, const Bias& bias, const Norms& norms, int64_t bh,
                   const float* out, const float* dout, const float* lse, float* dq, float* dk,
                   float* dv, BackwardWorkspace& w, typename Bias::Grad& grad, Counts& counts) {
  const int64_t d = p.dim, dvd = p.v_dim;
  const int64_t qb = p.q_block, kb = p.kv_block;
  const float* q = p.q + bh * p.q_len * d;
  const float* k = p.k + p.kv(bh) * p.k_len * d;
  const float* v = p.v + p.kv(bh) * p.k_len * dvd;
  out += bh * p.q_len * dvd;
  dout += bh * p.q_len * dvd;
  lse += bh * p.q_len;
  dq += bh * p.q_len * d;
  dk += bh * p.k_len * d;
  dv += bh * p.k_len * dvd;
  for (int64_t r = 0; r < p.q_len; ++r) {
    float delta = 0.f;
    for (int64_t e = 0; e < dvd; ++e) {
      delta += dout[r * dvd + e] * out[r * dvd + e];
      w.dout_t[e * p.q_len + r] = dout[r * dvd + e];
    }
    w.delta[r] = delta;
    for (int64_t e = 0; e < d; ++e) {
      w.qs[r * d + e] = w.qs_t[e * p.q_len + r] = q[r * d + e] * p.scale;
    }
  }
  for (int64_t c = 0; c < p.k_len; ++c) {
    for (int64_t e = 0; e < d; ++e) w.k_t[e * p.k_len + c] = k[c * d + e];
  }
  std::fill(w.dq_t.begin(), w.dq_t.end(), 0.f);
  std::fill(dk, dk + p.k_len * d, 0.f);
  std::fill(dv, dv + p.k_len * dvd, 0.f);
  int64_t computed = 0, skipped = 0;
  for (int64_t c0 = 0, b = 0; c0 < p.k_len; c0 += kb, ++b) {
    const int64_t cols = std::min(kb, p.k_len - c0);
    // causal: the first query row that sees key c0 (i = q_start + r >= c0)
    const int64_t first_row = p.causal ? std::max<int64_t>(c0 - p.q_start, 0) / qb * qb : 0;
    for (int64_t r0 = first_row; r0 < p.q_len; r0 += qb) {
      const int64_t rows = std::min(qb, p.q_len - r0), i0 = p.bias_start(bh) + r0;
      const int64_t slot0 = p.q_start + r0;
      const float lowest_lse = *std::min_element(lse + r0, lse + r0 + rows);
      if (norms.bound(p, bias, bh, r0, rows, b) < lowest_lse + kDropLog) {
        ++skipped;
        continue;
      }
      ++computed;
      float* st = w.st.data();
      float* dpt = w.dpt.data();
      at::native::cpublas::brgemm(cols, rows, d, d, p.q_len, qb, false, k + c0 * d,
                                  w.qs_t.data() + r0, st);
      at::native::cpublas::brgemm(cols, rows, dvd, dvd, p.q_len, qb, false, v + c0 * dvd,
                                  w.dout_t.data() + r0, dpt);
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t j = c0 + c;
        float* s = st + c * qb;   // becomes P^T's column: the weights of key j
        float* ds = dpt + c * qb;  // dP^T, becomes dS^T
        // causal: rows r >= j - i0 see key j
        const int64_t lo = p.causal ? std::clamp<int64_t>(j - slot0, 0, rows) : 0;
        std::fill(s, s + lo, 0.f);
        std::fill(ds, ds + lo, 0.f);
        const int64_t n = rows - lo;
        if (n == 0) continue;
        bias.add_col(bh, i0 + lo, r0 + lo, j, n, s + lo);
        if (p.mask) {  // hidden keys: -inf, so weight 0 (a row that sees nothing: lse -inf)
          for (int64_t r = lo; r < rows; ++r) {
            if (!p.mask_row(bh, r0 + r)[j * p.mask_k]) s[r] = kNegInf;
          }
        }
        weights_and_grad(s + lo, ds + lo, lse + r0 + lo, w.delta.data() + r0 + lo, n);
        bias.grad_col(bh, i0 + lo, r0 + lo, j, n, ds + lo, grad);
      }
      at::native::cpublas::brgemm(cols, dvd, rows, qb, dvd, dvd, true, st, dout + r0 * dvd,
                                  dv + c0 * dvd);
      at::native::cpublas::brgemm(cols, d, rows, qb, d, d, true, dpt, w.qs.data() + r0 * d,
                                  dk + c0 * d);
      at::native::cpublas::brgemm(d, rows, cols, p.k_len, qb, p.q_len, true, w.k_t.data() + c0,
                                  dpt, w.dq_t.data() + r0);
    }
  }
  counts.computed += computed;
  counts.skipped += skipped;
  for (int64_t r = 0; r < p.q_len; ++r) {
    for (int64_t e = 0; e < d; ++e) dq[r * d + e] = w.dq_t[e * p.q_len + r] * p.scale;
  }
}

// The gradients of q, k, v (in q's dtype), each thread taking whole heads (whichever is
// next), and the bias's gradient of each (batch, head) pair: the caller sums them in the
// order of the pairs, so that the bias's gradient has the same bits on every run whatever
// thread computed which pair (and however many threads there are).
template <typename Bias, typename MakeGrad>
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<typename Bias::Grad>> backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& dout_in, const at::Tensor& lse_in,
    const Bias& bias, int64_t q_start, bool causal, int64_t q_block, int64_t kv_block,
    const Layout& layout, MakeGrad make_grad) {
  const auto q = as_float(q_in), k = as_float(k_in), v = as_float(v_in);
  const auto out = as_float(out_in), dout = as_float(dout_in), lse = as_float(lse_in);
  TORCH_CHECK(out.sizes() == dout.sizes() && out.size(0) == q.size(0) &&
                  out.size(1) == q.size(1) && out.size(2) == q.size(2) &&
                  out.size(3) == v.size(3),
              "out and dout must be [batch, heads, q_len, v_dim]");
  TORCH_CHECK(lse.dim() == 3 && lse.sizes() == q.sizes().slice(0, 3),
              "lse must be [batch, heads, q_len]");
  const int64_t batch_heads = q.size(0) * q.size(1);
  // grouped keys: each query head's dK and dV first (no two threads write one), then summed
  // over the group in the order of the heads
  const int64_t group = q.size(1) / k.size(1);
  auto dq = at::zeros_like(q);
  auto dk = at::zeros({q.size(0), q.size(1), k.size(2), k.size(3)}, k.options());
  auto dv = at::zeros({q.size(0), q.size(1), v.size(2), v.size(3)}, v.options());
  std::vector<typename Bias::Grad> grads;  // one per (batch, head) pair
  grads.reserve(batch_heads);
  for (int64_t bh = 0; bh < batch_heads; ++bh) grads.push_back(make_grad());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(),
                                                                  batch_heads));
  if (q.size(2) > 0) {
    Problem p = make_problem(q, k, v, q_start, causal, q_block, kv_block, layout);
    const Norms norms(p, batch_heads);
    Counts counts;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      BackwardWorkspace w(p);
      for (int64_t bh = next++; bh < batch_heads; bh = next++) {
        backward_head(p, bias, norms, bh, out.data_ptr<float>(), dout.data_ptr<float>(),
                      lse.data_ptr<float>(), dq.data_ptr<float>(), dk.data_ptr<float>(),
                      dv.data_ptr<float>(), w, grads[bh], counts);
      }
      at::native::cpublas::brgemm_release(false);
    });
  }
  if (group > 1) {
    dk = dk.view({q.size(0), k.size(1), group, k.size(2), k.size(3)}).sum(2);
    dv = dv.view({q.size(0), k.size(1), group, v.size(2), v.size(3)}).sum(2);
  }
  const auto dtype = q_in.scalar_type();
  return {dq.to(dtype), dk.to(dtype), dv.to(dtype), std::move(grads)};
}

// ---- the ops -------------------------------------------------------------------------------

void check_float_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
              name, " must be a contiguous float32 CPU tensor");
}

// A reversed table of `width` offsets, entry 0 the offset hi, covers every offset i - j of
// queries q_start .. q_start + q_len - 1 and keys 0 .. k_len - 1.
void check_covers(const at::Tensor& q, const at::Tensor& k, int64_t hi, int64_t q_start,
                  int64_t width, const char* name, const Layout& layout) {
  const auto [first, last] = start_range(layout, q_start);
  TORCH_CHECK(hi >= last + q.size(2) - 1 && hi + k.size(2) - 1 - first < width, name,
              " does not cover the offsets of this attention");
}

OffsetBias offset_bias(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& rtable, int64_t hi, int64_t q_start,
                       const Layout& layout) {
  check_qkv(q, k, v);
  check_layout(q, k, layout);
  check_float_contiguous(rtable, "rtable");
  TORCH_CHECK(rtable.dim() == 2 && rtable.size(0) == q.size(1), "rtable must be [heads, width]");
  check_covers(q, k, hi, q_start, rtable.size(1), "rtable", layout);
  return OffsetBias(rtable.data_ptr<float>(), rtable.size(0), rtable.size(1), hi);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> offset_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rtable,
    int64_t hi, int64_t q_start, bool causal, int64_t q_block, int64_t kv_block,
    const std::optional<at::Tensor>& starts, const std::optional<at::Tensor>& mask) {
  const Layout layout{starts, mask};
  const OffsetBias bias = offset_bias(q, k, v, rtable, hi, q_start, layout);
  return forward(q, k, v, bias, q_start, causal, q_block, kv_block, layout);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> offset_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& rtable, int64_t hi,
    int64_t q_start, bool causal, int64_t q_block, int64_t kv_block,
    const std::optional<at::Tensor>& starts, const std::optional<at::Tensor>& mask) {
  const Layout layout{starts, mask};
  const OffsetBias bias = offset_bias(q, k, v, rtable, hi, q_start, layout);
  auto [dq, dk, dv, grads] = backward(q, k, v, out, dout, lse, bias, q_start, causal, q_block,
                                      kv_block, layout, [&] { return OffsetBias::Grad(bias); });
  auto drtable = at::zeros_like(rtable);
  float* dr = drtable.data_ptr<float>();
  for (size_t bh = 0; bh < grads.size(); ++bh) {  // in the order of the pairs: fixed
    float* row = dr + static_cast<int64_t>(bh) % bias.heads * bias.width;
    const float* g = grads[bh].table.data();
    for (int64_t t = 0; t < bias.width; ++t) row[bias.width - 1 - t] += g[t];
  }
  return {dq, dk, dv, drtable};
}

FireBias fire_bias(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& rpsi, int64_t hi, const at::Tensor& inv_den,
                   const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                   const at::Tensor& slope, const at::Tensor& intercept, int64_t q_start,
                   const Layout& layout) {
  check_qkv(q, k, v);
  check_layout(q, k, layout);
  for (auto [t, name] : {std::pair{&rpsi, "rpsi"}, {&inv_den, "inv_den"}, {&w1, "w1"},
                         {&b1, "b1"}, {&w2, "w2"}, {&slope, "slope"}, {&intercept, "intercept"}}) {
    check_float_contiguous(*t, name);
  }
  const int64_t heads = q.size(1), units = w1.numel();
  TORCH_CHECK(b1.numel() == units && w2.numel() == heads * units && slope.numel() == heads &&
                  intercept.numel() == heads,
              "FIRE's weights do not match the heads and hidden units");
  const bool per_row = inv_den.dim() == 2;
  TORCH_CHECK((inv_den.dim() == 1 && inv_den.numel() == q.size(2)) ||
                  (per_row && inv_den.size(0) == q.size(0) && inv_den.size(1) == q.size(2)),
              "inv_den must be [q_len] or [batch, q_len]");
  check_covers(q, k, hi, q_start, rpsi.numel(), "rpsi", layout);
  return FireBias(rpsi.data_ptr<float>(), rpsi.numel(), hi, inv_den.data_ptr<float>(),
                  per_row ? q.size(2) : 0, heads, units, w1.data_ptr<float>(),
                  b1.data_ptr<float>(), w2.data_ptr<float>(), slope.data_ptr<float>(),
                  intercept.data_ptr<float>());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fire_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rpsi,
    int64_t hi, const at::Tensor& inv_den, const at::Tensor& w1, const at::Tensor& b1,
    const at::Tensor& w2, const at::Tensor& slope, const at::Tensor& intercept, int64_t q_start,
    bool causal, int64_t q_block, int64_t kv_block, const std::optional<at::Tensor>& starts,
    const std::optional<at::Tensor>& mask) {
  const Layout layout{starts, mask};
  const FireBias bias = fire_bias(q, k, v, rpsi, hi, inv_den, w1, b1, w2, slope, intercept,
                                  q_start, layout);
  return forward(q, k, v, bias, q_start, causal, q_block, kv_block, layout);
}

std::vector<at::Tensor> fire_backward(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out,
                                      const at::Tensor& dout, const at::Tensor& lse,
                                      const at::Tensor& rpsi, int64_t hi, const at::Tensor& inv_den,
                                      const at::Tensor& w1, const at::Tensor& b1,
                                      const at::Tensor& w2, const at::Tensor& slope,
                                      const at::Tensor& intercept, int64_t q_start, bool causal,
                                      int64_t q_block, int64_t kv_block,
                                      const std::optional<at::Tensor>& starts,
                                      const std::optional<at::Tensor>& mask) {
  const Layout layout{starts, mask};
  const FireBias bias = fire_bias(q, k, v, rpsi, hi, inv_den, w1, b1, w2, slope, intercept,
                                  q_start, layout);
  const int64_t q_len = q.size(2);
  auto [dq, dk, dv, grads] =
      backward(q, k, v, out, dout, lse, bias, q_start, causal, q_block, kv_block, layout,
               [&] { return FireBias::Grad(bias, q_len); });
  auto drpsi = at::zeros_like(rpsi), dinv = at::zeros_like(inv_den), dw1 = at::zeros_like(w1),
       db1 = at::zeros_like(b1), dw2 = at::zeros_like(w2), dslope = at::zeros_like(slope),
       dintercept = at::zeros_like(intercept);
  float *pr = drpsi.data_ptr<float>(), *pi = dinv.data_ptr<float>();
  float *pw1 = dw1.data_ptr<float>(), *pb1 = db1.data_ptr<float>(), *pw2 = dw2.data_ptr<float>();
  for (size_t bh = 0; bh < grads.size(); ++bh) {  // in the order of the pairs: fixed
    const auto& g = grads[bh];
    const int64_t h = static_cast<int64_t>(bh) % bias.heads;
    for (int64_t t = 0; t < bias.width; ++t) pr[bias.width - 1 - t] += g.psi[t];
    float* pi_row = pi + static_cast<int64_t>(bh) / bias.heads * bias.inv_stride;
    for (int64_t r = 0; r < q_len; ++r) pi_row[r] += g.inv[r];
    for (int64_t u = 0; u < bias.units; ++u) {
      pw1[u] += lane_sum(g.w1[u]);
      pb1[u] += lane_sum(g.b1[u]);
      pw2[h * bias.units + u] += lane_sum(g.w2[u]);
    }
    dslope.data_ptr<float>()[h] += lane_sum(g.slope);
    dintercept.data_ptr<float>()[h] += lane_sum(g.intercept);
  }
  return {dq, dk, dv, drpsi, dinv, dw1, db1, dw2, dslope, dintercept};
}

ForgettingBias forgetting_bias(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& lo, int64_t highest, const at::Tensor& hi,
                               int64_t q_start, bool causal, const Layout& layout) {
  check_qkv(q, k, v);
  check_layout(q, k, layout);
  TORCH_CHECK(!layout.starts, "the forget gate's bias reads slots: starts must be None");
  check_float_contiguous(lo, "lo");
  check_float_contiguous(hi, "hi");
  TORCH_CHECK(causal, "the forget gate's bias is causal only: causal must be true");
  TORCH_CHECK(hi.dim() == 3 && hi.size(0) == q.size(0) && hi.size(1) == q.size(1) &&
                  hi.size(2) == k.size(2) && lo.sizes() == hi.sizes(),
              "hi and lo must be [batch, heads, k_len]");
  TORCH_CHECK(q_start >= 0 && q_start + q.size(2) <= k.size(2) &&
                  highest == q_start + q.size(2) - 1,
              "the queries must sit at key positions (q_start + q_len <= k_len, "
              "highest = q_start + q_len - 1)");
  return ForgettingBias{hi.data_ptr<float>(), lo.data_ptr<float>(), hi.size(2)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forgetting_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lo,
    int64_t highest, const at::Tensor& hi, int64_t q_start, bool causal, int64_t q_block,
    int64_t kv_block, const std::optional<at::Tensor>& starts,
    const std::optional<at::Tensor>& mask) {
  const Layout layout{starts, mask};
  const ForgettingBias bias =
      forgetting_bias(q, k, v, lo, highest, hi, q_start, causal, layout);
  return forward(q, k, v, bias, q_start, causal, q_block, kv_block, layout);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forgetting_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& lo, int64_t highest,
    const at::Tensor& hi, int64_t q_start, bool causal, int64_t q_block, int64_t kv_block,
    const std::optional<at::Tensor>& starts, const std::optional<at::Tensor>& mask) {
  const Layout layout{starts, mask};
  const ForgettingBias bias =
      forgetting_bias(q, k, v, lo, highest, hi, q_start, causal, layout);
  auto dlo = at::zeros_like(lo);
  float* dlo_data = dlo.data_ptr<float>();
  auto [dq, dk, dv, grads] =
      backward(q, k, v, out, dout, lse, bias, q_start, causal, q_block, kv_block, layout,
               [&] { return ForgettingBias::Grad{dlo_data}; });
  return {dq, dk, dv, dlo};
}

}  // namespace

TORCH_LIBRARY(relbias_fused, m) {
  m.def("offset_forward(Tensor q, Tensor k, Tensor v, Tensor rtable, int hi, int q_start, "
        "bool causal, int q_block, int kv_block, Tensor? starts=None, Tensor? mask=None) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("offset_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, "
        "Tensor rtable, int hi, int q_start, bool causal, int q_block, int kv_block, "
        "Tensor? starts=None, Tensor? mask=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("fire_forward(Tensor q, Tensor k, Tensor v, Tensor rpsi, int hi, Tensor inv_den, "
        "Tensor w1, Tensor b1, Tensor w2, Tensor slope, Tensor intercept, int q_start, "
        "bool causal, int q_block, int kv_block, Tensor? starts=None, Tensor? mask=None) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("fire_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, "
        "Tensor rpsi, int hi, Tensor inv_den, Tensor w1, Tensor b1, Tensor w2, Tensor slope, "
        "Tensor intercept, int q_start, bool causal, int q_block, int kv_block, "
        "Tensor? starts=None, Tensor? mask=None) -> Tensor[]");
  m.def("forgetting_forward(Tensor q, Tensor k, Tensor v, Tensor lo, int highest, Tensor hi, "
        "int q_start, bool causal, int q_block, int kv_block, Tensor? starts=None, "
        "Tensor? mask=None) -> (Tensor, Tensor, Tensor)");
  m.def("forgetting_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse, "
        "Tensor lo, int highest, Tensor hi, int q_start, bool causal, int q_block, int kv_block, "
        "Tensor? starts=None, Tensor? mask=None) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(relbias_fused, CPU, m) {
  m.impl("offset_forward", &offset_forward);
  m.impl("offset_backward", &offset_backward);
  m.impl("fire_forward", &fire_forward);
  m.impl("fire_backward", &fire_backward);
  m.impl("forgetting_forward", &forgetting_forward);
  m.impl("forgetting_backward", &forgetting_backward);
}
