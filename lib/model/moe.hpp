#pragma once
// The mixture-of-experts MLP of a transformer block (docs/moe.md), written over a kernel set K
// like the rest of the graph (model/transformer.hpp). K must have the MoE kernels
// (K::has_moe; the CPU kernel set, kernels/cpu/moe.hpp):
//
//   logits = norm2 Wr^T            [N,E]   router, replicated on every tensor rank
//   probs, expert, weight = softmax, top-k, renormalised gate weights
//   rows of the expert-sorted buffer: permute(norm2) per the dispatch plan (capacity per
//   sequence; dropped assignments contribute nothing)
//   y = expert MLPs (per expert: up -> gelu / swiglu -> down; column- then row-parallel
//       exactly like the dense MLP: each tensor rank holds its slice of every expert)
//   out = sum_k weight * y   (the row-parallel partial sums, combined, then one reduction)
//
// Auxiliary losses per sequence (the Switch load-balancing loss and the router z-loss),
// averaged over the micro-batch's sequences like the LM loss: the step's figure is their
// mean over the global batch whatever the micro-batch size or the layout.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "model/tensor_parallel.hpp"
#include "tensor/device.hpp"
#include "util/error.hpp"

namespace trident {

template <class K>
constexpr bool kernels_have_moe = requires { K::has_moe; };
// The load-balancing loss of sequences split over a context group (moe_aux_loss_partials).
template <class K>
constexpr bool kernels_have_moe_context = requires { K::has_moe_context; };

// What a MoE layer keeps from its forward to its backward (one micro-batch), M <= N*K rows.
template <class K>
struct MoeActs {
  using T = typename K::T;
  using S = typename K::S;
  DeviceArray<T> logits, probs;      // [N,E]
  DeviceArray<int32_t> expert;       // [N,K]
  DeviceArray<T> weight;             // [N,K] gate weights
  DeviceArray<int64_t> slot;         // [N*K] row in the expert-sorted buffer, -1 dropped
  DeviceArray<int64_t> slot_token;   // [N*K] (first M used)
  DeviceArray<int64_t> offsets;      // [E+1]
  DeviceArray<T> xp, h, a, y;        // [M,C], [M,Ul], [M,Fl], [M,C] (y: this rank's partial)
  DeviceArray<S> aux, z;             // [B] per sequence
  // Context parallelism: each sequence's assignment counts and probability sums [B, 2E] over
  // the context group, from forward to backward (moe_aux_loss_partials).
  DeviceArray<double> aux_partials;
  int64_t rows = 0;                  // M
  // Expert parallelism (EP > 1): the exchange of this micro-batch and the rows this rank's
  // experts received, expert-major (xe; h and a are then [R, ...]).
  std::vector<int64_t> send_rows, recv_rows;  // [EP] rows to / from each expert rank
  std::vector<int64_t> local_offsets;         // [E/EP + 1] over the R received rows
  std::vector<int64_t> src_row;               // [R] arrival row of each expert-major row
  DeviceArray<T> xe;                          // [R,C]
  int64_t received = 0;                       // R
  // FP8 expert GEMMs (train.precision = "fp8"): the offsets of their blocks (ExpertBlocks,
  // model/fp8_linear.hpp) over the experts' rows, one block per local expert and source.
  std::vector<int64_t> fp8_blocks;            // [E/EP * EP + 1], host
};

// Sums over the forwards since the last take (reported per log interval): the layers' mean
// auxiliary losses (summed over MoE layers, one mean per micro-batch) and the routed
// assignments per expert (before dropping) and dropped ones.
struct MoeStats {
  double aux_loss_sum = 0.0;
  double z_loss_sum = 0.0;
  std::vector<int64_t> load;  // [E]
  int64_t dropped = 0;
};

template <class K>
struct MoeParams {
  const typename K::T* router = nullptr;  // [E,C]
  typename K::G* d_router = nullptr;
  LinearParams<K> up, down;  // the stacked experts (architecture.hpp), this rank's slices
};

template <class K>
class MoeMlp {
 public:
  using T = typename K::T;
  using S = typename K::S;

