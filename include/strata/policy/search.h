// The policy search (FlexGen section 4.3; docs/cost-model.md): for every GPU batch size, number of
// GPU batches and on/off option, a linear program over the placement fractions (GLPK: nine, and
// for a mixture of experts' MLP halves placed apart three more); the optimum is rounded to whole
// layers, as the runtime places them, and checked again.
#pragma once
#include <optional>
#include <vector>

#include "strata/policy/cost_model.h"
#include "strata/quant/quant.h"

namespace strata {

struct SearchOptions {
  Workload workload;
  TierBytes budget;                      // bytes each tier may hold (usually the profile's gpu_mem, cpu_mem, disk_mem)
  bool allow_compression = false;        // also try 4-bit weights and/or KV cache (group 64)
  // With allow_compression: the weight compression that keeps the checkpoint's own codes
  // (WeightSource::codes_spec), tried instead of 4-bit group 64 when it is 4-bit, beside it when 8-bit.
  std::optional<Compression> kept_codes;
  std::optional<double> max_latency_s;   // bound on the time of one block
  int keep = 5;                          // candidates returned, best first
};

// SearchOptions::kept_codes from a weight source's codes_spec().
inline std::optional<Compression> kept_codes_compression(const std::optional<quant::QuantSpec>& spec) {
  if (!spec) return std::nullopt;
  return Compression{spec->bits, spec->group_size};
}

struct Candidate {
  Policy policy;              // realizable: whole layers per tier
  Prediction prediction;      // of the policy as realized
  Fractions lp_fractions{};   // the LP's optimum before rounding
  double lp_throughput_tok_s = 0;
  std::optional<TierBytes> plan_peak;  // what the runtime reserves (plan_placement)
};

struct SearchResult {
  std::vector<Candidate> ranked;  // best throughput first; ranked[0] is the choice
  int lps_solved = 0;
  double seconds = 0;
};

// Throws strata::Error "no policy fits ..." naming the binding tier (or the latency bound).
SearchResult search_policy(const ModelConfig& cfg, const HardwareProfile& hw, const SearchOptions& opts);

// Every candidate the search finds that fits the budgets (at most one per batch shape and
// options), each re-checked against the runtime's memory plan, best throughput first as in
// search_policy; `opts.keep` is ignored. With `lps_solved`, the number of LPs it took.
std::vector<Candidate> search_candidates(const ModelConfig& cfg, const HardwareProfile& hw, const SearchOptions& opts,
                                         int* lps_solved = nullptr);

// The latency-throughput frontier (FlexGen's Figure 1). For a given batch shape and options, the
// placement that minimizes the block time T maximizes throughput (block * n / T) and minimizes
// latency (T) at once, so the best policy under a latency bound is the best of the per-shape
// candidates whose latency is within it: no LP needs solving again per bound.
struct ParetoPoint {
  double max_latency_s = 0;
  std::optional<Candidate> best;  // the highest throughput within the bound (ties: lower latency); none fits
};
// For each bound, in the order given.
std::vector<ParetoPoint> pareto_points(const std::vector<Candidate>& candidates, const std::vector<double>& bounds);
// The candidates no other beats on both: lower or equal latency and higher throughput, by latency.
std::vector<Candidate> pareto_frontier(const std::vector<Candidate>& candidates);
// `points` bounds spaced evenly in log(latency) from the fastest candidate's latency to that of
// the best throughput (the frontier's ends; looser bounds all pick the best), both included (one
// bound when they are equal or points is 1).
std::vector<double> latency_sweep(const std::vector<Candidate>& candidates, int points);

// One LP: minimize T over the fractions for the batch shape and options the forms were built for.
struct LpSolution {
  bool feasible = false;
  Fractions x{};
  double total_s = 0;  // T at the optimum
};
// Among the placements with the optimal T, a second phase picks the one that loads links and
// compute least; it runs only when the optimum's throughput exceeds `refine_above_tok_s`.
LpSolution solve_placement_lp(const CostForms& forms, const TierBytes& budget, std::optional<double> max_latency_s,
                              double refine_above_tok_s = 0);

// Whether a prediction respects the budgets (with a relative slack of 1e-9) and the latency bound.
bool fits(const Prediction& p, const TierBytes& budget, std::optional<double> max_latency_s);

// Integer percentages under which assign_tiers puts exactly `on_gpu` and `on_cpu` of `units`
// (layers, or GPU batches for activations) on the GPU and the CPU, the rest on disk; none when
// whole percentages cannot express it.
std::optional<TierSplit> split_for_layers(int units, int on_gpu, int on_cpu);

}  // namespace strata
