// Pure functions of the optimizer: the learning-rate schedule and AdamW's arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "tensor/device.hpp"
#include "util/bf16.hpp"

using namespace trident;

TEST(LrSchedule, LinearWarmupThenCosineToFloor) {
  OptimConfig o;
  o.lr = 1e-3;
  o.min_lr = 1e-4;
  o.warmup_steps = 10;
  const int64_t steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(o, steps, 0), 1e-4);  // (0+1)/10 of lr
  EXPECT_DOUBLE_EQ(learning_rate(o, steps, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, steps, 9), 1e-3);  // warmup ends at full lr
  EXPECT_DOUBLE_EQ(learning_rate(o, steps, 10), 1e-3);
  EXPECT_NEAR(learning_rate(o, steps, 60), 0.5 * (1e-3 + 1e-4), 1e-15);  // halfway
  EXPECT_NEAR(learning_rate(o, steps, 110), 1e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, steps, 500), 1e-4, 1e-15);  // clamps past the end
  for (int64_t s = 10; s < steps; ++s)  // monotone decay
    EXPECT_LE(learning_rate(o, steps, s + 1), learning_rate(o, steps, s));
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, steps, 0), 1e-3);
}

TEST(AdamW, OneStepMatchesTheFormulaAndSkipsDecayWhereAsked) {
  OptimConfig o;
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.5;
  ParamInfo w;  // a decayed matrix
  w.name = "m.weight";
  w.local_shape = w.global_shape = {2};
  w.weight_decay = true;
  w.offset = 0;
  ParamInfo b;  // a bias: no decay
  b.name = "m.bias";
  b.local_shape = b.global_shape = {2};
  b.offset = 2;
  auto host = make_cpu_device();
  AdamW adam({w, b}, {{0, 4}}, o, *host);
  std::vector<float> weights = {1.0f, -2.0f, 1.0f, -2.0f};
  std::vector<float> grads = {0.5f, 0.25f, 0.5f, 0.25f};
  adam.update(weights.data(), grads.data(), o.lr, 1.0);
  // Step 1: m_hat = g, v_hat = g^2 -> update = g/|g| = sign(g) (+ decay on the matrix).
  EXPECT_NEAR(weights[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-6);
  EXPECT_NEAR(weights[1], -2.0 - 0.1 * (1.0 + 0.5 * -2.0), 1e-6);
  EXPECT_NEAR(weights[2], 1.0 - 0.1, 1e-6);
  EXPECT_NEAR(weights[3], -2.0 - 0.1, 1e-6);
  EXPECT_EQ(adam.state_bytes(), 4 * 2 * 4);
  EXPECT_EQ(adam.updates(), 1);
  // A shard of the same buffer ([1, 3): half the matrix, half the bias) updates identically.
  AdamW shard({w, b}, {{1, 3}}, o, *host);
  std::vector<float> w2 = {1.0f, -2.0f, 1.0f, -2.0f};
  shard.update(w2.data(), grads.data(), o.lr, 1.0);
  EXPECT_EQ(w2[0], 1.0f);
  EXPECT_EQ(w2[1], weights[1]);
  EXPECT_EQ(w2[2], weights[2]);
  EXPECT_EQ(w2[3], -2.0f);
  EXPECT_EQ(shard.state_bytes(), 2 * 2 * 4);
}

// A bf16 model's compute copy: rewritten in the update's own pass, bit for bit the rounding of
// the updated weights, when the optimizer owns every parameter; left alone (and reported so)
// for a ZeRO-1 shard, whose other weights arrive later by all-gather. Neighbouring tensors of
// the same decay run as one loop: the results are those of one loop per tensor.
TEST(AdamW, RewritesTheBf16CopyOnlyWhenItOwnsEveryParameter) {
  OptimConfig o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  std::vector<ParamInfo> params;
  const int64_t sizes[] = {7, 5, 9, 3};
  const bool decay[] = {true, true, false, true};
  int64_t offset = 0;
  for (int i = 0; i < 4; ++i) {
    ParamInfo p;
    p.name = "p" + std::to_string(i);
    p.local_shape = p.global_shape = {sizes[i]};
    p.weight_decay = decay[i];
    p.offset = offset;
    offset += sizes[i];
    params.push_back(p);
  }
  const int64_t n = offset;
  std::vector<float> start(n), grads(n);
  for (int64_t i = 0; i < n; ++i) {
    start[i] = 0.1f * static_cast<float>(i % 11) - 0.5f + 1e-3f * static_cast<float>(i);
    grads[i] = 0.03f * static_cast<float>((i * 7) % 13) - 0.2f;
  }
  auto host = make_cpu_device();
  // One AdamW per tensor: the reference for the merged loops.
  std::vector<float> ref = start;
  for (const ParamInfo& p : params) {
    AdamW one({p}, {{p.offset, p.offset + p.numel()}}, o, *host);
    for (int step = 0; step < 2; ++step)
      one.update(ref.data(), grads.data(), o.lr, 0.5);
  }
  AdamW all(params, {{0, n}}, o, *host);
  EXPECT_TRUE(all.owns_every_parameter());
  std::vector<float> weights = start;
  std::vector<uint16_t> copy(n, 0xffff);
  for (int step = 0; step < 2; ++step)
    EXPECT_TRUE(all.update(weights.data(), grads.data(), o.lr, 0.5, copy.data()));
  int64_t compared = 0;
  for (int64_t i = 0; i < n; ++i, ++compared) {
    EXPECT_EQ(weights[i], ref[i]) << i;
    EXPECT_EQ(copy[i], float_to_bf16(weights[i])) << i;
  }
  EXPECT_EQ(compared, n);
  // Without a copy: the same weights.
  AdamW plain(params, {{0, n}}, o, *host);
  std::vector<float> w_plain = start;
  for (int step = 0; step < 2; ++step)
    EXPECT_FALSE(plain.update(w_plain.data(), grads.data(), o.lr, 0.5));
  EXPECT_EQ(w_plain, weights);
  // A ZeRO-1 shard: its part updated like the whole, the copy untouched.
  AdamW shard(params, {{4, 15}}, o, *host);
  EXPECT_FALSE(shard.owns_every_parameter());
  std::vector<float> w_shard = start;
  std::vector<uint16_t> untouched(n, 0xffff);
  for (int step = 0; step < 2; ++step)
    EXPECT_FALSE(shard.update(w_shard.data(), grads.data(), o.lr, 0.5, untouched.data()));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(w_shard[i], (i >= 4 && i < 15) ? ref[i] : start[i]) << i;
    EXPECT_EQ(untouched[i], 0xffff) << i;
  }
}

