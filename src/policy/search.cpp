// The policy search: an LP per candidate batch shape and options (GLPK), rounding to whole layers,
// a re-check against the runtime's own memory plan, and a diagnosis when nothing fits.
#include "strata/policy/search.h"

#include <glpk.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "strata/core/error.h"
#include "strata/core/size.h"

namespace strata {
namespace {

constexpr Tier kTiers[3] = {Tier::Gpu, Tier::Cpu, Tier::Disk};

// The fractions an LP over the forms chooses: the nine of weights, KV cache and activations, and
// the MLP halves' three where the forms leave their split free.
int lp_vars(const CostForms& F) { return F.experts_free ? kNumVars : int(MG); }

// A small LP over columns 1..lp_vars (the fractions, in Var order) and any auxiliary columns.
class Lp {
 public:
  explicit Lp(const CostForms& F) : p_(glp_create_prob()), vars_(lp_vars(F)) {
    glp_set_obj_dir(p_, GLP_MIN);
    glp_add_cols(p_, vars_);
    for (int v = 0; v < vars_; ++v) glp_set_col_bnds(p_, v + 1, GLP_DB, 0.0, 1.0);
    for (int cls = 0; cls < vars_ / 3; ++cls)  // each class sums to 1
      add_row({{3 * cls + 1, 1.0}, {3 * cls + 2, 1.0}, {3 * cls + 3, 1.0}}, GLP_FX, 1.0);
  }
  ~Lp() { glp_delete_prob(p_); }
  Lp(const Lp&) = delete;
  Lp& operator=(const Lp&) = delete;

