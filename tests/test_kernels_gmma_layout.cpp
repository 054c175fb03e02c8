// The Hopper attention's shared-memory addressing (kernels/cuda/gmma_layout.hpp), on the CPU:
// every wgmma descriptor the forward and backward kernels build (Q, K, V, dO as K-major
// operands; V, K, dO, Q as MN-major B operands; per k-step, warpgroup, tile and head size)
// addresses the element TMA put there, and the fragment maps (accumulators, the A operand in
// registers) agree with the packing of P and dS. These are the kernels' own constexpr functions
// under the PTX ISA's layouts as gmma_layout.hpp writes them; whether the hardware reads those
// layouts is the GPU test's question (CudaAttention.WgmmaMatchesMmaSyncAndTheCpu, skipped
// without an sm_90 GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cuda/gmma_layout.hpp"

namespace gm = trident::cuda::gmma;

namespace {

constexpr uint32_t kBase = 7 * 1024;  // any 1024-aligned offset

struct Counts {
  int64_t compared = 0, differing = 0;
};

// Q (A operand) and K (B operand) of S = Q K^T: rows x HS tiles, k-steps of 16 over HS.
Counts check_k_major(int rows, int row0, int mn_extent, int HS) {
  Counts n;
  for (int ks = 0; ks < HS / 16; ks++) {
    const gm::SmemDesc d = gm::k_major_desc(kBase, rows, row0, ks);
    for (int mn = 0; mn < mn_extent; mn++)
      for (int k = 0; k < 16; k++) {
        n.compared++;
        if (gm::element_address(gm::Major::K, d, mn, k) !=
            gm::tile_address(kBase, rows, row0 + mn, 16 * ks + k))
          n.differing++;
      }
  }
  return n;
}

}  // namespace

TEST(GmmaLayout, SwizzlePermutesTheChunksOfEachRow) {
  // Within each 1024-byte atom, every 128-byte row keeps its 8 chunks (a permutation), and
  // every byte lands once.
  std::set<uint32_t> seen;
  for (uint32_t a = 0; a < 4 * gm::kAtomBytes; a++) {
    const uint32_t s = gm::swizzle128(a);
    EXPECT_EQ(s / gm::kRowBytes, a / gm::kRowBytes) << a;
    EXPECT_EQ(s % 16, a % 16) << a;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 4 * gm::kAtomBytes);
  // Row 3's chunk 5 sits at chunk 5 ^ 3 = 6 (the CUDA guide's 128-byte swizzle).
  EXPECT_EQ(gm::tma_sw128_address(0, 3, 5 * 8), 3 * 128 + 6 * 16u);
}

// Every K-major operand the kernels read: (tile rows, first row of the operand, its rows).
struct KMajorUse {
  const char* what;
  int rows, row0, extent;
};
std::vector<KMajorUse> k_major_uses(int HS) {
  const int bn = HS == 64 ? 128 : 64;  // the forward's and the dQ pass's key tile
  return {{"forward / dQ pass: Q, dO (A), warpgroup 1", 128, 0, 64},
          {"forward / dQ pass: Q, dO (A), warpgroup 2", 128, 64, 64},
          {"forward / dQ pass: K, V (B)", bn, 0, bn},
          {"dK/dV pass: K, V (A), warpgroup 1", 128, 0, 64},
          {"dK/dV pass: K, V (A), warpgroup 2", 128, 64, 64},
          {"dK/dV pass: Q, dO (B)", 64, 0, 64}};
}

TEST(GmmaLayout, KMajorDescriptorsReadWhatTmaWrote) {
  int64_t compared = 0, expected = 0;
  for (int HS : {64, 128})
    for (const KMajorUse& use : k_major_uses(HS)) {
      const Counts n = check_k_major(use.rows, use.row0, use.extent, HS);
      EXPECT_EQ(n.differing, 0) << use.what << ", HS " << HS;
      compared += n.compared;
      expected += int64_t(HS / 16) * use.extent * 16;
    }
  std::printf("[gmma] K-major descriptors (Q, K, V, dO): %lld element addresses compared\n",
              static_cast<long long>(compared));
  EXPECT_EQ(compared, expected);
  EXPECT_GT(compared, 0);
}

TEST(GmmaLayout, MnMajorDescriptorsReadWhatTmaWroteTransposed) {
  // V in O = P V and K in dQ = dS K (tiles of the key tile's rows), dO and Q in dV = P^T dO and
  // dK = dS^T Q (tiles of 64 queries), and the atomic dQ's dS^T [64 keys][64 queries] as its A:
  // k = the tile's row, n (or m) = the head dimension (or the query).
  int64_t compared = 0, differing = 0, expected = 0;
  for (int HS : {64, 128})
    for (int rows : {HS == 64 ? 128 : 64, 64}) {
      for (int j = 0; j < rows / 16; j++) {
        const gm::SmemDesc d = gm::mn_major_desc(kBase, rows, j);
        for (int n = 0; n < HS; n++)
          for (int k = 0; k < 16; k++) {
            compared++;
            if (gm::element_address(gm::Major::MN, d, n, k) !=
                gm::tile_address(kBase, rows, 16 * j + k, n))
              differing++;
          }
      }
      expected += int64_t(rows / 16) * HS * 16;
    }
  // The atomic dQ's B: a consumer warpgroup's 64 keys (rows 64 cw ..) of the 128-key K tile.
  for (int HS : {64, 128})
    for (int cw : {0, 1})
      for (int j = 0; j < 64 / 16; j++) {
        const gm::SmemDesc d = gm::mn_major_desc(kBase + 64 * cw * gm::kRowBytes, 128, j);
        for (int n = 0; n < HS; n++)
          for (int k = 0; k < 16; k++) {
            compared++;
            if (gm::element_address(gm::Major::MN, d, n, k) !=
                gm::tile_address(kBase, 128, 64 * cw + 16 * j + k, n))
              differing++;
          }
        expected += int64_t(HS) * 16;
      }
  std::printf("[gmma] MN-major descriptors (V, K, dO, Q, dS): %lld element addresses compared, "
              "%lld differ\n", static_cast<long long>(compared), static_cast<long long>(differing));
  EXPECT_EQ(compared, expected);
  EXPECT_GT(compared, 0);
  EXPECT_EQ(differing, 0);
}

