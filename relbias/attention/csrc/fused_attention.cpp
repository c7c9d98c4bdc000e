// Fused CPU attention with a relative bias computed inside the kernel (forward only).
//
// softmax_j(q_i k_j / sqrt(d) + PE(i, j) [+ causal mask]) v_j, one block of query rows
// against one block of keys at a time, with an online softmax (running maximum and
// sum per row), so that no q_len x k_len tensor exists. PE(i, j) is added to each block
// of scores as it is computed:
//   offset_attention: PE(i, j) = table[h, i - j - lowest], read from the reversed
//     table rtable[h, m] = PE(hi - m) (hi = the highest offset), so that the bias of a
//     row is a contiguous run of rtable: PE(i, j) = rtable[h, hi - i + j];
//   fire_attention: FIRE's f(psi(|i - j|) / psi(max(L, i))), with psi(|i - j|) read the
//     same way from a reversed table shared by the heads and f the MLP with its
//     non-switching hidden units folded into slope * x + intercept.
// Matrix products go through oneDNN's batch-reduce GEMM (at::native::cpublas::brgemm).
// Built on first use by relbias/fused.py (torch.utils.cpp_extension.load).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// s[c] += rtable[c] for c < n
inline void add_run(float* s, const float* run, int64_t n) {
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    (Vec::loadu(s + c) + Vec::loadu(run + c)).store(s + c);
  }
  for (; c < n; ++c) s[c] += run[c];
}

struct OffsetBias {
  const float* rtable;  // [heads, width]
  int64_t width, hi;
  void add(int64_t h, int64_t i, int64_t /*row*/, int64_t c0, int64_t n, float* s) const {
    add_run(s, rtable + h * width + (hi - i + c0), n);
  }
};

struct FireBias {
  const float* rpsi;  // [width], psi(|offset|) in reversed offset order
  int64_t width, hi;
  const float* inv_den;  // [q_len]: 1 / (psi(max(L, i)) + eps)
  int64_t units;
  const float *w1, *b1, *w2;      // [units], [units], [heads, units]
  const float *slope, *intercept;  // [heads]
  void add(int64_t h, int64_t i, int64_t row, int64_t c0, int64_t n, float* s) const {
    const float* run = rpsi + (hi - i + c0);
    const float* w2h = w2 + h * units;
    const float inv = inv_den[row];
    const Vec vinv(inv), vslope(slope[h]), vicpt(intercept[h]), zero(0.f);
    int64_t c = 0;
    for (; c + Vec::size() <= n; c += Vec::size()) {
      Vec x = Vec::loadu(run + c) * vinv;
      Vec out = at::vec::fmadd(x, vslope, vicpt);
      for (int64_t u = 0; u < units; ++u) {
        Vec hidden = at::vec::maximum(at::vec::fmadd(x, Vec(w1[u]), Vec(b1[u])), zero);
        out = at::vec::fmadd(hidden, Vec(w2h[u]), out);
      }
      (Vec::loadu(s + c) + out).store(s + c);
    }
    for (; c < n; ++c) {
      const float x = run[c] * inv;
      float out = x * slope[h] + intercept[h];
      for (int64_t u = 0; u < units; ++u) out += w2h[u] * std::max(x * w1[u] + b1[u], 0.f);
      s[c] += out;
    }
  }
};

// the lanes of v folded with op, starting from init
template <typename Op>
inline float fold_lanes(const Vec& v, Op op, float init) {
  float lanes[Vec::size()];
  v.store(lanes);
  for (int64_t k = 0; k < Vec::size(); ++k) init = op(init, lanes[k]);
  return init;
}

inline float max_of(const float* s, int64_t n) {
  Vec vmax(kNegInf);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) vmax = at::vec::maximum(vmax, Vec::loadu(s + c));
  float m = fold_lanes(vmax, [](float a, float b) { return std::max(a, b); }, kNegInf);
  for (; c < n; ++c) m = std::max(m, s[c]);
  return m;
}

// s[c] = exp(s[c] - m), returns the sum
inline float exp_sum(float* s, int64_t n, float m) {
  const Vec vm(m);
  Vec vsum(0.f);
  int64_t c = 0;
  for (; c + Vec::size() <= n; c += Vec::size()) {
    Vec e = (Vec::loadu(s + c) - vm).exp_u20();
    e.store(s + c);
    vsum = vsum + e;
  }
  float sum = fold_lanes(vsum, [](float a, float b) { return a + b; }, 0.f);
  for (; c < n; ++c) {
    s[c] = std::exp(s[c] - m);
    sum += s[c];
  }
  return sum;
}

// The shapes and data of one call: q is [batch * heads, q_len, dim] (scaled as it is read),
// k [batch * heads, k_len, dim], v [batch * heads, k_len, v_dim].
struct Problem {
  int64_t heads, q_len, k_len, dim, v_dim, q_start;
  bool causal;
  float scale;
  const float *q, *k, *v;
  float* out;

  // how many keys query rows r0 .. r0 + rows - 1 see (causal: up to the last of them)
  int64_t keys_seen(int64_t r0, int64_t rows) const {
    return causal ? std::min(k_len, q_start + r0 + rows) : k_len;
  }
};

