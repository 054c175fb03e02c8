#include "grid/process_grid.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "comm/mpi_comm.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

constexpr const char* kEnvRanksPerNode = "TRIDENT_RANKS_PER_NODE";

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("process grid: ") + call + " failed: " + std::string(text, len));
}

// TRIDENT_RANKS_PER_NODE: 0 when unset or empty; throws when not a positive integer. The
// environment is the same on every rank under mpiexec, so every rank throws the same.
int env_ranks_per_node() {
  const char* v = std::getenv(kEnvRanksPerNode);
  if (v == nullptr || *v == '\0') return 0;
  errno = 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < 1 || n > INT_MAX) {
    throw Error(std::string(kEnvRanksPerNode) + "='" + v + "' is not a positive integer");
  }
  return static_cast<int>(n);
}

int to_int(int64_t v, const char* key) {
  if (v < INT_MIN || v > INT_MAX) {
    throw Error(std::string(key) + " = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

std::unique_ptr<Communicator> split(MPI_Comm parent, int color, int key, const char* name) {
  MPI_Comm c = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(parent, color, key, &c), "MPI_Comm_split");
  if (c == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(c, name, true);
}

}  // namespace

// What every rank contributes to the one all-gather of the construction.
struct ProcessGrid::RankInfo {
  int32_t requested_rpn;  // ranks per node asked for (argument or environment); 0 = detect
  int32_t shm_leader;     // lowest world rank of this rank's shared-memory group
  int32_t shm_rank;       // rank in the shared-memory group
  int32_t shm_size;       // size of the shared-memory group
  int32_t cpus;           // logical CPUs of the rank's affinity mask
  CoreSet cores;          // their physical cores (core_share.hpp)
  char host[MPI_MAX_PROCESSOR_NAME];
};

ProcessGrid::ProcessGrid(MPI_Comm world, const GridShape& shape, int ranks_per_node,
                         const ModelConfig& model) {
  init(world, shape, ranks_per_node, model);
}

ProcessGrid::ProcessGrid(MPI_Comm world, const Config& config) {
  GridShape shape;
  shape.tp = to_int(config.parallel.tensor, "parallel.tensor");
  shape.pp = to_int(config.parallel.pipeline, "parallel.pipeline");
  shape.dp = to_int(config.parallel.data, "parallel.data");
  shape.cp = to_int(config.parallel.context, "parallel.context");
  shape.ep = to_int(config.parallel.expert, "parallel.expert");
  init(world, shape, to_int(config.parallel.ranks_per_node, "parallel.ranks_per_node"),
       config.model);
}

ProcessGrid::~ProcessGrid() {
  // Groups before the world they were split from: the reverse of table order.
  while (!owned_.empty()) owned_.pop_back();
}

void ProcessGrid::init(MPI_Comm world, const GridShape& shape, int ranks_per_node,
                       const ModelConfig& model) {
  int world_size = 0;
  check_mpi(MPI_Comm_size(world, &world_size), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(world, &rank_), "MPI_Comm_rank");

  // 1. Everything the arguments alone decide, before any collective. The same inputs on every
  //    rank (config, environment from mpiexec) give the same error on every rank.
  if (ranks_per_node < 0) {
    throw Error("parallel.ranks_per_node = " + std::to_string(ranks_per_node) +
                " must be >= 0 (0: detect)");
  }
  int requested = ranks_per_node;
  std::string source = "parallel.ranks_per_node";
  if (requested == 0) {
    requested = env_ranks_per_node();
    source = kEnvRanksPerNode;
  }
  validate_layout(shape, world_size, requested, model);
  shape_ = shape;
  coord_ = coord_of(shape_, rank_);

  // 2. One all-gather (every rank of `world` joins it): node facts and host names.
  MPI_Comm shm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shm),
            "MPI_Comm_split_type");
  RankInfo mine{};
  mine.requested_rpn = requested;
  MPI_Comm_rank(shm, &mine.shm_rank);
  MPI_Comm_size(shm, &mine.shm_size);
  {
    // The lowest world rank of the node: shm ranks are ordered by world rank (key = rank).
    int leader = rank_;
    MPI_Bcast(&leader, 1, MPI_INT, 0, shm);
    mine.shm_leader = leader;
  }
  MPI_Comm_free(&shm);
  {
    const ProcessCpus cpus = this_process_cpus();
    mine.cpus = cpus.cpus;
    mine.cores = cpus.cores;
  }
  int len = 0;
  MPI_Get_processor_name(mine.host, &len);
  mine.host[std::min(len, MPI_MAX_PROCESSOR_NAME - 1)] = '\0';
  std::vector<RankInfo> all(world_size);
  check_mpi(MPI_Allgather(&mine, sizeof(RankInfo), MPI_BYTE, all.data(), sizeof(RankInfo),
                          MPI_BYTE, world),
            "MPI_Allgather");

  // 3. Node checks on the gathered (identical) data: same decision on every rank.
  for (int r = 1; r < world_size; ++r) {
    if (all[r].requested_rpn != all[0].requested_rpn) {
      std::ostringstream m;
      m << "ranks per node differs between ranks (" << source << ": " << all[0].requested_rpn
        << " on rank 0, " << all[r].requested_rpn << " on rank " << r
        << "); set it the same for every rank";
      throw Error(m.str());
    }
  }
  node_of_.assign(world_size, 0);
  local_of_.assign(world_size, 0);
  host_of_.resize(world_size);
  for (int r = 0; r < world_size; ++r) host_of_[r] = all[r].host;
  std::vector<int> node_size;
  if (requested > 0) {
    simulated_ = true;
    node_source_ = "simulated by " + source;
    for (int r = 0; r < world_size; ++r) {
      node_of_[r] = r / requested;
      local_of_[r] = r % requested;
    }
    num_nodes_ = (world_size + requested - 1) / requested;
    node_size.assign(num_nodes_, requested);
    node_size.back() = world_size - (num_nodes_ - 1) * requested;
  } else {
    simulated_ = false;
    node_source_ = "detected with MPI_COMM_TYPE_SHARED";
    std::vector<int> leaders;
    for (int r = 0; r < world_size; ++r) leaders.push_back(all[r].shm_leader);
    std::sort(leaders.begin(), leaders.end());
    leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
    num_nodes_ = static_cast<int>(leaders.size());
    node_size.assign(num_nodes_, 0);
    for (int r = 0; r < world_size; ++r) {
      node_of_[r] = static_cast<int>(
          std::lower_bound(leaders.begin(), leaders.end(), all[r].shm_leader) - leaders.begin());
      local_of_[r] = all[r].shm_rank;
      node_size[node_of_[r]] = all[r].shm_size;
    }
    // Equal nodes: the standard message ("... does not divide the N ranks per node").
    bool uniform = std::all_of(node_size.begin(), node_size.end(),
                               [&](int s) { return s == node_size[0]; });
    if (uniform) validate_layout(shape_, world_size, node_size[0], model);
  }
  // Every tensor group inside one node (catches uneven nodes and ranks placed round-robin).
  check_inside_nodes(shape_, node_of_, host_of_);
  node_ = node_of_[rank_];
  local_rank_ = local_of_[rank_];
  ranks_per_node_ = node_size[node_];
  // The cores are shared among the ranks of the machine (the shared-memory group), whether or
  // not nodes are simulated: a simulated node's ranks still run on this machine's cores.
  std::vector<CoreSet> machine;
  size_t me = 0;
  for (int r = 0; r < world_size; ++r) {
    if (all[r].shm_leader != mine.shm_leader) continue;
    if (r == rank_) me = machine.size();
    machine.push_back(all[r].cores);
  }
  core_share_ = share_cores(machine, me, mine.cpus);

  // 4. The table and its communicators, in table order: collective over `world`, the same
  //    order on every rank. A group's color is its lowest world rank, its key this rank's
  //    index (the group-rank order of the pure functions in grid.hpp).
  dims_ = ParallelDims(shape_, rank_);
  dims_.placement = placement();
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(world, &dup), "MPI_Comm_dup");
  auto world_comm = std::make_unique<MpiCommunicator>(dup, "world", true);
  world_ = world_comm.get();
  dims_.mpi_world = world_->comm();
  for (DimGroup& g : dims_) {
    if (g.dim == Dim::World) {
      owned_.push_back(std::move(world_comm));
      g.host = world_;
    } else if (g.shared()) {
      g.host = dims_[g.shares].host;
    } else if (g.formed) {
      const int color =
          g.member() ? *std::min_element(g.ranks.begin(), g.ranks.end()) : MPI_UNDEFINED;
      if (std::unique_ptr<Communicator> c = split(world_->comm(), color, g.index, g.name)) {
        owned_.push_back(std::move(c));
        g.host = owned_.back().get();
      }
    }
  }
}

