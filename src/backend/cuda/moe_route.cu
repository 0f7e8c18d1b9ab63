// A mixture of experts' routing on the device, for a decode step's few tokens: what route_tokens
// (src/runtime/moe_routing.cpp) computes on the host, written where the gather, the experts'
// linears (launch_routed_linears) and combine_rows read it, so that the step never waits for the
// router's logits on the host and can be captured in a graph.
//
// One block of W warps (enough for the tokens, up to 16, and a thread per expert); warp w routes
// tokens w, w + W, ... with the host's float operations in the host's order: its lanes compute
// exp(logit - max) for the experts congruent to them mod 32, lane 0 sums them in expert order and
// the lanes divide; k warp-wide argmax rounds pick the largest probabilities (the lower expert on
// a tie), lane 0 summing them in that order for the renormalisation; lane 0 sorts the k
// ascending. Then thread e counts expert e's assignments, its first row (a sum over the experts
// before it) and its slot among the active experts, and places its assignments, walking them in
// token order, so each expert's tokens stay ascending. Each thread loops over at most the step's
// T k assignments or E experts: no atomics, the same result every run.
#include <algorithm>
#include <cmath>

#include "cuda_common.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kWarps = 16;  // at most; a launch takes a warp per token up to this, and a thread per expert
constexpr int kThreads = kWarps * 32;
static_assert(kMaxRoutedExperts <= kThreads, "a thread per expert");

// The better of two candidates: the larger probability, the lower expert on a tie (-1: none).
__device__ __forceinline__ void keep_better(float& p, int& e, float other_p, int other_e) {
  if (other_e >= 0 && (e < 0 || other_p > p || (other_p == p && other_e < e))) {
    p = other_p;
    e = other_e;
  }
}

__global__ void __launch_bounds__(kThreads) route_experts_kernel(const RouteExpertsParams p) {
  __shared__ float prob[kWarps][kMaxRoutedExperts];  // each warp's token's probabilities
  __shared__ int32_t chosen[kMaxRoutedTokens * kMaxRoutedK];  // each token's experts, ascending
  __shared__ float weight[kMaxRoutedTokens * kMaxRoutedK];
  __shared__ int32_t count[kMaxRoutedExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = p.experts, k = p.k, A = p.tokens * k;

  const int warps = int(blockDim.x) / 32;
  for (int t = warp; t < p.tokens; t += warps) {
    const float* row = p.logits + int64_t(t) * E;
    float* pr = prob[warp];
    float top = -INFINITY;
    for (int e = lane; e < E; e += 32) top = fmaxf(top, row[e]);
    top = warp_max(top);
    for (int e = lane; e < E; e += 32) pr[e] = expf(row[e] - top);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
      for (int e = 0; e < E; ++e) sum += pr[e];
    sum = __shfl_sync(kFullMask, sum, 0);
    for (int e = lane; e < E; e += 32) pr[e] /= sum;
    __syncwarp();
    int32_t* mine = chosen + t * k;
    float* w = weight + t * k;
    float picked = 0.0f;
    for (int j = 0; j < k; ++j) {
      float best_p = 0.0f;
      int best = -1;
      for (int e = lane; e < E; e += 32) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || mine[i] == e;
        if (!taken) keep_better(best_p, best, pr[e], e);
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float other_p = __shfl_xor_sync(kFullMask, best_p, o);
        const int other = __shfl_xor_sync(kFullMask, best, o);
        keep_better(best_p, best, other_p, other);
      }
      if (lane == 0) {
        mine[j] = best;
        w[j] = best_p;
        picked += best_p;
      }
      __syncwarp();
    }
    if (lane == 0) {
      for (int j = 1; j < k; ++j)  // ascending expert order, each weight with its expert
        for (int i = j; i > 0 && mine[i - 1] > mine[i]; --i) {
          const int32_t e = mine[i];
          mine[i] = mine[i - 1];
          mine[i - 1] = e;
          const float x = w[i];
          w[i] = w[i - 1];
          w[i - 1] = x;
        }
      if (p.renormalize)
        for (int j = 0; j < k; ++j) w[j] /= picked;
    }
    __syncwarp();  // the next token's probabilities go where this one's were
  }
  __syncthreads();

  const int e = threadIdx.x;
  if (e < E) {
    int n = 0;
    for (int i = 0; i < A; ++i) n += chosen[i] == e;
    count[e] = n;
  }
  __syncthreads();
  if (e < E) {
    int first = 0, slot = 0;  // expert e's first row, and its slot among the active experts
    for (int x = 0; x < e; ++x) {
      first += count[x];
      slot += count[x] > 0;
    }
    p.expert_begin[e] = first;
    if (e == E - 1) {
      p.expert_begin[E] = first + count[e];
      const int active = slot + (count[e] > 0);
      for (int s = active; s < p.active_slots; ++s) p.active[s] = -1;
      p.totals[0] += 1;  // one routed layer step, its tokens, its distinct experts
      p.totals[1] += p.tokens;
      p.totals[2] += active;
    }
    if (count[e] > 0) p.active[slot] = e;
    for (int i = 0; i < A; ++i)
      if (chosen[i] == e) {
        p.gather[first] = i / k;
        p.combine_rows[i] = first++;
      }
  }
  for (int i = threadIdx.x; i < A; i += int(blockDim.x)) p.combine_weights[i] = weight[i];
}

}  // namespace

void launch_route_experts(const RouteExpertsParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  // Enough warps for the tokens (up to 16) and threads for the experts, no more: a decode step of
  // Mixtral's 8 experts at batch 2 takes 64 threads, not 512.
  const int warps = std::max(std::min(p.tokens, kWarps), (p.experts + 31) / 32);
  route_experts_kernel<<<1, warps * 32, 0, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("route_experts_kernel", stream);
}

}  // namespace strata::cuda