  MoeMlp() = default;
  // Fl: the experts' hidden width on this rank (F / tp); llama: SwiGLU (up is [gate | up]).
  MoeMlp(const ModelConfig& m, int64_t Fl, bool swiglu)
      : E_(m.moe_experts), K_(m.moe_top_k), C_(m.width), Fl_(Fl), Ul_(swiglu ? 2 * Fl : Fl),
        T_(m.seq_len), swiglu_(swiglu), aux_coeff_(m.moe_aux_loss_coeff),
        z_coeff_(m.moe_z_loss_coeff),
        capacity_(K::moe_capacity(m.moe_capacity_factor, m.seq_len, m.moe_experts, m.moe_top_k)) {
    static_assert(std::is_same_v<T, S>, "the MoE graph assumes one activation/statistic type");
    El_ = E_;
    stats_.load.assign(static_cast<size_t>(E_), 0);
  }

  MoeActs<K> make_acts(Device& dev, int64_t B) const {
    const int64_t N = B * T_, NK = N * K_;
    MoeActs<K> m;
    m.logits = DeviceArray<T>(dev, N * E_);
    m.probs = DeviceArray<T>(dev, N * E_);
    m.expert = DeviceArray<int32_t>(dev, NK);
    m.weight = DeviceArray<T>(dev, NK);
    m.slot = DeviceArray<int64_t>(dev, NK);
    m.slot_token = DeviceArray<int64_t>(dev, NK);
    m.offsets = DeviceArray<int64_t>(dev, E_ + 1);
    // Under expert parallelism this rank's experts may receive every assignment of the group.
    const int64_t R = NK * EP_;
    m.xp = DeviceArray<T>(dev, NK * C_);
    m.h = DeviceArray<T>(dev, R * Ul_);
    m.a = DeviceArray<T>(dev, R * Fl_);
    if (EP_ > 1) m.xe = DeviceArray<T>(dev, R * C_);
    m.y = DeviceArray<T>(dev, NK * C_);
    m.aux = DeviceArray<S>(dev, B);
    m.z = DeviceArray<S>(dev, B);
    if (CP_ > 1) m.aux_partials = DeviceArray<double>(dev, B * 2 * E_);
    if (EP_ > 1) {  // the exchange plan's host lists, at their largest: no allocation per step
      m.send_rows.reserve(static_cast<size_t>(EP_));
      m.recv_rows.reserve(static_cast<size_t>(EP_));
      m.local_offsets.reserve(static_cast<size_t>(El_ + 1));
      m.src_row.reserve(static_cast<size_t>(R));
    }
    return m;
  }

  // norm2 [N,C]: all rows (gathered by the caller under sequence parallelism). out_rows: this
  // rank's rows of the MLP's output. `count`: add to the statistics (false when the forward is
  // rerun for a full recomputation).
  void forward(TensorParallel<K>& tp, K& k, const MoeParams<K>& p, MoeActs<K>& m, T* out_rows,
               const T* norm2, int64_t B, bool count) {
    const int64_t N = B * T_;
    k.linear_forward(m.logits.data(), norm2, p.router, nullptr, N, C_, E_);
    k.moe_router_forward(m.probs.data(), m.expert.data(), m.weight.data(), m.logits.data(), N,
                         E_, K_);
    aux_loss_forward(k, m, B);
    k.moe_z_loss_forward(m.z.data(), m.logits.data(), B, T_, E_);
    std::vector<int64_t>& load = plan_.load;
    load.resize(static_cast<size_t>(E_));
    m.rows = k.moe_dispatch_plan(m.slot.data(), m.slot_token.data(), m.offsets.data(),
                                 load.data(), m.expert.data(), B, T_, E_, K_, capacity_);
    if (count) {
      k.accumulate_mean(&stats_.aux_loss_sum, m.aux.data(), B);
      k.accumulate_mean(&stats_.z_loss_sum, m.z.data(), B);
      for (int64_t e = 0; e < E_; ++e) stats_.load[e] += load[e];
      stats_.dropped += N * K_ - m.rows;
    }
    const int64_t M = m.rows;
    k.moe_permute(m.xp.data(), norm2, m.slot_token.data(), M, C_);
    // The experts' rows: this rank's own (EP = 1), or what the expert group sent them.
    const T* xe = m.xp.data();
    T* ye = m.y.data();
    int64_t R = M;
    const int64_t* offsets = m.offsets.data();
    if (EP_ > 1) {
      ensure_exchange(k.device(), B);
      R = plan_exchange(k.device(), m);
      xe = m.xe.data();
      exchange_to_experts(k, m, m.xe.data(), m.xp.data());
      ye = expert_side_.data();
      offsets = m.local_offsets.data();
    }
    if (p.up.fp8) plan_fp8_blocks(k.device(), m);
    expert_forward(k, p.up, m, m.h.data(), xe, p.up.b, offsets, C_, Ul_);
    if (swiglu_)
      k.swiglu_forward(m.a.data(), m.h.data(), R, Fl_);
    else
      k.gelu_forward(m.a.data(), m.h.data(), R * Fl_);
    // Row-parallel: the replicated bias is added by tensor rank 0 only, before the sum.
    expert_forward(k, p.down, m, ye, m.a.data(), tp.rank() == 0 ? p.down.b : nullptr, offsets,
                   Fl_, C_);
    if (EP_ > 1) exchange_from_experts(k, m, m.y.data(), ye);
    T* partial = tp.partial_buffer(out_rows, N, C_);
    k.moe_unpermute(partial, m.y.data(), m.slot.data(), m.weight.data(), N, K_, C_);
    tp.reduce_partials(out_rows, partial, N, C_);
  }