TEST(GmmaLayout, AMisplacedKStepIsSeen) {
  // The check above sees a descriptor one k-step off (the counterfactual of an indexing slip).
  int64_t differing = 0;
  const gm::SmemDesc d = gm::k_major_desc(kBase, 128, 0, 1);
  for (int mn = 0; mn < 64; mn++)
    for (int k = 0; k < 16; k++)
      differing += gm::element_address(gm::Major::K, d, mn, k) !=
                   gm::tile_address(kBase, 128, mn, k);  // k-step 0's element
  EXPECT_EQ(differing, 64 * 16);
}

TEST(GmmaLayout, DescriptorFieldsAreEncodedWhereThePtxIsaPutsThem) {
  const gm::SmemDesc d{0x2F3A0, 16 * 1024, 1024};
  const uint64_t e = gm::encode(d);
  EXPECT_EQ(e & 0x3FFF, 0x2F3A0u >> 4);
  EXPECT_EQ((e >> 16) & 0x3FFF, (16u * 1024) >> 4);
  EXPECT_EQ((e >> 32) & 0x3FFF, 1024u >> 4);
  EXPECT_EQ((e >> 49) & 0x7, 0u);  // base offset: atoms are 1024-aligned
  EXPECT_EQ(e >> 62, 1u);          // SWIZZLE_128B
  // Every start the kernel can form (shared memory below 228 KB) fits the 14-bit field.
  EXPECT_LT((228u * 1024) >> 4, 1u << 14);
}

// The rows the two consumer warpgroups of an attention block own (block_acc_row, the query
// rows of the forward and dQ kernels, the dK/dV pass's keys): the 128 rows of the block, each by
// the four threads of a quad, e = 0 and 2 being the thread's two rows (e = 1, 3 their second
// columns). A warpgroup offset left out puts both warpgroups on rows 0-63.
TEST(GmmaLayout, TheConsumerWarpgroupsTakeTheBlocksRowsOnce) {
  std::vector<int> owners(128, 0);
  int64_t outside = 0;
  for (int cw = 0; cw < 2; cw++)
    for (int t = 0; t < 128; t++)
      for (const int e : {0, 2}) {
        const int row = gm::block_acc_row(cw, t, e);
        if (row < 64 * cw || row >= 64 * cw + 64) ++outside;
        if (row >= 0 && row < 128) ++owners[static_cast<size_t>(row)];
      }
  EXPECT_EQ(outside, 0) << "every row inside its warpgroup's 64";
  EXPECT_EQ(owners, std::vector<int>(128, 4)) << "each row by one quad";
  for (int t = 0; t < 128; t++)
    for (int e = 0; e < 4; e++)
      EXPECT_EQ(gm::block_acc_row(1, t, e) - gm::block_acc_row(0, t, e), 64);
}

TEST(GmmaLayout, AccumulatorsAndTheRegisterAOperandTileTheirMatrices) {
  // The accumulators of m64n128 cover the 64 x 128 tile once; the A registers of m64k16 cover
  // 64 x 16 once; and packing P (accumulators of columns [16 j, 16 j + 16)) into A puts each
  // value where the A operand expects it.
  std::set<std::pair<int, int>> acc, a;
  int64_t packed = 0, misplaced = 0;
  for (int t = 0; t < 128; t++) {
    for (int idx = 0; idx < 64; idx++)
      acc.insert({gm::acc_row(t, idx % 4), gm::acc_col(t, idx / 4, idx % 4)});
    for (int r = 0; r < 4; r++)
      for (int h = 0; h < 2; h++) {
        a.insert({gm::a_row(t, r), gm::a_col(t, r, h)});
        for (int j = 0; j < 8; j++) {
          const int idx = gm::acc_for_a(j, r, h);
          packed++;
          misplaced += gm::acc_row(t, idx % 4) != gm::a_row(t, r) ||
                       gm::acc_col(t, idx / 4, idx % 4) != 16 * j + gm::a_col(t, r, h);
        }
      }
  }
  EXPECT_EQ(acc.size(), 64u * 128);
  EXPECT_EQ(a.size(), 64u * 16);
  EXPECT_EQ(packed, 128 * 4 * 2 * 8);
  EXPECT_EQ(misplaced, 0);
}
