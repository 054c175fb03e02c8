// GPU selection (see device_select.hpp).
#include "grid/device_select.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "util/error.hpp"

namespace trident {

namespace {

// "0 and 2", "0, 1 and 3"
std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s << (i + 1 == ranks.size() ? " and " : ", ");
    s << ranks[i];
  }
  return s.str();
}

}  // namespace

int select_device(int local_rank, int local_size, int visible) {
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
    throw Error("select_device: node-local rank " + std::to_string(local_rank) +
                " is not in [0, " + std::to_string(local_size) + ")");
  }
  if (visible < 0) {
    throw Error("select_device: device count " + std::to_string(visible) + " is negative");
  }
  if (visible == 0) {
    throw Error("no CUDA device visible to this rank (node-local rank " +
                std::to_string(local_rank) + "): train.device = \"cuda\" needs a GPU; check "
                "CUDA_VISIBLE_DEVICES and the job's GPU allocation");
  }
  return local_rank % visible;
}

std::string gpu_identity(const GpuClaim& claim) {
  if (!claim.uuid.empty()) return claim.uuid;
  if (!claim.pci.empty()) return claim.host + "/pci:" + claim.pci;
  return "";
}

std::string format_gpu_uuid(const unsigned char bytes[16]) {
  bool any = false;
  for (int i = 0; i < 16; ++i) any = any || bytes[i] != 0;
  if (!any) return "";
  std::string s = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(bytes[i]));
    s += hex;
  }
  return s;
}

std::string GpuSharing::describe(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(sharers.size()) || sharers[rank].size() <= 1)
    return "own GPU";
  std::ostringstream s;
  s << "shared by ranks ";
  for (size_t i = 0; i < sharers[rank].size(); ++i) s << (i ? ", " : "") << sharers[rank][i];
  s << " (parallel.comm = \"mpi\": staged through host memory)";
  return s.str();
}

GpuSharing check_gpu_sharing(const std::vector<GpuClaim>& claims, bool nccl) {
  if (claims.empty()) throw Error("check_gpu_sharing: no ranks");
  std::map<std::string, std::vector<int>> by_gpu;  // identity -> ranks, in rank order
  std::vector<std::string> id_of(claims.size());
  for (size_t r = 0; r < claims.size(); ++r) {
    id_of[r] = gpu_identity(claims[r]);
    if (id_of[r].empty()) {
      throw Error("rank " + std::to_string(r) + " (host " + claims[r].host +
                  ") reported a GPU with neither a UUID nor a PCI bus id");
    }
    by_gpu[id_of[r]].push_back(static_cast<int>(r));
  }
  GpuSharing s;
  s.gpus = static_cast<int>(by_gpu.size());
  s.sharers.resize(claims.size());
  for (size_t r = 0; r < claims.size(); ++r) {
    s.sharers[r] = by_gpu[id_of[r]];
    s.max_ranks_per_gpu = std::max(s.max_ranks_per_gpu, static_cast<int>(s.sharers[r].size()));
  }
  if (!nccl || s.max_ranks_per_gpu <= 1) return s;

  // The shared GPU of the lowest rank, named; the others counted. Ranks are scanned in order,
  // so the message is the same on every rank.
  int shared_gpus = 0;
  const std::vector<int>* first = nullptr;
  for (size_t r = 0; r < claims.size(); ++r) {
    const std::vector<int>& g = s.sharers[r];
    if (g.size() <= 1 || g.front() != static_cast<int>(r)) continue;
    ++shared_gpus;
    if (first == nullptr) first = &g;
  }
  const GpuClaim& c = claims[first->front()];
  std::ostringstream m;
  m << "parallel.comm = \"nccl\": ranks " << rank_list(*first) << " (host " << c.host << ") "
    << (first->size() == 2 ? "both" : "all") << " use GPU " << id_of[first->front()];
  if (!c.uuid.empty() && !c.pci.empty()) m << " (PCI " << c.pci << ")";
  if (shared_gpus > 1) m << ", and " << shared_gpus - 1 << " more GPUs are shared";
  m << ": NCCL needs a GPU of its own for every rank; bind one GPU per rank (srun "
       "--gpus-per-task=1, --gpu-bind or CUDA_VISIBLE_DEVICES; docs/gpu.md) or use "
       "parallel.comm = \"mpi\" to share GPUs";
  throw Error(m.str());
}

}  // namespace trident
