#pragma once
// Shared-memory layouts of the Hopper attention kernels (attention_sm90.cu, attention_sm90_bwd.cu):
// where TMA puts a tile, how a wgmma descriptor addresses it, and which accumulator a thread
// holds. Plain C++ (host and device) so the CPU tests check the kernels' own descriptors and
// fragment maps (tests/test_kernels_gmma_layout.cpp) without a GPU.
//
// Conventions (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"; CUTLASS's
// cute/atom/mma_traits_sm90_gmma.hpp writes the same canonical layouts), bf16 operands:
//  * 128-byte swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B, descriptor layout type 1): memory is
//    made of 1024-byte atoms of 8 rows x 128 bytes, and the 16-byte chunk j of row r of an
//    atom sits at chunk j ^ (r % 8). It is a function of the shared-memory address (bits
//    [4,7) ^= bits [7,10)), so atoms must be 1024-byte aligned, and a descriptor whose start
//    is moved by a multiple of 16 bytes inside an atom still sees the same swizzle.
//  * K-major operand (Q and K in S = Q K^T: the k index runs along a row): an m x 16 slice is
//    rows of 8 at 128 bytes apart, groups of 8 rows SBO bytes apart, the 16 k elements two
//    16-byte chunks side by side; LBO is unused. A k-step of 16 moves the start by 32 bytes.
//  * MN-major operand (V in O = P V: the n index runs along a row, "transposed B"): n in runs
//    of 64 elements (one 128-byte row) LBO bytes apart, k rows 128 bytes apart in groups of 8
//    SBO bytes apart. A k-step of 16 moves the start by 16 rows.
//  * Accumulator D of m64nNk16 (fp32), thread t of the warpgroup, warp w = t / 32, lane = 4 g
//    + c: d[4 i + e] is row 16 w + g + 8 (e / 2), column 8 i + 2 c + (e % 2). An A operand in
//    registers (m64k16 bf16, four 32-bit registers of two values) has the same map per 8
//    columns: a[r] holds row 16 w + g + 8 (r % 2), columns 8 (r / 2) + 2 c and + 1 (the lower
//    column in the low half), so the accumulators of columns [16 j, 16 j + 16) are the A
//    operand of the k-step j as they are.
#include <cstdint>

#if defined(__CUDACC__)
#define TRIDENT_GMMA_HD __host__ __device__
#else
#define TRIDENT_GMMA_HD
#endif

