// Mixture-of-experts kernels (kernels/cpu/moe.hpp): router, auxiliary losses, dispatch plan,
// permutation and the grouped expert GEMMs. Small per-row loops are computed in double and
// parallel over rows; every sum runs in a fixed order, so results do not depend on the thread
// count. The expert GEMMs are one linear kernel call per expert (OpenBLAS threads inside).
#include "kernels/cpu/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/scratch.hpp"

namespace trident::cpu {

namespace {
// The thread_scratch buffers of the routing kernels (scratch.hpp), one tag per use.
struct RouterProbs;
struct RouterOrder;
struct RouterGradients;
struct AuxCounts;
struct AuxPartials;
struct ZLossProbs;
struct DispatchKept;
struct DispatchInSequence;
struct DispatchNext;
struct ReceiveBlockStart;

// log(sum_e exp(row[e])) and, when p != nullptr, p = softmax(row), in double.
template <typename T>
double softmax_row(double* p, const T* row, int64_t E) {
  double mx = -INFINITY;
  for (int64_t e = 0; e < E; e++) mx = std::max(mx, static_cast<double>(row[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < E; e++) {
    const double x = std::exp(static_cast<double>(row[e]) - mx);
    if (p) p[e] = x;
    sum += x;
  }
  if (p)
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
  return mx + std::log(sum);
}

}  // namespace

template <typename T>
void moe_router_forward(T* probs, int32_t* expert, T* weight, const T* logits, int64_t N,
                        int64_t E, int64_t K) {
#pragma omp parallel
  {
    double* const p = thread_scratch<RouterProbs, double>(static_cast<size_t>(E));
    int32_t* const order = thread_scratch<RouterOrder, int32_t>(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      softmax_row(p, logits + n * E, E);
      for (int64_t e = 0; e < E; e++) {
        probs[n * E + e] = static_cast<T>(p[e]);
        order[e] = static_cast<int32_t>(e);
      }
      // The K largest in descending order; equal probabilities: the lower expert first.
      std::partial_sort(order, order + K, order + E, [&](int32_t a, int32_t b) {
        return p[a] > p[b] || (p[a] == p[b] && a < b);
      });
      double chosen = 0.0;
      for (int64_t k = 0; k < K; k++) chosen += p[order[k]];
      for (int64_t k = 0; k < K; k++) {
        expert[n * K + k] = order[k];
        weight[n * K + k] = static_cast<T>(p[order[k]] / chosen);
      }
    }
  }
}

template <typename T>
void moe_router_backward(T* dlogits, const T* dweight, const T* dprobs_extra, const T* probs,
                         const int32_t* expert, const T* weight, int64_t N, int64_t E,
                         int64_t K) {
#pragma omp parallel
  {
    double* const dp = thread_scratch<RouterGradients, double>(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      const T* p = probs + n * E;
      for (int64_t e = 0; e < E; e++)
        dp[e] = dprobs_extra ? static_cast<double>(dprobs_extra[n * E + e]) : 0.0;
      // w_j = p_j / S over the chosen j: dL/dp_m = (dL/dw_m - sum_j dL/dw_j w_j) / S.
      double chosen = 0.0, gw = 0.0;
      for (int64_t k = 0; k < K; k++) {
        chosen += static_cast<double>(p[expert[n * K + k]]);
        gw += static_cast<double>(dweight[n * K + k]) * static_cast<double>(weight[n * K + k]);
      }
      for (int64_t k = 0; k < K; k++)
        dp[expert[n * K + k]] += (static_cast<double>(dweight[n * K + k]) - gw) / chosen;
      // Softmax backward: dlogit_e = p_e (dp_e - sum_j p_j dp_j).
      double pdp = 0.0;
      for (int64_t e = 0; e < E; e++) pdp += static_cast<double>(p[e]) * dp[e];
      for (int64_t e = 0; e < E; e++)
        dlogits[n * E + e] = static_cast<T>(static_cast<double>(p[e]) * (dp[e] - pdp));
    }
  }
}

namespace {

// counts[e] = assignments of sequence b routed to e (before dropping), e < E.
void sequence_counts(int64_t* counts, int64_t E, const int32_t* expert, int64_t b, int64_t Tn,
                     int64_t K) {
  std::fill(counts, counts + E, 0);
  const int32_t* ex = expert + b * Tn * K;
  for (int64_t i = 0; i < Tn * K; i++) counts[ex[i]]++;
}

}  // namespace

template <typename T>
void moe_aux_loss_partials(double* partials, const T* probs, const int32_t* expert, int64_t B,
                           int64_t Tn, int64_t E, int64_t K) {
  int64_t* const counts = thread_scratch<AuxCounts, int64_t>(static_cast<size_t>(E));
  for (int64_t b = 0; b < B; b++) {
    sequence_counts(counts, E, expert, b, Tn, K);
    double* const row = partials + b * 2 * E;
    for (int64_t e = 0; e < E; e++) row[e] = static_cast<double>(counts[e]);
    double* const P = row + E;
    std::fill(P, P + E, 0.0);
    for (int64_t t = 0; t < Tn; t++)
      for (int64_t e = 0; e < E; e++) P[e] += static_cast<double>(probs[(b * Tn + t) * E + e]);
  }
}

template <typename T>
void moe_aux_loss_from_partials(T* aux, const double* partials, int64_t B, int64_t T_seq,
                                int64_t E, int64_t K) {
  for (int64_t b = 0; b < B; b++) {
    const double* const row = partials + b * 2 * E;
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++)
      sum += row[e] / static_cast<double>(T_seq * K) * (row[E + e] / static_cast<double>(T_seq));
    aux[b] = static_cast<T>(static_cast<double>(E) * sum);
  }
}

template <typename T>
void moe_aux_loss_backward_from_partials(T* dprobs, const T* daux, const double* partials,
                                         int64_t B, int64_t Tn, int64_t T_seq, int64_t E,
                                         int64_t K, double scale) {
  for (int64_t b = 0; b < B; b++) {
    const double* const row = partials + b * 2 * E;
    for (int64_t e = 0; e < E; e++) {
      const double f = row[e] / static_cast<double>(T_seq * K);
      const T g = static_cast<T>(scale * static_cast<double>(daux[b]) * static_cast<double>(E) *
                                 f / static_cast<double>(T_seq));
      for (int64_t t = 0; t < Tn; t++) dprobs[(b * Tn + t) * E + e] += g;
    }
  }
}

// One rank's whole sequences: the loss from their own sums, the same arithmetic as the
// context-parallel path's.
template <typename T>
void moe_aux_loss_forward(T* aux, const T* probs, const int32_t* expert, int64_t B, int64_t Tn,
                          int64_t E, int64_t K) {
  double* const partials = thread_scratch<AuxPartials, double>(static_cast<size_t>(B * 2 * E));
  moe_aux_loss_partials(partials, probs, expert, B, Tn, E, K);
  moe_aux_loss_from_partials(aux, partials, B, Tn, E, K);
}

template <typename T>
void moe_aux_loss_backward(T* dprobs, const T* daux, const int32_t* expert, int64_t B,
                           int64_t Tn, int64_t E, int64_t K) {
  // Only the counts are read: the probability sums of the partials stay unset.
  double* const partials = thread_scratch<AuxPartials, double>(static_cast<size_t>(B * 2 * E));
  int64_t* const counts = thread_scratch<AuxCounts, int64_t>(static_cast<size_t>(E));
  for (int64_t b = 0; b < B; b++) {
    sequence_counts(counts, E, expert, b, Tn, K);
    for (int64_t e = 0; e < E; e++) partials[b * 2 * E + e] = static_cast<double>(counts[e]);
  }
  moe_aux_loss_backward_from_partials(dprobs, daux, partials, B, Tn, Tn, E, K, 1.0);
}

template <typename T>
void moe_z_loss_forward(T* z, const T* logits, int64_t B, int64_t Tn, int64_t E) {
  for (int64_t b = 0; b < B; b++) {
    double sum = 0.0;
    for (int64_t t = 0; t < Tn; t++) {
      const double lse = softmax_row<T>(nullptr, logits + (b * Tn + t) * E, E);
      sum += lse * lse;
    }
    z[b] = static_cast<T>(sum / static_cast<double>(Tn));
  }
}

template <typename T>
void moe_z_loss_backward(T* dlogits, const T* dz, const T* logits, int64_t B, int64_t Tn,
                         int64_t E) {
#pragma omp parallel
  {
    double* const p = thread_scratch<ZLossProbs, double>(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < B * Tn; n++) {
      const double lse = softmax_row(p, logits + n * E, E);
      const double g = static_cast<double>(dz[n / Tn]) * 2.0 * lse / static_cast<double>(Tn);
      for (int64_t e = 0; e < E; e++) dlogits[n * E + e] += static_cast<T>(g * p[e]);
    }
  }
}

int64_t moe_capacity(double factor, int64_t Tn, int64_t E, int64_t K) {
  if (factor <= 0.0) return 0;
  return static_cast<int64_t>(std::ceil(factor * static_cast<double>(Tn * K) /
                                        static_cast<double>(E)));
}

int64_t moe_dispatch_plan(int64_t* slot, int64_t* slot_token, int64_t* offsets, int64_t* load,
                          const int32_t* expert, int64_t B, int64_t Tn, int64_t E, int64_t K,
                          int64_t capacity) {
  // Pass 1: which assignments are kept (slot = 0 kept, -1 dropped) and each expert's rows.
  int64_t* const kept = thread_scratch<DispatchKept, int64_t>(static_cast<size_t>(E));
  int64_t* const in_sequence =
      thread_scratch<DispatchInSequence, int64_t>(static_cast<size_t>(E));
  std::fill(kept, kept + E, 0);
  std::fill(load, load + E, 0);
  for (int64_t b = 0; b < B; b++) {
    std::fill(in_sequence, in_sequence + E, 0);
    for (int64_t i = b * Tn * K; i < (b + 1) * Tn * K; i++) {
      const int32_t e = expert[i];
      load[e]++;
      const bool keep = capacity == 0 || in_sequence[e] < capacity;
      in_sequence[e]++;
      slot[i] = keep ? 0 : -1;
      if (keep) kept[e]++;
    }
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E; e++) offsets[e + 1] = offsets[e] + kept[e];
  // Pass 2: rows in (token, choice) order within each expert.
  int64_t* const next = thread_scratch<DispatchNext, int64_t>(static_cast<size_t>(E));
  std::copy(offsets, offsets + E, next);
  for (int64_t i = 0; i < B * Tn * K; i++) {
    if (slot[i] < 0) continue;
    const int64_t row = next[expert[i]]++;
    slot[i] = row;
    slot_token[row] = i / K;
  }
  return offsets[E];
}

void moe_ep_send_counts(int64_t* send_rows, int64_t* expert_rows, const int64_t* offsets,
                        int64_t E, int64_t EP) {
  const int64_t El = E / EP;
  for (int64_t e = 0; e < E; e++) expert_rows[e] = offsets[e + 1] - offsets[e];
  for (int64_t q = 0; q < EP; q++) send_rows[q] = offsets[(q + 1) * El] - offsets[q * El];
}

int64_t moe_ep_receive_plan(int64_t* offsets, int64_t* src_row, const int64_t* counts,
                            int64_t EP, int64_t El) {
  // Where each (source, expert) block starts in the received buffer.
  int64_t* const block_start =
      thread_scratch<ReceiveBlockStart, int64_t>(static_cast<size_t>(EP * El));
  int64_t received = 0;
  for (int64_t i = 0; i < EP * El; i++) {
    block_start[i] = received;
    received += counts[i];
  }
  offsets[0] = 0;
  int64_t row = 0;
  for (int64_t j = 0; j < El; j++) {
    for (int64_t p = 0; p < EP; p++) {
      const int64_t i = p * El + j;
      for (int64_t r = 0; r < counts[i]; r++) src_row[row++] = block_start[i] + r;
    }
    offsets[j + 1] = row;
  }
  return received;
}

template <typename T>
void moe_scatter_rows(T* out, const T* in, const int64_t* row, int64_t M, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; m++) std::memcpy(out + row[m] * C, in + m * C, sizeof(T) * C);
}

template <typename T>
void moe_permute(T* xp, const T* x, const int64_t* slot_token, int64_t M, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; m++) std::memcpy(xp + m * C, x + slot_token[m] * C, sizeof(T) * C);
}

