#pragma once
// ZeRO-2 and ZeRO-3 inside one rank's model (optim.zero_stage; docs/parallelism.md "ZeRO
// stages"). The flat buffer is cut into units (model/params.hpp's param_units: a layer, a
// layer's stacked experts, the embeddings, the final norm, the LM head); every rank of a unit's
// group (the data x context group; the expert-data group for experts) owns an even slice of it.
//
// Stage 2: the rank keeps the accumulated gradients of its slices only (packed, grad_store()).
// Backward writes a unit's gradients into a window of the whole unit, opened (zeroed) the first
// time a gradient of the unit is asked for; when the unit's backward of a micro-batch is done the
// window's reduce-scatter over the unit's group is posted, and when it completes (below) the
// rank's slice is added into the packed gradients and the window handed back. The micro-batches
// accumulate into the slices.
//
// Stage 3: the fp32 master weights are packed slices too (weight_store()). The compute copy of
// a unit (K's T: fp32 on the CPU, bf16 on a GPU) is all-gathered, in place, into one of a few
// slots the first time a pass (one micro-batch's forward or backward of a chunk) reads it, and
// each layer the pass reaches starts the gather of the next layer in the pass's direction
// (non-blocking): the prefetch. A new pass forgets what the slots hold, so a unit is gathered
// once per pass that reads it, the same number on every rank of its group (the gathers are
// collectives).
//
// Both stages' collectives are non-blocking: a unit's reduce-scatter is completed (its slice
// added, its window handed back) when the next one is posted, or when the step's gradients are
// asked for; a gather when its unit is read. So at most three windows exist: the one in flight,
// the one backward writes, and with a tied head the token embedding's. On the CPU, MPI
// progresses them inside the rank's MPI calls only; a helper thread testing them
// (comm.hpp's ProgressHelper) made ZeRO-3 slower on a machine whose cores all compute (0.76x
// of ZeRO-1 against 0.80x without, bench/zero_stages.py): the copies it drives need a core.
//
// Ranks of a group make the same calls in the same order (they run the same schedule on the
// same layout), which is what the collectives need.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "model/kernel_traits.hpp"
#include "model/params.hpp"
#include "tensor/device.hpp"
#include "util/error.hpp"

namespace trident {

// Bytes of a rank's model state by kind (the start-up lines, the memory test).
struct ModelStateBytes {
  int64_t weights = 0;    // fp32 master weights (stage 3: the rank's slices)
  int64_t compute = 0;    // a separate compute copy (bf16 on a GPU; none on the CPU)
  int64_t gradients = 0;  // fp32 gradients (stage 2, 3: the rank's slices)
  int64_t moments = 0;    // AdamW's two moments (stage 1 and up: the rank's slices)
  int64_t gather = 0;     // stage 3: the gather slots; stage 2, 3: the gradient windows at peak
  int64_t total() const { return weights + compute + gradients + moments + gather; }
};

template <class K>
class ZeroShards {
 public:
  using T = typename K::T;
  using G = typename K::G;
  // The gradients' and master weights' type on the wire (fp32; fp64 in the CPU's double kernel
  // set, which the finite-difference tests run).
  static constexpr DType master_dtype = std::is_same_v<G, float> ? DType::F32 : DType::F64;

