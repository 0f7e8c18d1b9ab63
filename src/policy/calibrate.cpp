// Fits a hardware profile's rates to measured runs (include/strata/policy/calibrate.h).
#include "strata/policy/calibrate.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "strata/core/error.h"

namespace strata {
namespace {

constexpr double kHuge = 1e30;  // a rate that makes its term vanish

// Predicted seconds of one phase on each lane: per-layer terms times the layers (and steps).
struct PhaseLanes {
  std::array<double, kNumLanes> prefill{}, decode{};
};

PhaseLanes predicted_lanes(const HardwareProfile& hw, const CalibrationSample& s) {
  const PhaseTerms terms = phase_terms(cost_forms(s.config, s.policy, s.workload, hw),
                                       realized_fractions(s.policy, s.config.n_layers));
  const double l = s.config.n_layers;
  auto lanes = [l](const std::array<double, kNumTerms>& t) {
    return std::array<double, kNumLanes>{t[COMP] * l, t[CTOG] * l, t[GTOC] * l, (t[DTOC] + t[CTOD]) * l, t[CATT] * l};
  };
  return {lanes(terms.prefill), lanes(terms.decode)};
}

// The compute term split into what each compute constant scales: GEMMs and dequantization,
// attention on the GPU tier (decode's, and prefill's where the profile measured its rate), units
// of per-layer overhead (the term with an overhead of 1 s per unit, minus without), units of
// per-step overhead (the same with 1 s per unit and step) and the stage's link seconds (the same
// with a link interference of 1). The parts add up: cost_model.cpp
// sums them into COMP. (Attention delegated to the CPU is a lane of its own, CATT.)
struct ComputeParts {
  double gemm = 0, gpu_attention = 0, units = 0, step_units = 0, links = 0;
};

// The compute columns of the fit, in elimination order (a dependent column is the last of a set).
enum ComputeColumn : int { kColGemm, kColGpuAttention, kColOverhead, kColStepOverhead, kColLinkInterference, kNumColumns };
const char* const kColumnName[kNumColumns] = {"gemm", "gpu attention", "overhead", "step overhead", "link interference"};

HardwareProfile without_calibration(HardwareProfile hw) {
  hw.compute_overhead_s = 0;
  hw.step_overhead_s = 0;
  hw.link_interference = 0;
  hw.overlap_slowdown = 0;
  // Dequantization falls back to the attention rate when unmeasured; pin it so that changing the
  // attention rates below leaves it alone.
  if (hw.gpu_dequant_bw <= 0) hw.gpu_dequant_bw = hw.gpu_attention_bw;
  return hw;
}

std::array<ComputeParts, 2> compute_parts(const HardwareProfile& raw, const CalibrationSample& s) {
  HardwareProfile no_attention = raw, one_second = raw, one_step_second = raw, interfering = raw;
  no_attention.gpu_attention_bw = kHuge;
  if (no_attention.gpu_attention_q4_bw > 0) no_attention.gpu_attention_q4_bw = kHuge;
  for (GemmPoint& g : no_attention.gpu_prefill_attention) g.flops_per_s = kHuge;
  one_second.compute_overhead_s = 1;
  one_step_second.step_overhead_s = 1;
  interfering.link_interference = 1;
  const PhaseLanes all = predicted_lanes(raw, s), gemm = predicted_lanes(no_attention, s),
                   plus = predicted_lanes(one_second, s), plus_step = predicted_lanes(one_step_second, s),
                   plus_links = predicted_lanes(interfering, s);
  std::array<ComputeParts, 2> parts;
  for (int phase = 0; phase < 2; ++phase) {
    auto comp = [phase](const PhaseLanes& l) { return (phase == 0 ? l.prefill : l.decode)[kLaneCompute]; };
    parts[size_t(phase)] = {comp(gemm), comp(all) - comp(gemm), comp(plus) - comp(all), comp(plus_step) - comp(all),
                            comp(plus_links) - comp(all)};
  }
  return parts;
}

// A column whose pivot falls below this share of its own weighted norm is (up to rounding) a
// combination of the columns before it: the runs do not tell it apart from them.
constexpr double kDependentPivot = 1e-10;

// A mean squared relative residual below this is rounding: the fit is exact.
constexpr double kRoundingResidual = 1e-18;

struct LeastSquares {
  std::vector<double> coef;       // 0 for unused columns
  std::vector<double> std_error;  // each coefficient's standard error (0 for unused columns, or with no spare rows)
  int dependent = -1;             // a column the runs cannot separate from the others; coef unset then
};

// Least squares of relative residuals: minimize sum ((sum_j c_j a_ij - m_i) / w_i)^2 over the
// columns in `use`, w_i the measured time m_i unless `scale` gives another (the time a target m_i
// was cut from: the fit then weighs each run by its whole measured time). Solved by Gauss-Jordan
// elimination on the normal equations (at most five columns), in column order, so the column
// reported dependent is the last of a dependent set. The same elimination inverts the normal
// matrix, whose diagonal times the residuals' variance is each coefficient's variance.
LeastSquares relative_least_squares(const std::vector<std::vector<double>>& a, const std::vector<double>& m,
                                    const std::vector<bool>& use, const std::vector<double>& scale = {}) {
  auto weight_of = [&](size_t i) { return scale.empty() ? m[i] : scale[i]; };
  const size_t k = use.size();
  std::vector<size_t> cols;
  for (size_t j = 0; j < k; ++j)
    if (use[j]) cols.push_back(j);
  const size_t n = cols.size(), width = 2 * n + 1;  // [normal matrix | right side | identity]
  std::vector<std::vector<double>> A(n, std::vector<double>(width, 0.0));
  for (size_t i = 0; i < m.size(); ++i) {
    const double w = 1.0 / (weight_of(i) * weight_of(i));
    for (size_t r = 0; r < n; ++r) {
      for (size_t c = 0; c < n; ++c) A[r][c] += w * a[i][cols[r]] * a[i][cols[c]];
      A[r][n] += w * a[i][cols[r]] * m[i];
    }
  }
  for (size_t r = 0; r < n; ++r) A[r][n + 1 + r] = 1;
  std::vector<double> norm(n);
  for (size_t c = 0; c < n; ++c) norm[c] = A[c][c];
  LeastSquares out;
  for (size_t p = 0; p < n; ++p) {  // no row swaps: the normal matrix is symmetric positive semidefinite
    if (!(A[p][p] > kDependentPivot * norm[p])) {
      out.dependent = int(cols[p]);
      return out;
    }
    for (size_t r = 0; r < n; ++r) {
      if (r == p) continue;
      const double f = A[r][p] / A[p][p];
      for (size_t c = p; c < width; ++c) A[r][c] -= f * A[p][c];
    }
  }
  out.coef.assign(k, 0.0);
  out.std_error.assign(k, 0.0);
  for (size_t r = 0; r < n; ++r) out.coef[cols[r]] = A[r][n] / A[r][r];
  if (m.size() > n) {
    double squares = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      double predicted = 0;
      for (size_t j : cols) predicted += out.coef[j] * a[i][j];
      squares += std::pow((predicted - m[i]) / weight_of(i), 2);
    }
    // Residuals at rounding level are exact runs (made-up ones, in tests): no scatter to weigh.
    const double variance = squares / double(m.size()) < kRoundingResidual ? 0 : squares / double(m.size() - n);
    for (size_t r = 0; r < n; ++r) out.std_error[cols[r]] = std::sqrt(variance * A[r][n + 1 + r] / A[r][r]);
  }
  return out;
}

// A part is fitted only if it lies this many standard errors from 0: a smaller one the runs'
// scatter could have made (a factor of x30 on an attention that is 1% of the compute, fitted to
// runs 10% apart), and keeping it would trade a measured rate for a free factor.
constexpr double kMinStdErrors = 3;

// The column other than the GEMMs' whose coefficient lies fewest standard errors from 0, if that
// is under kMinStdErrors; -1 if none.
int least_determined(const LeastSquares& ls, const std::vector<bool>& use) {
  int worst = -1;
  double worst_ratio = kMinStdErrors;
  for (int j = kColGemm + 1; j < kNumColumns; ++j) {
    if (!use[size_t(j)] || ls.std_error[size_t(j)] <= 0) continue;
    const double ratio = std::fabs(ls.coef[size_t(j)]) / ls.std_error[size_t(j)];
    if (ratio < worst_ratio) worst = j, worst_ratio = ratio;
  }
  return worst;
}

// A compute column's coefficient as the profile reads it: overheads in ms, the attention a factor.
std::string in_units(int column, double v) {
  std::ostringstream s;
  s.precision(3);
  if (column == kColOverhead) s << v * 1e3 << " ms per layer-unit";
  else if (column == kColStepOverhead) s << v * 1e3 << " ms per step-unit";
  else if (column == kColLinkInterference) s << v << " s per link-second";
  else s << "factor " << v;
  return s.str();
}

constexpr double kMinSeconds = 1e-6;  // lanes busier than this count as observations
// A fitted overhead above -1 ns per layer-unit is a zero the rounding made negative: kept (as 0).
constexpr double kNoiseSeconds = 1e-9;

// Calls fn(measured compute seconds, the phase's compute parts under `hw`) for each phase of each
// sample whose compute lane was busy.
template <class Fn>
void for_each_busy_compute(const HardwareProfile& hw, const std::vector<CalibrationSample>& samples, Fn fn) {
  for (const CalibrationSample& s : samples) {
    const auto parts = compute_parts(hw, s);
    for (int phase = 0; phase < 2; ++phase) {
      const double m = (phase == 0 ? s.prefill_busy : s.decode_busy)[kLaneCompute];
      if (m >= kMinSeconds) fn(m, parts[size_t(phase)]);
    }
  }
}

// The first fitted column whose sign has no physical meaning (a negative overhead or share of the
// copies, a non-positive GPU attention factor), or -1.
int wrong_sign(const std::vector<double>& c, const std::vector<bool>& use) {
  for (int j : {kColOverhead, kColStepOverhead, kColLinkInterference})
    if (use[size_t(j)] && c[size_t(j)] < -kNoiseSeconds) return j;
  return use[kColGpuAttention] && c[kColGpuAttention] <= 0 ? kColGpuAttention : -1;
}

CalibrationFit fit(const HardwareProfile& base, const std::vector<CalibrationSample>& samples,
                   const MeasuredOverheads* overheads) {
  const HardwareProfile raw = without_calibration(base);
  CalibrationFit f;

  // 1. Links and the CPU attention (first: the compute lane's share of the copies is priced on the
  // refined links): one factor per lane (the disk lane's reads and writes share one); 1 where no
  // run kept the lane busy.
  std::vector<PhaseLanes> lanes;
  for (const CalibrationSample& s : samples) lanes.push_back(predicted_lanes(raw, s));
  bool attention_unmeasured = false;  // predicted, but no run measured the lane
  for (int lane = kLaneH2d; lane < kNumLanes; ++lane) {
    double num = 0, den = 0;
    for (size_t i = 0; i < samples.size(); ++i)
      for (int phase = 0; phase < 2; ++phase) {
        const double p = (phase == 0 ? lanes[i].prefill : lanes[i].decode)[size_t(lane)];
        const double m = (phase == 0 ? samples[i].prefill_busy : samples[i].decode_busy)[size_t(lane)];
        if (p < kMinSeconds) continue;
        if (m < kMinSeconds) {
          attention_unmeasured = attention_unmeasured || lane == kLaneCpuAttention;
          continue;
        }
        num += p / m;
        den += (p / m) * (p / m);
      }
    const double factor = den > 0 ? num / den : 1.0;
    if (lane == kLaneCpuAttention) {
      f.cpu_attention_factor = factor;
      if (den == 0 && attention_unmeasured) f.undetermined.push_back("cpu attention");
    } else {
      f.link_factor[size_t(lane)] = factor;
    }
  }

  HardwareProfile linked = raw;  // the bare rates with the links refined
  linked.cpu_to_gpu_bw /= f.link_factor[kLaneH2d];
  linked.gpu_to_cpu_bw /= f.link_factor[kLaneD2h];
  linked.disk_to_cpu_bw /= f.link_factor[kLaneDisk];
  linked.cpu_to_disk_bw /= f.link_factor[kLaneDisk];

  // 2. Compute lane: the columns of ComputeColumn, two phases per sample.
  // Measured overheads are no columns: their seconds come off each measured time, which still
  // weighs its run.
  std::vector<std::vector<double>> rows;
  std::vector<double> measured, scale;
  for_each_busy_compute(linked, samples, [&](double m, const ComputeParts& p) {
    rows.push_back({p.gemm, p.gpu_attention, p.units, p.step_units, p.links});
    measured.push_back(overheads ? m - overheads->layer_s * p.units - overheads->step_s * p.step_units : m);
    scale.push_back(m);
  });
  if (rows.size() < 2) STRATA_FAIL("calibration: fewer than two phases with a busy compute lane");
  std::vector<bool> use(kNumColumns, true);
  // No run with attention on the GPU: nothing to fit there, nothing to report.
  use[kColGpuAttention] = std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r[kColGpuAttention] > 0; });
  // With one layer count, work per step and per layer step are the same column up to the layers:
  // only runs of two layer counts or more tell them apart, and only then is there a step part to fit.
  use[kColStepOverhead] = std::any_of(samples.begin(), samples.end(), [&](const CalibrationSample& s) {
    return s.config.n_layers != samples.front().config.n_layers;
  });
  if (overheads) use[kColOverhead] = use[kColStepOverhead] = false;
  // No run that moves anything: no copies to slow the compute.
  use[kColLinkInterference] = std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r[kColLinkInterference] > 0; });
  // A column the runs cannot determine (say every run is another's multiple: the same phases, only more GPU batches), or
  // one with a physically meaningless sign, is dropped: an overhead to 0, the GPU attention's
  // factor to the GEMM's (its term folded into that column).
  auto drop = [&](int column) {
    use[size_t(column)] = false;
    if (column != kColGpuAttention) return;
    for (auto& r : rows) r[kColGemm] += r[size_t(column)], r[size_t(column)] = 0;
  };
  std::vector<double> c;
  for (;;) {
    const LeastSquares ls = relative_least_squares(rows, measured, use, scale);
    if (ls.dependent == kColGemm) STRATA_FAIL("calibration: the runs do not determine the compute lane (no GEMM time predicted)");
    if (ls.dependent > 0) {
      f.undetermined.push_back(kColumnName[ls.dependent]);
      drop(ls.dependent);
      continue;
    }
    c = ls.coef;
    std::ostringstream why;
    if (const int bad = wrong_sign(c, use); bad >= 0) {
      why << kColumnName[bad] << " (fitted " << in_units(bad, c[size_t(bad)]) << ")";
      drop(bad);
    } else if (const int vague = least_determined(ls, use); vague > 0) {
      why << kColumnName[vague] << " (fitted " << in_units(vague, c[size_t(vague)]) << " +- "
          << in_units(vague, ls.std_error[size_t(vague)]) << ": within the runs' scatter)";
      drop(vague);
    } else {
      break;
    }
    f.dropped.push_back(why.str());
  }
  if (!use[kColGpuAttention]) c[kColGpuAttention] = c[kColGemm];
  if (c[kColGemm] <= 0) STRATA_FAIL("calibration: the compute lane's fit has a non-positive GEMM factor");
  f.gemm_factor = c[kColGemm];
  f.gpu_attention_factor = c[kColGpuAttention];
  f.overhead_s = overheads ? overheads->layer_s : std::max(0.0, c[kColOverhead]);
  f.step_overhead_s = overheads ? overheads->step_s : std::max(0.0, c[kColStepOverhead]);
  f.link_interference = std::max(0.0, c[kColLinkInterference]);

  // The refined rates.
  HardwareProfile hw = linked;
  for (std::vector<GemmPoint>* curve : {&hw.gpu_gemm, &hw.gpu_gemm2})
    for (GemmPoint& g : *curve) g.flops_per_s /= f.gemm_factor;
  hw.gpu_dequant_bw /= f.gemm_factor;
  hw.gpu_elementwise_s *= f.gemm_factor;  // the compute lane's own work, with the GEMMs
  for (double* bw : {&hw.gpu_attention_bw, &hw.gpu_attention_q4_bw}) *bw /= f.gpu_attention_factor;
  for (GemmPoint& g : hw.gpu_prefill_attention) g.flops_per_s /= f.gpu_attention_factor;
  for (double* bw : {&hw.cpu_attention_bw, &hw.cpu_attention_q4_bw}) *bw /= f.cpu_attention_factor;  // 0 (unmeasured) stays 0
  hw.compute_overhead_s = f.overhead_s;
  hw.step_overhead_s = f.step_overhead_s;
  hw.link_interference = f.link_interference;

  // 3. Overlap: the phases' wall time against the refined terms, k on a grid of 0.005.
  double best_k = 0, best = kHuge;
  for (int step = 0; step <= 200; ++step) {
    hw.overlap_slowdown = step / 200.0;
    double sq = 0;
    for (const CalibrationSample& s : samples) sq += std::pow(throughput_error(hw, s), 2);
    if (sq < best) best = sq, best_k = hw.overlap_slowdown;
  }
  hw.overlap_slowdown = f.overlap_slowdown = best_k;
  f.profile = hw;
  return f;
}