  // d_rows: this rank's rows of dL/d(MLP output). Accumulates every MoE parameter gradient;
  // returns this rank's rows of dL/d(norm2). loss_scale: the LM loss's (1/micro-batches), which
  // scales the auxiliary losses' gradients the same way.
  const T* backward(TensorParallel<K>& tp, K& k, const MoeParams<K>& p, const MoeActs<K>& m,
                    const T* d_rows, const T* norm2, int64_t B, S loss_scale) {
    const int64_t N = B * T_, M = m.rows;
    ensure_scratch(k.device(), B);
    const T* d_all = tp.gather_output_grad(d_rows, N, C_);
    k.moe_unpermute_backward(dy_.data(), dweight_.data(), d_all, m.y.data(), m.slot.data(),
                             m.weight.data(), N, K_, C_);
    // The gate weights multiply the sum over the tensor ranks of the partial outputs.
    if (tp.size() > 1) tp.all_reduce_sum(dweight_.data(), N * K_);
    // The experts' side mirrors the forward: the output gradients travel to the experts' ranks
    // and the input gradients back (two more all-to-alls under expert parallelism).
    const T* dye = dy_.data();
    const T* xe = m.xp.data();
    T* dxe = dxp_.data();
    int64_t R = M;
    const int64_t* offsets = m.offsets.data();
    if (EP_ > 1) {
      ensure_exchange(k.device(), B);
      R = m.received;
      exchange_to_experts(k, m, dye_.data(), dy_.data());
      dye = dye_.data();
      xe = m.xe.data();
      dxe = dxe_.data();
      offsets = m.local_offsets.data();
    }
    expert_backward(k, p.down, m, da_.data(), dye, m.a.data(), offsets, Fl_, C_);
    if (swiglu_)
      k.swiglu_backward(dh_.data(), da_.data(), m.h.data(), R, Fl_);
    else
      k.gelu_backward(dh_.data(), m.h.data(), da_.data(), R * Fl_);
    expert_backward(k, p.up, m, dxe, dh_.data(), xe, offsets, C_, Ul_);
    if (EP_ > 1) exchange_from_experts(k, m, dxp_.data(), dxe);
    k.moe_permute_backward(d_norm2_.data(), dxp_.data(), m.slot.data(), N, K_, C_);
    // Router: the gate weights' gradient, the load-balancing loss's and the z-loss's, each
    // sequence's auxiliary loss weighted coeff * loss_scale / B like the LM loss's tokens.
    const S per_sequence = loss_scale / static_cast<S>(B);
    k.fill(dprobs_.data(), N * E_, S(0));
    if (aux_coeff_ > 0) {
      k.fill(daux_.data(), B, static_cast<S>(aux_coeff_) * per_sequence);
      aux_loss_backward(k, m, B);
    }
    k.moe_router_backward(dlogits_.data(), dweight_.data(), dprobs_.data(), m.probs.data(),
                          m.expert.data(), m.weight.data(), N, E_, K_);
    if (z_coeff_ > 0) {
      k.fill(daux_.data(), B, static_cast<S>(z_coeff_) * per_sequence);
      k.moe_z_loss_backward(dlogits_.data(), daux_.data(), m.logits.data(), B, T_, E_);
    }
    // The router is replicated: every rank computes the same dWr (counted once in the norm);
    // its input gradient joins the experts' partial sum on rank 0 only.
    k.linear_backward(tp.rank() == 0 ? d_router_.data() : nullptr, p.d_router, nullptr,
                      dlogits_.data(), norm2, p.router, N, C_, E_);
    if (tp.rank() == 0) k.add_inplace(d_norm2_.data(), d_router_.data(), N * C_);
    return tp.reduce_input_grad(d_norm2_.data(), N, C_);
  }