  // `data`: the group the dense units are sharded over; `expert_data`: the stacked experts'
  // (nullptr: data's).
  ZeroShards(const std::vector<ParamInfo>& params, int64_t flat_size, int stage,
             Communicator& data, Communicator* expert_data, K& k)
      : k_(k), stage_(stage), units_(param_units(params, flat_size)) {
    if (stage != 2 && stage != 3)
      throw Error("ZeroShards: stage " + std::to_string(stage) + " (2 or 3)");
    unit_of_.assign(params.size(), -1);
    for (size_t u = 0; u < units_.size(); ++u) {
      Shard& s = shards_.emplace_back();
      s.comm = units_[u].expert && expert_data ? expert_data : &data;
      const int size = s.comm->size();
      s.slice = (units_[u].range.size() + size - 1) / size;
      s.mine = zero_slice(units_[u].range, s.comm->rank(), size);
      store_.ranges.push_back(s.mine);
      max_slice_ = std::max(max_slice_, s.slice);
      for (int i : units_[u].params) unit_of_[static_cast<size_t>(i)] = static_cast<int>(u);
    }
    // Packed positions: the slices in flat order (units are sorted by offset); touching slices
    // are one stored range.
    int64_t at = 0;
    for (Shard& s : shards_) {
      s.index = at;
      at += s.mine.size();
    }
    store_.ranges = coalesced(std::move(store_.ranges));
    Device& dev = k_.device();
    grads_ = DeviceArray<G>(dev, at);
    if (stage_ == 3) {
      master_ = DeviceArray<G>(dev, at);
      int slots = 0;
      for (const ParamUnit& unit : units_) slots = std::max(slots, units_in_layer(unit.layer));
      // The units one operation reads (a layer's, or the LM head beside the final norm), the
      // next layer's prefetched beside them, and one more for the head's pair.
      slots_.resize(static_cast<size_t>(2 * std::max(1, slots) + 1));
    }
  }

  int stage() const { return stage_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  int unit_of(int param) const { return unit_of_[static_cast<size_t>(param)]; }
  // The rank's slices, in flat order: what the packed gradients (and at stage 3 the weights)
  // store.
  const FlatStore& store() const { return store_; }
  G* grads() { return grads_.data(); }
  G* master() { return stage_ == 3 ? master_.data() : nullptr; }
  // The packed position of unit u's slice.
  int64_t packed_index(int u) const { return shards_[static_cast<size_t>(u)].index; }
  FlatRange slice_of(int u) const { return shards_[static_cast<size_t>(u)].mine; }

  void zero_grads() {
    finish_reductions(0);
    for (Shard& s : shards_) close_window(s);
    k_.device().fill_zero(grads_.data(), grads_.bytes());
  }

  // ------------------------------------------------------------------------ gradients
  // Where backward accumulates the gradient of parameter i (flat offset `offset`): its unit's
  // window (opened and zeroed if not open), or on a group of one the packed gradients.
  G* grad(int param, int64_t offset) {
    const int u = unit_of(param);
    Shard& s = shards_[static_cast<size_t>(u)];
    const FlatRange& range = units_[static_cast<size_t>(u)].range;
    if (s.comm->size() == 1) return grads_.data() + s.index + (offset - range.begin);
    if (!s.window) {
      s.window = take_window(s.slice * s.comm->size());
      k_.device().fill_zero(s.window->data(), s.slice * s.comm->size() * sizeof(G));
    }
    return s.window->data() + (offset - range.begin);
  }
  // The backward of unit u for the running micro-batch is done: post the reduce-scatter of its
  // window (if open); its slice is added into the packed gradients when it completes (in the
  // order posted: the same sums on every run).
  void reduce_unit(int u) {
    Shard& s = shards_[static_cast<size_t>(u)];
    if (!s.window) return;
    finish_reductions(kReductionsInFlight - 1);
    Reduction& r = reductions_.emplace_back();
    r.unit = u;
    r.window = std::move(s.window);
    if (free_received_.empty()) {
      r.received = std::make_unique<DeviceArray<G>>(k_.device(), max_slice_);
      received_bytes_ += r.received->bytes();
    } else {
      r.received = std::move(free_received_.back());
      free_received_.pop_back();
    }
    r.request = s.comm->ireduce_scatter(r.window->data(), r.received->data(), s.slice,
                                        master_dtype);
  }
  // Every unit of layer `layer` (a dense part and its experts).
  void reduce_layer(int layer) {
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].layer == layer) reduce_unit(static_cast<int>(u));
  }
  // Every window still open (end of a step: a unit whose backward did not say it was done),
  // and every reduction completed: grads() holds the step's sums.
  void reduce_all() {
    for (size_t u = 0; u < units_.size(); ++u) reduce_unit(static_cast<int>(u));
    finish_reductions(0);
  }

