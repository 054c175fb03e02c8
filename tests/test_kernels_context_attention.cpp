// The context-parallel (ring) attention kernels (kernels/cpu/context_attention.cpp) and the
// position-indexed RoPE and position-embedding kernels, in one process without MPI:
//  * the whole chunked scheme on N = 1, 2, 4 simulated context ranks (each holds chunks i and
//    2N-1-i of every sequence; local causal attention, then the other ranks' key/value blocks
//    merged in, the backward the same way) against attention_forward / attention_backward on
//    the full sequence: out, lse and dqkv, mapped back to global rows;
//  * merge_forward against its formula and merge_backward against finite differences of
//    sum(R * out) (the incoming out/lse held fixed), the rows each may write, lse = -inf;
//  * packed documents: the same scheme with each row's document start (global positions, and
//    the local ones of the diagonal block) against attention_forward with doc_start;
//  * bitwise independence of the thread count;
//  * rope_backward_at and position_embedding_*_at against their whole-sequence twins at
//    positions t, and the transpose of rope_forward_at at scattered positions.
// Every check counts the values it compared and asserts that there were some.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "context_ring_shape.hpp"
#include "kernel_vectors.hpp"

namespace {

using namespace trident::cpu;
using namespace trident::test;  // kernel_vectors.hpp, context_ring_shape.hpp

// max |a - ref| / max |ref|, adding the number of compared values to *compared.
template <typename T>
double max_rel_diff(const std::vector<T>& ref, const std::vector<T>& a, int64_t* compared) {
  EXPECT_EQ(ref.size(), a.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size() && i < a.size(); i++) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(ref[i])));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  *compared += static_cast<int64_t>(std::min(ref.size(), a.size()));
  return diff / std::max(scale, 1e-300);
}

class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }

 private:
  int saved_;
};

// ------------------------------------------------------------- the chunked scheme on N ranks

template <typename F>
struct AttentionResult {
  std::vector<F> out, lse, dqkv;  // global layouts
};

// Packed documents of the whole sequences: doc_start [B, T] (empty: none), and per simulated
// rank its rows' starts as positions in the sequence (the merges') and as local rows (the
// diagonal block's: the first local row at or after the start), and its rows' positions.
struct RingDocuments {
  std::vector<int32_t> global;                               // [B, T]
  std::vector<std::vector<int32_t>> start, local, positions;  // per rank: [B, Tl], [B, Tl], [Tl]
  RingDocuments() = default;
  RingDocuments(const RingShape& s, std::vector<int32_t> doc_start) : global(std::move(doc_start)) {
    const int64_t Tl = s.Tl();
    for (int64_t i = 0; i < s.N; i++) {
      std::vector<int32_t> pos(Tl), st(s.B * Tl), loc(s.B * Tl);
      for (int64_t r = 0; r < Tl; r++) pos[r] = static_cast<int32_t>(s.global_row(i, r));
      for (int64_t b = 0; b < s.B; b++)
        for (int64_t r = 0; r < Tl; r++) {
          st[b * Tl + r] = global[b * s.T + pos[r]];
          loc[b * Tl + r] = static_cast<int32_t>(
              std::lower_bound(pos.begin(), pos.end(), st[b * Tl + r]) - pos.begin());
        }
      start.push_back(st);
      local.push_back(loc);
      positions.push_back(pos);
    }
  }
  bool any() const { return !global.empty(); }
};

// The whole sequence on one rank: the reference.
template <typename F>
AttentionResult<F> full_attention(const RingShape& s, const std::vector<F>& qkv,
                                  const std::vector<F>& dout, const RingDocuments& docs) {
  AttentionResult<F> r{std::vector<F>(s.B * s.T * s.C()), std::vector<F>(s.B * s.NH * s.T),
                       std::vector<F>(qkv.size())};
  const int32_t* ds = docs.any() ? docs.global.data() : nullptr;
  attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS, ds);
  attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), s.B,
                     s.T, s.NH, s.KVH, s.HS, ds);
  return r;
}