  int add_col(double objective) {  // a non-negative auxiliary variable
    const int j = glp_add_cols(p_, 1);
    glp_set_col_bnds(p_, j, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(p_, j, objective);
    return j;
  }
  void set_objective(int col, double c) { glp_set_obj_coef(p_, col, c); }

  // sum coef * col  (== rhs for GLP_FX, <= rhs for GLP_UP)
  void add_row(const std::vector<std::pair<int, double>>& terms, int type, double rhs) {
    const int i = glp_add_rows(p_, 1);
    std::vector<int> idx{0};
    std::vector<double> val{0.0};
    for (const auto& [col, c] : terms)
      if (c != 0) {
        idx.push_back(col);
        val.push_back(c);
      }
    glp_set_mat_row(p_, i, int(idx.size()) - 1, idx.data(), val.data());
    glp_set_row_bnds(p_, i, type, type == GLP_UP ? 0.0 : rhs, rhs);
  }

  // form(x) - sum aux <= rhs, scaled by 1/scale for conditioning.
  void add_form_row(const LinearForm& form, std::vector<std::pair<int, double>> aux, double rhs, double scale = 1) {
    std::vector<std::pair<int, double>> terms;
    for (int v = 0; v < vars_; ++v) terms.push_back({v + 1, form.coef[v] / scale});
    for (auto& [col, c] : aux) terms.push_back({col, c / scale});
    add_row(terms, GLP_UP, (rhs - form.constant) / scale);
  }

  bool solve() {
    const int term = glp_term_out(GLP_OFF);  // glp_scale_prob reports to the terminal
    glp_scale_prob(p_, GLP_SF_AUTO);
    glp_term_out(term);
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    // No presolve: these LPs are tiny, and a second solve then starts from the first's basis.
    parm.presolve = GLP_OFF;
    if (glp_simplex(p_, &parm) != 0) return false;
    return glp_get_status(p_) == GLP_OPT;
  }
  double value(int col) const { return glp_get_col_prim(p_, col); }
  double objective() const { return glp_get_obj_val(p_); }
  Fractions fractions() const {
    Fractions x{};
    for (int v = 0; v < vars_; ++v) x[v] = std::clamp(value(v + 1), 0.0, 1.0);
    return x;
  }
  int vars() const { return vars_; }

 private:
  glp_prob* p_;
  int vars_;
};

// a * x + b * y
LinearForm combined(const LinearForm& x, double a, const LinearForm& y, double b) {
  LinearForm r;
  r.constant = a * x.constant + b * y.constant;
  for (int v = 0; v < kNumVars; ++v) r.coef[v] = a * x.coef[v] + b * y.coef[v];
  return r;
}

// Memory rows: the peak on each tier within its budget (rows scaled by the budget).
void add_memory_rows(Lp& lp, const CostForms& F, const TierBytes& budget, std::optional<Tier> skip = {}) {
  for (Tier t : kTiers) {
    if (skip && *skip == t) continue;
    const double b = budget.at(t);
    lp.add_form_row(F.peak[int(t)], {}, b, b > 0 ? b : 1e9);
  }
}

}  // namespace

LpSolution solve_placement_lp(const CostForms& F, const TierBytes& budget, std::optional<double> max_latency_s,
                              double refine_above_tok_s) {
  Lp lp(F);
  const double l = F.n_layers, gen_steps = F.gen_len - 1;
  // T = T_pre * l + T_gen * (n - 1) * l; each stage time is an auxiliary variable bounded below by
  // its terms (their max, with overlap) or by their sum (without). With overlap the compute is the
  // pipeline of COMP and CATT (compute_stage): a column P above both of its linear pieces.
  const int tpre = lp.add_col(l), tgen = lp.add_col(gen_steps * l);
  const double n = F.num_gpu_batches, s = F.comp_serial_share;
  for (auto [forms, col] : {std::pair{&F.prefill, tpre}, std::pair{&F.decode, tgen}}) {
    const std::array<LinearForm, kNumTerms>& t = *forms;
    if (!F.overlap) {
      LinearForm sum;
      for (const LinearForm& term : t) sum = combined(sum, 1.0, term, 1.0);
      lp.add_form_row(sum, {{col, -1.0}}, 0.0);
      continue;
    }
    const int pipeline = lp.add_col(0.0);
    lp.add_form_row(combined(t[COMP], 1.0, t[CATT], 1.0 / n), {{pipeline, -1.0}}, 0.0);
    lp.add_form_row(combined(t[CATT], 1.0, t[COMP], s + (1 - s) / n), {{pipeline, -1.0}}, 0.0);
    const std::array<const LinearForm*, 4> links = {&t[CTOG], &t[GTOC], &t[DTOC], &t[CTOD]};
    const double k = F.overlap_slowdown;
    if (k <= 0) {
      for (const LinearForm* link : links) lp.add_form_row(*link, {{col, -1.0}}, 0.0);
      lp.add_row({{pipeline, 1.0}, {col, -1.0}}, GLP_UP, 0.0);
      continue;
    }
    // T >= (1 - k) M + k * (links + P) with M >= every link and P: linear, and tight at the optimum.
    const int max_col = lp.add_col(0.0);
    LinearForm links_sum;
    for (const LinearForm* link : links) {
      lp.add_form_row(*link, {{max_col, -1.0}}, 0.0);
      links_sum = combined(links_sum, 1.0, *link, k);
    }
    lp.add_row({{pipeline, 1.0}, {max_col, -1.0}}, GLP_UP, 0.0);
    lp.add_form_row(links_sum, {{pipeline, k}, {max_col, 1.0 - k}, {col, -1.0}}, 0.0);
  }
  add_memory_rows(lp, F, budget);

  // The objective is the latency, so a latency bound only says whether the optimum meets it; as a
  // row it would change nothing but the vertex the solver returns among equal optima (and so the
  // rounding), and a bounded search would no longer agree with the frontier (pareto_points).
  LpSolution r;
  if (!lp.solve()) return r;
  if (max_latency_s && lp.objective() > *max_latency_s * (1 + 1e-9)) return r;
  r.feasible = true;
  r.x = lp.fractions();
  r.total_s = lp.objective();
  if (double(F.block_size) * F.gen_len / r.total_s <= refine_above_tok_s) return r;

  // Many placements often share the optimal T (a link that does not bound T can carry more or
  // less). Among them, take the one that loads all links and compute least: it leaves slack
  // where the model is approximate, and it keeps bytes off slower tiers for no gain.
  lp.add_row({{tpre, l}, {tgen, gen_steps * l}}, GLP_UP, r.total_s * (1 + 1e-9) + 1e-12);
  lp.set_objective(tpre, 0);
  lp.set_objective(tgen, 0);
  for (int v = 0; v < lp.vars(); ++v) {
    double c = 0;
    for (const LinearForm& t : F.prefill) c += l * t.coef[v];
    for (const LinearForm& t : F.decode) c += gen_steps * l * t.coef[v];
    lp.set_objective(v + 1, c);
  }
  if (lp.solve()) r.x = lp.fractions();
  return r;
}

bool fits(const Prediction& p, const TierBytes& budget, std::optional<double> max_latency_s) {
  for (Tier t : kTiers)
    if (p.peak.at(t) > budget.at(t) * (1 + 1e-9) + 1e-6) return false;
  return !max_latency_s || p.latency_s <= *max_latency_s * (1 + 1e-9);
}

std::optional<TierSplit> split_for_layers(int n, int on_gpu, int on_cpu) {
  if (n < 1 || on_gpu < 0 || on_cpu < 0 || on_gpu + on_cpu > n) return std::nullopt;
  const int g0 = int(std::lround(100.0 * on_gpu / n)), gc0 = int(std::lround(100.0 * (on_gpu + on_cpu) / n));
  for (int dg : {0, -1, 1})
    for (int dgc : {0, -1, 1}) {
      const int g = g0 + dg, gc = gc0 + dgc;
      if (g < 0 || gc < g || gc > 100) continue;
      const TierSplit s{g, gc - g, 100 - gc};
      int count[3] = {0, 0, 0};
      for (Tier t : assign_tiers(n, s)) ++count[int(t)];
      if (count[0] == on_gpu && count[1] == on_cpu) return s;
    }
  return std::nullopt;
}

namespace {

struct Shape {
  int gbs, ngb;
  bool cpu_attention;
  std::optional<Compression> weights;  // compress_weights
  bool compress_cache;
  bool cpu_experts_prefill = false, cpu_experts_decode = false;
  // The MLP halves placed apart from the attention halves, the LP choosing both splits
  // (ExpertSplit::Free): a second weight class.
  bool experts_apart = false;
};

Policy make_policy(const Shape& s) {
  Policy p;
  p.gpu_batch_size = s.gbs;
  p.num_gpu_batches = s.ngb;
  p.overlap = true;
  p.cpu_attention = s.cpu_attention;
  p.cpu_experts_prefill = s.cpu_experts_prefill;
  p.cpu_experts_decode = s.cpu_experts_decode;
  p.compress_weights = s.weights;
  if (s.compress_cache) p.compress_kv_cache = Compression{4, 64};
  return p;
}

// GPU batch sizes and GPU batch counts to try: FlexGen's grid, denser where the paper's
// policies lie (48, 72, 20, 12, ...).
const std::vector<int>& batch_sizes() {
  static const std::vector<int> v = {1,  2,  3,  4,   6,   8,   12,  16,  20,  24,  28,  32,  40,  48,  56,  64,  72,
                                     80, 96, 112, 128, 144, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 1024};
  return v;
}
const std::vector<int>& batch_counts() {
  static const std::vector<int> v = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,  14,  16,
                                     20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256};
  return v;
}
// Sequences per block at most: beyond this a job's blocks become too coarse to be practical.
constexpr int kMaxBlock = 8192;

// A mixture of experts also tries its experts computed on the CPU in decode, or in both phases
// (decode steps activate few experts, prefill steps nearly all; prefill alone never pays where
// decode does not), and its MLP halves placed apart from the attention halves, the LP choosing
// both splits (MoE-Lightning's placement, every MLP half on the CPU, among them).
//
// Compressed weights are 4-bit group 64, or the checkpoint's own codes (SearchOptions::kept_codes)
// where it has some: in their place when 4-bit (a second quantization gains a few bytes and loses
// the file's values), beside them when 8-bit (fewer bytes against exact values: the throughput
// decides).
std::vector<std::optional<Compression>> weight_options(const SearchOptions& opts) {
  std::vector<std::optional<Compression>> v = {std::nullopt};
  if (!opts.allow_compression) return v;
  if (!opts.kept_codes || opts.kept_codes->bits > 4) v.push_back(Compression{4, 64});
  if (opts.kept_codes) v.push_back(opts.kept_codes);
  return v;
}

std::vector<Shape> option_sets(const SearchOptions& opts, bool moe) {
  std::vector<Shape> v;
  const std::vector<std::pair<bool, bool>> phases =
      moe ? std::vector<std::pair<bool, bool>>{{false, false}, {false, true}, {true, true}}
          : std::vector<std::pair<bool, bool>>{{false, false}};
  for (const std::optional<Compression>& weights : weight_options(opts))
    for (int cc = 0; cc <= int(opts.allow_compression); ++cc)
      for (int ca = 0; ca <= 1; ++ca)
        for (const auto& [xp, xd] : phases)
          for (int apart = 0; apart <= int(moe); ++apart)
            v.push_back({0, 0, bool(ca), weights, bool(cc), xp, xd, bool(apart)});
  return v;
}

// Layer counts on (gpu, cpu) near the LP's fractions of one class: floor and ceiling of each.
// `disk_too`: also the floor and ceiling of the disk's count, the CPU taking the rest.
std::vector<std::pair<int, int>> nearby_counts(double g, double c, int n, bool disk_too = false) {
  std::vector<std::pair<int, int>> v;
  auto add = [&](int ng, int nc) {
    if (ng >= 0 && nc >= 0 && ng + nc <= n && std::find(v.begin(), v.end(), std::pair{ng, nc}) == v.end())
      v.push_back({ng, nc});
  };
  auto near = [n](double f) { return std::array<int, 2>{int(std::floor(f * n + 1e-9)), int(std::ceil(f * n - 1e-9))}; };
  for (int ng : near(g))
    for (int nc : near(c)) add(ng, nc);
  if (disk_too)
    for (int ng : near(g))
      for (int nd : near(1 - g - c)) add(ng, n - ng - nd);
  return v;
}

// Seconds of work on all links and compute over the block: what the LP's second phase minimizes.
double load(const CostForms& F, const Prediction& p) {
  double pre = 0, gen = 0;
  for (double t : p.prefill.terms) pre += t;
  for (double t : p.decode.terms) gen += t;
  return F.n_layers * (pre + (F.gen_len - 1) * gen);
}

// The classes a policy places, in Var order: weights, KV cache, activations, and the MLP halves
// where they are apart (expert_weights). Units: layers, but GPU batches for activations.
constexpr int kExperts = 3;
int num_classes(const Policy& p) { return p.expert_weights ? 4 : 3; }
int class_units(int cls, const Policy& p, int n_layers) { return cls == 2 ? p.num_gpu_batches : n_layers; }
TierSplit& class_split(int cls, Policy& p) {
  return cls == 0 ? p.weights : cls == 1 ? p.kv_cache : cls == 2 ? p.activations : *p.expert_weights;
}

// A candidate paired with the forms that price it.
using Priced = std::pair<Candidate, CostForms>;

// The best realizable policy among the roundings of the LP's fractions that still fits. Where
// the LP chose the MLP halves' split, each rounding of it is priced as evaluate prices the policy
// (its split fixed: constants, with the runtime's buffers, not the LP's interpolation of them).
std::optional<Priced> round_to_units(const ModelConfig& cfg, const HardwareProfile& hw, const Policy& shape,
                                     const CostForms& F, const LpSolution& lp, const SearchOptions& opts) {
  struct Rounded {
    TierSplit split;
    double gpu = 0, cpu = 0, disk = 0;  // the realized fractions
  };
  std::vector<Rounded> splits[4];
  for (int cls = 0; cls < lp_vars(F) / 3; ++cls) {
    const int units = class_units(cls, shape, F.n_layers);
    // A layer's MLP half is most of its bytes: rounded onto the disk it can cost more than the
    // LP's share there gained, so the CPU may take the disk's fraction of a layer instead.
    for (auto [ng, nc] : nearby_counts(lp.x[3 * cls], lp.x[3 * cls + 1], units, cls == kExperts))
      if (auto s = split_for_layers(units, ng, nc))
        splits[cls].push_back({*s, double(ng) / units, double(nc) / units, double(units - ng - nc) / units});
  }
  if (!F.experts_free) splits[kExperts].push_back({});  // tied: the weights' split places them
  std::optional<Priced> best;
  double best_load = 0;
  for (const Rounded& m : splits[kExperts]) {
    Policy placed = shape;
    if (F.experts_free) placed.expert_weights = m.split;
    const CostForms forms = F.experts_free ? cost_forms(cfg, placed, opts.workload, hw) : F;
    for (const Rounded& w : splits[0])
      for (const Rounded& c : splits[1])
        for (const Rounded& h : splits[2]) {
          Policy p = placed;
          p.weights = w.split;
          p.kv_cache = c.split;
          p.activations = h.split;
          const Prediction pred = predict(forms, {w.gpu, w.cpu, w.disk, c.gpu, c.cpu, c.disk, h.gpu, h.cpu, h.disk,
                                                  m.gpu, m.cpu, m.disk});
          if (!fits(pred, opts.budget, opts.max_latency_s)) continue;
          // The fastest; among equally fast ones (a link that does not bound T), the least load.
          const double t = pred.throughput_tok_s, best_t = best ? best->first.prediction.throughput_tok_s : 0;
          const double ld = load(forms, pred);
          if (!best || t > best_t * (1 + 1e-9) || (t >= best_t * (1 - 1e-9) && ld < best_load)) {
            best = Priced{Candidate{p, pred, lp.x, double(F.block_size) * F.gen_len / lp.total_s, std::nullopt},
                          forms};
            best_load = ld;
          }
        }
  }
  return best;
}

// The candidate with the prefill_batches_per_step that makes its placement fastest: 0 (FlexGen's
// schedule) or 1 .. ngb - 1 GPU batches starting per super-step. Ties keep 0, then the larger
// count (fewer super-steps, fewer weight reads). Memory does not depend on it; the latency bound
// does. The terms stay those of `F`: only the schedule changes.
Candidate with_best_stagger(const CostForms& F, Candidate c, const SearchOptions& opts) {
  const Fractions x = realized_fractions(c.policy, F.n_layers);
  std::optional<Prediction> best;
  int best_per_step = 0;
  auto consider = [&](int per_step) {
    const Prediction p = predict(with_stagger(F, per_step), x);
    if (!fits(p, opts.budget, opts.max_latency_s)) return;
    if (best && !(p.throughput_tok_s > best->throughput_tok_s * (1 + 1e-9))) return;
    best = p;
    best_per_step = per_step;
  };
  consider(0);
  for (int per_step = F.num_gpu_batches - 1; per_step >= 1; --per_step) consider(per_step);
  if (!best) return c;  // none fits the latency bound: leave it to the caller's check
  c.policy.prefill_batches_per_step = best_per_step;
  c.prediction = *best;
  return c;
}

std::optional<TierBytes> runtime_peak(const ModelConfig& cfg, const Policy& p, const Workload& w, DType dt) {
  return plan_placement(cfg, p, PlanShape{w.prompt_len, w.gen_len}, dt).peak();
}

// How far a candidate is over its budgets: the sum of relative overflows of the model's and the
// runtime plan's peaks (0 when it fits).
double overflow(const Candidate& c, const TierBytes& budget) {
  double o = 0;
  for (Tier t : kTiers) {
    double peak = c.prediction.peak.at(t);
    if (c.plan_peak) peak = std::max(peak, c.plan_peak->at(t));
    const double b = budget.at(t);
    if (peak > b * (1 + 1e-9) + 1e-6) o += (peak - b) / std::max(b, 1.0);
  }
  return o;
}

// Re-checks a candidate against the runtime's memory plan; when that is over a budget, moves one
// layer of one class to a neighbouring tier at a time (the move that most reduces the overflow)
// until it fits. Returns nothing when no sequence of moves makes it fit.
std::optional<Candidate> recheck(const ModelConfig& cfg, const HardwareProfile& hw, CostForms F, Candidate c,
                                 const SearchOptions& opts) {
  const int n = cfg.n_layers;
  CostForms staggered = with_stagger(F, c.policy.prefill_batches_per_step);
  c.plan_peak = runtime_peak(cfg, c.policy, opts.workload, F.dtype);
  for (int step = 0; step < num_classes(c.policy) * n; ++step) {
    const double over = overflow(c, opts.budget);
    // Moves change the placement, and so perhaps the best stagger.
    if (over == 0 && fits(c.prediction, opts.budget, opts.max_latency_s)) return with_best_stagger(F, c, opts);
    std::optional<Candidate> best_move;
    std::optional<CostForms> best_move_forms;
    double best_over = over;
    for (int cls = 0; cls < num_classes(c.policy); ++cls) {
      const int units = class_units(cls, c.policy, n);
      int count[3] = {0, 0, 0};
      for (Tier t : assign_tiers(units, class_split(cls, c.policy))) ++count[int(t)];
      for (int from = 0; from < 3; ++from)
        for (int to = 0; to < 3; ++to) {
          if (from == to || count[from] == 0) continue;
          int moved[3] = {count[0], count[1], count[2]};
          --moved[from];
          ++moved[to];
          const auto s = split_for_layers(units, moved[0], moved[1]);
          if (!s) continue;
          Candidate m = c;
          class_split(cls, m.policy) = *s;
          // Moved MLP halves placed apart change the constants that price them.
          std::optional<CostForms> refixed;
          if (cls == kExperts) refixed = cost_forms(cfg, m.policy, opts.workload, hw);
          m.prediction = predict(refixed ? *refixed : staggered, realized_fractions(m.policy, n));
          m.plan_peak = runtime_peak(cfg, m.policy, opts.workload, F.dtype);
          const double o = overflow(m, opts.budget);
          if (o < best_over || (o == best_over && best_move &&
                                m.prediction.throughput_tok_s > best_move->prediction.throughput_tok_s)) {
            best_over = o;
            best_move = std::move(m);
            best_move_forms = std::move(refixed);
          }
        }
    }
    if (!best_move) return std::nullopt;
    c = std::move(*best_move);
    if (best_move_forms) F = staggered = std::move(*best_move_forms);
  }
  return std::nullopt;
}

std::string describe_shape(const Policy& p) {
  std::ostringstream os;
  os << "gpu_batch_size " << p.gpu_batch_size << ", " << p.num_gpu_batches << " GPU batch"
     << (p.num_gpu_batches == 1 ? "" : "es");
  // "4-bit weights and KV cache", or each with its own bits.
  const bool same = p.compress_weights && p.compress_kv_cache && p.compress_weights->bits == p.compress_kv_cache->bits;
  if (p.compress_weights) os << ", " << p.compress_weights->bits << "-bit weights";
  if (p.compress_kv_cache) os << (same ? " and" : ", " + std::to_string(p.compress_kv_cache->bits) + "-bit") << " KV cache";
  return os.str();
}

// The least a tier must hold for the forms: minimize its peak, with the other tiers within their
// budgets (or unlimited when `others_free`). Infinity when the other tiers cannot make room.
double least_on_tier(const CostForms& F, Tier t, const TierBytes& budget, bool others_free) {
  Lp lp(F);
  const int m = lp.add_col(1.0);
  lp.add_form_row(F.peak[int(t)], {{m, -1.0}}, 0.0, 1e9);
  if (!others_free) add_memory_rows(lp, F, budget, t);
  if (!lp.solve()) return std::numeric_limits<double>::infinity();
  return lp.objective();
}

[[noreturn]] void no_policy_fits(const ModelConfig& cfg, const HardwareProfile& hw, const SearchOptions& opts) {
  // The smallest candidate: one sequence per GPU batch, one GPU batch, the most compression allowed.
  std::optional<Compression> fewest_bits;
  for (const std::optional<Compression>& w : weight_options(opts))
    if (w && (!fewest_bits || w->bits < fewest_bits->bits)) fewest_bits = w;
  Policy smallest = make_policy({1, 1, false, fewest_bits, opts.allow_compression});
  const CostForms F = cost_forms(cfg, smallest, opts.workload, hw);
  std::ostringstream os;
  os << "no policy fits " << cfg.name << " (prompt " << opts.workload.prompt_len << ", generation "
     << opts.workload.gen_len << ")";
  // A tier that cannot hold its share even with everything else offloaded binds on its own.
  double worst = 1.0;
  std::optional<Tier> alone;
  for (Tier t : kTiers) {
    const double need = least_on_tier(F, t, opts.budget, true), b = opts.budget.at(t);
    const double ratio = b > 0 ? need / b : (need > 0 ? std::numeric_limits<double>::infinity() : 0);
    if (need > b * (1 + 1e-9) + 1e-6 && ratio > worst) {
      worst = ratio;
      alone = t;
    }
  }
  if (alone) {
    os << ": the " << tier_name(*alone) << " tier is the binding one: even " << describe_shape(smallest)
       << " with everything else offloaded needs " << format_bytes(least_on_tier(F, *alone, opts.budget, true))
       << " there, over its budget of " << format_bytes(opts.budget.at(*alone));
    throw Error(os.str());
  }
  // Memory allows the smallest candidate: the latency bound is what no candidate meets.
  const LpSolution fastest = solve_placement_lp(F, opts.budget, std::nullopt);
  if (fastest.feasible) {
    os << ": none meets the latency bound of " << opts.max_latency_s.value_or(0) << " s ("
       << describe_shape(smallest) << " takes " << fastest.total_s << " s)";
    throw Error(os.str());
  }
  // Otherwise the tiers are short together: say what each would need with the others full, and
  // name the one whose budget that exceeds the most. A tier that cannot make up the shortfall
  // alone (its need is infinite) is not named.
  struct Need {
    Tier t;
    double bytes, ratio;
  };
  std::vector<Need> needs;
  for (Tier t : kTiers) {
    const double need = least_on_tier(F, t, opts.budget, false), b = opts.budget.at(t);
    if (std::isfinite(need)) needs.push_back({t, need, b > 0 ? need / b : std::numeric_limits<double>::infinity()});
  }
  if (needs.empty()) {
    os << ": no single tier's budget can make room for " << describe_shape(smallest) << "; raise several";
    throw Error(os.str());
  }
  std::stable_sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) { return a.ratio > b.ratio; });
  os << ": the " << tier_name(needs[0].t) << " tier is the binding one: " << describe_shape(smallest) << " needs ";
  for (size_t i = 0; i < needs.size(); ++i)
    os << (i ? ", or " : "") << format_bytes(needs[i].bytes) << " on the " << tier_name(needs[i].t) << " tier (budget "
       << format_bytes(opts.budget.at(needs[i].t)) << ")";
  throw Error(os.str());
}

}  // namespace

