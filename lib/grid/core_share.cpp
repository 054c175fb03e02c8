#include "grid/core_share.hpp"

#include <sched.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <fstream>
#include <string>

namespace trident {

void CoreSet::add(int core) {
  if (core >= 0 && core < kMaxCpus) words[core / 64] |= uint64_t{1} << (core % 64);
}

bool CoreSet::has(int core) const {
  return core >= 0 && core < kMaxCpus && ((words[core / 64] >> (core % 64)) & 1) != 0;
}

int CoreSet::count() const {
  int n = 0;
  for (uint64_t w : words) n += std::popcount(w);
  return n;
}

bool CoreSet::overlaps(const CoreSet& other) const {
  for (size_t i = 0; i < words.size(); ++i)
    if ((words[i] & other.words[i]) != 0) return true;
  return false;
}

CoreSet cores_of_cpus(const std::vector<int>& cpus,
                      const std::function<int(int)>& first_sibling) {
  CoreSet cores;
  for (int cpu : cpus) cores.add(first_sibling(cpu));
  return cores;
}

namespace {
// The lowest CPU of cpu's core: the first number of its thread_siblings_list ("0,64", "0-1",
// "5"; the kernel lists them in increasing order); cpu itself where the file is missing.
int first_sibling_from_sysfs(int cpu) {
  std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                   "/topology/thread_siblings_list");
  std::string list;
  if (!std::getline(in, list) || list.empty() ||
      !std::isdigit(static_cast<unsigned char>(list[0])))
    return cpu;
  return std::stoi(list);
}
}  // namespace

ProcessCpus this_process_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < kMaxCpus; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  // No mask read (a kernel with more than kMaxCpus CPUs refuses a cpu_set_t): the CPU this
  // thread runs on stands for the rank's cores, one thread.
  if (cpus.empty()) cpus.push_back(std::max(0, sched_getcpu()));
  return {static_cast<int>(cpus.size()), cores_of_cpus(cpus, first_sibling_from_sysfs)};
}

CoreShare share_cores(const std::vector<CoreSet>& host, size_t me, int cpus) {
  CoreShare share;
  share.cpus = std::max(1, cpus);
  share.cores = std::max(1, host.at(me).count());
  share.sharers = static_cast<int>(std::count_if(
      host.begin(), host.end(), [&](const CoreSet& other) { return other.overlaps(host[me]); }));
  share.sharers = std::max(1, share.sharers);  // an empty set overlaps nothing, not even itself
  share.threads = std::max(1, share.cores / share.sharers);
  return share;
}

std::string CoreShare::describe() const {
  std::string s = std::to_string(cores) + (cores == 1 ? " core" : " cores");
  if (cpus != cores) s += " (" + std::to_string(cpus) + " CPUs)";
  if (sharers == 1) return s + " of its own";
  return s + " shared by " + std::to_string(sharers) + " ranks";
}

}  // namespace trident