// The ring on N simulated ranks, as the model runs it: local causal attention, every other
// rank's kv block merged in; backward from the final out/lse, the gradient of each block's k/v
// accumulated (starting from its owner's local one) by every rank that used it, then unpacked.
template <typename F>
AttentionResult<F> ring_attention(const RingShape& s, const std::vector<F>& qkv,
                                  const std::vector<F>& dout, const RingDocuments& docs) {
  const int64_t N = s.N, B = s.B, Tl = s.Tl(), rows = B * Tl;
  const auto local = [&](int64_t i) { return docs.any() ? docs.local[i].data() : nullptr; };
  const auto start = [&](int64_t i) { return docs.any() ? docs.start[i].data() : nullptr; };
  const auto positions = [&](int64_t j) { return docs.any() ? docs.positions[j].data() : nullptr; };
  std::vector<std::vector<F>> lqkv(N), ldout(N), out(N), lse(N), kv(N), dqkv(N), dkv(N);
  for (int64_t i = 0; i < N; i++) {
    lqkv[i] = to_local(qkv, s, i, s.CQ());
    ldout[i] = to_local(dout, s, i, s.C());
    out[i].resize(rows * s.C());
    lse[i].resize(B * s.NH * Tl);
    kv[i].resize(rows * s.KVC());
    attention_forward(out[i].data(), lse[i].data(), lqkv[i].data(), B, Tl, s.NH, s.KVH, s.HS,
                      local(i));
    kv_pack(kv[i].data(), lqkv[i].data(), rows, s.NH, s.KVH, s.HS);
  }
  for (int64_t i = 0; i < N; i++)
    for (int64_t step = 1; step < N; step++) {  // the ring's order: blocks of i-1, i-2, ...
      const int64_t j = (i - step + N) % N;
      const BlockPair p = block_pair(s, i, j);
      attention_merge_forward(out[i].data(), lse[i].data(), lqkv[i].data(), kv[j].data(), B, Tl,
                              p.q0, p.Tq, p.k0, p.Tk, s.NH, s.KVH, s.HS, start(i), positions(j));
    }
  for (int64_t i = 0; i < N; i++) {
    dqkv[i].resize(rows * s.CQ());
    dkv[i].resize(rows * s.KVC());
    attention_backward(dqkv[i].data(), ldout[i].data(), lqkv[i].data(), out[i].data(),
                       lse[i].data(), B, Tl, s.NH, s.KVH, s.HS, local(i));
    kv_pack(dkv[i].data(), dqkv[i].data(), rows, s.NH, s.KVH, s.HS);
  }
  for (int64_t i = 0; i < N; i++)
    for (int64_t step = 1; step < N; step++) {
      const int64_t j = (i - step + N) % N;
      const BlockPair p = block_pair(s, i, j);
      attention_merge_backward(dqkv[i].data(), dkv[j].data(), ldout[i].data(), lqkv[i].data(),
                               kv[j].data(), out[i].data(), lse[i].data(), B, Tl, p.q0, p.Tq,
                               p.k0, p.Tk, s.NH, s.KVH, s.HS, start(i), positions(j));
    }
  AttentionResult<F> r{std::vector<F>(B * s.T * s.C()), std::vector<F>(B * s.NH * s.T),
                       std::vector<F>(qkv.size())};
  for (int64_t i = 0; i < N; i++) {
    kv_unpack(dqkv[i].data(), dkv[i].data(), rows, s.NH, s.KVH, s.HS);
    from_local(r.out, out[i], s, i, s.C());
    lse_from_local(r.lse, lse[i], s, i);
    from_local(r.dqkv, dqkv[i], s, i, s.CQ());
  }
  return r;
}