namespace {

// out[n] = sum over token n's kept assignments k of w_k * rows[slot[n, k]], w_k = weight[n, k]
// (nullptr: 1, exact). The combine of the experts' outputs and the permutation's backward.
template <typename T>
void sum_assigned_rows(T* out, const T* rows, const int64_t* slot, const T* weight, int64_t N,
                       int64_t K, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    T* o = out + n * C;
    std::fill(o, o + C, T(0));
    for (int64_t k = 0; k < K; k++) {
      const int64_t s = slot[n * K + k];
      if (s < 0) continue;
      const T w = weight ? weight[n * K + k] : T(1);
      const T* src = rows + s * C;
      for (int64_t c = 0; c < C; c++) o[c] += w * src[c];
    }
  }
}

}  // namespace

template <typename T>
void moe_permute_backward(T* dx, const T* dxp, const int64_t* slot, int64_t N, int64_t K,
                          int64_t C) {
  sum_assigned_rows(dx, dxp, slot, static_cast<const T*>(nullptr), N, K, C);
}

template <typename T>
void moe_unpermute(T* out, const T* y, const int64_t* slot, const T* weight, int64_t N,
                   int64_t K, int64_t C) {
  sum_assigned_rows(out, y, slot, weight, N, K, C);
}

template <typename T>
void moe_unpermute_backward(T* dy, T* dweight, const T* dout, const T* y, const int64_t* slot,
                            const T* weight, int64_t N, int64_t K, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const T* g = dout + n * C;
    for (int64_t k = 0; k < K; k++) {
      const int64_t s = slot[n * K + k];
      if (s < 0) {
        dweight[n * K + k] = T(0);
        continue;
      }
      const T w = weight[n * K + k];
      const T* src = y + s * C;
      T* d = dy + s * C;
      double dot = 0.0;
      for (int64_t c = 0; c < C; c++) {
        d[c] = w * g[c];
        dot += static_cast<double>(g[c]) * static_cast<double>(src[c]);
      }
      dweight[n * K + k] = static_cast<T>(dot);
    }
  }
}

