#pragma once
// How many CPU threads a rank runs when the config leaves it to Trident (train.threads = 0): one
// per physical core the rank may run on, those cores shared out among the ranks of its host
// that may run on them too.
//
// A rank may run on the CPUs of its affinity mask. A launcher that binds nothing (MPICH's
// mpiexec by default) leaves every rank the whole node; one that binds (srun --cpus-per-task
// under Slurm's task/affinity plugin, mpiexec -bind-to core:N) gives each rank its own share.
// Dividing the mask by the node's ranks is right only in the first case: bound ranks would use
// 1/ranks_per_node of their own cores. So the ranks all-gather the cores of their masks
// (ProcessGrid does it with its node facts) and each divides its cores by the number of ranks of
// its host whose masks hold any of them, itself included.
//
// SMT siblings (hyper-threads) are one core: the GEMMs that take most of a step keep a core's
// FMA units busy, and a second thread on the core only competes for them (oneMKL's threading
// guidance; PyTorch's default thread count is the physical cores too).
//
// share_cores and cores_of_cpus are pure (unit-tested in tests/test_comm_grid.cpp);
// this_process_cpus reads the affinity mask and /sys.
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trident {

constexpr int kMaxCpus = 1024;  // glibc's CPU_SETSIZE: the CPUs a cpu_set_t can name

// A set of physical cores, each named by the lowest logical CPU of the core. Trivially
// copyable: ranks all-gather it as bytes.
struct CoreSet {
  std::array<uint64_t, kMaxCpus / 64> words{};
  void add(int core);  // ignores ids outside [0, kMaxCpus)
  bool has(int core) const;
  int count() const;
  bool overlaps(const CoreSet& other) const;
};

// The cores of the logical CPUs `cpus`: first_sibling(cpu) is the lowest CPU of cpu's core.
CoreSet cores_of_cpus(const std::vector<int>& cpus, const std::function<int(int)>& first_sibling);

// The CPUs this process may run on (sched_getaffinity) and their cores, each CPU's siblings
// read from /sys/devices/system/cpu/cpuN/topology/thread_siblings_list (a CPU whose file cannot
// be read counts as a core of its own). On a machine of more than kMaxCpus CPUs the mask cannot
// be read: the CPU the caller runs on stands for it (one thread).
struct ProcessCpus {
  int cpus = 1;  // logical CPUs of the mask
  CoreSet cores;
};
ProcessCpus this_process_cpus();

// One rank's share of the cores of its host.
struct CoreShare {
  int cpus = 1;     // logical CPUs of the rank's affinity mask
  int cores = 1;    // physical cores among them
  int sharers = 1;  // ranks of the host whose masks hold any of those cores, itself included
  int threads = 1;  // the default thread count: max(1, cores / sharers)
  // "2 cores (4 CPUs) shared by 2 ranks", "1 core of its own"
  std::string describe() const;
};

// host: the cores of every rank on one host; me: this rank's index there; cpus: the logical CPUs
// of its mask.
CoreShare share_cores(const std::vector<CoreSet>& host, size_t me, int cpus);

}  // namespace trident