// `lengths`: packed documents, per sequence its documents' lengths (summing to T); empty: none.
template <typename F>
void check_ring(const RingShape& s, double tol,
                const std::vector<std::vector<int32_t>>& lengths = {}) {
  ASSERT_EQ(s.T % (2 * s.N), 0) << s.name();
  std::mt19937_64 rng(1000 + s.T + 10 * s.N + 100 * s.KVH);
  // Scores of a few units: rows far from uniform, so that misplaced keys show.
  const auto qkv = random_vec<F>(rng, s.B * s.T * s.CQ(), -1.5, 1.5);
  const auto dout = random_vec<F>(rng, s.B * s.T * s.C());
  RingDocuments docs;
  if (!lengths.empty()) {
    std::vector<int32_t> doc_start = document_starts_of(lengths);
    ASSERT_EQ(static_cast<int64_t>(doc_start.size()), s.B * s.T) << s.name();
    docs = RingDocuments(s, std::move(doc_start));
  }
  const AttentionResult<F> ref = full_attention(s, qkv, dout, docs);
  const AttentionResult<F> ring = ring_attention(s, qkv, dout, docs);
  int64_t compared = 0;
  const double e_out = max_rel_diff(ref.out, ring.out, &compared);
  const double e_lse = max_rel_diff(ref.lse, ring.lse, &compared);
  const double e_dqkv = max_rel_diff(ref.dqkv, ring.dqkv, &compared);
  EXPECT_LE(e_out, tol) << s.name() << " out";
  EXPECT_LE(e_lse, tol) << s.name() << " lse";
  EXPECT_LE(e_dqkv, tol) << s.name() << " dqkv";
  ASSERT_EQ(compared, static_cast<int64_t>(ref.out.size() + ref.lse.size() + ref.dqkv.size()));
  ASSERT_GT(compared, 0);
  std::cout << "[ring " << (sizeof(F) == 8 ? "double" : "float")
            << (docs.any() ? ", documents" : "") << "] " << s.name()
            << " max rel err out " << std::scientific << std::setprecision(2) << e_out << " lse "
            << e_lse << " dqkv " << e_dqkv << " (" << compared << " values)" << std::endl;
}

// T = 8 * 37: chunks of 37 (N = 4), 74 (N = 2) rows, never a multiple of the 128-row blocks;
// T = 512, N = 2: chunks of 128, local blocks of 256; T = 600, N = 2: 150-row chunks, so the
// merged query and key ranges both end in partial 128-row blocks.
TEST(ContextAttention, RingMatchesFullAttentionDouble) {
  for (int64_t N : {1, 2, 4}) {
    check_ring<double>({2, 296, N, 4, 2, 16}, 1e-12);  // GQA
    check_ring<double>({2, 296, N, 3, 3, 16}, 1e-12);  // MHA
  }
  check_ring<double>({2, 512, 2, 4, 2, 16}, 1e-12);
  check_ring<double>({2, 600, 2, 4, 1, 8}, 1e-12);
}

// Packed documents: lengths that end inside chunks and inside 128-row blocks, a one-row
// document, a document spanning several chunks (and so several ranks), and a sequence that is
// one document; every rank's merges then see parts of blocks, whole blocks and nothing.
TEST(ContextAttention, RingWithDocumentsMatchesFullAttention) {
  for (int64_t N : {1, 2, 4}) {
    check_ring<double>({2, 296, N, 4, 2, 16}, 1e-12, {{30, 1, 100, 45, 120}, {296}});
    check_ring<float>({2, 296, N, 4, 2, 16}, 1e-5, {{37, 37, 74, 148}, {5, 200, 91}});
  }
  check_ring<double>({1, 600, 2, 4, 1, 8}, 1e-12, {{140, 160, 1, 299}});
}

TEST(ContextAttention, RingMatchesFullAttentionFloat) {
  for (int64_t N : {1, 2, 4}) {
    check_ring<float>({2, 296, N, 4, 2, 16}, 1e-5);
    check_ring<float>({2, 296, N, 3, 3, 16}, 1e-5);
  }
  check_ring<float>({2, 512, 2, 4, 2, 16}, 1e-5);
  check_ring<float>({2, 600, 2, 4, 1, 8}, 1e-5);
}

// ---------------------------------------------- one merge: formula, gradient, rows written

struct MergeCase {
  int64_t B = 2, Tl = 11, NH = 4, KVH = 2, HS = 4;
  int64_t q0 = 3, Tq = 5, k0 = 2, Tk = 7;
  int64_t CQ() const { return (NH + 2 * KVH) * HS; }
  int64_t C() const { return NH * HS; }
  int64_t KVC() const { return 2 * KVH * HS; }
  // Rows whose incoming lse is -inf (no keys yet) and whose out is NaN (must not be read).
  bool empty(int64_t b, int64_t h, int64_t t) const {
    return (b == 0 && t == q0) || (b == 1 && h == 2 && t == q0 + 2);
  }
};

struct MergeInputs {
  std::vector<double> qkv, kv, out0, lse0, R;
};