// A thread's buffers: one block of q_block query rows and kv_block keys, and the keys of
// one head transposed ([dim, k_len]), the layout the product q k^T reads.
struct Workspace {
  std::vector<float> q, scores, acc, row_max, row_sum, kt;
  int64_t kt_head = -1, kt_keys = 0;  // kt holds the first kt_keys keys of head kt_head

  Workspace(int64_t q_block, int64_t kv_block, const Problem& p)
      : q(q_block * p.dim), scores(q_block * kv_block), acc(q_block * p.v_dim),
        row_max(q_block), row_sum(q_block), kt(p.dim * p.k_len) {}

  const float* keys_transposed(const Problem& p, int64_t bh, int64_t keys) {
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
// time: scores = q k^T (one matrix product), + bias, folded into a running maximum and
// sum per row (the online softmax); acc += weights v (a second product).
template <typename Bias>
void attend_block(const Problem& p, const Bias& bias, int64_t bh, int64_t r0, int64_t rows,
                  int64_t kv_block, Workspace& w) {
  const int64_t h = bh % p.heads;
  const int64_t i0 = p.q_start + r0;  // the absolute position of the block's first query
  const int64_t kv_end = p.keys_seen(r0, rows);
  const float* kt = w.keys_transposed(p, bh, kv_end);
  const float* q = p.q + (bh * p.q_len + r0) * p.dim;
  for (int64_t e = 0; e < rows * p.dim; ++e) w.q[e] = q[e] * p.scale;
  std::fill(w.row_max.begin(), w.row_max.end(), kNegInf);
  std::fill(w.row_sum.begin(), w.row_sum.end(), 0.f);
  std::fill(w.acc.begin(), w.acc.end(), 0.f);
  for (int64_t c0 = 0; c0 < kv_end; c0 += kv_block) {
    const int64_t cols = std::min(kv_block, kv_end - c0);
    at::native::cpublas::brgemm(rows, cols, p.dim, p.dim, p.k_len, kv_block, false, w.q.data(),
                                kt + c0, w.scores.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* s = w.scores.data() + r * kv_block;
      const int64_t i = i0 + r;
      const int64_t seen = p.causal ? std::clamp<int64_t>(i - c0 + 1, 0, cols) : cols;
      std::fill(s + seen, s + cols, 0.f);  // future keys: weight 0
      if (seen == 0) continue;
      bias.add(h, i, r0 + r, c0, seen, s);
      const float old_max = w.row_max[r];
      const float new_max = std::max(old_max, max_of(s, seen));
      if (new_max == kNegInf) {  // every score so far is -inf: nothing to weigh yet
        std::fill(s, s + seen, 0.f);
        continue;
      }
      const float sum = exp_sum(s, seen, new_max);  // s becomes exp(s - new_max)
      const float rescale = old_max == kNegInf ? 0.f : std::exp(old_max - new_max);
      w.row_sum[r] = w.row_sum[r] * rescale + sum;
      w.row_max[r] = new_max;
      if (rescale != 1.f) {
        float* acc = w.acc.data() + r * p.v_dim;
        for (int64_t d = 0; d < p.v_dim; ++d) acc[d] *= rescale;
      }
    }
    at::native::cpublas::brgemm(rows, p.v_dim, cols, kv_block, p.v_dim, p.v_dim, true,
                                w.scores.data(), p.v + (bh * p.k_len + c0) * p.v_dim,
                                w.acc.data());
  }
  float* out = p.out + (bh * p.q_len + r0) * p.v_dim;
  for (int64_t r = 0; r < rows; ++r) {
    const float inv_sum = 1.f / w.row_sum[r];
    for (int64_t d = 0; d < p.v_dim; ++d) out[r * p.v_dim + d] = w.acc[r * p.v_dim + d] * inv_sum;
  }
}

// A run of blocks of query rows of one head (blocks first .. last - 1): a thread's unit of
// work, for which it transposes that head's keys once.
struct Unit {
  int64_t bh, first, last, cost;
};

// Every head's blocks cut into runs of about equal cost (scores computed), enough runs to
// keep every thread busy, the costliest first.
std::vector<Unit> units_of_work(const Problem& p, int64_t batch_heads, int64_t q_block) {
  const int64_t q_blocks = (p.q_len + q_block - 1) / q_block;
  const int64_t threads = at::get_num_threads();
  const int64_t runs = std::min(q_blocks, (2 * threads + batch_heads - 1) / batch_heads);
  std::vector<int64_t> cost(q_blocks);
  int64_t total = 0;
  for (int64_t b = 0; b < q_blocks; ++b) {
    const int64_t rows = std::min(q_block, p.q_len - b * q_block);
    cost[b] = rows * p.keys_seen(b * q_block, rows);
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

// Every block of query rows of every head, shared out to the threads.
template <typename Bias>
at::Tensor attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                     const Bias& bias, int64_t q_start, bool causal, int64_t q_block,
                     int64_t kv_block) {
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
              "q, k, v must be [batch, heads, len, dim]");
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && k_in.scalar_type() == at::kFloat &&
                  v_in.scalar_type() == at::kFloat,
              "q, k, v must be float32");
  TORCH_CHECK(k_in.size(0) == q_in.size(0) && k_in.size(1) == q_in.size(1) &&
                  k_in.size(3) == q_in.size(3) &&
                  v_in.sizes().slice(0, 3) == k_in.sizes().slice(0, 3),
              "q, k, v must agree in batch and heads, q and k in dim, k and v in length");
  TORCH_CHECK(q_block > 0 && kv_block > 0, "q_block and kv_block must be positive");
  const auto q = q_in.contiguous();
  const auto k = k_in.contiguous();
  const auto v = v_in.contiguous();
  const int64_t batch_heads = q.size(0) * q.size(1), q_len = q.size(2);
  auto out = at::empty({q.size(0), q.size(1), q_len, v.size(3)}, q.options());
  if (q_len == 0) return out;
  TORCH_CHECK(k.size(2) > 0, "k_len must be positive");
  const Problem p{q.size(1), q_len, k.size(2), q.size(3), v.size(3), q_start, causal,
                  1.f / std::sqrt(static_cast<float>(q.size(3))), q.data_ptr<float>(),
                  k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>()};
  const std::vector<Unit> units = units_of_work(p, batch_heads, q_block);
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Workspace w(q_block, kv_block, p);
    for (size_t u = next++; u < units.size(); u = next++) {  // whichever thread is free
      for (int64_t b = units[u].last - 1; b >= units[u].first; --b) {
        const int64_t r0 = b * q_block;
        attend_block(p, bias, units[u].bh, r0, std::min(q_block, q_len - r0), kv_block, w);
      }
    }
    at::native::cpublas::brgemm_release(false);
  });
  return out;
}