namespace {

// Whether a policy's CPU attention and CPU experts have something on the CPU to compute: with all
// the cache on the GPU, or no MLP half on the CPU tier, its twin without them is the same policy.
bool delegates_to_cpu(const Policy& p) {
  if (p.cpu_attention && p.kv_cache.gpu == 100) return false;
  const TierSplit& experts = p.expert_weights ? *p.expert_weights : p.weights;
  return !((p.cpu_experts_prefill || p.cpu_experts_decode) && experts.cpu == 0);
}

// Best throughput first; equal throughputs (a compute-bound model scales T with the block) by
// lower latency. Throughput is compared at a relative 1e-9 so that the order stays strict.
bool by_throughput(const Candidate& a, const Candidate& b) {
  const auto key = [](const Candidate& c) { return std::llround(std::log(c.prediction.throughput_tok_s) * 1e9); };
  const long long ka = key(a), kb = key(b);
  return ka != kb ? ka > kb : a.prediction.latency_s < b.prediction.latency_s;
}

// The LP's candidate for every batch shape and options worth solving, rounded to whole layers but
// not yet re-checked against the runtime's plan, best throughput first, with the forms it came from.
// `refine_all`: the LP's second phase for every shape, not only those that may rank first (its
// vertex decides the rounding, so a frontier needs it for the slower shapes too).
std::vector<std::pair<Candidate, CostForms>> collect(const ModelConfig& cfg, const HardwareProfile& hw,
                                                     const SearchOptions& opts, int& lps_solved, bool refine_all) {
  std::vector<std::pair<Candidate, CostForms>> found;
  double best_found = 0;       // best throughput of a rounded candidate so far
  for (Shape options : option_sets(opts, cfg.moe() && hw.cpu_flops > 0)) {
    for (int gbs : batch_sizes()) {
      bool any = false;
      double best_here = 0;  // best LP throughput for this GPU batch size
      for (int ngb : batch_counts()) {
        if (gbs * ngb > kMaxBlock) break;
        options.gbs = gbs;
        options.ngb = ngb;
        const Policy shape = make_policy(options);
        const CostForms F = cost_forms(cfg, shape, opts.workload, hw,
                                       options.experts_apart ? ExpertSplit::Free : ExpertSplit::Fixed);
        // The second phase only for LPs that may rank: an LP's throughput bounds its rounding's.
        const LpSolution lp = solve_placement_lp(F, opts.budget, opts.max_latency_s, refine_all ? 0 : 0.8 * best_found);
        ++lps_solved;
        // Memory and T both grow with the block: more GPU batches will not fit either.
        if (!lp.feasible) break;
        any = true;
        const double tput = double(F.block_size) * F.gen_len / lp.total_s;
        best_here = std::max(best_here, tput);
        std::optional<Priced> c = round_to_units(cfg, hw, shape, F, lp, opts);
        if (c && !delegates_to_cpu(c->first.policy)) c.reset();
        // Ranked by the schedule it will run: staggering only adds to the LP's rounded throughput.
        if (c) c->first = with_best_stagger(c->second, std::move(c->first), opts);
        if (c) best_found = std::max(best_found, c->first.prediction.throughput_tok_s);
        if (c) found.push_back(std::move(*c));
        // Past its peak, throughput falls as the block pushes data to slower tiers (FlexGen stops
        // at the first fall; a margin keeps plateaus). The shapes skipped take longer per block
        // too, so they are off the latency-throughput frontier as well.
        if (tput < 0.7 * best_here) break;
      }
      // Nor will larger GPU batches fit in memory. Under a latency bound go on: a larger GPU
      // batch can finish sooner (the GEMMs' rate grows with their rows faster than their work).
      if (!any && !opts.max_latency_s) break;
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return by_throughput(a.first, b.first); });
  return found;
}

}  // namespace