namespace trident::cuda::gmma {

constexpr uint32_t kAtomBytes = 1024;  // 8 rows x 128 bytes
constexpr uint32_t kRowBytes = 128;    // 64 bf16
constexpr int kRowElems = 64;

constexpr TRIDENT_GMMA_HD uint32_t swizzle128(uint32_t addr) {
  return addr ^ (((addr >> 7) & 7u) << 4);
}

// Byte address at which TMA (box of `rows` x 64 bf16, SWIZZLE_128B) writes element (row, col)
// of its box into a 1024-aligned destination `base`.
constexpr TRIDENT_GMMA_HD uint32_t tma_sw128_address(uint32_t base, int row, int col) {
  return swizzle128(base + uint32_t(row) * kRowBytes + uint32_t(col) * 2);
}

enum class Major { K, MN };

struct SmemDesc {
  uint32_t start;  // byte address in shared memory (16-aligned)
  uint32_t lbo;    // leading-dimension byte offset (MN-major: between 64-element runs of n)
  uint32_t sbo;    // stride byte offset (between groups of 8 rows / 8 k)
};

// The 64-bit wgmma matrix descriptor: start, LBO and SBO in 16-byte units (14 bits each at bits
// 0, 16, 32), base offset 0 (atoms 1024-aligned), layout type SWIZZLE_128B (1) at bits 62-63.
constexpr TRIDENT_GMMA_HD uint64_t encode(SmemDesc d) {
  return uint64_t((d.start >> 4) & 0x3FFFu) | uint64_t((d.lbo >> 4) & 0x3FFFu) << 16 |
         uint64_t((d.sbo >> 4) & 0x3FFFu) << 32 | uint64_t(1) << 62;
}

// The address the descriptor `d` (SWIZZLE_128B, bf16) gives element (mn, k) of its operand,
// mn < 64 (A) or < N (B), k < 16: the canonical layouts above.
constexpr TRIDENT_GMMA_HD uint32_t element_address(Major major, SmemDesc d, int mn, int k) {
  const uint32_t off =
      major == Major::K
          ? uint32_t(mn % 8) * kRowBytes + uint32_t(mn / 8) * d.sbo + uint32_t(k / 8) * 16 +
                uint32_t(k % 8) * 2
          : uint32_t(mn % kRowElems) * 2 + uint32_t(mn / kRowElems) * d.lbo +
                uint32_t(k % 8) * kRowBytes + uint32_t(k / 8) * d.sbo;
  return swizzle128(d.start + off);
}

// ------------------------------------------------------------------ the attention tiles
// A tile of `rows` x HS bf16 is loaded as HS / 64 boxes of rows x 64 (128-byte rows, the
// swizzle's width), box b at base + b * rows * 128: column col of row r is in box col / 64.
constexpr TRIDENT_GMMA_HD uint32_t tile_address(uint32_t base, int rows, int row, int col) {
  return tma_sw128_address(base + uint32_t(col / kRowElems) * uint32_t(rows) * kRowBytes, row,
                           col % kRowElems);
}

// K-major operand (S = Q K^T: Q as A, rows [row0, row0 + 64); K as B, all `rows` keys) of a
// tile at `base`: k-step ks covers columns [16 ks, 16 ks + 16).
constexpr TRIDENT_GMMA_HD SmemDesc k_major_desc(uint32_t base, int rows, int row0, int ks) {
  return SmemDesc{base + uint32_t((16 * ks) / kRowElems) * uint32_t(rows) * kRowBytes +
                      uint32_t(row0) * kRowBytes + uint32_t((16 * ks) % kRowElems) * 2,
                  16, 8 * kRowBytes};
}

// MN-major B operand (V in O = P V: k = key, n = head dimension) of a tile of `rows` keys at
// `base`: k-step j covers keys [16 j, 16 j + 16); the HS / 64 boxes are the runs of n.
constexpr TRIDENT_GMMA_HD SmemDesc mn_major_desc(uint32_t base, int rows, int j) {
  return SmemDesc{base + uint32_t(16 * j) * kRowBytes, uint32_t(rows) * kRowBytes,
                  8 * kRowBytes};
}

// Accumulator fragment of a warpgroup thread (m64nNk16, fp32): row and column of d[4 i + e].
constexpr TRIDENT_GMMA_HD int acc_row(int thread, int e) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * ((e % 4) / 2);
}
constexpr TRIDENT_GMMA_HD int acc_col(int thread, int i, int e) {
  return 8 * i + 2 * (thread % 4) + (e % 2);
}
// The same row in a block whose consumer warpgroups take 64 rows each: warpgroup cw's
// accumulators hold rows [64 cw, 64 cw + 64) of the block's 128 (the attention kernels' query
// rows, or the dK/dV pass's keys).
constexpr TRIDENT_GMMA_HD int block_acc_row(int cw, int thread, int e) {
  return 64 * cw + acc_row(thread, e);
}
// A operand in registers (m64k16 bf16): row and column of half h (0 low, 1 high) of a[r].
constexpr TRIDENT_GMMA_HD int a_row(int thread, int r) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * (r % 2);
}
constexpr TRIDENT_GMMA_HD int a_col(int thread, int r, int h) {
  return 8 * (r / 2) + 2 * (thread % 4) + h;
}
// Which accumulator (index into d[], of the 16 columns of k-step j) the kernel packs into
// half h of a[r]: columns 16 j + 8 (r / 2) + .., rows + 8 (r % 2).
constexpr TRIDENT_GMMA_HD int acc_for_a(int j, int r, int h) {
  return 4 * (2 * j + r / 2) + 2 * (r % 2) + h;
}

}  // namespace trident::cuda::gmma