MergeInputs merge_inputs(const MergeCase& c, std::mt19937_64& rng) {
  MergeInputs in;
  in.qkv = random_vec<double>(rng, c.B * c.Tl * c.CQ(), -1.5, 1.5);
  in.kv = random_vec<double>(rng, c.B * c.Tl * c.KVC(), -1.5, 1.5);
  in.out0 = random_vec<double>(rng, c.B * c.Tl * c.C());
  in.lse0 = random_vec<double>(rng, c.B * c.NH * c.Tl, -1.0, 2.0);
  in.R = random_vec<double>(rng, c.B * c.Tl * c.C());
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t h = 0; h < c.NH; h++)
      for (int64_t t = 0; t < c.Tl; t++)
        if (c.empty(b, h, t)) {
          in.lse0[(b * c.NH + h) * c.Tl + t] = -std::numeric_limits<double>::infinity();
          std::fill_n(in.out0.begin() + (b * c.Tl + t) * c.C() + h * c.HS, c.HS,
                      std::numeric_limits<double>::quiet_NaN());
        }
  return in;
}

// The merged (out, lse) from scratch: out = (e^lse0 out0 + sum_s e^S v_s) / (e^lse0 + sum_s e^S).
void merge_reference(std::vector<double>& out, std::vector<double>& lse, const MergeCase& c,
                     const MergeInputs& in) {
  out = in.out0;
  lse = in.lse0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.HS));
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t h = 0; h < c.NH; h++)
      for (int64_t t = c.q0; t < c.q0 + c.Tq; t++) {
        const int64_t j = h / (c.NH / c.KVH);
        const double* q = in.qkv.data() + (b * c.Tl + t) * c.CQ() + h * c.HS;
        const double l0 = in.lse0[(b * c.NH + h) * c.Tl + t];
        const bool none = c.empty(b, h, t);
        double sum = none ? 0.0 : std::exp(l0);
        std::vector<double> acc(c.HS, 0.0);
        for (int64_t i = 0; i < c.HS && !none; i++)
          acc[i] = std::exp(l0) * in.out0[(b * c.Tl + t) * c.C() + h * c.HS + i];
        for (int64_t s = c.k0; s < c.k0 + c.Tk; s++) {
          const double* k = in.kv.data() + (b * c.Tl + s) * c.KVC() + j * c.HS;
          const double* v = k + c.KVH * c.HS;
          double dot = 0;
          for (int64_t i = 0; i < c.HS; i++) dot += q[i] * k[i];
          const double e = std::exp(scale * dot);
          sum += e;
          for (int64_t i = 0; i < c.HS; i++) acc[i] += e * v[i];
        }
        for (int64_t i = 0; i < c.HS; i++)
          out[(b * c.Tl + t) * c.C() + h * c.HS + i] = acc[i] / sum;
        lse[(b * c.NH + h) * c.Tl + t] = std::log(sum);
      }
}

std::vector<double> merged_out(const MergeCase& c, const MergeInputs& in,
                               std::vector<double>* lse_out = nullptr) {
  std::vector<double> out = in.out0, lse = in.lse0;
  attention_merge_forward(out.data(), lse.data(), in.qkv.data(), in.kv.data(), c.B, c.Tl, c.q0,
                          c.Tq, c.k0, c.Tk, c.NH, c.KVH, c.HS);
  if (lse_out) *lse_out = lse;
  return out;
}

TEST(ContextAttention, MergeForwardMatchesFormula) {
  const MergeCase c;
  std::mt19937_64 rng(11);
  const MergeInputs in = merge_inputs(c, rng);
  std::vector<double> ref_out, ref_lse, lse;
  merge_reference(ref_out, ref_lse, c, in);
  const std::vector<double> out = merged_out(c, in, &lse);
  int64_t compared = 0, untouched = 0;
  double worst = 0;
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t t = 0; t < c.Tl; t++)
      for (int64_t h = 0; h < c.NH; h++) {
        const int64_t li = (b * c.NH + h) * c.Tl + t;
        const bool inside = t >= c.q0 && t < c.q0 + c.Tq;
        for (int64_t i = 0; i < c.HS; i++) {
          const int64_t oi = (b * c.Tl + t) * c.C() + h * c.HS + i;
          if (inside) {
            ASSERT_FALSE(std::isnan(out[oi])) << "b " << b << " t " << t << " h " << h;
            worst = std::max(worst, std::abs(out[oi] - ref_out[oi]));
            compared++;
          } else {  // bitwise untouched
            EXPECT_EQ(std::memcmp(&out[oi], &in.out0[oi], sizeof(double)), 0) << "t " << t;
            untouched++;
          }
        }
        if (inside) {
          worst = std::max(worst, std::abs(lse[li] - ref_lse[li]));
          compared++;
        } else {
          EXPECT_EQ(lse[li], in.lse0[li]);
          untouched++;
        }
      }
  EXPECT_LE(worst, 1e-13);
  ASSERT_GT(compared, 0);
  ASSERT_GT(untouched, 0);
  std::cout << "[merge forward] max abs err vs formula " << std::scientific
            << std::setprecision(2) << worst << " (" << compared << " values, " << untouched
            << " untouched)" << std::endl;
}