template <typename T>
void moe_expert_linear_forward(T* out, const T* inp, const T* w, const T* b,
                               const int64_t* offsets, int64_t E, int64_t C, int64_t OC) {
  for (int64_t e = 0; e < E; e++) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    linear_forward(out + offsets[e] * OC, inp + offsets[e] * C, w + e * OC * C,
                   b ? b + e * OC : nullptr, rows, C, OC);
  }
}

template <typename T>
void moe_expert_linear_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                                const int64_t* offsets, int64_t E, int64_t C, int64_t OC) {
  for (int64_t e = 0; e < E; e++) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    linear_backward(dinp ? dinp + offsets[e] * C : nullptr, dw ? dw + e * OC * C : nullptr,
                    db ? db + e * OC : nullptr, dout + offsets[e] * OC, inp + offsets[e] * C,
                    w + e * OC * C, rows, C, OC);
  }
}

#define TRIDENT_INSTANTIATE(T)                                                                   \
  template void moe_router_forward<T>(T*, int32_t*, T*, const T*, int64_t, int64_t, int64_t);    \
  template void moe_router_backward<T>(T*, const T*, const T*, const T*, const int32_t*,         \
                                       const T*, int64_t, int64_t, int64_t);                     \
  template void moe_aux_loss_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                        int64_t);                                                \
  template void moe_aux_loss_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t,         \
                                         int64_t, int64_t);                                      \
  template void moe_aux_loss_partials<T>(double*, const T*, const int32_t*, int64_t, int64_t,   \
                                         int64_t, int64_t);                                      \
  template void moe_aux_loss_from_partials<T>(T*, const double*, int64_t, int64_t, int64_t,      \
                                              int64_t);                                          \
  template void moe_aux_loss_backward_from_partials<T>(T*, const T*, const double*, int64_t,     \
                                                       int64_t, int64_t, int64_t, int64_t,       \
                                                       double);                                  \
  template void moe_z_loss_forward<T>(T*, const T*, int64_t, int64_t, int64_t);                  \
  template void moe_z_loss_backward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);       \
  template void moe_permute<T>(T*, const T*, const int64_t*, int64_t, int64_t);                  \
  template void moe_scatter_rows<T>(T*, const T*, const int64_t*, int64_t, int64_t);             \
  template void moe_permute_backward<T>(T*, const T*, const int64_t*, int64_t, int64_t,          \
                                        int64_t);                                                \
  template void moe_unpermute<T>(T*, const T*, const int64_t*, const T*, int64_t, int64_t,       \
                                 int64_t);                                                       \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const int64_t*, const T*,  \
                                          int64_t, int64_t, int64_t);                            \
  template void moe_expert_linear_forward<T>(T*, const T*, const T*, const T*, const int64_t*,   \
                                             int64_t, int64_t, int64_t);                         \
  template void moe_expert_linear_backward<T>(T*, T*, T*, const T*, const T*, const T*,          \
                                              const int64_t*, int64_t, int64_t, int64_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
