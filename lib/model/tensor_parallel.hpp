#pragma once
// Megatron-style tensor parallelism, written once for every model and both kernel sets
// (K = CpuKernels<F> or CudaKernels<T>): which collective runs where, and who adds a bias.
//
// N = B*T rows of a micro-batch. Without sequence parallelism every tensor rank holds all N
// rows of the residual stream; with it, rank r holds rows [r*N/tp, (r+1)*N/tp) ("its rows").
//
//                       forward                            backward
//  column-parallel   input: all-gather rows (SP)        input grad: all-reduce, or
//  Y_r = X W_r^T+b_r  weight rows (output features)      reduce-scatter to its rows (SP)
//                     split over ranks; bias split too
//  row-parallel      output: all-reduce, or             output grad: all-gather rows (SP)
//  Y = sum_r X_r W_r^T  reduce-scatter to its rows (SP);  input grad needs no collective
//                     weight columns split; the bias is
//                     replicated and added by rank 0 only
//  vocab-parallel    each rank looks up the ids in its   gathered rows' gradient into its
//  embedding          vocabulary block; output like a     rows of the table
//                     row-parallel one
//  vocab-parallel    max and [sum-exp | target logit] all-reduced over the group: the logits
//  cross-entropy      [N, V] are never gathered
//
// A column-parallel layer's input buffer is [N,C]: a norm writes the rank's rows into it at
// first_row(N) and forward() completes it (under SP), so backward finds the whole input there.
#include <cstdint>
#include <memory>

#include "comm/comm.hpp"
#include "model/architecture.hpp"
#include "model/fp8_linear.hpp"
#include "tensor/device.hpp"

namespace trident {

// The tensor group as the layers see it, with the scratch its collectives need.
template <class K>
class TensorParallel {
 public:
  using T = typename K::T;
  using S = typename K::S;

  TensorParallel(Communicator& comm, const ModelShard& shard, K& kernels)
      : comm_(comm),
        k_(kernels),
        rank_(shard.tp_rank),
        size_(shard.tp_size),
        sp_(shard.sequence_parallel && shard.tp_size > 1),
        overlap_(shard.tp_overlap && shard.tp_size > 1 && kernels.device().is_host() &&
                 comm.progress_from_helper_thread()) {
    if (overlap_) progress_ = std::make_unique<ProgressHelper>();
  }

  Communicator& comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool sequence_parallel() const { return sp_; }
  // Rows of the residual stream this rank holds, and the first of them.
  int64_t rows(int64_t N) const { return sp_ ? N / size_ : N; }
  int64_t first_row(int64_t N) const { return sp_ ? rank_ * rows(N) : 0; }