  // Context parallelism (model/context_parallel.hpp): `group` is the context group, each
  // sequence's rows split over it (T_ is the rank's share), so the load-balancing loss of a
  // sequence sums its counts and probabilities over the group. The z-loss is a mean over
  // tokens: the group's average of the ranks' means is the sequence's. Token dropping decides
  // per sequence in order and is refused under CP (config.cpp); nullptr: CP = 1.
  void set_context_group(Communicator* group) {
    CP_ = group ? group->size() : 1;
    context_group_ = CP_ > 1 ? group : nullptr;
    if (CP_ > 1 && capacity_ > 0)
      throw Error("model.moe_capacity_factor > 0 (token dropping) with parallel.context > 1: "
                  "not built");
  }

  // Expert parallelism: `group` is the expert group (grid/grid.hpp expert_group; its size is
  // EP, its rank the expert rank). This rank then holds experts [rank*E/EP, (rank+1)*E/EP)
  // only (MoeParams' expert slices are those), tokens cross the group by all-to-all, and the
  // experts' parameter gradients sum the group's tokens routed to them. nullptr: EP = 1.
  void set_expert_group(Communicator* group) {
    const int64_t ep = group ? group->size() : 1;
    if (E_ % ep != 0)
      throw Error("model.moe_experts (" + std::to_string(E_) +
                  ") must be divisible by parallel.expert (" + std::to_string(ep) + ")");
    expert_group_ = ep > 1 ? group : nullptr;
    EP_ = ep;
    El_ = E_ / ep;
  }
  int64_t local_experts() const { return El_; }

  // The statistics since the last call, into `into` (its load list reused: no allocation once
  // it holds E); resets them.
  void take_stats(MoeStats& into) {
    into.aux_loss_sum = stats_.aux_loss_sum;
    into.z_loss_sum = stats_.z_loss_sum;
    into.dropped = stats_.dropped;
    into.load.assign(stats_.load.begin(), stats_.load.end());
    stats_.aux_loss_sum = stats_.z_loss_sum = 0.0;
    stats_.dropped = 0;
    std::fill(stats_.load.begin(), stats_.load.end(), int64_t{0});
  }
  MoeStats take_stats() {
    MoeStats s;
    take_stats(s);
    return s;
  }

 private:
  // The experts' linear layer p on their rows x [R,Cin] (expert-major at `offsets`), out
  // [R,Cout]: K's grouped GEMM, or Fp8Linear's blocks where p is in FP8.
  void expert_forward(K& k, const LinearParams<K>& p, const MoeActs<K>& m, T* out, const T* x,
                      const T* b, const int64_t* offsets, int64_t Cin, int64_t Cout) {
    if constexpr (kernels_have_fp8<K>)
      if (p.fp8)
        return p.fp8->experts_forward(k, p.fp8_delayed, out, x, p.w, b, fp8_blocks(m), Cin,
                                      Cout);
    k.moe_expert_linear_forward(out, x, p.w, b, offsets, El_, Cin, Cout);
  }
  void expert_backward(K& k, const LinearParams<K>& p, const MoeActs<K>& m, T* dx, const T* dy,
                       const T* x, const int64_t* offsets, int64_t Cin, int64_t Cout) {
    if constexpr (kernels_have_fp8<K>)
      if (p.fp8)
        return p.fp8->experts_backward(k, p.fp8_delayed, dx, p.dw, p.db, dy, x, p.w,
                                       fp8_blocks(m), Cin, Cout);
    k.moe_expert_linear_backward(dx, p.dw, p.db, dy, x, p.w, offsets, El_, Cin, Cout);
  }
  ExpertBlocks fp8_blocks(const MoeActs<K>& m) const {
    return ExpertBlocks{m.fp8_blocks.data(), El_, EP_};
  }
  // m.fp8_blocks from the forward's routing: each local expert's rows, one block per source
  // (the expert group's ranks in order, as moe_ep_receive_plan orders them; one source, this
  // rank, without expert parallelism).
  void plan_fp8_blocks(Device& dev, MoeActs<K>& m) {
    std::vector<int64_t>& blocks = m.fp8_blocks;
    blocks.assign(static_cast<size_t>(El_ * EP_ + 1), 0);
    if (EP_ == 1) {
      dev.to_host(blocks.data(), m.offsets.data(),
                  static_cast<int64_t>(blocks.size() * sizeof(int64_t)));
      return;
    }
    for (int64_t j = 0; j < El_; ++j)
      for (int64_t q = 0; q < EP_; ++q) {
        const int64_t s = j * EP_ + q;
        blocks[s + 1] = blocks[s] + plan_.arriving[q * El_ + j];
      }
  }