std::string joined(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

}  // namespace

std::string undetermined_list(const CalibrationFit& f) { return joined(f.undetermined, ", "); }

std::string dropped_list(const CalibrationFit& f) { return joined(f.dropped, "; "); }

std::array<std::array<double, kNumLanes>, 2> predicted_lane_seconds(const HardwareProfile& hw,
                                                                    const CalibrationSample& s) {
  const PhaseLanes p = predicted_lanes(hw, s);
  return {p.prefill, p.decode};
}

double throughput_error(const HardwareProfile& hw, const CalibrationSample& s) {
  const Prediction p = evaluate(s.config, s.policy, s.workload, hw);
  // Throughput is generated tokens over the two phases' time, the same tokens on both sides.
  return (s.prefill_s + s.decode_s) / p.total_s - 1;
}

std::optional<MeasuredOverheads> measure_overheads(const HardwareProfile& base, const std::vector<CalibrationSample>& probes,
                                                   const std::string& on) {
  if (probes.empty()) STRATA_FAIL("overhead measurement: no probe runs");
  const HardwareProfile raw = without_calibration(base);
  enum { kUnits, kStepUnits };
  std::vector<std::vector<double>> rows;
  std::vector<double> beyond_terms, measured;
  for_each_busy_compute(raw, probes, [&](double m, const ComputeParts& p) {
    rows.push_back({p.units, p.step_units});
    beyond_terms.push_back(m - p.gemm - p.gpu_attention - p.links);
    measured.push_back(m);
  });
  if (rows.size() < 2) return std::nullopt;  // a backend whose lanes these blocks are too short for
  std::vector<bool> use = {true, std::any_of(probes.begin(), probes.end(), [&](const CalibrationSample& s) {
                             return s.config.n_layers != probes.front().config.n_layers;
                           })};
  MeasuredOverheads out;
  out.on = on;
  // A negative part (the other absorbing the probes' scatter) is measured as none: the other alone.
  for (;;) {
    const LeastSquares ls = relative_least_squares(rows, beyond_terms, use, measured);
    if (ls.dependent >= 0) {
      use[size_t(ls.dependent)] = false;
    } else if (use[kStepUnits] && ls.coef[kStepUnits] < 0) {
      use[kStepUnits] = false;
    } else if (use[kUnits] && ls.coef[kUnits] < 0) {
      use[kUnits] = false;
    } else {
      out.layer_s = ls.coef[kUnits];
      out.step_s = ls.coef[kStepUnits];
      return out;
    }
    if (!use[kUnits] && !use[kStepUnits]) return out;  // the probes' time is all in the terms
  }
}

