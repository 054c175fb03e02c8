#pragma once
// Context parallelism (parallel.context = CP): the sequence dimension split over the ranks of
// the context group.
//
// Chunk layout (the causal load balance): a sequence of T tokens is cut into 2 CP chunks of
// Tc = T / (2 CP); context rank i holds chunks i and 2 CP - 1 - i, in that order, as its
// Tl = T / CP local rows. Under the causal mask chunk c attends to chunks <= c, so rank i's
// queries see 2i + 1 half-chunks' worth of keys in its first chunk and 2(2CP - 1 - i) + 1 in
// its second: the same total on every rank.
//
// Attention is a ring over the group. Every rank packs the keys and values of its local rows
// (only the kv heads: [B, Tl, 2 KVH HS]) into a block that travels CP - 1 hops to the next
// rank while the rank computes with the block it holds. Which query rows see which key rows of
// a block follows from the chunk indices (rank i holding the block of rank j):
//   j == i  causal attention over the local rows (the local order keeps the mask right),
//   j <  i  all local queries see the block's first chunk (chunk j < i < 2CP-1-i), whole;
//   j >  i  the second local chunk (2CP-1-i > 2CP-1-j > j) sees the whole block; the first
//           chunk (i < j) sees none of it.
// Each step's partial result merges into the running output and log-sum-exp (online softmax,
// as the kernels do per tile). The backward runs the same ring from the final output and
// log-sum-exp: the key/value block travels again (CP - 1 hops) and with it an accumulator of
// its key/value gradient, which after CP hops is back on its owner.
//
// Packed documents (data.document_mask): each local row's document start, as a position in the
// sequence for the merges (a block's keys are visible from that position on) and as a local
// row for the diagonal block (the first local row at or after it: the local order keeps
// positions increasing, so the visible keys stay a contiguous range there too).
//
// What crosses the group per layer and micro-batch, in elements of the activation type with
// E = B Tl 2 KVH HS (one block): forward (CP - 1) E; backward (CP - 1) E of blocks and CP E of
// gradients. Sends are posted before the step's attention and waited for after it, so a block
// travels while the previous one is computed.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "tensor/device.hpp"

namespace trident {

// The pure part: where local row t of a sequence sits in it.
struct ContextLayout {
  int rank = 0;
  int size = 1;
  int64_t seq_len = 0;  // T

  int64_t chunk_rows() const { return seq_len / (2 * size); }  // Tc
  int64_t rows() const { return seq_len / size; }              // Tl
  // The position in the sequence of local row t (0 <= t < rows()).
  int64_t position(int64_t t) const {
    const int64_t tc = chunk_rows();
    return t < tc ? rank * tc + t : (2 * size - 1 - rank) * tc + (t - tc);
  }
  // position(t) of every local row, in order (increasing).
  std::vector<int32_t> positions() const {
    std::vector<int32_t> out(static_cast<size_t>(rows()));
    for (int64_t t = 0; t < rows(); ++t)
      out[static_cast<size_t>(t)] = static_cast<int32_t>(position(t));
    return out;
  }
  // local[b * Tl + t] = global[b * T + position(t)] for B sequences (tokens, targets).
  template <typename V>
  void take_local(V* local, const V* global, int64_t B) const {
    const int64_t tl = rows(), tc = chunk_rows();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t half = 0; half < 2; ++half) {
        const V* src = global + b * seq_len + position(half * tc);
        V* dst = local + b * tl + half * tc;
        for (int64_t t = 0; t < tc; ++t) dst[t] = src[t];
      }
  }
};

// A micro-batch's document starts on this rank (K's memory; both nullptr without documents):
// `local` [B,Tl] as local rows (the diagonal block's attention), `position` [B,Tl] as positions
// in the sequence (the merges').
struct RingDocuments {
  const int32_t* local = nullptr;
  const int32_t* position = nullptr;
};

// The ring attention of one rank (see above). Holds the blocks in flight (two key/value blocks
// and two gradient accumulators, allocated for the largest micro-batch seen); the context
// communicator counts what crosses the group.
template <class K>
class ContextRing {
 public:
  using T = typename K::T;
  using Saved = typename K::Saved;

  ContextRing() = default;
  ContextRing(Communicator* group, ContextLayout layout, int64_t NH, int64_t KVH, int64_t HS)
      : group_(group), layout_(layout), NH_(NH), KVH_(KVH), HS_(HS) {}

  bool active() const { return layout_.size > 1; }
  const ContextLayout& layout() const { return layout_; }

  // out [B,Tl,NH HS], lse [B,NH,Tl] (the kernels' Saved) of the local queries against the whole
  // sequence's keys, from the local qkv [B,Tl,(NH+2KVH) HS] (q and k rotated).
  void forward(K& k, T* out, Saved* lse, const T* qkv, int64_t B, RingDocuments docs = {}) {
    const int64_t Tl = layout_.rows(), N = B * Tl;
    ensure(k, B);
    k.kv_pack(kv_[0].data(), qkv, N, NH_, KVH_, HS_);
    for (int step = 0; step < layout_.size; ++step) {
      Exchange ex;
      if (step + 1 < layout_.size) ex.start(*this, kv_[0].data(), kv_[1].data(), N, kTagKv);
      const int src = holder(step);
      if (step == 0)
        k.attention_forward(out, lse, qkv, B, Tl, NH_, KVH_, HS_, docs.local);
      else
        visit(src, [&](int64_t q0, int64_t Tq, int64_t k0, int64_t Tk) {
          k.attention_merge_forward(out, lse, qkv, kv_[0].data(), B, Tl, q0, Tq, k0, Tk, NH_,
                                    KVH_, HS_, docs.position, key_positions(src, docs));
        });
      ex.finish();
      if (step + 1 < layout_.size) std::swap(kv_[0], kv_[1]);
    }
  }

