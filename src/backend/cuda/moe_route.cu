// A mixture of experts' routing on the device, for a decode step's few tokens: what route_tokens
// (src/runtime/moe_routing.cpp) computes on the host, written where the gather, the experts'
// linears (launch_routed_linears) and combine_rows read it, so that the step never waits
// for the router's logits on the host and can be captured in a graph.
//
// One warp. Lane t routes token t as the host does, in the same order of float operations: the
// softmax's sum over the experts in order, then k passes over the experts for the k largest
// probabilities (the lower expert on a tie), summed in that order for the renormalisation, then
// the k sorted ascending. The counting sort by expert follows: each lane counts and places the
// assignments of the experts congruent to it modulo 32, walking the assignments in token order,
// so each expert's tokens stay ascending; lane 0 turns the counts into offsets in between.
#include <cmath>

#include "cuda_common.h"
#include "kernels.h"

namespace strata::cuda {

namespace {

constexpr int kLanes = 32;
static_assert(kMaxRoutedTokens <= kLanes, "a lane per token");

__global__ void route_experts_kernel(const RouteExpertsParams p) {
  __shared__ int32_t chosen[kMaxRoutedTokens * kMaxRoutedK];  // each token's experts, ascending
  __shared__ float weight[kMaxRoutedTokens * kMaxRoutedK];
  __shared__ int32_t begin[kMaxRoutedExperts + 1];
  const int lane = threadIdx.x, E = p.experts, k = p.k, A = p.tokens * k;

  if (lane < p.tokens) {
    const float* row = p.logits + int64_t(lane) * E;
    float top = row[0];
    for (int e = 1; e < E; ++e) top = fmaxf(top, row[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += expf(row[e] - top);
    int32_t* mine = chosen + lane * k;
    float* w = weight + lane * k;
    float picked = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = 0;
      float best_p = -1.0f;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || mine[i] == e;
        const float pe = expf(row[e] - top) / sum;
        if (!taken && pe > best_p) {  // strictly greater: the lower expert wins a tie
          best = e;
          best_p = pe;
        }
      }
      mine[j] = best;
      w[j] = best_p;
      picked += best_p;
    }
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
  __syncthreads();

  for (int e = lane; e < E; e += kLanes) {
    int n = 0;
    for (int i = 0; i < A; ++i) n += chosen[i] == e;
    begin[e + 1] = n;
  }
  __syncthreads();
  if (lane == 0) {
    begin[0] = 0;
    int active = 0;
    for (int e = 0; e < E; ++e) {
      active += begin[e + 1] > 0;
      begin[e + 1] += begin[e];
    }
    int slot = 0;
    for (int e = 0; e < E && slot < p.active_slots; ++e)
      if (begin[e + 1] > begin[e]) p.active[slot++] = e;
    for (; slot < p.active_slots; ++slot) p.active[slot] = -1;
    p.totals[0] += 1;  // one routed layer step, its tokens, its distinct experts
    p.totals[1] += p.tokens;
    p.totals[2] += active;
  }
  __syncthreads();

  for (int e = lane; e < E; e += kLanes) {
    int next = begin[e];
    for (int i = 0; i < A; ++i)
      if (chosen[i] == e) {
        p.gather[next] = i / k;
        p.combine_rows[i] = next++;
      }
  }
  for (int e = lane; e <= E; e += kLanes) p.expert_begin[e] = begin[e];
  for (int i = lane; i < A; i += kLanes) p.combine_weights[i] = weight[i];
}

}  // namespace

void launch_route_experts(const RouteExpertsParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  route_experts_kernel<<<1, kLanes, 0, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH("route_experts_kernel", stream);
}

}  // namespace strata::cuda