// The scalar loss sum(R * out) over the merged rows; the empty rows' NaN out0 is never read.
double merge_loss(const MergeCase& c, const MergeInputs& in) {
  const std::vector<double> out = merged_out(c, in);
  double l = 0;
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t t = c.q0; t < c.q0 + c.Tq; t++)
      for (int64_t i = 0; i < c.C(); i++) {
        const int64_t oi = (b * c.Tl + t) * c.C() + i;
        l += in.R[oi] * out[oi];
      }
  return l;
}

// Finite differences of sum(R * out) w.r.t. every element of qkv and kv (the incoming out/lse
// fixed) against merge_backward's accumulation into random dqkv / dkv (gradient = after -
// before); what it must not write (k/v columns of dqkv, rows outside the ranges) stays bitwise.
TEST(ContextAttention, MergeBackwardMatchesFiniteDifferences) {
  const MergeCase c;
  std::mt19937_64 rng(12);
  MergeInputs in = merge_inputs(c, rng);
  std::vector<double> lse;
  const std::vector<double> out = merged_out(c, in, &lse);
  std::vector<double> dout(out.size(), 0.0);  // R on the merged rows: the loss's gradient
  for (int64_t b = 0; b < c.B; b++)
    for (int64_t t = c.q0; t < c.q0 + c.Tq; t++)
      for (int64_t i = 0; i < c.C(); i++) {
        const int64_t oi = (b * c.Tl + t) * c.C() + i;
        dout[oi] = in.R[oi];
      }
  const auto dqkv0 = random_vec<double>(rng, in.qkv.size());
  const auto dkv0 = random_vec<double>(rng, in.kv.size());
  std::vector<double> dqkv = dqkv0, dkv = dkv0;
  attention_merge_backward(dqkv.data(), dkv.data(), dout.data(), in.qkv.data(), in.kv.data(),
                           out.data(), lse.data(), c.B, c.Tl, c.q0, c.Tq, c.k0, c.Tk, c.NH,
                           c.KVH, c.HS);
  constexpr double h = 1e-6;
  int64_t compared = 0, untouched = 0;
  double worst = 0, g_norm = 0;
  auto check = [&](std::vector<double>& x, const std::vector<double>& after,
                   const std::vector<double>& before, auto written) {
    double diff2 = 0, ref2 = 0;
    for (size_t e = 0; e < x.size(); e++) {
      const double x0 = x[e];
      x[e] = x0 + h;
      const double lp = merge_loss(c, in);
      x[e] = x0 - h;
      const double lm = merge_loss(c, in);
      x[e] = x0;
      const double fd = (lp - lm) / (2 * h);
      if (written(e)) {
        const double g = after[e] - before[e];
        diff2 += (fd - g) * (fd - g);
        ref2 += fd * fd;
        compared++;
      } else {
        EXPECT_EQ(fd, 0.0) << "element " << e << " is outside the block";
        EXPECT_EQ(std::memcmp(&after[e], &before[e], sizeof(double)), 0) << "element " << e;
        untouched++;
      }
    }
    g_norm = std::max(g_norm, std::sqrt(ref2));
    worst = std::max(worst, std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-300));
  };
  check(in.qkv, dqkv, dqkv0, [&](size_t e) {
    const int64_t row = static_cast<int64_t>(e) / c.CQ() % c.Tl;
    const int64_t col = static_cast<int64_t>(e) % c.CQ();
    return row >= c.q0 && row < c.q0 + c.Tq && col < c.C();
  });
  check(in.kv, dkv, dkv0, [&](size_t e) {
    const int64_t row = static_cast<int64_t>(e) / c.KVC() % c.Tl;
    return row >= c.k0 && row < c.k0 + c.Tk;
  });
  EXPECT_LE(worst, 1e-6);
  EXPECT_GT(g_norm, 0.0);
  ASSERT_GT(compared, 0);
  ASSERT_GT(untouched, 0);
  std::cout << "[merge backward] FD rel err " << std::scientific << std::setprecision(2) << worst
            << " (" << compared << " gradients, " << untouched << " untouched)" << std::endl;
}