  // dqkv [B,Tl,(NH+2KVH) HS] (overwrite) from dout [B,Tl,NH HS] and the forward's final out and
  // lse.
  void backward(K& k, T* dqkv, const T* dout, const T* qkv, const T* out, const Saved* lse,
                int64_t B, RingDocuments docs = {}) {
    const int64_t Tl = layout_.rows(), N = B * Tl;
    ensure(k, B);
    k.kv_pack(kv_[0].data(), qkv, N, NH_, KVH_, HS_);
    for (int step = 0; step < layout_.size; ++step) {
      Exchange blocks;
      if (step + 1 < layout_.size)
        blocks.start(*this, kv_[0].data(), kv_[1].data(), N, kTagKv);
      const int src = holder(step);
      if (step == 0) {
        // The local block: dq from the local keys, and the local block's own dk, dv, which
        // start its accumulator.
        k.attention_backward(dqkv, dout, qkv, out, lse, B, Tl, NH_, KVH_, HS_, docs.local);
        k.kv_pack(dkv_[0].data(), dqkv, N, NH_, KVH_, HS_);
      } else {
        visit(src, [&](int64_t q0, int64_t Tq, int64_t k0, int64_t Tk) {
          k.attention_merge_backward(dqkv, dkv_[0].data(), dout, qkv, kv_[0].data(), out, lse,
                                     B, Tl, q0, Tq, k0, Tk, NH_, KVH_, HS_, docs.position,
                                     key_positions(src, docs));
        });
      }
      // The accumulator follows its block; after the last step it goes home.
      Exchange grads;
      grads.start(*this, dkv_[0].data(), dkv_[1].data(), N, kTagGrad);
      blocks.finish();
      grads.finish();
      std::swap(kv_[0], kv_[1]);
      std::swap(dkv_[0], dkv_[1]);
    }
    k.kv_unpack(dqkv, dkv_[0].data(), N, NH_, KVH_, HS_);
  }

 private:
  static constexpr int kTagKv = 0x4b56;    // "KV"
  static constexpr int kTagGrad = 0x644b;  // "dK"

  // One hop of the ring: send `mine` to the next rank, receive the previous rank's into
  // `theirs`.
  struct Exchange {
    std::unique_ptr<CommRequest> send, recv;
    void start(ContextRing& ring, const T* mine, T* theirs, int64_t N, int tag) {
      const int n = ring.layout_.size, r = ring.layout_.rank;
      const int64_t count = N * 2 * ring.KVH_ * ring.HS_;
      recv = ring.group_->irecv(theirs, count, K::act_dtype, (r + n - 1) % n, tag);
      send = ring.group_->isend(mine, count, K::act_dtype, (r + 1) % n, tag);
    }
    void finish() {
      if (send) send->wait();
      if (recv) recv->wait();
    }
  };

  // Whose block this rank holds at ring step `step`.
  int holder(int step) const { return (layout_.rank - step + layout_.size) % layout_.size; }

  // The (query rows, key rows) pair of block `src` (another rank's) that this rank's queries
  // see in full (see the file comment): visit(q0, Tq, k0, Tk).
  template <class Visit>
  void visit(int src, Visit&& v) const {
    const int64_t tc = layout_.chunk_rows(), tl = layout_.rows();
    if (src < layout_.rank)
      v(int64_t{0}, tl, int64_t{0}, tc);
    else
      v(tc, tc, int64_t{0}, tl);
  }

  void ensure(K& k, int64_t B) {
    if (key_positions_.empty()) {  // each rank's rows' positions in the sequence (documents)
      for (int r = 0; r < layout_.size; ++r) {
        const std::vector<int32_t> host =
            ContextLayout{r, layout_.size, layout_.seq_len}.positions();
        const int64_t rows = static_cast<int64_t>(host.size());
        key_positions_.emplace_back(k.device(), rows);
        k.upload_ids(key_positions_.back().data(), host.data(), rows);
      }
    }
    const int64_t n = B * layout_.rows() * 2 * KVH_ * HS_;
    if (kv_[0].size() >= n) return;
    for (auto* a : {&kv_[0], &kv_[1], &dkv_[0], &dkv_[1]}) *a = DeviceArray<T>(k.device(), n);
  }
  // The positions of rank src's rows, for the merges' masks (nullptr without documents).
  const int32_t* key_positions(int src, const RingDocuments& docs) const {
    return docs.position ? key_positions_[static_cast<size_t>(src)].data() : nullptr;
  }

  Communicator* group_ = nullptr;
  ContextLayout layout_;
  int64_t NH_ = 0, KVH_ = 0, HS_ = 0;
  DeviceArray<T> kv_[2], dkv_[2];
  std::vector<DeviceArray<int32_t>> key_positions_;  // per rank of the group: [Tl]
};

}  // namespace trident