  // The forward's exchange plan: each expert's row count goes to its owner (one all-to-all of
  // E/EP integers per rank), who orders its arrivals expert-major (kernels/cpu/moe.hpp).
  // Returns R, the rows this rank's experts receive. The counts are host integers, but the
  // expert group's communicator takes device memory (a GPU's is staged or NCCL), so they
  // travel through counts_ on the device, E sent then E received.
  int64_t plan_exchange(Device& dev, MoeActs<K>& m) {
    std::vector<int64_t>& expert_rows = plan_.expert_rows;
    std::vector<int64_t>& arriving = plan_.arriving;
    std::vector<int64_t>& per_rank = plan_.per_rank;
    expert_rows.resize(static_cast<size_t>(E_));
    arriving.resize(static_cast<size_t>(E_));
    per_rank.assign(static_cast<size_t>(EP_), El_);
    m.send_rows.assign(static_cast<size_t>(EP_), 0);
    K::moe_ep_send_counts(m.send_rows.data(), expert_rows.data(), m.offsets.data(), E_, EP_);
    const int64_t bytes = E_ * static_cast<int64_t>(sizeof(int64_t));
    dev.from_host(counts_.data(), expert_rows.data(), bytes);
    expert_group_->all_to_all_v(counts_.data(), per_rank, counts_.data() + E_, per_rank,
                                DType::I64);
    dev.to_host(arriving.data(), counts_.data() + E_, bytes);
    m.recv_rows.assign(static_cast<size_t>(EP_), 0);
    int64_t R = 0;
    for (int64_t q = 0; q < EP_; ++q)
      for (int64_t j = 0; j < El_; ++j) m.recv_rows[q] += arriving[q * El_ + j];
    for (int64_t rows : m.recv_rows) R += rows;
    m.local_offsets.assign(static_cast<size_t>(El_ + 1), 0);
    m.src_row.assign(static_cast<size_t>(R), 0);
    m.received = K::moe_ep_receive_plan(m.local_offsets.data(), m.src_row.data(),
                                        arriving.data(), EP_, El_);
    return m.received;
  }
  // rows[M,C] in expert-sorted order -> this rank's experts' rows [R,C], expert-major.
  void exchange_to_experts(K& k, const MoeActs<K>& m, T* expert_rows, const T* rows) {
    T* arrived = arrival_.data();
    expert_group_->all_to_all_v(rows, scaled(m.send_rows, plan_.send_elems), arrived,
                                scaled(m.recv_rows, plan_.recv_elems), K::act_dtype);
    k.moe_permute(expert_rows, arrived, m.src_row.data(), m.received, C_);
  }
  // The experts' rows [R,C], expert-major -> rows[M,C] back where they were sent from.
  void exchange_from_experts(K& k, const MoeActs<K>& m, T* rows, const T* expert_rows) {
    T* arrived = arrival_.data();
    k.moe_scatter_rows(arrived, expert_rows, m.src_row.data(), m.received, C_);
    expert_group_->all_to_all_v(arrived, scaled(m.recv_rows, plan_.recv_elems), rows,
                                scaled(m.send_rows, plan_.send_elems), K::act_dtype);
  }
  // Row counts as element counts of C-wide rows, into `elems` (returned).
  const std::vector<int64_t>& scaled(const std::vector<int64_t>& rows,
                                     std::vector<int64_t>& elems) const {
    elems.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) elems[i] = rows[i] * C_;
    return elems;
  }

