#pragma once
// A cluster described for the cost model (docs/plan.md): devices per node, one device's
// throughput, GEMM efficiency and memory, and the links between devices inside a node and
// across nodes. Read from configs/hardware/*.toml (written by hand from datasheets, or by
// `trident bench-hw` from measurements). Pure: no MPI, no device.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trident {

// One kind of link: achieved bandwidth per device and per direction, latency per message.
struct LinkSpec {
  double bandwidth_gbs = 0.0;  // GB/s (1e9 bytes) per device, one direction
  double efficiency = 1.0;     // fraction of bandwidth_gbs collectives achieve
  double latency_us = 0.0;     // per algorithm step (one message on the link)
  double bytes_per_s() const { return bandwidth_gbs * efficiency * 1e9; }
};

// Bytes a device sends per byte of message in a collective over n devices, as a multiple of
// (n-1)/n: ring all-reduce 2, ring all-gather and reduce-scatter 1. Send/recv: a multiple of
// the message (1).
struct CollectiveFactors {
  double all_reduce = 2.0;
  double all_gather = 1.0;
  double reduce_scatter = 1.0;
  double send_recv = 1.0;
};

// The optimizer pass's bytes per owned fp32 parameter: AdamW reads weight, gradient and two
// moments and writes weight and two moments (7 values), the gradient norm reads the gradient
// again and zeroing it writes it (2 more): 9 x 4 bytes.
constexpr double kOptimizerBytesPerParam = 36.0;

struct DeviceSpec {
  std::string kind;                 // "gpu" | "cpu"
  double peak_tflops_fp32 = 0.0;    // dense peak, 1e12 FLOP/s
  double peak_tflops_bf16 = 0.0;
  // Optional, a GPU's only (0: absent): the dense FP8 tensor-core rate train.precision = "fp8"
  // runs the covered linear layers' GEMMs at (docs/plan.md "FP8"). A CPU has none: the CPU
  // reference stores its quantised operands in fp32 and multiplies them at the fp32 rate.
  double peak_tflops_fp8 = 0.0;
  // (GEMM size, fraction of peak): size is the cube root of m*n*k; sorted by size.
  std::vector<std::pair<double, double>> gemm_efficiency;
  // Optional (empty: gemm_efficiency by volume): [rows, in, out, fraction of peak] of a linear
  // layer's three training GEMMs (forward rows x in x out, both gradients) as the trainer runs
  // them, on a full grid (every combination of the rows, in and out values present), which
  // gemm_efficiency() interpolates in log space. A GEMM's efficiency depends on its shape, not
  // only its volume: thin products split over a rank's threads worse than a cube of the same
  // FLOPs (docs/plan.md, "Third wave"). bench-hw measures it on the CPU.
  std::vector<std::array<double, 4>> gemm_efficiency_shapes;
  // Optional (empty: gemm_efficiency_shapes for bf16 too): the same grid through the products
  // train.precision = "bf16" runs where they are not the fp32 GEMM's (a CPU's oneDNN bf16
  // engine, train.cpu_bf16_gemm: its operands converted at each call, its own blocking), in
  // fractions of peak_tflops_bf16. bench-hw measures it where "auto" runs that engine.
  std::vector<std::array<double, 4>> gemm_efficiency_shapes_bf16;
  // Optional (empty: the GEMM curve at T x HS x T): (size, fraction of peak) the trainer's fused
  // attention forward and backward reach, counted as the plan counts attention's FLOPs (the
  // full T x T, three passes); size is the cube root of T*T*HS. bench-hw measures it on both
  // devices; on a CPU the blocked kernel's softmax and small GEMMs run far below the GEMM curve.
  std::vector<std::pair<double, double>> attention_efficiency;
  // Optional (empty: attention_efficiency for bf16 too): the same curve for the attention
  // train.precision = "bf16" runs where it is not fp32's kernel (a CPU's oneDNN bf16 engine:
  // kernels/cpu/attention_bf16.cpp, a matmul call per query block, whose cost per call
  // outweighs its speed on short heads), in fractions of peak_tflops_bf16. bench-hw measures it
  // where train.cpu_bf16_gemm = "auto" runs that engine.
  std::vector<std::pair<double, double>> attention_efficiency_bf16;
  // Optional (empty: 1/3, the forward's share of the FLOPs the plan counts): (size, fraction of
  // the attention's forward + backward time its forward takes), size as attention_efficiency's;
  // fractions in (0, 1). What recomputation reruns and a pipeline stage's forward holds: the
  // forward's share of the time is not its share of the FLOPs where the softmax's exponentials
  // and the kernels' per-call costs weigh (short heads on a CPU: 0.40-0.48 at T 128, head size
  // 16; 0.30-0.33 at T 1024, head size 64). bench-hw measures it with each attention curve.
  std::vector<std::pair<double, double>> attention_forward_share;
  // Optional: the same for the attention attention_efficiency_bf16 times. A bf16 plan reads it
  // where it reads that curve (1/3 where this is empty), attention_forward_share otherwise.
  std::vector<std::pair<double, double>> attention_forward_share_bf16;
  double memory_gib = 0.0;          // capacity, GiB
  double reserved_gib = 0.0;        // taken before training starts (context, workspaces)
  double memory_bandwidth_gbs = 0.0;
  // Optional (absent: 1), in (0, 1]: the share of memory_bandwidth_gbs the trainer's
  // memory-bound kernels (norms, activations, residual adds, the optimizer's pass, copies)
  // stream at. A measured file's bandwidth is already that of the trainer's own kernel (1); a
  // datasheet file's is the chip's peak, which such kernels do not reach (an H200's: 0.71,
  // bench-hw --device cuda).
  double memory_efficiency = 1.0;
  // Optional (empty: memory_bytes_per_s() at every size): (parameters, GB/s) the trainer's
  // optimizer pass streams at over a rank's parameters (gradient norm, AdamW, gradient zeroing;
  // bytes as the plan counts them); sorted by parameters. bench-hw measures it on both devices;
  // on a CPU AdamW streams nearer a copy's rate than the GELU's and a small model's state sits
  // in cache.
  std::vector<std::pair<double, double>> optimizer_bandwidth_gbs;
  // Optional, a GPU's only (0: absent): GB/s of one device-to-host copy into pinned memory, one
  // direction (the PCIe link's): a checkpoint's staging copy of the rank's weights and moments
  // (docs/plan.md "Checkpoints"). A CPU's staging is a copy in its own memory.
  double host_link_gbs = 0.0;
  // Both backends of the trainer keep the row logsumexp [B,NH,T] (blocked, fused attention),
  // never the probabilities [B,NH,T,T]; PlanProblem::attention can still model the latter.
  bool materializes_attention() const { return false; }
};