TEST(GradSync, BucketsCoverTheBufferFromTheEndAtParameterBoundaries) {
  std::vector<ParamInfo> params(4);
  for (int i = 0; i < 4; ++i) {
    params[i].local_shape = {100};
    params[i].offset = 100 * i;
  }
  EXPECT_EQ(make_buckets(params, 400, 150),
            (std::vector<FlatRange>{{300, 400}, {200, 300}, {100, 200}, {0, 100}}));
  EXPECT_EQ(make_buckets(params, 400, 250), (std::vector<FlatRange>{{200, 400}, {0, 200}}));
  EXPECT_EQ(make_buckets(params, 400, 10),  // a parameter larger than a bucket stays whole
            (std::vector<FlatRange>{{300, 400}, {200, 300}, {100, 200}, {0, 100}}));
  EXPECT_EQ(make_buckets(params, 400, 1000), (std::vector<FlatRange>{{0, 400}}));
}

TEST(GradSync, ZeroSlicesPartitionEachBucket) {
  for (int64_t len : {1, 7, 64, 101})
    for (int dp : {1, 2, 3, 4, 8}) {
      const FlatRange bucket{1000, 1000 + len};
      int64_t next = bucket.begin;
      for (int r = 0; r < dp; ++r) {
        const FlatRange s = zero_slice(bucket, r, dp);
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.size(), (len + dp - 1) / dp);
        next = s.end;
      }
      EXPECT_EQ(next, bucket.end);
    }
}

TEST(GradNorm, CountsOnlyParametersMarkedCounted) {
  ParamInfo a, b;
  a.local_shape = {3};
  a.offset = 0;
  b.local_shape = {1};
  b.offset = 3;
  b.counted_in_norm = false;  // e.g. a replica another tensor rank counts
  std::vector<float> g = {1, 2, 2, 100};
  auto host = make_cpu_device();
  EXPECT_DOUBLE_EQ(grad_square_sum({a, b}, g.data(), {{0, 4}}, *host), 9.0);
  EXPECT_DOUBLE_EQ(grad_square_sum({a, b}, g.data(), {{1, 4}}, *host), 8.0);
}

TEST(GradNorm, BackToBackRangesRunTogether) {
  std::vector<float> g(10);
  const std::vector<Device::Range> ranges = {
      {g.data(), 2}, {g.data() + 2, 3}, {g.data() + 6, 1}, {g.data() + 7, 3}, {g.data(), 1}};
  std::vector<std::pair<int64_t, int64_t>> runs;  // (offset, size)
  for_each_contiguous_run(ranges, [&](const float* data, int64_t size) {
    runs.emplace_back(data - g.data(), size);
  });
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 5}, {6, 4}, {0, 1}};
  EXPECT_EQ(runs, expected);
  int calls = 0;
  for_each_contiguous_run({}, [&](const float*, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}