  // Where a row-parallel layer writes its partial products [N,C] before reduce_partials: the
  // output itself (all-reduced in place), or scratch (reduce-scattered into the output).
  T* partial_buffer(T* out, int64_t N, int64_t C) { return sp_ ? scratch(full_, N * C) : out; }
  // out[rows(N), C] = this rank's rows of the sum over the group of partial[N,C].
  void reduce_partials(T* out, T* partial, int64_t N, int64_t C) {
    if (sp_)
      comm_.reduce_scatter(partial, out, rows(N) * C, K::act_dtype);
    else
      comm_.all_reduce(out, N * C, K::act_dtype, ReduceOp::Sum);
    round_sum(out, rows(N) * C);
  }
  // x[N,C] holds this rank's rows at first_row(N): fetch the others' (SP only).
  void gather_input(T* x, int64_t N, int64_t C) {
    if (sp_) comm_.all_gather(x + first_row(N) * C, x, rows(N) * C, K::act_dtype);
  }
  // The rank's rows of the sum over the group of a column-parallel layer's input gradient
  // partial[N,C]: summed in place, or reduce-scattered into scratch (SP).
  const T* reduce_input_grad(T* partial, int64_t N, int64_t C) {
    if (!sp_) {
      comm_.all_reduce(partial, N * C, K::act_dtype, ReduceOp::Sum);
      round_sum(partial, N * C);
      return partial;
    }
    T* mine = scratch(d_rows_, rows(N) * C);
    comm_.reduce_scatter(partial, mine, rows(N) * C, K::act_dtype);
    round_sum(mine, rows(N) * C);
    return mine;
  }
  // reduce_input_grad(partial, N, C) with `weight_grad` (computation only) run meanwhile:
  // Megatron-LM's overlap of a column-parallel layer's backward all-reduce (reduce-scatter
  // under SP) with its weight gradient. On the CPU a non-blocking all-reduce or reduce-scatter,
  // driven by the helper thread during weight_grad (comm.hpp's ProgressHelper); on the GPU
  // (the stream orders the work anyway) weight_grad, then the blocking collective. The same
  // sum either way up to the MPI library's order of the partial sums.
  template <class Work>
  const T* reduce_input_grad_during(T* partial, int64_t N, int64_t C, Work&& weight_grad) {
    if (!overlap_) {
      weight_grad();
      return reduce_input_grad(partial, N, C);
    }
    if (sp_) {
      T* mine = scratch(d_rows_, rows(N) * C);
      auto request = comm_.ireduce_scatter(partial, mine, rows(N) * C, K::act_dtype);
      progress_->during(*request, weight_grad);
      round_sum(mine, rows(N) * C);
      return mine;
    }
    auto request = comm_.iall_reduce(partial, N * C, K::act_dtype, ReduceOp::Sum);
    progress_->during(*request, weight_grad);
    round_sum(partial, N * C);
    return partial;
  }
  // gather_input(x, N, C) with `work` (computation that does not touch x) run meanwhile:
  // Megatron-LM's overlap, under SP, of the backward's all-gather of a column-parallel layer's
  // input (the recomputed norm output, which its weight gradient reads) with its input
  // gradient (which does not). Overlapped as reduce_input_grad_during is; otherwise the
  // gather, then `work`. The gather copies, so x is the same either way.
  template <class Work>
  void gather_input_during(T* x, int64_t N, int64_t C, Work&& work) {
    if (!sp_ || !overlap_) {
      gather_input(x, N, C);
      work();
      return;
    }
    auto request = comm_.iall_gather(x + first_row(N) * C, x, rows(N) * C, K::act_dtype);
    progress_->during(*request, work);
  }
  // The gradient of all N rows from this rank's rows d[rows(N), C]: d itself, or the
  // all-gather into scratch (SP).
  const T* gather_output_grad(const T* d, int64_t N, int64_t C) {
    if (!sp_) return d;
    T* all = scratch(d_full_, N * C);
    comm_.all_gather(d, all, rows(N) * C, K::act_dtype);
    return all;
  }
  // The tensor group's sums of bf16 values (kernels_store_bf16_values) are taken in fp32 and
  // rounded once here, as a bf16 all-reduce of two ranks rounds its fp32 sum.
  void round_sum(T* x, int64_t n) {
    if constexpr (kernels_store_bf16_values<K>)
      if (size_ > 1) k_.round_sum(x, n);
  }
  void all_reduce_max(S* x, int64_t n) { comm_.all_reduce(x, n, K::stat_dtype, ReduceOp::Max); }
  void all_reduce_sum(S* x, int64_t n) { comm_.all_reduce(x, n, K::stat_dtype, ReduceOp::Sum); }