void check_float_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
              name, " must be a contiguous float32 CPU tensor");
}

// A reversed table of `width` offsets, entry 0 the offset hi, covers every offset i - j of
// queries q_start .. q_start + q_len - 1 and keys 0 .. k_len - 1.
void check_covers(const at::Tensor& q, const at::Tensor& k, int64_t hi, int64_t q_start,
                  int64_t width, const char* name) {
  TORCH_CHECK(hi >= q_start + q.size(2) - 1 && hi + k.size(2) - 1 - q_start < width, name,
              " does not cover the offsets of this attention");
}

at::Tensor offset_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& rtable, int64_t hi, int64_t q_start, bool causal,
                            int64_t q_block, int64_t kv_block) {
  check_float_contiguous(rtable, "rtable");
  TORCH_CHECK(rtable.dim() == 2 && rtable.size(0) == q.size(1), "rtable must be [heads, width]");
  check_covers(q, k, hi, q_start, rtable.size(1), "rtable");
  OffsetBias bias{rtable.data_ptr<float>(), rtable.size(1), hi};
  return attention(q, k, v, bias, q_start, causal, q_block, kv_block);
}

at::Tensor fire_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& rpsi, int64_t hi, const at::Tensor& inv_den,
                          const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                          const at::Tensor& slope, const at::Tensor& intercept, int64_t q_start,
                          bool causal, int64_t q_block, int64_t kv_block) {
  for (auto [t, name] : {std::pair{&rpsi, "rpsi"}, {&inv_den, "inv_den"}, {&w1, "w1"},
                         {&b1, "b1"}, {&w2, "w2"}, {&slope, "slope"}, {&intercept, "intercept"}}) {
    check_float_contiguous(*t, name);
  }
  const int64_t heads = q.size(1), units = w1.numel();
  TORCH_CHECK(b1.numel() == units && w2.numel() == heads * units && slope.numel() == heads &&
                  intercept.numel() == heads && inv_den.numel() == q.size(2),
              "FIRE's weights do not match the heads and hidden units");
  check_covers(q, k, hi, q_start, rpsi.numel(), "rpsi");
  FireBias bias{rpsi.data_ptr<float>(), rpsi.numel(), hi, inv_den.data_ptr<float>(), units,
                w1.data_ptr<float>(), b1.data_ptr<float>(), w2.data_ptr<float>(),
                slope.data_ptr<float>(), intercept.data_ptr<float>()};
  return attention(q, k, v, bias, q_start, causal, q_block, kv_block);
}

}  // namespace

TORCH_LIBRARY(relbias_fused, m) {
  m.def("offset_attention(Tensor q, Tensor k, Tensor v, Tensor rtable, int hi, int q_start, "
        "bool causal, int q_block, int kv_block) -> Tensor");
  m.def("fire_attention(Tensor q, Tensor k, Tensor v, Tensor rpsi, int hi, Tensor inv_den, "
        "Tensor w1, Tensor b1, Tensor w2, Tensor slope, Tensor intercept, int q_start, "
        "bool causal, int q_block, int kv_block) -> Tensor");
}

TORCH_LIBRARY_IMPL(relbias_fused, CPU, m) {
  m.impl("offset_attention", &offset_attention);
  m.impl("fire_attention", &fire_attention);
}