CalibrationFit calibrate_profile(const HardwareProfile& base, const std::vector<CalibrationSample>& samples,
                                 const std::string& by, const MeasuredOverheads* overheads) {
  if (samples.size() < 2) STRATA_FAIL("calibration needs at least two measured runs, got " << samples.size());
  for (const CalibrationSample& s : samples)
    if (!(s.prefill_s > 0) || !(s.decode_s >= 0) || s.workload.gen_len < 1)
      STRATA_FAIL("calibration: run " << s.name << " has no measured prefill time");
  CalibrationFit f = fit(base, samples, overheads);
  for (const CalibrationSample& s : samples) {
    f.error_before.push_back(throughput_error(base, s));
    f.error_after.push_back(throughput_error(f.profile, s));
  }
  if (samples.size() >= 4)
    for (size_t i = 0; i < samples.size(); ++i) {
      std::vector<CalibrationSample> rest;
      for (size_t j = 0; j < samples.size(); ++j)
        if (j != i) rest.push_back(samples[j]);
      // A fit can fail without the sample (the only run that kept a lane busy, or a degenerate
      // rest): no out-of-sample figure for it then, rather than no calibration at all.
      double error = std::nan("");
      try {
        error = throughput_error(fit(base, rest, overheads).profile, samples[i]);
      } catch (const Error&) {
      }
      f.error_leave_one_out.push_back(error);
    }
  std::ostringstream d;
  d << base.description << (base.description.empty() ? "" : "; ") << "calibrated by " << by << " over "
    << samples.size() << " runs: compute x" << f.gemm_factor << " (gpu attention x" << f.gpu_attention_factor
    << ", cpu attention x" << f.cpu_attention_factor << "), overhead " << f.overhead_s
    << " s per layer-unit and " << f.step_overhead_s << " s per step-unit"
    << (overheads ? " (measured on " + overheads->on + ")" : std::string()) << ", link interference "
    << f.link_interference << ", links x" << f.link_factor[kLaneH2d] << " / x"
    << f.link_factor[kLaneD2h] << " / disk x" << f.link_factor[kLaneDisk] << ", overlap slowdown "
    << f.overlap_slowdown;
  if (!f.undetermined.empty()) d << " (not determined by these runs: " << undetermined_list(f) << ")";
  if (!f.dropped.empty()) d << " (dropped: " << dropped_list(f) << ")";
  f.profile.description = d.str();
  f.profile.calibrated = by + " over " + std::to_string(samples.size()) + " runs";
  return f;
}

}  // namespace strata