 private:
  T* scratch(DeviceArray<T>& buf, int64_t n) {
    if (buf.size() < n) buf = DeviceArray<T>(k_.device(), n);
    return buf.data();
  }
  Communicator& comm_;
  K& k_;
  int rank_, size_;
  bool sp_;
  bool overlap_;  // the *_during calls overlap (parallel.tp_overlap, on the CPU)
  std::unique_ptr<ProgressHelper> progress_;  // drives their collectives (overlap_ only)
  DeviceArray<T> full_, d_full_, d_rows_;
};

// One parameter tensor of a layer: compute weights and fp32 (or F) gradients; bias parts are
// nullptr where the architecture has no bias.
template <class K>
struct LinearParams {
  const typename K::T* w = nullptr;
  const typename K::T* b = nullptr;
  typename K::G* dw = nullptr;
  typename K::G* db = nullptr;
  Fp8Linear<K>* fp8 = nullptr;  // the layer's GEMMs in FP8 (train.precision = "fp8"), else none
  Fp8GemmScaling* fp8_delayed = nullptr;  // its delayed recipe's state; none: current scaling
};

// K::linear_forward / linear_backward, or their FP8 forms when the layer has them.
template <class K>
void linear_forward(K& k, const LinearParams<K>& p, typename K::T* y, const typename K::T* x,
                    const typename K::T* b, int64_t N, int64_t C, int64_t OC) {
  if constexpr (kernels_have_fp8<K>)
    if (p.fp8) return p.fp8->forward(k, p.fp8_delayed, y, x, p.w, b, N, C, OC);
  k.linear_forward(y, x, p.w, b, N, C, OC);
}
template <class K>
void linear_backward(K& k, const LinearParams<K>& p, typename K::T* dx, typename K::G* dw,
                     typename K::G* db, const typename K::T* dy, const typename K::T* x,
                     int64_t N, int64_t C, int64_t OC) {
  if constexpr (kernels_have_fp8<K>)
    if (p.fp8) return p.fp8->backward(k, p.fp8_delayed, dx, dw, db, dy, x, p.w, N, C, OC);
  k.linear_backward(dx, dw, db, dy, x, p.w, N, C, OC);
}

// Y[N, out_local] = X[N, in] W_r^T + b_r: this rank's block of output features.
template <class K>
struct ColumnParallelLinear {
  using T = typename K::T;
  int64_t in = 0, out_local = 0;

  // x[N, in]: this rank's rows at first_row(N) on entry; all rows on return (kept for backward).
  void forward(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* y, T* x,
               int64_t N) const {
    tp.gather_input(x, N, in);
    linear_forward(k, p, y, x, p.b, N, in, out_local);
  }
  // forward() with the GELU after it (a GPT-2 MLP's up projection, not in FP8; K has
  // linear_gelu_forward): y = the pre-activation, kept for backward, act = gelu(y).
  void forward_gelu(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* y, T* act, T* x,
                    int64_t N) const {
    tp.gather_input(x, N, in);
    k.linear_gelu_forward(act, y, x, p.w, p.b, N, in, out_local);
  }
  // Accumulates dW, db; returns the rank's rows of dL/dX (in dx_partial [N, in] or scratch).
  // x[N, in] as forward() takes it: this rank's rows at first_row(N) on entry (a norm output
  // recomputed in backward), all rows on return. dX first, as Megatron-LM orders it: under SP
  // the all-gather of x runs while dX is computed (dX does not read x), then dX's sum over the
  // group (reduce-scatter under SP) while dW, db are (TensorParallel's *_during). dX and dW
  // are independent GEMMs: the same bits as one linear_backward call.
  // FP8 layers (p.fp8) quantise dy once for dX and dW, and reduce amaxes over the group: they
  // gather x first and compute both before dX's reduction, without the overlap.
  const T* backward(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* dx_partial,
                    const T* dy, T* x, int64_t N) const {
    if (p.fp8) {
      tp.gather_input(x, N, in);
      linear_backward(k, p, dx_partial, p.dw, p.db, dy, x, N, in, out_local);
      return tp.reduce_input_grad(dx_partial, N, in);
    }
    tp.gather_input_during(x, N, in, [&] {
      k.linear_backward(dx_partial, nullptr, nullptr, dy, x, p.w, N, in, out_local);
    });
    return tp.reduce_input_grad_during(dx_partial, N, in, [&] {
      k.linear_backward(nullptr, p.dw, p.db, dy, x, p.w, N, in, out_local);
    });
  }
  // The split backward (zero-bubble schedules): backward() without dW, db, which
  // weight_backward() accumulates later from the same dy [N, out_local] and x [N, in], kept by
  // the caller until then. No collective in weight_backward: dy and x are the rank's own.
  const T* input_backward(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* dx_partial,
                          const T* dy, const T* x, int64_t N) const {
    linear_backward(k, p, dx_partial, nullptr, nullptr, dy, x, N, in, out_local);
    return tp.reduce_input_grad(dx_partial, N, in);
  }
  void weight_backward(K& k, const LinearParams<K>& p, const T* dy, const T* x, int64_t N) const {
    linear_backward(k, p, nullptr, p.dw, p.db, dy, x, N, in, out_local);
  }
};

// Y[rows, out] = sum_r X_r[N, in_local] W_r^T + b: the input features are split; the bias is
// replicated and added once, by tensor rank 0, before the sum.
template <class K>
struct RowParallelLinear {
  using T = typename K::T;
  int64_t in_local = 0, out = 0;