  // The load-balancing loss of the micro-batch's B sequences into m.aux: from the rank's rows,
  // or under context parallelism from their sums over the group (kept in m for backward).
  void aux_loss_forward(K& k, MoeActs<K>& m, int64_t B) {
    if (CP_ == 1)
      return k.moe_aux_loss_forward(m.aux.data(), m.probs.data(), m.expert.data(), B, T_, E_,
                                    K_);
    if constexpr (kernels_have_moe_context<K>) {
      k.moe_aux_loss_partials(m.aux_partials.data(), m.probs.data(), m.expert.data(), B, T_, E_,
                              K_);
      context_group_->all_reduce(m.aux_partials.data(), B * 2 * E_, DType::F64, ReduceOp::Sum);
      k.moe_aux_loss_from_partials(m.aux.data(), m.aux_partials.data(), B, T_ * CP_, E_, K_);
    } else {
      throw Error("parallel.context > 1: this kernel set has no mixture of experts under "
                  "context parallelism");
    }
  }
  // dprobs_ += the load-balancing loss's gradient (daux_ per sequence). Under context
  // parallelism the rank's rows get CP times theirs: the replicas' gradients are averaged
  // over data x context, and this loss is the sequence's, not the rank's share of it.
  void aux_loss_backward(K& k, const MoeActs<K>& m, int64_t B) {
    if (CP_ == 1)
      return k.moe_aux_loss_backward(dprobs_.data(), daux_.data(), m.expert.data(), B, T_, E_,
                                     K_);
    if constexpr (kernels_have_moe_context<K>)
      k.moe_aux_loss_backward_from_partials(dprobs_.data(), daux_.data(), m.aux_partials.data(),
                                            B, T_, T_ * CP_, E_, K_, static_cast<double>(CP_));
    else
      throw Error("parallel.context > 1: this kernel set has no mixture of experts under "
                  "context parallelism");
  }

  // The exchange's arrival-order and expert-output rows (forward and backward).
  void ensure_exchange(Device& dev, int64_t B) {
    if (B <= exchange_B_) return;
    exchange_B_ = B;
    const int64_t R = B * T_ * K_ * EP_;
    arrival_ = DeviceArray<T>(dev, R * C_);
    expert_side_ = DeviceArray<T>(dev, R * C_);
    if (counts_.size() == 0) counts_ = DeviceArray<int64_t>(dev, 2 * E_);
  }

  void ensure_scratch(Device& dev, int64_t B) {
    if (B <= scratch_B_) return;
    scratch_B_ = B;
    const int64_t N = B * T_, NK = N * K_;
    const int64_t R = NK * EP_;  // the most rows this rank's experts may receive
    dy_ = DeviceArray<T>(dev, NK * C_);
    da_ = DeviceArray<T>(dev, R * Fl_);
    dh_ = DeviceArray<T>(dev, R * Ul_);
    dxp_ = DeviceArray<T>(dev, NK * C_);
    if (EP_ > 1) {
      dye_ = DeviceArray<T>(dev, R * C_);
      dxe_ = DeviceArray<T>(dev, R * C_);
    }
    dweight_ = DeviceArray<T>(dev, NK);
    dprobs_ = DeviceArray<T>(dev, N * E_);
    dlogits_ = DeviceArray<T>(dev, N * E_);
    daux_ = DeviceArray<S>(dev, B);
    d_router_ = DeviceArray<T>(dev, N * C_);
    d_norm2_ = DeviceArray<T>(dev, N * C_);
  }

  int64_t E_ = 0, K_ = 0, C_ = 0, Fl_ = 0, Ul_ = 0, T_ = 0;
  bool swiglu_ = false;
  double aux_coeff_ = 0.0, z_coeff_ = 0.0;
  int64_t capacity_ = 0;
  MoeStats stats_;
  // The routing's small lists (E or EP entries), kept from call to call.
  struct PlanScratch {
    std::vector<int64_t> load, expert_rows, arriving, per_rank, send_elems, recv_elems;
  } plan_;
  // Backward scratch shared by the MoE layers (one backward runs at a time).
  int64_t scratch_B_ = 0;
  DeviceArray<T> dy_, da_, dh_, dxp_, dweight_, dprobs_, dlogits_, d_router_, d_norm2_;
  DeviceArray<S> daux_;
  // Expert parallelism (EP_ > 1): the group, the local expert count, and [R,C] buffers: the
  // rows in arrival order, the experts' forward output and the backward's expert-side rows.
  Communicator* expert_group_ = nullptr;
  int64_t EP_ = 1, El_ = 0, exchange_B_ = 0;
  Communicator* context_group_ = nullptr;  // context parallelism (set_context_group)
  int64_t CP_ = 1;
  DeviceArray<T> arrival_, expert_side_, dye_, dxe_;
  DeviceArray<int64_t> counts_;  // the plan's row counts in device memory: [sent E | received E]
};

}  // namespace trident