// Each merge task writes its own rows with a fixed order of operations: 1 and 3 threads give
// the same bits (float, the trainer's type; ranges with partial 128-row blocks).
TEST(ContextAttention, MergeIsIndependentOfThreadCount) {
  const int64_t B = 2, Tl = 300, NH = 4, KVH = 2, HS = 16, q0 = 150, Tq = 150, k0 = 0, Tk = 300;
  const int64_t CQ = (NH + 2 * KVH) * HS, C = NH * HS, KVC = 2 * KVH * HS;
  std::mt19937_64 rng(13);
  const auto qkv = random_vec<float>(rng, B * Tl * CQ, -1.5, 1.5);
  const auto kv = random_vec<float>(rng, B * Tl * KVC, -1.5, 1.5);
  const auto out0 = random_vec<float>(rng, B * Tl * C);
  const auto lse0 = random_vec<float>(rng, B * NH * Tl, 0.0, 3.0);
  const auto dout = random_vec<float>(rng, B * Tl * C);
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    std::vector<float> out = out0, lse = lse0, dqkv(qkv.size(), 0.5f), dkv(kv.size(), -0.5f);
    attention_merge_forward(out.data(), lse.data(), qkv.data(), kv.data(), B, Tl, q0, Tq, k0, Tk,
                            NH, KVH, HS);
    attention_merge_backward(dqkv.data(), dkv.data(), dout.data(), qkv.data(), kv.data(),
                             out.data(), lse.data(), B, Tl, q0, Tq, k0, Tk, NH, KVH, HS);
    return std::vector<std::vector<float>>{out, lse, dqkv, dkv};
  };
  const auto one = run(1), three = run(3);
  int64_t compared = 0;
  for (size_t i = 0; i < one.size(); i++) {
    EXPECT_TRUE(bitwise_equal(one[i], three[i])) << "output " << i;
    compared += static_cast<int64_t>(one[i].size());
  }
  ASSERT_GT(compared, 0);
}

TEST(ContextAttention, KvPackUnpack) {
  const int64_t N = 7, NH = 4, KVH = 2, HS = 3, CQ = (NH + 2 * KVH) * HS, KVC = 2 * KVH * HS;
  std::mt19937_64 rng(14);
  const auto qkv = random_vec<double>(rng, N * CQ);
  const auto dkv = random_vec<double>(rng, N * KVC);
  std::vector<double> kv(N * KVC, 0.0), dqkv = random_vec<double>(rng, N * CQ);
  const std::vector<double> dqkv0 = dqkv;
  kv_pack(kv.data(), qkv.data(), N, NH, KVH, HS);
  kv_unpack(dqkv.data(), dkv.data(), N, NH, KVH, HS);
  int64_t compared = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < CQ; c++) {
      if (c >= NH * HS) {
        EXPECT_EQ(kv[n * KVC + c - NH * HS], qkv[n * CQ + c]) << "row " << n << " col " << c;
        EXPECT_EQ(dqkv[n * CQ + c], dkv[n * KVC + c - NH * HS]) << "row " << n << " col " << c;
      } else {
        EXPECT_EQ(dqkv[n * CQ + c], dqkv0[n * CQ + c]) << "q column overwritten";
      }
      compared++;
    }
  ASSERT_EQ(compared, N * CQ);
}

// ---------------------------------------------------- position-indexed RoPE and embeddings