  void forward(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* y_rows, const T* x,
               int64_t N) const {
    T* partial = tp.partial_buffer(y_rows, N, out);
    linear_forward(k, p, partial, x, tp.rank() == 0 ? p.b : nullptr, N, in_local, out);
    tp.reduce_partials(y_rows, partial, N, out);
  }
  // dx[N, in_local] (overwrite); dW, db accumulate (db from all rows: the same on every rank).
  void backward(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* dx, const T* dy_rows,
                const T* x, int64_t N) const {
    linear_backward(k, p, dx, p.dw, p.db, tp.gather_output_grad(dy_rows, N, out), x, N, in_local,
                    out);
  }
  // The split backward (zero-bubble schedules): dx as backward() does, no dW, db; the output
  // gradient of all N rows is copied into dy_kept [N, out] (the gather under SP is not redone
  // later), from which weight_backward() accumulates dW, db with x [N, in_local].
  void input_backward(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* dx,
                      const T* dy_rows, const T* x, T* dy_kept, int64_t N) const {
    k.copy(dy_kept, tp.gather_output_grad(dy_rows, N, out), N * out);
    linear_backward(k, p, dx, nullptr, nullptr, dy_kept, x, N, in_local, out);
  }
  void weight_backward(K& k, const LinearParams<K>& p, const T* dy_kept, const T* x,
                       int64_t N) const {
    linear_backward(k, p, nullptr, p.dw, p.db, dy_kept, x, N, in_local, out);
  }
  // backward() and input_backward() of a layer whose input is gelu(pre) (a GPT-2 MLP's down
  // projection, not in FP8; K has linear_backward_dgelu): the input gradient through the GELU,
  // dpre [N, in_local] = dL/dx * gelu'(pre), in place of dL/dx. dpre must not alias x.
  void backward_dgelu(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* dpre,
                      const T* dy_rows, const T* x, const T* pre, int64_t N) const {
    k.linear_backward_dgelu(dpre, p.dw, p.db, tp.gather_output_grad(dy_rows, N, out), x, p.w,
                            pre, N, in_local, out);
  }
  void input_backward_dgelu(TensorParallel<K>& tp, K& k, const LinearParams<K>& p, T* dpre,
                            const T* dy_rows, T* dy_kept, const T* pre, int64_t N) const {
    k.copy(dy_kept, tp.gather_output_grad(dy_rows, N, out), N * out);
    k.linear_backward_dgelu(dpre, nullptr, nullptr, dy_kept, nullptr, p.w, pre, N, in_local,
                            out);
  }
};

// Token lookup in a vocab-parallel table: this rank holds rows [vocab_begin, vocab_begin +
// rows) of the padded vocabulary; ids outside look up zeros, and the sum over the group
// completes every row.
template <class K>
struct VocabParallelEmbedding {
  using T = typename K::T;
  int64_t width = 0, vocab_begin = 0, rows = 0;

