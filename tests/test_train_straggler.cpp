// The straggler report's ranking, line and metrics.jsonl record (train/straggler.hpp), without
// MPI. The report of a real run with one slowed rank: tests/test_app_watchdog.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/straggler.hpp"

using namespace trident;

TEST(Straggler, RanksBySlownessRelativeToTheMedian) {
  EXPECT_DOUBLE_EQ(median_of({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median_of({4, 1, 2, 3}), 2.5);
  const auto ranked = rank_by_score({10, 10, 30, 10});
  ASSERT_EQ(ranked.size(), 4u);
  EXPECT_EQ(ranked[0].rank, 2);
  EXPECT_DOUBLE_EQ(ranked[0].score, 3.0);
  EXPECT_EQ(ranked[1].rank, 0) << "ties keep rank order";
  EXPECT_DOUBLE_EQ(ranked[1].score, 1.0);
  EXPECT_DOUBLE_EQ(rank_by_score({0, 0})[0].score, 1.0) << "a zero median scores 1";
  EXPECT_EQ(format_straggler_line(11, 20, {10, 10, 30, 10}, {5, 5, 1, 5}, 2),
            "straggler report, steps 11-20 (ms per step): compute median 10.0, slowest rank 2 "
            "x3.00 (30.0), rank 0 x1.00 (10.0); communication median 5.0, most rank 0 x1.00 "
            "(5.0), rank 1 x1.00 (5.0)");
  const auto j = straggler_record(20, 10, {10, 30}, {5, 1}, 1);
  EXPECT_EQ(j.dump(),
            "{\"comm_ms\":[5.0,1.0],\"compute_ms\":[10.0,30.0],\"slowest\":[{\"rank\":1,"
            "\"score\":1.5}],\"step\":20,\"steps\":10,\"type\":\"straggler\"}");
}
