#pragma once
// CPU kernels of the mixture-of-experts MLP (model/moe.hpp, docs/moe.md), in the conventions of
// kernels/cpu/ops.hpp (row-major, parameter gradients accumulate, activation gradients
// overwrite, float and double). Symbols: N = B*T token rows, E experts, K = top_k routed
// experts per token, C width, M kept assignments (<= N*K), their rows sorted by expert.
//
// Router: probs[N,E] = softmax(logits); each token's K largest probabilities (ties: the lower
// expert index first) renormalised to sum to 1 are its gate weights.
// Assignment (n, k) = token n's k-th choice; slot[n*K + k] is its row in the expert-sorted
// buffer, or -1 when capacity dropped it. Within an expert the rows follow (n, k) order.
#include <cstdint>

namespace trident::cpu {

// ---------------------------------------------------------------- router
// probs[N,E] = softmax(logits[N,E]) (in double); expert[N,K] the K most probable experts in
// descending order; weight[N,K] = their probabilities / the sum of the K.
template <typename T>
void moe_router_forward(T* probs, int32_t* expert, T* weight, const T* logits, int64_t N,
                        int64_t E, int64_t K);
// dlogits[N,E] (overwrite) = softmax backward of dprobs, where dprobs[n,e] = dprobs_extra[n,e]
// (nullptr: 0) plus, for a chosen e = expert[n,k], the renormalisation's backward of dweight:
//   (dweight[n,k] - sum_j dweight[n,j] weight[n,j]) / S,   S = sum_j probs[n, expert[n,j]].
template <typename T>
void moe_router_backward(T* dlogits, const T* dweight, const T* dprobs_extra, const T* probs,
                         const int32_t* expert, const T* weight, int64_t N, int64_t E,
                         int64_t K);

// ---------------------------------------------------------------- auxiliary losses
// Per sequence b of B (rows [b*T, (b+1)*T)), the Switch load-balancing loss
//   aux[b] = E * sum_e f[b,e] * P[b,e],  f = assignments to e / (T*K) (before any dropping,
//   no gradient),  P = mean_t probs[t,e].
template <typename T>
void moe_aux_loss_forward(T* aux, const T* probs, const int32_t* expert, int64_t B, int64_t Tn,
                          int64_t E, int64_t K);
// dprobs[N,E] += daux[b] * E * f[b,e] / T
template <typename T>
void moe_aux_loss_backward(T* dprobs, const T* daux, const int32_t* expert, int64_t B,
                           int64_t Tn, int64_t E, int64_t K);
// Context parallelism splits each sequence over ranks (model/context_parallel.hpp): the loss
// of a sequence then needs its sums over the group. For the rank's Tn rows of each of B
// sequences: partials[b, 0..E) = assignments routed to e, partials[b, E..2E) = sum_t probs[t,e]
// (summed over the context group by the caller).
template <typename T>
void moe_aux_loss_partials(double* partials, const T* probs, const int32_t* expert, int64_t B,
                           int64_t Tn, int64_t E, int64_t K);
// aux[b] from the group's sums, T the whole sequence's length: moe_aux_loss_forward's formula.
template <typename T>
void moe_aux_loss_from_partials(T* aux, const double* partials, int64_t B, int64_t T_seq,
                                int64_t E, int64_t K);
// dprobs[b*Tn + t, e] += scale * daux[b] * E * f[b,e] / T for the rank's Tn rows, f from the
// group's sums (scale: the context size, whose average of the replicas' gradients the loss's
// gradient must survive).
template <typename T>
void moe_aux_loss_backward_from_partials(T* dprobs, const T* daux, const double* partials,
                                         int64_t B, int64_t Tn, int64_t T_seq, int64_t E,
                                         int64_t K, double scale);
// Router z-loss per sequence: z[b] = mean_t logsumexp(logits[t,:])^2.
template <typename T>
void moe_z_loss_forward(T* z, const T* logits, int64_t B, int64_t Tn, int64_t E);
// dlogits[N,E] += dz[b] * 2 * lse[t] * softmax(logits[t])[e] / T
template <typename T>
void moe_z_loss_backward(T* dlogits, const T* dz, const T* logits, int64_t B, int64_t Tn,
                         int64_t E);

// ---------------------------------------------------------------- dispatch plan
// The capacity of one expert in one sequence: ceil(factor * T * K / E); 0 when factor is 0
// (dropless: no limit).
int64_t moe_capacity(double factor, int64_t Tn, int64_t E, int64_t K);
// From expert[N,K]: slot[N*K] (the assignment's row, -1 dropped), slot_token[M] (the token of
// each row), offsets[E+1] (expert e's rows are [offsets[e], offsets[e+1])), load[E] (the
// assignments routed to e before dropping). Within each sequence of T rows an expert takes
// assignments in (token, choice) order until `capacity` (0: unlimited). Returns M.
int64_t moe_dispatch_plan(int64_t* slot, int64_t* slot_token, int64_t* offsets, int64_t* load,
                          const int32_t* expert, int64_t B, int64_t Tn, int64_t E, int64_t K,
                          int64_t capacity);

// ---------------------------------------------------------------- permute / unpermute
// xp[M,C] = x[slot_token[m]]
template <typename T>
void moe_permute(T* xp, const T* x, const int64_t* slot_token, int64_t M, int64_t C);
// dx[N,C] (overwrite) = sum_k dxp[slot[n,k]] over the token's kept assignments, in k order.
template <typename T>
void moe_permute_backward(T* dx, const T* dxp, const int64_t* slot, int64_t N, int64_t K,
                          int64_t C);
// out[N,C] (overwrite) = sum_k weight[n,k] * y[slot[n,k]] over the kept assignments.
template <typename T>
void moe_unpermute(T* out, const T* y, const int64_t* slot, const T* weight, int64_t N,
                   int64_t K, int64_t C);
// dy[M,C] (overwrite) = weight[n,k] * dout[n] at row slot[n,k];
// dweight[N,K] (overwrite) = dot(dout[n], y[slot[n,k]]), 0 for a dropped assignment.
template <typename T>
void moe_unpermute_backward(T* dy, T* dweight, const T* dout, const T* y, const int64_t* slot,
                            const T* weight, int64_t N, int64_t K, int64_t C);

// ---------------------------------------------------------------- expert parallelism
// EP ranks of an expert group each hold El = E/EP consecutive experts (rank q: experts
// [q*El, (q+1)*El)), so a rank's expert-sorted rows (offsets[E+1] of moe_dispatch_plan) go to
// rank q as the one contiguous block [offsets[q*El], offsets[(q+1)*El]).
// send_rows[EP]: the rows for each rank; expert_rows[E]: the rows for each expert (what each
// destination needs, El counts per rank, to place what it receives).
void moe_ep_send_counts(int64_t* send_rows, int64_t* expert_rows, const int64_t* offsets,
                        int64_t E, int64_t EP);
// The receiving side. The rows arrive back to back in (source rank, local expert, row) order,
// counts[p*El + j] of them from source p for local expert j. The grouped GEMMs want them
// expert-major: offsets[El+1] (local expert j's rows are [offsets[j], offsets[j+1]), sources
// in rank order inside, so the order never depends on timing) and src_row[R], the received row
// of each expert-major row (moe_permute with it gathers, moe_scatter_rows scatters back).
// Returns R, the rows received.
int64_t moe_ep_receive_plan(int64_t* offsets, int64_t* src_row, const int64_t* counts,
                            int64_t EP, int64_t El);
// out[row[m]] = in[m] for m < M (the inverse of moe_permute's gather when `row` is a
// permutation).
template <typename T>
void moe_scatter_rows(T* out, const T* in, const int64_t* row, int64_t M, int64_t C);

// ---------------------------------------------------------------- grouped expert GEMMs
// Expert e's rows [offsets[e], offsets[e+1]) of inp[M,C] through its linear layer: weight rows
// [e*OC, (e+1)*OC) of w[E*OC, C], bias b[e*OC ..] (b may be nullptr).
// out[M,OC] = inp @ w_e^T + b_e.
template <typename T>
void moe_expert_linear_forward(T* out, const T* inp, const T* w, const T* b,
                               const int64_t* offsets, int64_t E, int64_t C, int64_t OC);
// dinp[M,C] (overwrite; skipped when nullptr), dw[E*OC,C] +=, db[E*OC] += (may be nullptr).
template <typename T>
void moe_expert_linear_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                                const int64_t* offsets, int64_t E, int64_t C, int64_t OC);

}  // namespace trident::cpu