SearchResult search_policy(const ModelConfig& cfg, const HardwareProfile& hw, const SearchOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult result;
  // Under a latency bound every shape's LP is refined, as for the frontier: the pick under each
  // bound is then the frontier's row for it.
  std::vector<std::pair<Candidate, CostForms>> found =
      collect(cfg, hw, opts, result.lps_solved, opts.max_latency_s.has_value());
  // Re-check the best against the runtime's memory plan until `keep` survive and no unchecked
  // candidate could beat them (a repair only moves layers, so it may lower a throughput).
  for (auto& [c, F] : found) {
    const int k = std::max(opts.keep, 1);
    if (int(result.ranked.size()) >= k && !by_throughput(c, result.ranked[k - 1])) break;
    if (auto ok = recheck(cfg, hw, std::move(F), std::move(c), opts)) {
      result.ranked.push_back(std::move(*ok));
      std::stable_sort(result.ranked.begin(), result.ranked.end(), by_throughput);
    }
  }
  if (int(result.ranked.size()) > std::max(opts.keep, 1)) result.ranked.resize(std::max(opts.keep, 1));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.ranked.empty()) no_policy_fits(cfg, hw, opts);
  return result;
}

std::vector<Candidate> search_candidates(const ModelConfig& cfg, const HardwareProfile& hw, const SearchOptions& opts,
                                         int* lps_solved) {
  int lps = 0;
  std::vector<std::pair<Candidate, CostForms>> found = collect(cfg, hw, opts, lps, true);
  if (lps_solved) *lps_solved = lps;
  std::vector<Candidate> out;
  for (auto& [c, F] : found)
    if (auto ok = recheck(cfg, hw, std::move(F), std::move(c), opts)) out.push_back(std::move(*ok));
  std::stable_sort(out.begin(), out.end(), by_throughput);
  if (out.empty()) no_policy_fits(cfg, hw, opts);
  return out;
}

