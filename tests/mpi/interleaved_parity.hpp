#pragma once
// The interleaved parity check of test_parity_interleaved_np4.cpp and
// test_parity_interleaved_tp_np4.cpp (two binaries: each fits its MPI test timeout).
#include <gtest/gtest.h>
#include <mpi.h>

#include "counted_parity.hpp"

namespace trident::test {

inline std::vector<std::string> interleaved(int virtual_stages,
                                            std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"parallel.schedule=interleaved",
                                "parallel.virtual_stages=" + std::to_string(virtual_stages)};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// check_counted_parity of an interleaved layout.
inline void check_interleaved_parity(const ParityLayout& l, std::vector<std::string> extra,
                                     ParityData data = ParityData::Shards) {
  int64_t found = 0;
  for (const std::string& o : extra) found += o == "parallel.schedule=interleaved";
  ASSERT_EQ(found, 1) << "not an interleaved layout";
  check_counted_parity(l, std::move(extra), data);
}

}  // namespace trident::test
