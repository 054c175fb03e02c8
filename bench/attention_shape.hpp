#pragma once
// The attention benchmarks' shapes (bench/gpu_attention.cu, bench/attention_cpu.cpp):
// "B:T:NH:KVH:HS" on the command line.
#include <cstdint>
#include <cstdio>

struct AttentionShape {
  int64_t B, T, NH, KVH, HS;
};

// False for anything but five positive sizes with KVH dividing NH.
inline bool parse_attention_shape(const char* s, AttentionShape& out) {
  long long v[5];
  if (std::sscanf(s, "%lld:%lld:%lld:%lld:%lld", &v[0], &v[1], &v[2], &v[3], &v[4]) != 5)
    return false;
  out = {v[0], v[1], v[2], v[3], v[4]};
  return out.B > 0 && out.T > 0 && out.NH > 0 && out.KVH > 0 && out.HS > 0 &&
         out.NH % out.KVH == 0;
}