  // ------------------------------------------------------------------------ weights (stage 3)
  // A pass (one micro-batch's forward or backward of a chunk, or a decode step) begins: what the
  // slots hold is forgotten, and the pass runs toward higher layers (forward) or lower.
  void begin_pass(bool backward) {
    backward_ = backward;
    for (Slot& slot : slots_) slot.unit = -1;
  }
  // The compute copy of parameter i (flat offset `offset`), gathered for this pass.
  const T* weight(int param, int64_t offset) {
    const int u = unit_of(param);
    const FlatRange& range = units_[static_cast<size_t>(u)].range;
    Slot& slot = resident(u);
    if (!slot.prefetched_next && units_[static_cast<size_t>(u)].layer >= 0) {
      slot.prefetched_next = true;
      prefetch_layer(adjacent_layer(u, backward_ ? -1 : +1));
    }
    return slot.buffer.data() + (offset - range.begin);
  }
  // Start gathering the units of layer `layer` (nothing for -1 or a layer not on this rank).
  void prefetch_layer(int layer) {
    if (layer < 0) return;
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].layer == layer && find_slot(static_cast<int>(u)) == nullptr)
        start_gather(static_cast<int>(u));
  }
  // The master weights changed (the update, a load): every gathered copy is stale.
  void weights_changed() {
    for (Slot& slot : slots_) slot.unit = -1;
  }

  // Bytes held beyond the packed slices: the gather slots, the windows and the received
  // slices (every one made: their peak).
  int64_t gather_bytes() const {
    int64_t n = window_bytes_ + received_bytes_;
    for (const Slot& slot : slots_) n += slot.buffer.bytes();
    return n;
  }

  // Completes what is still in flight (a prefetch the last pass made) unless an error unwinds:
  // then the requests are dropped (comm.hpp: never block while unwinding).
  ~ZeroShards() {
    try {
      if (std::uncaught_exceptions() > 0) return;
      for (Slot& slot : slots_)
        if (slot.pending) slot.pending->wait();
      for (Reduction& r : reductions_) r.request->wait();
    } catch (...) {  // a failed collective at exit: its error was or will be reported elsewhere
    }
  }
  ZeroShards(const ZeroShards&) = delete;
  ZeroShards& operator=(const ZeroShards&) = delete;

 private:
  struct Shard {
    Communicator* comm = nullptr;
    int64_t slice = 0;  // elements per rank (the unit padded to slice * size)
    FlatRange mine;     // this rank's slice of the unit
    int64_t index = 0;  // where `mine` starts in the packed buffers
    std::unique_ptr<DeviceArray<G>> window;  // the unit's whole gradient (open) or none
  };
  // A unit's reduce-scatter in flight: its window and the slice it receives.
  struct Reduction {
    int unit = -1;
    std::unique_ptr<DeviceArray<G>> window, received;
    std::unique_ptr<CommRequest> request;
  };
  // A layer's reduce-scatter overlaps the backward of the next: more in flight would hold more
  // windows (a window each).
  static constexpr size_t kReductionsInFlight = 1;

  struct Slot {
    int unit = -1;           // the unit whose compute copy `buffer` holds (-1: none)
    int64_t used = 0;        // the demand counter when last used (least recently used goes)
    bool prefetched_next = false;
    DeviceArray<T> buffer;   // [slice * size] the gathered unit
    std::unique_ptr<CommRequest> pending;  // the gather in flight
  };

  int units_in_layer(int layer) const {
    if (layer < 0) return 1;
    int n = 0;
    for (const ParamUnit& unit : units_) n += unit.layer == layer;
    return n;
  }
  // The layer of the first unit after (dir +1) or before (-1) unit u that belongs to another
  // layer; -1 if none.
  int adjacent_layer(int u, int dir) const {
    const int layer = units_[static_cast<size_t>(u)].layer;
    for (int v = u + dir; v >= 0 && v < static_cast<int>(units_.size()); v += dir)
      if (const int other = units_[static_cast<size_t>(v)].layer; other >= 0 && other != layer)
        return other;
    return -1;
  }

  // Completes the oldest reductions until at most `keep` are in flight: each one's slice added
  // into the packed gradients, its window and received buffer handed back.
  void finish_reductions(size_t keep) {
    while (reductions_.size() > keep) {
      Reduction& r = reductions_.front();
      r.request->wait();
      const Shard& s = shards_[static_cast<size_t>(r.unit)];
      G* into = grads_.data() + s.index;
      if constexpr (std::is_same_v<G, float>) {
        k_.device().add(into, r.received->data(), s.mine.size());
      } else {  // the double kernel set: host memory
        for (int64_t i = 0; i < s.mine.size(); ++i) into[i] += r.received->data()[i];
      }
      free_windows_.push_back(std::move(r.window));
      free_received_.push_back(std::move(r.received));
      reductions_.erase(reductions_.begin());
    }
  }
  // A free window of at least `elements` (the smallest such), else a new one of exactly that
  // size: units of one size (the layers) share their windows.
  std::unique_ptr<DeviceArray<G>> take_window(int64_t elements) {
    auto best = free_windows_.end();
    for (auto it = free_windows_.begin(); it != free_windows_.end(); ++it)
      if ((*it)->size() >= elements &&
          (best == free_windows_.end() || (*it)->size() < (*best)->size()))
        best = it;
    if (best != free_windows_.end()) {
      auto w = std::move(*best);
      free_windows_.erase(best);
      return w;
    }
    window_bytes_ += elements * static_cast<int64_t>(sizeof(G));
    return std::make_unique<DeviceArray<G>>(k_.device(), elements);
  }
  void close_window(Shard& s) {
    if (s.window) free_windows_.push_back(std::move(s.window));
  }

  void finish_gather(Slot& slot) {
    if (!slot.pending) return;
    slot.pending->wait();
    slot.pending.reset();
  }
  Slot* find_slot(int u) {
    for (Slot& slot : slots_)
      if (slot.unit == u) return &slot;
    return nullptr;
  }
  Slot& resident(int u) {
    Slot* slot = find_slot(u);
    if (!slot) slot = &start_gather(u);
    finish_gather(*slot);
    slot->used = ++demands_;
    return *slot;
  }
  // Posts the gather of unit u into a free slot, else the least recently used one (waiting out
  // a gather still in flight there: every rank completes every collective it posted).
  Slot& start_gather(int u) {
    Slot* victim = nullptr;
    for (Slot& slot : slots_) {
      const bool free = slot.unit < 0, victim_free = victim && victim->unit < 0;
      if (!victim || (free && !victim_free) || (free == victim_free && slot.used < victim->used))
        victim = &slot;
    }
    Slot& slot = *victim;
    finish_gather(slot);
    const Shard& s = shards_[static_cast<size_t>(u)];
    if (slot.buffer.size() < s.slice * s.comm->size())  // grown to the largest unit it held
      slot.buffer = DeviceArray<T>(k_.device(), s.slice * s.comm->size());
    // In place: the rank's slice goes where the gather puts it (no send buffer, no copy of it).
    Device& dev = k_.device();
    const int64_t mine = s.mine.size();
    T* own = slot.buffer.data() + s.comm->rank() * s.slice;
    if constexpr (kernels_keep_compute_copy<K>)
      k_.convert(own, master_.data() + s.index, mine);
    else
      dev.copy(own, master_.data() + s.index, mine * sizeof(G));
    dev.fill_zero(own + mine, (s.slice - mine) * sizeof(T));
    slot.unit = u;
    slot.used = ++demands_;
    slot.prefetched_next = false;
    slot.pending = s.comm->iall_gather(own, slot.buffer.data(), s.slice, K::act_dtype);
    return slot;
  }

  K& k_;
  int stage_;
  std::vector<ParamUnit> units_;
  std::vector<int> unit_of_;
  std::vector<Shard> shards_;
  FlatStore store_;
  int64_t max_slice_ = 0;  // the largest unit slice: the reduce-scatter's receive buffer
  DeviceArray<G> grads_, master_;
  std::vector<Reduction> reductions_;  // in flight, oldest first
  std::vector<std::unique_ptr<DeviceArray<G>>> free_received_;
  int64_t received_bytes_ = 0;  // every received-slice buffer made
  std::vector<std::unique_ptr<DeviceArray<G>>> free_windows_;
  int64_t window_bytes_ = 0;  // every window made
  std::vector<Slot> slots_;
  bool backward_ = false;
  int64_t demands_ = 0;
};

}  // namespace trident