// Positions t of every sequence reproduce the whole-sequence kernels bit for bit.
template <typename F>
void check_at_kernels_match_sequence_kernels() {
  const int64_t B = 3, T = 37, NH = 4, KVH = 2, HS = 8, C = 24, Tmax = 40;
  const int64_t CQ = (NH + 2 * KVH) * HS;
  std::vector<int32_t> positions(B * T);
  for (int64_t n = 0; n < B * T; n++) positions[n] = static_cast<int32_t>(n % T);
  std::mt19937_64 rng(15);
  int64_t compared = 0;

  const auto dqkv = random_vec<F>(rng, B * T * CQ);
  std::vector<F> seq = dqkv, at = dqkv;
  rope_backward(seq.data(), B, T, NH, KVH, HS, 10000.0);
  rope_backward_at(at.data(), positions.data(), B * T, NH, KVH, HS, 10000.0);
  EXPECT_TRUE(bitwise_equal(seq, at)) << "rope_backward_at";
  EXPECT_FALSE(bitwise_equal(seq, dqkv)) << "rope_backward did nothing";
  compared += static_cast<int64_t>(seq.size());

  const auto wpe = random_vec<F>(rng, Tmax * C);
  const auto x = random_vec<F>(rng, B * T * C);
  std::vector<F> out_seq = x, out_at = x;
  position_embedding_forward(out_seq.data(), wpe.data(), B, T, C);
  position_embedding_forward_at(out_at.data(), wpe.data(), positions.data(), B * T, C);
  EXPECT_TRUE(bitwise_equal(out_seq, out_at)) << "position_embedding_forward_at";
  compared += static_cast<int64_t>(out_seq.size());

  const auto dwpe0 = random_vec<F>(rng, Tmax * C);
  std::vector<F> dwpe_seq = dwpe0, dwpe_at = dwpe0;
  position_embedding_backward(dwpe_seq.data(), x.data(), B, T, C);
  position_embedding_backward_at(dwpe_at.data(), x.data(), positions.data(), B * T, C);
  EXPECT_TRUE(bitwise_equal(dwpe_seq, dwpe_at)) << "position_embedding_backward_at";
  compared += static_cast<int64_t>(dwpe_seq.size());
  ASSERT_GT(compared, 0);
}

TEST(ContextAttention, AtKernelsMatchSequenceKernels) {
  check_at_kernels_match_sequence_kernels<double>();
  check_at_kernels_match_sequence_kernels<float>();
}

// Scattered, repeated positions (a rank's two chunks, decoding rows): rope_backward_at is the
// transpose of rope_forward_at, <fwd(x), y> = <x, bwd(y)>, and undoes it; the embedding's
// backward sums repeated positions in row order whatever the thread count.
TEST(ContextAttention, AtKernelsAtScatteredPositions) {
  const int64_t N = 29, NH = 4, KVH = 2, HS = 8, CQ = (NH + 2 * KVH) * HS, C = 40, Tmax = 5000;
  std::mt19937_64 rng(16);
  std::uniform_int_distribution<int32_t> pos(0, Tmax - 1);
  std::vector<int32_t> positions(N);
  for (int32_t& p : positions) p = pos(rng);
  positions[5] = positions[17] = positions[3];  // repeats
  int64_t compared = 0;

  const auto x = random_vec<double>(rng, N * CQ), y = random_vec<double>(rng, N * CQ);
  std::vector<double> fx = x, by = y;
  rope_forward_at(fx.data(), positions.data(), N, NH, KVH, HS, 10000.0);
  rope_backward_at(by.data(), positions.data(), N, NH, KVH, HS, 10000.0);
  double lhs = 0, rhs = 0, mag = 0;
  for (int64_t i = 0; i < N * CQ; i++) {
    lhs += fx[i] * y[i];
    rhs += x[i] * by[i];
    mag += std::abs(fx[i] * y[i]);
  }
  EXPECT_LE(std::abs(lhs - rhs), 1e-13 * mag) << "<fwd x, y> " << lhs << " <x, bwd y> " << rhs;
  compared += 2 * N * CQ;
  std::vector<double> back = fx;
  rope_backward_at(back.data(), positions.data(), N, NH, KVH, HS, 10000.0);
  const double e_inv = max_rel_diff(x, back, &compared);
  EXPECT_LE(e_inv, 1e-14);

  const auto dout = random_vec<float>(rng, N * C);
  const auto dwpe0 = random_vec<float>(rng, Tmax * C);
  std::vector<float> ref = dwpe0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) ref[positions[n] * C + c] += dout[n * C + c];
  for (int threads : {1, 3}) {
    ThreadCount tc(threads);
    std::vector<float> dwpe = dwpe0;
    position_embedding_backward_at(dwpe.data(), dout.data(), positions.data(), N, C);
    EXPECT_TRUE(bitwise_equal(ref, dwpe)) << threads << " threads";
    compared += static_cast<int64_t>(ref.size());
  }
  ASSERT_GT(compared, 0);
  std::cout << "[rope_at] |<fwd x,y> - <x,bwd y>| " << std::scientific << std::setprecision(2)
            << std::abs(lhs - rhs) << " of " << mag << ", bwd(fwd x) rel err " << e_inv
            << std::endl;
}

}  // namespace