std::vector<ParetoPoint> pareto_points(const std::vector<Candidate>& candidates, const std::vector<double>& bounds) {
  std::vector<ParetoPoint> points;
  for (double bound : bounds) {
    ParetoPoint pt;
    pt.max_latency_s = bound;
    const Candidate* best = nullptr;
    for (const Candidate& c : candidates)
      if (c.prediction.latency_s <= bound * (1 + 1e-9) && (!best || by_throughput(c, *best))) best = &c;
    if (best) pt.best = *best;
    points.push_back(std::move(pt));
  }
  return points;
}

std::vector<Candidate> pareto_frontier(const std::vector<Candidate>& candidates) {
  std::vector<Candidate> by_latency = candidates;
  // Lower latency first; at equal latency the better throughput first, so that it alone is kept.
  std::stable_sort(by_latency.begin(), by_latency.end(), [](const Candidate& a, const Candidate& b) {
    if (a.prediction.latency_s != b.prediction.latency_s) return a.prediction.latency_s < b.prediction.latency_s;
    return by_throughput(a, b);
  });
  std::vector<Candidate> frontier;
  for (Candidate& c : by_latency)
    if (frontier.empty() || by_throughput(c, frontier.back())) frontier.push_back(std::move(c));
  return frontier;
}

std::vector<double> latency_sweep(const std::vector<Candidate>& candidates, int points) {
  if (candidates.empty() || points < 1) return {};
  // From the fastest candidate to the best one: looser bounds only repeat the best.
  const std::vector<Candidate> front = pareto_frontier(candidates);
  const double lo = front.front().prediction.latency_s, hi = front.back().prediction.latency_s;
  if (points == 1 || !(hi > lo)) return {hi};
  std::vector<double> v;
  for (int i = 0; i < points; ++i) v.push_back(lo * std::pow(hi / lo, double(i) / (points - 1)));
  v.back() = hi;  // exactly, so that the loosest bound admits the best candidate
  return v;
}

}  // namespace strata