struct HardwareSpec {
  std::string name;
  std::string source;  // the file it was read from
  int64_t devices_per_node = 0;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;
  CollectiveFactors collectives;
  // Optional (0: absent): GB/s the job's checkpoint writes reach on its file system, all its
  // ranks writing one file together (storage.write_gbs; `trident bench-hw --storage-dir DIR`
  // measures it as the checkpoint writes: collective MPI-IO, then a sync). Without it the plan
  // does not model checkpoints (docs/plan.md "Checkpoints").
  double storage_write_gbs = 0.0;
  // Optional (0: none counted): milliseconds a checkpoint pays for each dataset of its own
  // beyond its bytes (creation, metadata, the checksums' agreement; storage.dataset_ms, which
  // bench-hw measures beside write_gbs). A checkpoint writes three datasets a tensor.
  double storage_dataset_ms = 0.0;

  // Peak dense FLOP/s for train.precision ("fp32" | "bf16" | "fp8"); trident::Error otherwise.
  // For "fp8" the peak of its base precision (fp8_base_precision): the rate of everything but
  // the FP8 GEMMs, and the peak MFU is reported against ("bf16-equivalent" on a GPU, as
  // torchtitan and Megatron-LM report FP8 runs).
  double peak_flops(const std::string& precision) const;
  // What train.precision = "fp8" keeps outside its FP8 GEMMs (activations, attention, norms,
  // the LM head, the compute copy of the weights): "bf16" on a GPU, "fp32" on a CPU (the
  // reference computes in fp32).
  std::string fp8_base_precision() const;
  // The dense FLOP/s of an FP8 GEMM: device.peak_tflops_fp8 on a GPU (a trident::Error of one
  // line naming the file and the key where the file has none), the fp32 peak on a CPU (the
  // reference's FP8 GEMMs are fp32 GEMMs of the quantised values).
  double fp8_gemm_flops() const;
  // Bytes of one quantised FP8 element: 1 on a GPU, the fp32 compute type's 4 on a CPU.
  double fp8_element_bytes() const;
  // Bytes per second the trainer's memory-bound kernels stream at: memory_bandwidth_gbs times
  // memory_efficiency.
  double memory_bytes_per_s() const;
  // Fraction of peak a GEMM of m x n x k reaches: the curve linearly interpolated in
  // log(size), flat beyond its ends.
  // A linear layer's GEMM of `rows` x `in` x `out` (forward; its gradients the same FLOPs):
  // gemm_efficiency_shapes interpolated where the file has it, else the volume curve at the
  // cube root of rows in out. `precision` "bf16" takes gemm_efficiency_shapes_bf16 where the
  // file has that grid.
  double gemm_efficiency(double rows, double in, double out,
                         const std::string& precision = "") const;
  // Fraction of peak the attention of sequence T and head size HS reaches: the attention curve
  // where the file has one (interpolated as gemm_efficiency), else gemm_efficiency(T, HS, T).
  // `precision` "bf16" takes attention_efficiency_bf16 where the file has that curve.
  double attention_efficiency(double T, double HS, const std::string& precision = "") const;
  // The fraction of that attention's forward + backward time its forward takes: the share
  // curve that goes with the efficiency curve attention_efficiency reads (interpolated as it
  // is), else 1/3 (the forward's share of the FLOPs the plan counts).
  double attention_forward_share(double T, double HS, const std::string& precision = "") const;
  // Bytes per second of the optimizer pass over `parameters` owned elements: the optimizer
  // curve where the file has one (interpolated as gemm_efficiency), else the memory bandwidth.
  double optimizer_bytes_per_s(double parameters) const;
};