  void forward(TensorParallel<K>& tp, K& k, const T* table, T* out_rows, const int32_t* ids,
               int64_t N) const {
    T* partial = tp.partial_buffer(out_rows, N, width);
    k.token_embedding_forward(partial, ids, table, N, width, vocab_begin, rows);
    tp.reduce_partials(out_rows, partial, N, width);
  }
  // d_all: the gradient of all N rows (TensorParallel::gather_output_grad).
  void backward(K& k, typename K::G* dtable, const T* d_all, const int32_t* ids,
                int64_t N) const {
    k.token_embedding_backward(dtable, d_all, ids, N, width, vocab_begin, rows);
  }
};

// Softmax cross-entropy over vocab-parallel logits [N, local] without gathering them: three
// local passes with a MAX and a SUM all-reduce between them (one fused pass over each row where
// the kernel set has one and the vocabulary is not split).
template <class K>
struct VocabParallelCrossEntropy {
  using T = typename K::T;
  using S = typename K::S;
  int64_t local = 0, vocab_begin = 0, vocab_size = 0;

  // losses[N], row_max[N], sums[2N] (kept for backward).
  void forward(TensorParallel<K>& tp, K& k, S* losses, S* row_max, S* sums, const T* logits,
               const int32_t* targets, int64_t N) const {
    if (tp.size() == 1 && K::has_fused_cross_entropy) {
      k.cross_entropy_forward_fused(losses, row_max, sums, logits, targets, N, local, vocab_size);
      return;
    }
    split_passes(tp, k, losses, row_max, sums, logits, N, [&] {
      k.cross_entropy_local_sums(sums, logits, targets, row_max, N, local, vocab_begin,
                                 vocab_size);
    });
  }
  // forward, then dlogits[N, local] = (softmax - onehot) * dloss[n] in place of the logits.
  // Where the kernel set has it: in one pass over each row when the vocabulary is not split;
  // when it is, and the set keeps them (the CPU's), the sums' pass leaves exp(logit - max) in
  // place of the logits for the gradient to scale (one exp per column, not two; the same bits).
  void forward_backward(TensorParallel<K>& tp, K& k, S* losses, S* row_max, S* sums, T* logits,
                        const int32_t* targets, const S* dloss, int64_t N) const {
    if constexpr (K::has_fused_cross_entropy_grad) {
      if (tp.size() == 1) {
        k.cross_entropy_fused_grad(losses, row_max, sums, logits, logits, targets, dloss, N,
                                   local, vocab_size);
        return;
      }
      if constexpr (K::cross_entropy_keeps_exps) {
        split_passes(tp, k, losses, row_max, sums, logits, N, [&] {
          k.cross_entropy_local_sums(sums, logits, targets, row_max, N, local, vocab_begin,
                                     vocab_size, logits);  // the exps in place of the logits
        });
        k.cross_entropy_backward_kept(logits, logits, targets, sums, dloss, N, local,
                                      vocab_begin, vocab_size);
        return;
      }
    }
    forward(tp, k, losses, row_max, sums, logits, targets, N);
    backward(k, logits, logits, targets, row_max, sums, dloss, N);
  }
  // The passes over a split vocabulary with the group's reductions between them: the local
  // max, its MAX all-reduce, `local_sums` (the sums' pass into sums[2N]), their SUM all-reduce,
  // the losses.
  template <class SumsPass>
  void split_passes(TensorParallel<K>& tp, K& k, S* losses, S* row_max, S* sums, const T* logits,
                    int64_t N, SumsPass&& local_sums) const {
    k.cross_entropy_local_max(row_max, logits, N, local, vocab_begin, vocab_size);
    tp.all_reduce_max(row_max, N);
    local_sums();
    tp.all_reduce_sum(sums, 2 * N);
    k.cross_entropy_loss(losses, row_max, sums, N);
  }
  // dlogits[N, local] (may alias logits) = (softmax - onehot) * dloss[n].
  void backward(K& k, T* dlogits, const T* logits, const int32_t* targets, const S* row_max,
                const S* sums, const S* dloss, int64_t N) const {
    k.cross_entropy_backward(dlogits, logits, targets, row_max, sums, dloss, N, local,
                             vocab_begin, vocab_size);
  }
};

}  // namespace trident
