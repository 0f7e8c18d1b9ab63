// Calibration of a hardware profile against measured runs (`strata bench --calibrate`, issue 12,
// docs/cost-model.md "Calibration"). The profile's link and compute rates are measured one at a
// time by `strata profile`; in a real schedule the lanes share memory bandwidth and cores, and the
// compute lane does work the terms leave out. The fit compares every predicted term with the busy
// time of the lane that carries it, phase by phase, then fits how far the lanes' overlap falls
// short of the paper's max:
//   1. compute lane = a_gemm * (GEMM and dequantization term) + a_gpu_attn * (GPU-tier attention)
//                     + overhead * (layer-units of work)
//                     + step_overhead * (step-units: work per step outside the layers; fitted
//                       only when the runs have two layer counts or more)
//                     + link_interference * (the stage's link seconds, at the refined link rates:
//                       copies on the compute's own cores slow it)     (least squares, relative)
//   2. each link lane = its term * a_link, and the CPU attention lane = CATT * a_cpu_attn
//      (least squares, relative; fitted first, since 1. prices the copies at these rates)
//   3. overlap_slowdown: the phase times against max + k (sum - max) of the refined terms (the
//      links and the compute pipeline, cost_model.h's StageTime)
//      (a one-dimensional least squares over k in [0, 1])
// and folds the factors into a refined profile (rates divided by their factor).
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "strata/model/config.h"
#include "strata/policy/cost_model.h"
#include "strata/policy/policy.h"
#include "strata/profile/hardware.h"

namespace strata {

// Lanes of the offloading engine (OffloadReport's busy times), in this order. The CPU attention
// lane is busy in decode only (OffloadReport::cpu_attention_seconds).
enum BusyLane : int { kLaneCompute, kLaneH2d, kLaneD2h, kLaneDisk, kLaneCpuAttention, kNumLanes };

// One measured block: what ran and how long each phase and lane took.
struct CalibrationSample {
  std::string name;
  ModelConfig config;
  Policy policy;
  Workload workload;
  double prefill_s = 0, decode_s = 0;  // wall time of the phases (decode: gen_len - 1 steps)
  std::array<double, kNumLanes> prefill_busy{}, decode_busy{};
};

// A lane's fit: measured busy = factor * predicted (or, for compute, the three-part form).
struct CalibrationFit {
  HardwareProfile profile;   // the refined profile
  double gemm_factor = 1, gpu_attention_factor = 1, cpu_attention_factor = 1, overhead_s = 0, step_overhead_s = 0;
  double link_interference = 0;  // compute seconds per second of the stage's (refined) link work
  // Compute parts the runs could not separate from the ones before them ("gpu attention",
  // "overhead"): the GPU attention factor is then the GEMM's, the overhead 0. More varied runs
  // determine them. "cpu attention": runs delegate attention but none measured its lane (a
  // results.jsonl from before that lane was recorded); its factor stays 1.
  std::vector<std::string> undetermined;
  // Compute parts the runs did determine but with a meaningless sign (a negative overhead, a
  // non-positive attention factor), as "overhead (fitted -0.12 ms per layer-unit)", or less than 3
  // standard errors from 0 ("gpu attention (fitted factor 6.4 +- factor 11: within the runs'
  // scatter)"): dropped like the undetermined ones. A sign drop says the terms miss something that
  // scales another way; a scatter drop, that the runs are too noisy or the part too small to tell.
  std::vector<std::string> dropped;
  std::array<double, kNumLanes> link_factor{1, 1, 1, 1, 1};  // H2d, D2h and Disk (the others unused)
  double overlap_slowdown = 0;
  // Relative error of predicted total throughput per sample (predicted / measured - 1), with the
  // base profile and with the refined one.
  std::vector<double> error_before, error_after;
  // Each sample predicted by a fit without it (>= 4 samples); NaN where that fit fails.
  std::vector<double> error_leave_one_out;
};

// The compute lane's work outside the cost model's terms, measured rather than fitted: per unit
// of work and layer (CalibrationFit::overhead_s) and per unit and step outside the layers
// (step_overhead_s), in seconds.
struct MeasuredOverheads {
  double layer_s = 0, step_s = 0;
  std::string on;  // what they were measured on, for the profile's description
};

// Overheads from probe runs: blocks of a model whose layers do almost no work (engine_calibration.h),
// at two layer counts or more for a step part. Their compute lane's busy time less what the
// terms predict, fitted to the units of work per layer and per step (relative least squares). A
// part that comes out negative is measured as 0, the other fitted alone. nullopt when fewer than
// two probe phases kept the compute lane measurably busy (a backend whose lane times read 0 for
// blocks this short); throws with no probes.
std::optional<MeasuredOverheads> measure_overheads(const HardwareProfile& base,
                                                   const std::vector<CalibrationSample>& probes, const std::string& on);

// Throws strata::Error with fewer than 2 samples or a sample without measured times. A staggered
// sample (prefill_batches_per_step) is fitted through its super-steps: its phases are the steps in
// which some GPU batch prefills and the others, as the engine reports them (cost_model.h, phase_terms).
// `by` names the runs in the refined profile's description ("calibrated by BY over N runs: ...").
// With `overheads`, the two overheads are those, not columns of the fit: each run's compute less
// them is fitted to the other parts.
CalibrationFit calibrate_profile(const HardwareProfile& base, const std::vector<CalibrationSample>& samples,
                                 const std::string& by = "strata bench --calibrate",
                                 const MeasuredOverheads* overheads = nullptr);

// fit.undetermined as "gpu attention, overhead" ("" when every part was fitted).
std::string undetermined_list(const CalibrationFit& fit);
// fit.dropped likewise, "; "-separated.
std::string dropped_list(const CalibrationFit& fit);

// The cost model's seconds on each lane for the sample's block under `hw`: [0] prefill, [1] decode
// (phase_terms times the layers; the disk lane carries reads and writes).
std::array<std::array<double, kNumLanes>, 2> predicted_lane_seconds(const HardwareProfile& hw,
                                                                    const CalibrationSample& s);

// The total-throughput error of one sample under a profile: predicted / measured - 1.
double throughput_error(const HardwareProfile& hw, const CalibrationSample& s);

}  // namespace strata
