// Per-element math shared by the host and CUDA back ends.
//
// Each function is written once, marked WEFT_HD (__host__ __device__ under
// nvcc), and called by the host reference ops and by the CUDA kernels alike, so
// the two back ends differ only in how work is spread over threads and in
// summation order, never in the formula.
//
// defines: math::gelu, math::gelu_grad, math::silu, math::silu_grad, math::AdamWParams, math::adamw_step,
//   math::sign, math::kMaxExperts, math::kMaxExpertGroups, math::Score, math::RouteRule, math::route_row,
//   math::route_row_backward, WEFT_HD
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define WEFT_HD __host__ __device__
#else
#define WEFT_HD
#endif

namespace weft::math {

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
// x^3))).
template <class T> WEFT_HD inline T gelu(T x) {
  constexpr T k = T(0.7978845608028654);  // sqrt(2 / pi)
  constexpr T c = T(0.044715);
  using std::tanh;
  return T(0.5) * x * (T(1) + tanh(k * (x + c * x * x * x)));
}

// d gelu / dx for the same approximation.
template <class T> WEFT_HD inline T gelu_grad(T x) {
  constexpr T k = T(0.7978845608028654);
  constexpr T c = T(0.044715);
  using std::tanh;
  const T u = k * (x + c * x * x * x);
  const T t = tanh(u);
  const T du = k * (T(1) + T(3) * c * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

// SiLU (swish): x sigmoid(x), and its derivative sigmoid(x) (1 + x (1 - sigmoid(x))).
template <class T> WEFT_HD inline T silu(T x) {
  using std::exp;
  return x / (T(1) + exp(-x));
}
template <class T> WEFT_HD inline T silu_grad(T x) {
  using std::exp;
  const T s = T(1) / (T(1) + exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

// One AdamW step for one element (decoupled weight decay, Loshchilov and
// Hutter; PyTorch's AdamW):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)
// with the bias corrections bc1 = 1 - b1^t and bc2 = 1 - b2^t computed once per
// step by the caller. S is the type the state and the arithmetic use: float for
// training (f32 and bf16 parameters), double on the host's double-precision
// checking path.
template <class S> struct AdamWParams {
  S lr, beta1, beta2, eps, weight_decay, bc1, bc2;
};
using AdamW = AdamWParams<float>;

template <class P, class S>
WEFT_HD inline void adamw_step(P& p, S g, S& m, S& v, const AdamWParams<S>& a, bool decay) {
  using std::sqrt;
  m = a.beta1 * m + (S(1) - a.beta1) * g;
  v = a.beta2 * v + (S(1) - a.beta2) * g * g;
  const S update = (m / a.bc1) / (sqrt(v / a.bc2) + a.eps);
  const S ps = static_cast<S>(p);
  p = static_cast<P>(ps - a.lr * (update + (decay ? a.weight_decay * ps : S(0))));
}

// -1, 0 or 1 (0 for 0 and NaN): the direction of a sign step (ops::Update::sign_step).
template <class T> WEFT_HD inline double sign(T x) { return x > T(0) ? 1.0 : x < T(0) ? -1.0 : 0.0; }

// A mixture of experts' routing of one token (ops/moe.hpp), by the rule's scores:
//   softmax  probs (E) = softmax(logits) (Mixtral, Qwen3-MoE); returns logsumexp(logits)
//   sigmoid  probs (E) = sigmoid(logits) (DeepSeek-V3); returns their sum u (+ 1e-20), over which
//            the load-balancing loss normalises them
// idx (k) the k largest of probs + bias (bias null: none; ties to the lower expert), weight (k)
// their probabilities (without the bias), divided by their sum where renormalised (+ 1e-20 for
// sigmoid scores, as DeepSeek-V3 and Megatron-Core divide), times the rule's scale; with the rule's
// groups, among the experts of its top groups only (RouteRule). E <= kMaxExperts
// (the backward's one row of E on the stack, or in a GPU thread's local memory: Qwen3-MoE's 128,
// DeepSeek-V3's 256 and Kimi K2's 384 experts fit).
inline constexpr long kMaxExperts = 512;

enum class Score : int { softmax, sigmoid };

// Group-limited routing (DeepSeek-V3's n_group, topk_group): the E experts in `groups` groups of
// E / groups neighbours, each group scored by the sum of its two largest probs + bias, and the
// top k chosen among the experts of the `top_groups` best groups only (ties to the lower group).
inline constexpr long kMaxExpertGroups = 64;

template <class S>
struct RouteRule {
  Score score = Score::softmax;
  bool renormalise = true;
  S scale = 1;          // the chosen weights' factor (DeepSeek-V3's routed_scaling_factor)
  long groups = 1;      // expert groups (1: every expert eligible)
  long top_groups = 1;  // the groups a token's experts come from (with groups > 1)
};

template <class S, class I>
WEFT_HD inline S route_row(S* probs, I* idx, S* weight, const S* logits, const S* bias, long E, long k,
                           const RouteRule<S>& r) {
  using std::exp;
  using std::log;
  S norm = 0;
  if (r.score == Score::softmax) {
    S m = logits[0];
    for (long e = 1; e < E; ++e) m = logits[e] > m ? logits[e] : m;
    S sum = 0;
    for (long e = 0; e < E; ++e) sum += probs[e] = exp(logits[e] - m);
    for (long e = 0; e < E; ++e) probs[e] /= sum;
    norm = log(sum) + m;
  } else {
    for (long e = 0; e < E; ++e) norm += probs[e] = S(1) / (S(1) + exp(-logits[e]));
    norm += S(1e-20);
  }
  // The groups a token may choose from (a bit each; all where groups is 1).
  const auto biased = [&](long e) { return bias ? probs[e] + bias[e] : probs[e]; };
  unsigned long long eligible = ~0ull;
  if (r.groups > 1) {
    const long size = E / r.groups;
    S group_score[kMaxExpertGroups];
    for (long g = 0; g < r.groups; ++g) {  // the sum of the group's two largest
      long first = g * size;
      for (long e = g * size + 1; e < (g + 1) * size; ++e) first = biased(e) > biased(first) ? e : first;
      long second = -1;
      for (long e = g * size; e < (g + 1) * size; ++e)
        if (e != first && (second < 0 || biased(e) > biased(second))) second = e;
      group_score[g] = biased(first) + biased(second);
    }
    eligible = 0;
    for (long j = 0; j < r.top_groups; ++j) {
      long best = -1;
      for (long g = 0; g < r.groups; ++g)
        if (!(eligible >> g & 1ull) && (best < 0 || group_score[g] > group_score[best])) best = g;
      eligible |= 1ull << best;
    }
  }
  S chosen = 0;
  for (long j = 0; j < k; ++j) {  // the j-th largest: the first of the largest not yet chosen
    long best = -1;
    for (long e = 0; e < E; ++e) {
      bool taken = r.groups > 1 && !(eligible >> (e / (E / r.groups)) & 1ull);
      for (long i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (taken) continue;
      if (best < 0 || biased(e) > biased(best)) best = e;
    }
    idx[j] = static_cast<I>(best);
    weight[j] = probs[best];
    chosen += probs[best];
  }
  if (r.score == Score::sigmoid) chosen += S(1e-20);
  if (r.renormalise)
    for (long j = 0; j < k; ++j) weight[j] /= chosen;
  if (r.scale != S(1))
    for (long j = 0; j < k; ++j) weight[j] *= r.scale;
  return norm;
}

// One token's dlogits (E) into out, from dL/dprobs: aux[e] (the load-balancing loss's gradient by
// each expert's share of the token, null for none: for softmax scores probs itself, for sigmoid
// probs / norm) plus what the chosen weights pass back (dweight, null for none) through the scale
// and the renormalisation; then through the softmax or the sigmoid; plus z lse probs[e] (the
// z-loss's, dL/dlse = z lse; softmax scores only, norm = lse).
template <class S, class I>
WEFT_HD inline void route_row_backward(S* out, const S* dweight, const S* probs, const I* idx, const S* weight, S norm,
                                       long E, long k, const RouteRule<S>& r, const S* aux, S z) {
  const bool sigmoid = r.score == Score::sigmoid;
  for (long e = 0; e < E; ++e) out[e] = S(0);
  if (aux) {
    if (sigmoid) {  // q_e = p_e / u: dp_e = (aux_e - sum_f aux_f q_f) / u
      S dot = 0;
      for (long e = 0; e < E; ++e) dot += aux[e] * probs[e];
      for (long e = 0; e < E; ++e) out[e] = (aux[e] - dot / norm) / norm;
    } else {
      for (long e = 0; e < E; ++e) out[e] = aux[e];
    }
  }
  if (dweight) {
    if (r.renormalise) {  // weight_j = c p_j / s: dp_j = (c dweight_j - sum_i dweight_i weight_i) / s
      S dot = 0, s = sigmoid ? S(1e-20) : S(0);
      for (long j = 0; j < k; ++j) {
        dot += dweight[j] * weight[j];
        s += probs[idx[j]];
      }
      for (long j = 0; j < k; ++j) out[idx[j]] += (r.scale * dweight[j] - dot) / s;
    } else {
      for (long j = 0; j < k; ++j) out[idx[j]] += r.scale * dweight[j];
    }
  }
  if (sigmoid) {
    for (long e = 0; e < E; ++e) out[e] *= probs[e] * (S(1) - probs[e]);
    return;
  }
  S dot = 0;
  for (long e = 0; e < E; ++e) dot += probs[e] * out[e];
  for (long e = 0; e < E; ++e) out[e] = probs[e] * (out[e] - dot) + z * norm * probs[e];
}

}  // namespace weft::math