// What `trident bench-hw` measures on a device, in the units it measures (app/cmd_bench_hw.cpp
// on the CPU, cuda/cuda_bench_hw.cpp on a GPU): GEMM GFLOP/s at a size (the cube root of the
// FLOPs' m n k; a cube, or a linear layer's three training GEMMs of that volume), the fused
// attention's GFLOP/s at (T, head size) counted as the plan counts it, and the optimizer pass's
// bytes per second (kOptimizerBytesPerParam a parameter) over a parameter count.
struct MeasuredGemm {
  double size = 0, gflops = 0;
};
struct MeasuredAttention {
  int64_t T = 0, head_size = 0;
  double gflops = 0;
  // The forward's best time over the sum of its and the backward's, each timed alone (0: not
  // measured).
  double forward_share = 0;
};
struct MeasuredOptimizer {
  int64_t parameters = 0;
  double bytes_per_s = 0;
};

// A measured rate as a fraction of the peak, as every measured curve and grid of a hardware
// file holds it: clamped to [1e-3, 1].
double measured_efficiency(double gflops, double peak_gflops);

// The attention curve (attention_efficiency and _bf16) of measured rates over a peak.
std::vector<std::pair<double, double>> attention_curve(
    double peak_gflops, const std::vector<MeasuredAttention>& attention);
// The forward-share curve (attention_forward_share and _bf16) of the same measurements, each
// share clamped to [0.05, 0.95]; empty where any point lacks its share.
std::vector<std::pair<double, double>> attention_share_curve(
    const std::vector<MeasuredAttention>& attention);

// Sets the device's measured curves from them, the same way for every device: the GEMM curve is
// `training`'s rates over `peak_gflops` and the attention curve attention's (each fraction
// measured_efficiency's; attention's size the cube root of T T HS), the optimizer curve the
// rates in GB/s, the attention's forward-share curve attention_share_curve's. Empty `attention`
// or `optimizer`: that optional curve stays empty.
void set_measured_curves(DeviceSpec& device, double peak_gflops,
                         const std::vector<MeasuredGemm>& training,
                         const std::vector<MeasuredAttention>& attention,
                         const std::vector<MeasuredOptimizer>& optimizer);

// Reads and checks a hardware file. A missing key, a wrong type or an impossible value is a
// trident::Error of one line naming the file and the key.
HardwareSpec load_hardware(const std::string& path);
HardwareSpec parse_hardware(const std::string& toml_text, const std::string& source);

// The file text for `hw` (what bench-hw writes), with `comment` lines at the top.
std::string hardware_to_toml(const HardwareSpec& hw, const std::vector<std::string>& comment);

// Seconds for one collective of `bytes` (per device) over `n` devices on `link`: the ring
// algorithm's steps times the latency plus the bytes on the wire over the bandwidth.
enum class Collective { AllReduce, AllGather, ReduceScatter, SendRecv };
double collective_seconds(const HardwareSpec& hw, const LinkSpec& link, Collective c, int64_t n,
                          double bytes);
// Seconds for one all-to-all over `n` devices on `link` in which each device holds `bytes`
// split evenly over the n destinations (its own block stays): a pairwise exchange of n - 1
// steps, each one message latency, sending (n-1)/n of the bytes at send_recv's factor.
double all_to_all_seconds(const HardwareSpec& hw, const LinkSpec& link, int64_t n, double bytes);

}  // namespace trident