const std::string& ProcessGrid::host() const { return host_of_[rank_]; }

std::vector<const Communicator*> ProcessGrid::communicators() const {
  const std::vector<Communicator*> all = dims_.host_communicators();
  return {all.begin(), all.end()};
}

void ProcessGrid::reset_stats() {
  for (Communicator* c : communicators()) c->stats().reset();
}

std::string ProcessGrid::describe() const {
  std::ostringstream o;
  const bool cp = shape_.cp > 1;  // the cp column only where there is context parallelism
  o << "process grid: TP=" << shape_.tp << (cp ? " CP=" + std::to_string(shape_.cp) : "")
    << " PP=" << shape_.pp << " DP=" << shape_.dp
    << (shape_.ep > 1 ? " (EP=" + std::to_string(shape_.ep) + " inside DP)" : std::string())
    << ", "
    << world_size() << " ranks on " << num_nodes_ << (num_nodes_ == 1 ? " node" : " nodes")
    << " (" << node_source_ << ")\n";
  size_t host_w = 4;
  for (const auto& h : host_of_) host_w = std::max(host_w, h.size());
  char line[512];
  std::snprintf(line, sizeof line, "%6s %5s %6s %4s%s %4s %4s  %s\n", "rank", "node", "local",
                "tp", cp ? "   cp" : "", "pp", "dp", "host");
  o << line;
  for (int r = 0; r < world_size(); ++r) {
    GridCoord c = coord_of(shape_, r);
    char cp_column[16] = "";
    if (cp) std::snprintf(cp_column, sizeof cp_column, " %4d", c.cp);
    std::snprintf(line, sizeof line, "%6d %5d %6d %4d%s %4d %4d  %s\n", r, node_of_[r],
                  local_of_[r], c.tp, cp_column, c.pp, c.dp, host_of_[r].c_str());
    o << line;
  }
  return o.str();
}

std::string ProcessGrid::stats_table() const { return format_comm_stats(communicators()); }

std::string format_comm_stats(const std::vector<const Communicator*>& comms) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-11s %-15s %10s %12s %10s\n", "group", "op", "calls", "MB",
                "seconds");
  o << line;
  for (const Communicator* c : comms) {
    if (c == nullptr) continue;
    for (const auto& [op, s] : c->stats().ops) {
      if (s.calls == 0) continue;
      std::snprintf(line, sizeof line, "%-11s %-15s %10lld %12.3f %10.3f\n", c->name().c_str(),
                    op.c_str(), static_cast<long long>(s.calls), s.bytes / 1e6, s.seconds);
      o << line;
    }
  }
  return o.str();
}

}  // namespace trident
