// MoeMlp<T, A, D>: a mixture-of-experts MLP (Shazeer et al. 2017; Mixtral, Qwen3-MoE, DeepSeek-V3's
// shared experts), a layer over the rows of a stream in layout A, as LayerNorm is (each token on its
// own but for the router's losses): in a block it takes the MLP's place.
//
//   x       (B, T, C) in A                 the rank's rows, N = B T (local)
//   logits  (N, E)      acc<T>             x Wr^T, the router's; probs = softmax(logits), or
//                                          sigmoid(logits) (DeepSeek-V3's scores) (ops::Route)
//   index   (N, k)      int32              each token's k experts (the largest probs, plus the
//                                          expert bias where there is one), weight (N, k) their
//                                          probabilities (renormalised to sum 1 where the options
//                                          say, times the options' scale)
//   xp      (M, C)                         the tokens' rows in the experts' order: expert e's block of
//                                          count_e rows, M = N k (dropless) or fewer (capacity)
//   h       (M, 2H), a (M, H)              each block through its expert's SwiGLU: h = xp W1_e^T
//                                          (gate and up interleaved, ops::SwiGlu), a = silu(gate) up
//   yp      (M, C)                         a W2_e^T
//   y       (B, T, C) in A                 sum over j of weight[n, j] yp[slot of (n, j)], plus the
//                                          shared expert's SwiGLU of x where there is one
//
// Parameters: router Wr (E, C), experts.gate_up (E, 2H, C) (row 2f the gate of feature f, 2f + 1
// its up), experts.down (E, C, H), shared.gate_up (2S, C), shared.down (C, S) where S > 0, and
// router.bias (E) where the options ask for an expert bias (below). The router is replicated; the
// experts are sharded over the expert axis (ExpertSharded: rank e of an expert group of ep holds
// experts [e E/ep, (e + 1) E/ep), all of them where ep is 1).
//
// G, the precision's GEMMs (core/precision.hpp): ExactGemms, or fp8::Gemms<...>, under which each
// expert's four GEMMs and the shared expert's (not the router's, which stays in T as Transformer
// Engine keeps it) read float8 casts of their operands as nn::Linear's do: up and down forward
// (activation x weight), dgrad (gradient x weight) and wgrad (gradient x activation), each expert's
// block of rows cast with scales of its own (per-group scaling, as torchao's MoE training does).
// Every operand is whole on its rank, so nothing is reduced; with expert parallelism an expert's
// rows gather every data rank's tokens routed to it, so it casts as one rank's expert does.
// Tensorwise and rowwise only: a blockwise weight gradient would need each expert's token count in
// whole blocks, and experts split over the tensor ranks would need their amaxes reduced (both
// refused at compile time).
//
// On the tensor axis, the ET policy (ExpertTensor):
//   whole     (the default) each tensor rank holds its experts and the shared expert whole and runs
//             them on its own rows: the layer keeps its input's layout A (Replicate, or Shard<1>
//             under sequence parallelism); gradients are whole, or (SP) the rank's rows' share
//             (replicated_param_grad<A>, expert_param_grad<A>)
//   sharded   expert-tensor parallelism (Megatron-Core's expert_tensor_parallel_size = the tensor
//             degree): every expert's SwiGLU, and the shared expert's, split over the tensor ranks
//             as a Megatron MLP is, gate_up by (gate, up) pairs of hidden features (Shard<1>: local
//             (E/ep, 2H/tp, C)), down by its input features (Shard<2>: (E/ep, C, H/tp)). The layer
//             takes every row of its tensor group (A Replicate on tensor: a block puts Local::enter
//             before it, the all-gather under SP) and gives a partial sum (Out Partial on tensor,
//             Local::leave after it). Each tensor rank routes and dispatches the same rows with its
//             own expert group (the router's work and its statistics repeated; the same choices);
//             its experts' outputs are partial, so the weights' gradients are all-reduced over
//             tensor (N k scalars) before the router's backward, and the router's part of the input
//             gradient is added on tensor rank 0 alone (GradIn Partial). A capacity then needs no
//             whole sequence on one rank.
//
// Expert parallelism (ep > 1, nn/expert_dispatch.hpp), the Dispatcher's way:
//   AllToAllDispatch   xp's rows go to the ranks that hold their experts (dispatch: one
//                      all-to-all-v over the expert group, after the counts'), each rank runs its
//                      experts on what it got, and the outputs come back (combine) before the
//                      weighted sum; backward sends dyp the same way and dxp back
//   AllGatherDispatch  the group's rows, indices and weights are gathered (Ng = ep N tokens), the
//                      plan covers them all, each rank runs its experts on their slots and sums
//                      their weighted outputs over every gathered token, and a reduce-scatter adds
//                      the ranks' parts and gives each its rows; backward gathers dy, and the
//                      weights' and rows' gradients are reduce-scattered the same way The expert group is carved from
//                      the data x context ranks
// (comm/mesh.hpp), whose tokens differ; a rank's tensor ranks, under SP, exchange their own rows
// in their own groups.
//
// The router's losses, added to the model's loss through their gradients (as Megatron-Core does;
// the layer keeps their values for the log, last_aux and last_z, with the expert load last_load):
//   load balancing  aux = E sum_e f_e P_e, f_e = (slots routed to e) / N, P_e = the mean of probs[., e]
//                   over the tokens (transformers' load_balancing_loss_func for one layer; Switch's
//                   with top-k slots), times aux_coef
//   z-loss          z = the mean over tokens of logsumexp(logits)^2 (ST-MoE), times z_coef
// (With sigmoid scores, P_e is the mean of each token's scores over their sum, as Megatron-Core
// normalises them; the z-loss is refused.)
// N and the sums are over the micro-batch's tokens on every rank (all-reduced over data, context and,
// under sequence parallelism, tensor: one all-reduce of 2E + 2 doubles in forward), so that every
// layout computes the same losses; their gradients are scaled by the micro-batch's weight in the
// step (the mesh's grad_scale(): nn::StageMesh's, which nn::StagedModel hands its blocks; 1 where
// the mesh has none).
//
// Aux-loss-free balancing (DeepSeek-V3; expert_bias): a per-expert bias b (E) is added to the
// scores for the choice of experts only (the weights are the scores without it), and each optimizer
// step moves it by b_e -= bias_rate sign(load_e - mean): experts that got more than their share of
// the step's slots become less likely, the others more. Its gradient buffer carries the load, E
// (slots chosen for e) - N k from every micro-batch of every rank (exact integers, summed as
// gradients are: over data, context and, under sequence parallelism, tensor), and the optimizer
// step gives it its sign step (nn::SignStep, optim/data_parallel.hpp), outside the optimizer's rule
// and the gradient norm: every layout moves it alike, and checkpoints keep it as a parameter.
//
// Group-limited routing (DeepSeek-V3; groups > 1): the experts in `groups` groups of neighbours, each
// token's top k taken from the experts of its top_groups groups, a group scored by the sum of its
// two largest scores (plus the bias); the gradients are those of the experts chosen, as without.
//
// On the Meta device (the plan) every expert gets the same share of the tokens, k N / E slots of
// each rank's N (the routing a balanced router converges to), and each rank of an expert group gets
// what it sends.
//
// Capacity (capacity_factor > 0): each sample may send at most ceil(factor T k / E) of its tokens to
// an expert; its tokens past that, in token order, are dropped from that expert (their slot's output
// and gradient are zero). Per sample, so that the data and pipe layouts drop the same tokens; with
// the sequence split over ranks (context or sequence parallelism) it is refused. Dropless by default.
//
// defines: nn::MoeOptions, nn::MoeMlp, nn::moe_plan, nn::balanced_moe_plan
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/redistribute.hpp"
#include "weft/core/error.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/expert_dispatch.hpp"
#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/nn/stage_mesh.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/moe.hpp"
#include "weft/ops/scaled_gemm.hpp"
#include "weft/ops/swiglu.hpp"

namespace weft::nn {

using math::Score;

struct MoeOptions {
  std::int64_t experts = 8, top_k = 2, hidden = 0;  // E, k, H (each expert's hidden width)
  bool renormalise = true;                          // the top-k weights divided by their sum (Mixtral)
  double capacity_factor = 0;                       // 0: dropless
  double aux_coef = 0.01, z_coef = 0;               // the router's losses' coefficients
  std::int64_t shared_hidden = 0;                   // S: a shared expert of this width, 0 for none
  Score score = Score::softmax;                     // the router's scores: softmax, or sigmoid (DeepSeek-V3)
  double scale = 1;                                 // the chosen weights' factor (routed_scaling_factor)
  bool expert_bias = false;                         // a per-expert bias on the choice (aux-loss-free balancing)
  double bias_rate = 1e-3;                          // its step each optimizer step (0: held fixed)
  std::int64_t groups = 1, top_groups = 1;          // group-limited routing (DeepSeek-V3's n_group, topk_group)
};

// The experts' order of a micro-batch's slots from each token's k experts (host memory): slot (N, k)
// each (token, j)'s row in xp or -1 where dropped, rows (M) each row's token, offsets (E + 1) each
// expert's block. Slots go expert by expert, in token order; `capacity` > 0 keeps at most that many
// of each sample's (T tokens) slots per expert.
struct MoePlan {
  std::vector<std::int32_t> slot, rows;
  std::vector<std::int64_t> offsets;
  std::int64_t dropped = 0;
  std::vector<std::int64_t> sample_dropped;  // balanced_moe_plan's: each sample's dropped slots
};
inline MoePlan moe_plan(std::span<const std::int32_t> index, std::int64_t N, std::int64_t T, std::int64_t E,
                        std::int64_t k, std::int64_t capacity) {
  MoePlan p;
  p.slot.assign(static_cast<std::size_t>(N * k), -1);
  p.offsets.assign(static_cast<std::size_t>(E + 1), 0);
  std::vector<std::int64_t> used(static_cast<std::size_t>(E));
  std::vector<char> keep(static_cast<std::size_t>(N * k), 1);
  for (std::int64_t n = 0; n < N; ++n) {
    if (n % T == 0) std::fill(used.begin(), used.end(), 0);  // a new sample
    for (std::int64_t j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(n * k + j);
      const auto e = static_cast<std::size_t>(index[i]);
      if (capacity > 0 && used[e] >= capacity) {
        keep[i] = 0;
        ++p.dropped;
        continue;
      }
      ++used[e];
      ++p.offsets[e + 1];
    }
  }
  for (std::int64_t e = 0; e < E; ++e)
    p.offsets[static_cast<std::size_t>(e + 1)] += p.offsets[static_cast<std::size_t>(e)];
  p.rows.resize(static_cast<std::size_t>(p.offsets.back()));
  std::vector<std::int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < k; ++j) {
      const auto i = static_cast<std::size_t>(n * k + j);
      if (!keep[i]) continue;
      const auto m = next[static_cast<std::size_t>(index[i])]++;
      p.slot[i] = static_cast<std::int32_t>(m);
      p.rows[static_cast<std::size_t>(m)] = static_cast<std::int32_t>(n);
    }
  return p;
}

// What moe_plan gives for the balanced routing the Meta device plans, slot (n, j) to expert
// (n k + j) mod E, from counts alone (each sample's slots of each expert in closed form: a plan of
// a large model on a large mesh routes millions of slots per layer): offsets, dropped and each
// sample's drops; slot and rows left empty (the Meta device reads no values).
inline MoePlan balanced_moe_plan(std::int64_t N, std::int64_t T, std::int64_t E, std::int64_t k,
                                 std::int64_t capacity) {
  MoePlan p;
  p.offsets.assign(static_cast<std::size_t>(E + 1), 0);
  const auto below = [&](std::int64_t x, std::int64_t e) {
    return x > e ? (x - e + E - 1) / E : 0;
  };  // i < x, i % E == e
  for (std::int64_t n0 = 0; n0 < N; n0 += T) {
    const std::int64_t a = n0 * k, b = std::min(N, n0 + T) * k;  // the sample's slots
    std::int64_t dropped = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t c = below(b, e) - below(a, e), kept = capacity > 0 ? std::min(c, capacity) : c;
      p.offsets[static_cast<std::size_t>(e + 1)] += kept;
      dropped += c - kept;
    }
    p.sample_dropped.push_back(dropped);
    p.dropped += dropped;
  }
  for (std::int64_t e = 0; e < E; ++e)
    p.offsets[static_cast<std::size_t>(e + 1)] += p.offsets[static_cast<std::size_t>(e)];
  return p;
}

// Whether a precision's GEMMs are blockwise FP8 (MoeMlp refuses them).
template <class G> inline constexpr bool fp8_blockwise = false;
template <class S, class Grad> inline constexpr bool fp8_blockwise<fp8::Gemms<S, Grad>> = fp8::is_blockwise<S>;

// The experts on the tensor axis (MoeMlp above): whole on every tensor rank, or each split over the
// tensor ranks (expert-tensor parallelism).
enum class ExpertTensor { whole, sharded };

namespace detail {
template <LayoutType A, ExpertTensor ET> struct moe_layouts : SameLayout<A> {
  using weights = Replicate;  // the experts' placements on tensor: gate_up's, down's
  using down_weights = Replicate;
  using shared_up = Replicated;
  using shared_down = Replicated;
  using expert_grad = expert_param_grad<A>;  // the rows' share under SP
  using down_grad = expert_param_grad<A>;
  using shared_up_grad = replicated_param_grad<A>;
  using shared_down_grad = replicated_param_grad<A>;
};
template <LayoutType A> struct moe_layouts<A, ExpertTensor::sharded> {
  static_assert(IsReplicate<typename A::tensor>,
                "MoeMlp<..., ExpertTensor::sharded>: the layer takes every row of its tensor group; give it a "
                "Replicate input on tensor (Local::enter before it, Local::leave after it)");
  using partial = Layout<typename A::data, weft::Partial, typename A::pipe, typename A::context>;
  using In = A;
  using Out = partial;
  using GradIn = partial;  // the experts' input gradients: each tensor rank's features' addend
  using GradOut = A;
  using weights = Shard<1>;       // gate_up (E, 2H, C): by (gate, up) pairs
  using down_weights = Shard<2>;  // down (E, C, H)
  using shared_up = Layout<Replicate, Shard<0>>;
  using shared_down = Layout<Replicate, Shard<1>>;
  using expert_grad = ExpertSharded<weights>;  // each rank's slice whole (every row is on it)
  using down_grad = ExpertSharded<down_weights>;
  using shared_up_grad = shared_up;
  using shared_down_grad = shared_down;
};
}  // namespace detail

template <Floating T, LayoutType A, class D = Host, ExpertDispatch Dispatcher = AllToAllDispatch,
          ExpertTensor ET = ExpertTensor::whole, GemmPolicy G = ExactGemms>
class MoeMlp : public detail::moe_layouts<A, ET> {
  static_assert(!G::fp8 || ops::ImplementedOn<ops::ScaledGemm, D>,
                "MoeMlp: the precision's FP8 GEMMs need ops::ScaledGemm on this device, which has none here; train "
                "FP8 on the host, or use Precision<bf16, float> here");
  static_assert(!G::fp8 || ET == ExpertTensor::whole,
                "MoeMlp: FP8 experts split over the tensor ranks (ExpertTensor::sharded) would need their amaxes "
                "reduced over them, which is not written yet; keep the experts whole (ExpertTensor::whole)");
  static_assert(!fp8_blockwise<G>,
                "MoeMlp: blockwise FP8 needs each expert's tokens (the K of its weight gradients) in whole blocks, "
                "which the router does not give; use tensorwise or rowwise scaling for a mixture of experts");
  using Lay = detail::moe_layouts<A, ET>;
  static constexpr bool split = ET == ExpertTensor::sharded;  // the experts over the tensor ranks
  using Y = typename Lay::Out;                                // the output's layout (Partial where split)

 public:
  using S = accumulate_t<T>;  // the router's probabilities and weights

  struct Ctx {
    Tensor<T, A, D> x;                  // (B, T, C) the input, for the router's and the experts' gradients
    Allocation probs, index, weight;    // (N, E) S, (N, k) int32, (N, k) S
    Allocation lse;                     // (N) S: logsumexp of the logits (softmax) or the scores' sum
    std::vector<double> counts;         // (E) the slots this rank's tokens chose per expert (before any drop)
    std::int64_t Ng = 0;                // the tokens the plan covers: N, or ep N where gathered
    Allocation xs, ws;                  // (Ng, C) T, (Ng, k) S: the gathered rows and weights (all-gather)
    Allocation slot, rows;              // (Ng, k), (M) int32 on the device (MoePlan's; gathered: this
                                        // rank's experts' slots, numbered from 0, the others -1)
    std::int64_t M = 0;                 // the plan's slots this rank holds (rows of xp)
    ExpertRoute route;                  // the all-to-all exchange
    std::vector<std::int64_t> offsets;  // (El + 1) on the host: each local expert's block in xe
    Allocation xe;                      // (Me, C) the experts' inputs (kept with expert parallelism)
    Allocation h, a, yp;                // (Me, 2H), (Me, H), (M, C)
    Allocation sh, sa;                  // the shared expert's (N, 2S), (N, S)
    std::vector<S> aux_grad;            // (E): dL/dprobs[., e] of the load-balancing loss (unscaled)
    S z_grad = 0;                       // dL/dlse[n] = z_grad lse[n] of the z-loss (unscaled)
    std::int64_t N = 0;
    double aux = 0, z = 0, load = 0;  // this forward's router losses, load and dropped slots, which
    std::int64_t dropped = 0;         // backward adds to the step's (StepStats)
  };

  // The router's figures summed over the micro-batches whose backward ran since the last
  // take_step_stats() (a recomputed forward counts once: backward adds them), for the log.
  struct StepStats {
    double aux = 0, z = 0, load = 0;
    std::int64_t dropped = 0, batches = 0;
  };

  Param<T, Replicated, replicated_param_grad<A>, D> router;  // (E, C)
  // (E, 2H, C): local (E/ep, 2H, C), or (E/ep, 2H/tp, C) split
  Param<T, ExpertSharded<typename Lay::weights>, typename Lay::expert_grad, D> gate_up;
  // (E, C, H): local (E/ep, C, H), or (E/ep, C, H/tp) split
  Param<T, ExpertSharded<typename Lay::down_weights>, typename Lay::down_grad, D> down;
  Param<T, typename Lay::shared_up, typename Lay::shared_up_grad, D> shared_up;        // (2S, C): (2S/tp, C) split
  Param<T, typename Lay::shared_down, typename Lay::shared_down_grad, D> shared_down;  // (C, S): (C, S/tp) split
  // (E) added to the scores for the choice only, moved by a sign step (SignStep), not the optimizer:
  // its gradient buffer gathers E (slots chosen) - N k per expert, the load over the mean
  Param<T, Replicated, replicated_param_grad<A>, D> bias;
  MoeOptions options;
  double last_aux = 0, last_z = 0;  // the last forward's router losses (before their coefficients)
  double last_load = 0;             // its expert load: the most slots an expert got over the mean, all ranks'
  std::int64_t last_dropped = 0;    // and the slots it dropped on this rank
  // The step's so far, handed over and started again.
  StepStats take_step_stats() { return std::exchange(step_stats_, StepStats{}); }

  MoeMlp() = default;
  // Parameter ids id (router), id + 1 (experts' gate-up), id + 2 (down), id + 3 and id + 4 (the
  // shared expert's); weights normal(0, std), the down projections normal(0, out_std).
  MoeMlp(D& dev, std::int64_t C, const MoeOptions& o, const Spread& s, std::uint64_t id, std::uint64_t seed, double std,
         double out_std)
      : router(dev, {check(C, o, s), C}, s, id, {Init::normal, std}, seed, Decay::yes),
        gate_up(dev, {o.experts, 2 * o.hidden, C}, s, id + 1, {Init::normal, std}, seed, Decay::yes),
        down(dev, {o.experts, C, o.hidden}, s, id + 2, {Init::normal, out_std}, seed, Decay::yes),
        options(o),
        first_expert_(s.expert_index * (o.experts / s.expert_degree)) {
    if (o.shared_hidden > 0) {
      shared_up = {dev, {2 * o.shared_hidden, C}, s, id + 3, {Init::normal, std}, seed, Decay::yes};
      shared_down = {dev, {C, o.shared_hidden}, s, id + 4, {Init::normal, out_std}, seed, Decay::yes};
    }
    if (o.expert_bias) {
      bias = {dev, {o.experts}, s, id + 5, {Init::zeros}, seed, Decay::no};
      bias.sign_step = SignStep{o.bias_rate};
    }
  }

  std::int64_t width() const { return router.value.global_shape()[1]; }
  // This rank's hidden features of each expert, and of the shared expert (H / tp, S / tp where split).
  std::int64_t hidden() const { return gate_up.value.local_shape()[1] / 2; }
  std::int64_t shared_hidden() const { return options.shared_hidden > 0 ? shared_down.value.local_shape()[1] : 0; }

  // x (B, T, C) in A -> y (B, T, C) in A (Partial on tensor where split).
  template <AxisComms M>
  Tensor<T, Y, D> forward(Ctx& ctx, const Tensor<T, A, D>& x, M& mesh) {
    D& dev = x.dev();
    const std::int64_t C = width(), E = options.experts, k = options.top_k, H = hidden();
    const std::int64_t N = x.numel() / C, Tl = x.local_shape()[1];
    if (x.local_shape()[2] != C)
      throw Error("MoeMlp::forward", cat("an input of width ", x.local_shape()[2], " for a layer of ", C),
                  "build the layer for the stream's width");
    if (options.capacity_factor > 0 && (IsShard<typename A::tensor> || mesh.comm(Axis::context).size() > 1))
      throw Error("MoeMlp::forward", "a capacity with the sequence split over ranks (sequence or context parallelism)",
                  "train dropless (capacity factor 0) with these layouts");
    ctx = Ctx{};
    ctx.N = N;
    ctx.x = x.clone(Category::activations);
    // The router.
    Allocation logits = alloc<S>(dev, N * E);
    ops::Gemm<D>::run(dev, Trans::no, Trans::yes, N, E, C, S(1), x.data(), C, router.value.data(), C, S(0),
                      static_cast<S*>(logits.data()), E);
    ctx.probs = alloc<S>(dev, N * E);
    ctx.index = alloc<std::int32_t>(dev, N * k);
    ctx.weight = alloc<S>(dev, N * k);
    ctx.lse = alloc<S>(dev, N);
    Allocation bs;  // the bias in S
    if (options.expert_bias) {
      bs = alloc<S>(dev, E);
      ops::Memory<D>::convert(dev, static_cast<S*>(bs.data()), bias.value.data(), E);
    }
    ops::Route<D>::forward(dev, probs(ctx), index(ctx), weight(ctx), lse(ctx), static_cast<const S*>(logits.data()),
                           static_cast<const S*>(bs.data()), N, E, k, rule());
    logits.reset();
    router_losses(ctx, dev, mesh);
    // The tokens the plan covers: this rank's, or (all-gather dispatch) its expert group's, their
    // rows and routing gathered in rank order.
    auto& group = mesh.comm(Axis::expert);
    const int ep = group.size(), me = group.rank();
    constexpr bool gathers = std::same_as<Dispatcher, AllGatherDispatch>;
    const bool gathered = gathers && ep > 1, exchanged = !gathers && ep > 1;
    const std::int64_t Ng = gathered ? ep * N : N;
    const T* xs = x.data();
    const S* ws = weight(ctx);
    std::vector<std::int32_t> idx(is_meta<D> ? 0 : static_cast<std::size_t>(Ng * k));
    if (gathered) {
      ctx.xs = alloc<T>(dev, Ng * C);
      ctx.ws = alloc<S>(dev, Ng * k);
      Allocation ig = alloc<std::int32_t>(dev, Ng * k);
      group.all_gather(std::span<const T>(x.data(), static_cast<std::size_t>(N * C)),
                       std::span<T>(static_cast<T*>(ctx.xs.data()), static_cast<std::size_t>(Ng * C)));
      group.all_gather(
          std::span<const std::int32_t>(index(ctx), static_cast<std::size_t>(N * k)),
          std::span<std::int32_t>(static_cast<std::int32_t*>(ig.data()), static_cast<std::size_t>(Ng * k)));
      group.all_gather(std::span<const S>(weight(ctx), static_cast<std::size_t>(N * k)),
                       std::span<S>(static_cast<S*>(ctx.ws.data()), static_cast<std::size_t>(Ng * k)));
      xs = static_cast<const T*>(ctx.xs.data());
      ws = static_cast<const S*>(ctx.ws.data());
      dev.to_host(idx.data(), ig.data(), idx.size() * sizeof(std::int32_t));
    } else {
      dev.to_host(idx.data(), ctx.index.data(), idx.size() * sizeof(std::int32_t));
    }
    // The plan, on the host: every expert's slots, in token order. The Meta device (the plan,
    // cost/measure.hpp) routes nothing: it plans a balanced routing, slot (n, j) to expert
    // (n k + j) mod E, every expert N k / E slots on every rank (k distinct experts a token, as
    // k <= E), by counts (balanced_moe_plan).
    const std::int64_t cap = options.capacity_factor > 0
                                 ? static_cast<std::int64_t>(std::ceil(
                                       options.capacity_factor * static_cast<double>(Tl * k) / static_cast<double>(E)))
                                 : 0;
    MoePlan plan = is_meta<D> ? balanced_moe_plan(Ng, Tl, E, k, cap) : moe_plan(idx, Ng, Tl, E, k, cap);
    if (!gathered) {
      last_dropped = plan.dropped;
    } else if constexpr (is_meta<D>) {  // this rank's samples' (its N tokens are whole samples)
      const auto first = plan.sample_dropped.begin() + me * (N / Tl);
      last_dropped = std::accumulate(first, first + N / Tl, std::int64_t{0});
    } else {
      last_dropped = static_cast<std::int64_t>(
          std::count(plan.slot.begin() + me * N * k, plan.slot.begin() + (me + 1) * N * k, -1));
    }
    ctx.Ng = Ng;
    ctx.aux = last_aux, ctx.z = last_z, ctx.load = last_load, ctx.dropped = last_dropped;
    Allocation xp;  // (M, C): the rows in the experts' order, all experts' (or this rank's, gathered)
    if (gathered) {
      // This rank's experts' blocks of the plan: their slots renumbered from 0, the others' -1.
      const std::int64_t El = E / ep, lo = plan.offsets[static_cast<std::size_t>(me * El)],
                         hi = plan.offsets[static_cast<std::size_t>((me + 1) * El)];
      if constexpr (!is_meta<D>) {
        for (std::int32_t& m : plan.slot) m = m >= lo && m < hi ? static_cast<std::int32_t>(m - lo) : -1;
        plan.rows = std::vector<std::int32_t>(plan.rows.begin() + lo, plan.rows.begin() + hi);
      }
      ctx.offsets.assign(plan.offsets.begin() + me * El, plan.offsets.begin() + (me + 1) * El + 1);
      for (std::int64_t& o : ctx.offsets) o -= lo;
      ctx.M = hi - lo;
    } else {
      ctx.M = plan.offsets.back();
    }
    // (M) and (Ng, k) int32 on the device; the Meta device's only sized
    ctx.slot = is_meta<D> ? alloc<std::int32_t>(dev, Ng * k) : upload(dev, plan.slot);
    ctx.rows = is_meta<D> ? alloc<std::int32_t>(dev, ctx.M) : upload(dev, plan.rows);
    xp = alloc<T>(dev, ctx.M * C);
    ops::Dispatch<D>::gather(dev, static_cast<T*>(xp.data()), xs, rows(ctx), ctx.M, C);
    // All-to-all dispatch: the rows to the ranks of their experts.
    if (exchanged) {
      std::vector<std::int64_t> counts(static_cast<std::size_t>(E));
      for (std::int64_t e = 0; e < E; ++e)
        counts[static_cast<std::size_t>(e)] =
            plan.offsets[static_cast<std::size_t>(e) + 1] - plan.offsets[static_cast<std::size_t>(e)];
      ctx.route = expert_route(group, std::span<const std::int64_t>(counts));
      if constexpr (is_meta<D>) ctx.route.recv = ctx.route.send;  // every rank alike: it gets what it sends
      ctx.offsets = ctx.route.offsets();
      ctx.xe = alloc<T>(dev, ctx.offsets.back() * C);
      dispatch(dev, group, ctx.route, static_cast<const T*>(xp.data()), static_cast<T*>(ctx.xe.data()), C);
    } else {
      if (!gathered) ctx.offsets = plan.offsets;
      ctx.xe = std::move(xp);
    }
    const std::int64_t Me = ctx.offsets.back();
    const T* xe = static_cast<const T*>(ctx.xe.data());
    // The experts, block by block (this rank's: local expert e is global expert e + its first).
    ctx.h = alloc<T>(dev, Me * 2 * H);
    ctx.a = alloc<T>(dev, Me * H);
    Allocation ye = alloc<T>(dev, Me * C);
    for (std::int64_t e = 0; e + 1 < static_cast<std::int64_t>(ctx.offsets.size()); ++e) {
      const std::int64_t o = ctx.offsets[static_cast<std::size_t>(e)],
                         n = ctx.offsets[static_cast<std::size_t>(e) + 1] - o;
      if (n == 0) continue;
      T* h = hp(ctx) + o * 2 * H;
      T* a = ap(ctx) + o * H;
      gemm<A_, W_>(dev, e, "up", Trans::no, Trans::yes, n, 2 * H, C, xe + o * C, C,
                   gate_up.value.data() + e * 2 * H * C, C, S(0), h, 2 * H);
      ops::SwiGlu<D>::forward(dev, a, h, n * H);
      gemm<A_, W_>(dev, e, "down", Trans::no, Trans::yes, n, C, H, a, H, down.value.data() + e * C * H, H, S(0),
                   static_cast<T*>(ye.data()) + o * C, C);
    }
    if (!exchanged) {
      if (ep == 1) ctx.xe.reset();  // one rank gathers again in backward: cheaper to redo than to keep
      ctx.yp = std::move(ye);
    } else {  // the outputs back to the tokens' ranks
      ctx.yp = alloc<T>(dev, ctx.M * C);
      combine(dev, group, ctx.route, static_cast<const T*>(ye.data()), ypp(ctx), C);
    }
    // The weighted sum of each token's experts' outputs; gathered, this rank's experts' part of
    // every gathered token's, summed over the group and scattered back.
    auto y = Tensor<T, Y, D>::empty(dev, x.global_shape(), x.spread(), Category::activations);
    if (gathered) {
      Allocation ys = alloc<T>(dev, Ng * C);
      ops::Dispatch<D>::combine(dev, static_cast<T*>(ys.data()), static_cast<const T*>(ctx.yp.data()), slot(ctx), ws,
                                Ng, k, C, false);
      group.reduce_scatter(std::span<const T>(static_cast<const T*>(ys.data()), static_cast<std::size_t>(Ng * C)),
                           std::span<T>(y.data(), static_cast<std::size_t>(N * C)));
    } else {
      ops::Dispatch<D>::combine(dev, y.data(), static_cast<const T*>(ctx.yp.data()), slot(ctx), ws, N, k, C, false);
    }
    if (const std::int64_t Sh = shared_hidden(); Sh > 0) {
      ctx.sh = alloc<T>(dev, N * 2 * Sh);
      ctx.sa = alloc<T>(dev, N * Sh);
      gemm<A_, W_>(dev, -1, "up", Trans::no, Trans::yes, N, 2 * Sh, C, x.data(), C, shared_up.value.data(), C, S(0),
                   static_cast<T*>(ctx.sh.data()), 2 * Sh);
      ops::SwiGlu<D>::forward(dev, static_cast<T*>(ctx.sa.data()), static_cast<const T*>(ctx.sh.data()), N * Sh);
      gemm<A_, W_>(dev, -1, "down", Trans::no, Trans::yes, N, C, Sh, static_cast<const T*>(ctx.sa.data()), Sh,
                   shared_down.value.data(), Sh, S(1), y.data(), C);
    }
    return y;
  }

  // dy (B, T, C) in A -> dx (Partial on tensor where split); accumulates every parameter's gradient,
  // the router's losses' included.
  template <AxisComms M>
  Tensor<T, typename Lay::GradIn, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, M& mesh) {
    D& dev = dy.dev();
    const std::int64_t C = width(), E = options.experts, k = options.top_k, H = hidden(), N = ctx.N;
    const std::int64_t Mr = ctx.M, Me = ctx.offsets.back(), Ng = ctx.Ng;
    auto& group = mesh.comm(Axis::expert);
    const int ep = group.size();
    constexpr bool gathers = std::same_as<Dispatcher, AllGatherDispatch>;
    const bool gathered = gathers && ep > 1, exchanged = !gathers && ep > 1;
    // The combine's backward over the tokens the plan covers (dy gathered where they were).
    Allocation dys, dws;
    if (gathered) {
      dys = alloc<T>(dev, Ng * C);
      group.all_gather(std::span<const T>(dy.data(), static_cast<std::size_t>(N * C)),
                       std::span<T>(static_cast<T*>(dys.data()), static_cast<std::size_t>(Ng * C)));
    }
    const T* dyt = gathered ? static_cast<const T*>(dys.data()) : dy.data();
    const S* ws = gathered ? static_cast<const S*>(ctx.ws.data()) : weight(ctx);
    Allocation dyp = alloc<T>(dev, Mr * C), dweight = alloc<S>(dev, N * k);
    if (gathered) dws = alloc<S>(dev, Ng * k);
    ops::Dispatch<D>::combine_backward(dev, static_cast<T*>(dyp.data()),
                                       static_cast<S*>(gathered ? dws.data() : dweight.data()), dyt,
                                       static_cast<const T*>(ctx.yp.data()), slot(ctx), ws, Ng, k, C);
    ctx.yp.reset();
    if (gathered)  // each token's weights' gradients: one rank holds each slot's expert, the others add 0
      group.reduce_scatter(std::span<const S>(static_cast<const S*>(dws.data()), static_cast<std::size_t>(Ng * k)),
                           std::span<S>(static_cast<S*>(dweight.data()), static_cast<std::size_t>(N * k)));
    if constexpr (split)  // each tensor rank's experts' outputs were an addend of yp: so are these
      mesh.comm(Axis::tensor)
          .all_reduce(std::span<S>(static_cast<S*>(dweight.data()), static_cast<std::size_t>(N * k)));
    // The experts' inputs and output gradients in their blocks: the inputs kept (or, on one rank,
    // gathered again), and dyp sent the way xp went (all-to-all: combine's adjoint).
    Allocation xe, dye;
    if (exchanged) {
      xe = std::move(ctx.xe);
      dye = alloc<T>(dev, Me * C);
      dispatch(dev, group, ctx.route, static_cast<const T*>(dyp.data()), static_cast<T*>(dye.data()), C);
    } else {
      if (ep == 1) {
        xe = alloc<T>(dev, Mr * C);
        ops::Dispatch<D>::gather(dev, static_cast<T*>(xe.data()), ctx.x.data(), rows(ctx), Mr, C);
      } else {
        xe = std::move(ctx.xe);
      }
      dye = std::move(dyp);
    }
    Allocation dxe = alloc<T>(dev, Me * C), da = alloc<T>(dev, Me * H), dh = alloc<T>(dev, Me * 2 * H);
    for (std::int64_t e = 0; e + 1 < static_cast<std::int64_t>(ctx.offsets.size()); ++e) {
      const std::int64_t o = ctx.offsets[static_cast<std::size_t>(e)],
                         n = ctx.offsets[static_cast<std::size_t>(e) + 1] - o;
      if (n == 0) continue;
      const T* g = static_cast<const T*>(dye.data()) + o * C;
      T* dae = static_cast<T*>(da.data()) + o * H;
      T* dhe = static_cast<T*>(dh.data()) + o * 2 * H;
      gemm<G_, W_>(dev, e, "down dgrad", Trans::no, Trans::no, n, H, C, g, C, down.value.data() + e * C * H, H, S(0),
                   dae, H);
      gemm<G_, A_>(dev, e, "down wgrad", Trans::yes, Trans::no, C, H, n, g, C, ap(ctx) + o * H, H, S(1),
                   down.grad.data() + e * C * H, H);
      ops::SwiGlu<D>::backward(dev, dhe, hp(ctx) + o * 2 * H, dae, n * H);
      gemm<G_, A_>(dev, e, "up wgrad", Trans::yes, Trans::no, 2 * H, C, n, dhe, 2 * H,
                   static_cast<const T*>(xe.data()) + o * C, C, S(1), gate_up.grad.data() + e * 2 * H * C, C);
      gemm<G_, W_>(dev, e, "up dgrad", Trans::no, Trans::no, n, C, 2 * H, dhe, 2 * H,
                   gate_up.value.data() + e * 2 * H * C, C, S(0), static_cast<T*>(dxe.data()) + o * C, C);
    }
    Allocation dxp;  // (M, C) in the plan's order, back on the tokens' rank
    if (exchanged) {
      dxp = alloc<T>(dev, Mr * C);
      combine(dev, group, ctx.route, static_cast<const T*>(dxe.data()), static_cast<T*>(dxp.data()), C);
    } else {
      dxp = std::move(dxe);
    }
    // Each slot's input gradient summed into its token's row (gathered: this rank's experts' part
    // of every gathered token's, summed over the group and scattered back).
    auto dx = Tensor<T, typename Lay::GradIn, D>::empty(dev, dy.global_shape(), dy.spread(), Category::activations);
    if (gathered) {
      Allocation dxs = alloc<T>(dev, Ng * C);
      ops::Dispatch<D>::combine(dev, static_cast<T*>(dxs.data()), static_cast<const T*>(dxp.data()), slot(ctx),
                                static_cast<const S*>(nullptr), Ng, k, C, false);
      group.reduce_scatter(std::span<const T>(static_cast<const T*>(dxs.data()), static_cast<std::size_t>(Ng * C)),
                           std::span<T>(dx.data(), static_cast<std::size_t>(N * C)));
    } else {
      ops::Dispatch<D>::combine(dev, dx.data(), static_cast<const T*>(dxp.data()), slot(ctx),
                                static_cast<const S*>(nullptr), N, k, C, false);
    }
    // The router: the combine's weights and the router's losses, through the softmax.
    const double scale = grad_scale_of(mesh);
    std::vector<S> aux(ctx.aux_grad.size());
    for (std::size_t e = 0; e < aux.size(); ++e) aux[e] = static_cast<S>(scale * static_cast<double>(ctx.aux_grad[e]));
    Allocation aux_dev = upload(dev, aux);
    Allocation dlogits = alloc<T>(dev, N * E);
    ops::Route<D>::backward(dev, static_cast<T*>(dlogits.data()), static_cast<const S*>(dweight.data()), probs(ctx),
                            index(ctx), weight(ctx), lse(ctx), N, E, k, rule(), static_cast<const S*>(aux_dev.data()),
                            static_cast<S>(scale * static_cast<double>(ctx.z_grad)));
    ops::Gemm<D>::run(dev, Trans::yes, Trans::no, E, C, N, S(1), static_cast<const T*>(dlogits.data()), E, ctx.x.data(),
                      C, S(1), router.grad.data(), C);
    if (!split || mesh.comm(Axis::tensor).rank() == 0)  // split: the same on every tensor rank, added once
      ops::Gemm<D>::run(dev, Trans::no, Trans::no, N, C, E, S(1), static_cast<const T*>(dlogits.data()), E,
                        router.value.data(), C, S(1), dx.data(), C);
    if (options.expert_bias) {  // the bias's sign step's input: E (slots chosen) - N k, exact in Gb
      using Gb = typename decltype(bias)::grad_type;
      std::vector<Gb> load(static_cast<std::size_t>(E));
      for (std::int64_t e = 0; e < E; ++e)
        load[static_cast<std::size_t>(e)] = static_cast<Gb>(
            static_cast<double>(E) * ctx.counts[static_cast<std::size_t>(e)] - static_cast<double>(N * k));
      Allocation l = upload(dev, load);
      ops::Memory<D>::add(dev, bias.grad.data(), static_cast<const Gb*>(l.data()), E);
    }
    if (const std::int64_t Sh = shared_hidden(); Sh > 0) {
      Allocation dsa = alloc<T>(dev, N * Sh), dsh = alloc<T>(dev, N * 2 * Sh);
      gemm<G_, W_>(dev, -1, "down dgrad", Trans::no, Trans::no, N, Sh, C, dy.data(), C, shared_down.value.data(), Sh,
                   S(0), static_cast<T*>(dsa.data()), Sh);
      gemm<G_, A_>(dev, -1, "down wgrad", Trans::yes, Trans::no, C, Sh, N, dy.data(), C,
                   static_cast<const T*>(ctx.sa.data()), Sh, S(1), shared_down.grad.data(), Sh);
      ops::SwiGlu<D>::backward(dev, static_cast<T*>(dsh.data()), static_cast<const T*>(ctx.sh.data()),
                               static_cast<const T*>(dsa.data()), N * Sh);
      gemm<G_, A_>(dev, -1, "up wgrad", Trans::yes, Trans::no, 2 * Sh, C, N, static_cast<const T*>(dsh.data()), 2 * Sh,
                   ctx.x.data(), C, S(1), shared_up.grad.data(), C);
      gemm<G_, W_>(dev, -1, "up dgrad", Trans::no, Trans::no, N, C, 2 * Sh, static_cast<const T*>(dsh.data()), 2 * Sh,
                   shared_up.value.data(), C, S(1), dx.data(), C);
    }
    step_stats_.aux += ctx.aux, step_stats_.z += ctx.z, step_stats_.load += ctx.load;
    step_stats_.dropped += ctx.dropped, ++step_stats_.batches;
    ctx = Ctx{};
    return dx;
  }

  // describe's rows (nn/comm_walk.hpp): the router's statistics, all-reduced in forward over the
  // ranks that hold other tokens, and the expert exchange's collectives (expert parallelism).
  void comm_rows(std::vector<CommRow>& out, const std::string& row, const Shape& shape, const Spread& s,
                 std::int64_t elem) const {
    CommRow r{cat(row, " (mixture of experts: ", options.experts, " experts, top ", options.top_k,
                  s.expert_degree > 1 ? cat(", ", Dispatcher::name(), " over expert ", s.expert_degree) : "",
                  split && s.tensor_degree > 1 ? cat(", each split over tensor ", s.tensor_degree) : "", ")"),
              A::name(),
              Y::name(),
              {},
              {}};
    const std::int64_t bytes = (2 * options.experts + 2) * 8;
    r.forward.push_back(detail::reduction(Axis::data, s.data_degree, bytes));
    r.forward.push_back(detail::reduction(Axis::context, s.context_degree, bytes));
    if constexpr (IsShard<typename A::tensor>)
      r.forward.push_back(detail::reduction(Axis::tensor, s.tensor_degree, bytes));
    if constexpr (split) {  // the weights' gradients, each tensor rank's addend (N k scalars)
      const std::int64_t C = shape[shape.rank() - 1];
      const std::int64_t N = shape.numel() / C / (s.data_degree * s.context_degree);
      r.backward.push_back(
          detail::reduction(Axis::tensor, s.tensor_degree, N * options.top_k * static_cast<std::int64_t>(sizeof(S))));
    }
    if (const int ep = s.expert_degree; ep > 1) {
      // Expert parallelism, per micro-batch. The tokens' rows: N a rank, of C elements.
      const std::int64_t C = shape[shape.rank() - 1], k = options.top_k;
      const std::int64_t N =
          shape.numel() / C / (s.data_degree * s.context_degree) / (IsShard<typename A::tensor> ? s.tensor_degree : 1);
      const auto step = [&](Collective c, std::int64_t in, std::int64_t out) {
        return detail::collective_step(c, Axis::expert, ep, in, out);
      };
      if constexpr (std::same_as<Dispatcher, AllGatherDispatch>) {
        // The rows, the experts' indices and weights gathered; the weighted outputs summed and
        // scattered; backward: dy gathered, the weights' and the rows' gradients summed and scattered.
        const std::int64_t rows = N * C * elem, idx = N * k * 4, w = N * k * static_cast<std::int64_t>(sizeof(S));
        r.forward.push_back(step(Collective::all_gather, rows, ep * rows));
        r.forward.push_back(step(Collective::all_gather, idx, ep * idx));
        r.forward.push_back(step(Collective::all_gather, w, ep * w));
        r.forward.push_back(step(Collective::reduce_scatter, ep * rows, rows));
        r.backward.push_back(step(Collective::all_gather, rows, ep * rows));
        r.backward.push_back(step(Collective::reduce_scatter, ep * w, w));
        r.backward.push_back(step(Collective::reduce_scatter, ep * rows, rows));
      } else {
        // The counts' all-to-all (E int64), then the rows' all-to-all-v each way, forward (dispatch,
        // combine) and backward. Their bytes here are at balance (each rank's N k slots spread
        // evenly, none dropped); a run's are the rows it routed (nn/expert_dispatch.hpp).
        const std::int64_t counts = options.experts * 8, moved = N * k * C * elem;
        r.forward.push_back(step(Collective::all_to_all, counts, counts));
        r.forward.push_back(step(Collective::all_to_all, moved, moved));
        r.forward.push_back(step(Collective::all_to_all, moved, moved));
        r.backward.push_back(step(Collective::all_to_all, moved, moved));
        r.backward.push_back(step(Collective::all_to_all, moved, moved));
      }
    }
    out.push_back(std::move(r));
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "MoeMlp"; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + ".router.weight", router);
    f(prefix + ".experts.gate_up", gate_up);
    f(prefix + ".experts.down", down);
    if (options.shared_hidden > 0) {
      f(prefix + ".shared.gate_up", shared_up);
      f(prefix + ".shared.down", shared_down);
    }
    if (options.expert_bias) f(prefix + ".router.bias", bias);
  }

 private:
  static constexpr fp8::Operand A_ = fp8::Operand::activation, W_ = fp8::Operand::weight, G_ = fp8::Operand::gradient;
  // C = op(A) op(B) + beta C in T, or on float8 casts (ra, rb: what op(A) and op(B) are, G above):
  // local expert e's (the shared expert's where e < 0) GEMM `which`, named so in a refusal.
  template <fp8::Operand ra, fp8::Operand rb, class C>
  void gemm(D& dev, std::int64_t e, const char* which, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
            std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, S beta, C* c,
            std::int64_t ldc) const {
    if constexpr (G::fp8)
      ops::ScaledGemm<D>::template run<G, ra, rb>(
          dev, ta, tb, m, n, k, S(1), a, lda, b, ldb, beta, c, ldc,
          e < 0 ? cat("MoeMlp's shared expert's ", which, " GEMM")
                : cat("MoeMlp's expert ", first_expert_ + e, "'s ", which, " GEMM"));
    else ops::Gemm<D>::run(dev, ta, tb, m, n, k, S(1), a, lda, b, ldb, beta, c, ldc);
  }

  static std::int64_t check(std::int64_t C, const MoeOptions& o, const Spread& s) {
    const std::string where = "MoeMlp";
    if (o.experts % s.expert_degree != 0)
      throw Error(where, cat(o.experts, " experts over an expert degree of ", s.expert_degree),
                  cat("choose an expert degree that divides the ", o.experts, " experts"));
    if (o.experts < 1 || o.experts > ops::Route<Host>::max_experts)
      throw Error(where, cat(o.experts, " experts"), cat("use 1 to ", ops::Route<Host>::max_experts, " experts"));
    if (o.top_k < 1 || o.top_k > o.experts)
      throw Error(where, cat("top-k ", o.top_k, " of ", o.experts, " experts"), "choose from 1 to the experts");
    if (o.hidden < 1 || C < 1 || o.shared_hidden < 0)
      throw Error(where, cat("width ", C, ", expert width ", o.hidden, ", shared width ", o.shared_hidden),
                  "give the layer positive widths (a shared width of 0 for none)");
    if (split && (o.hidden % s.tensor_degree != 0 || o.shared_hidden % s.tensor_degree != 0))
      throw Error(where,
                  cat("experts of width ", o.hidden, " and a shared width of ", o.shared_hidden,
                      " split over a tensor degree of ", s.tensor_degree),
                  "choose a tensor degree that divides both widths, or keep the experts whole on tensor");
    if (!(o.capacity_factor >= 0) || !std::isfinite(o.capacity_factor))
      throw Error(where, cat("a capacity factor of ", o.capacity_factor),
                  "use a positive capacity factor, or 0 for dropless routing");
    if (!(o.aux_coef >= 0) || !(o.z_coef >= 0) || !std::isfinite(o.aux_coef) || !std::isfinite(o.z_coef))
      throw Error(where, cat("loss coefficients ", o.aux_coef, " (load balancing) and ", o.z_coef, " (z-loss)"),
                  "use finite coefficients of 0 or more");
    if (o.score == Score::sigmoid && o.z_coef > 0)
      throw Error(where, cat("a z-loss (coefficient ", o.z_coef, ") with sigmoid scores"),
                  "train sigmoid routers without the z-loss (z coefficient 0), as DeepSeek-V3 does");
    if (!(o.scale > 0) || !std::isfinite(o.scale))
      throw Error(where, cat("a routing scale of ", o.scale),
                  "scale the chosen weights by a positive factor (1: none)");
    if (!(o.bias_rate >= 0) || !std::isfinite(o.bias_rate))
      throw Error(where, cat("an expert-bias rate of ", o.bias_rate),
                  "use a rate of 0 or more (DeepSeek-V3: 1e-3; 0 holds the bias fixed)");
    if (o.groups != 1 &&
        (o.groups < 1 || o.groups > math::kMaxExpertGroups || o.experts % o.groups != 0 || o.experts / o.groups < 2))
      throw Error(where, cat(o.experts, " experts in ", o.groups, " groups"),
                  cat("use 1 group, or up to ", math::kMaxExpertGroups,
                      " groups that divide the experts into groups of 2 or more"));
    if (o.top_groups < 1 || o.top_groups > o.groups || o.top_k > o.top_groups * (o.experts / o.groups))
      throw Error(where,
                  cat("top-k ", o.top_k, " from the top ", o.top_groups, " of ", o.groups, " groups of ",
                      o.experts / o.groups, " experts"),
                  "choose from 1 to the groups, enough of them to hold the top-k experts");
    return o.experts;
  }

  math::RouteRule<S> rule() const {
    return {options.score, options.renormalise, static_cast<S>(options.scale), static_cast<long>(options.groups),
            static_cast<long>(options.top_groups)};
  }

  template <class E>
  static Allocation alloc(D& dev, std::int64_t n) {
    return dev.allocate(std::max<std::int64_t>(n, 1) * static_cast<std::int64_t>(sizeof(E)), Category::activations);
  }
  template <class E>
  static Allocation upload(D& dev, const std::vector<E>& v) {
    Allocation a = alloc<E>(dev, static_cast<std::int64_t>(v.size()));
    if (!v.empty()) dev.from_host(a.data(), v.data(), v.size() * sizeof(E));
    return a;
  }
  // The load-balancing and z-losses from this micro-batch's statistics summed over the ranks that
  // hold other tokens; their gradients kept in ctx.
  template <class M>
  void router_losses(Ctx& ctx, D& dev, M& mesh) {
    const std::int64_t E = options.experts, k = options.top_k, N = ctx.N;
    Allocation st = dev.allocate((2 * E + 1) * static_cast<std::int64_t>(sizeof(double)), Category::activations);
    dev.zero(st.data(), static_cast<std::size_t>(2 * E + 1) * sizeof(double));
    auto* d = static_cast<double*>(st.data());
    ops::Route<D>::stats(dev, d, d + E, d + 2 * E, probs(ctx), index(ctx), lse(ctx), N, E, k, options.score);
    std::vector<double> sums(static_cast<std::size_t>(2 * E + 2));
    dev.to_host(sums.data(), st.data(), static_cast<std::size_t>(2 * E + 1) * sizeof(double));
    sums.back() = static_cast<double>(N);
    ctx.counts.assign(sums.begin(), sums.begin() + E);
    mesh.comm(Axis::data).all_reduce(std::span<double>(sums));
    mesh.comm(Axis::context).all_reduce(std::span<double>(sums));
    if constexpr (IsShard<typename A::tensor>) mesh.comm(Axis::tensor).all_reduce(std::span<double>(sums));
    const double tokens = sums.back();
    double aux = 0;
    ctx.aux_grad.assign(static_cast<std::size_t>(E), S(0));
    for (std::int64_t e = 0; e < E; ++e) {
      const double f = sums[static_cast<std::size_t>(e)] / tokens, p = sums[static_cast<std::size_t>(E + e)] / tokens;
      aux += static_cast<double>(E) * f * p;
      ctx.aux_grad[static_cast<std::size_t>(e)] =
          static_cast<S>(options.aux_coef * static_cast<double>(E) * f / tokens);
    }
    last_aux = aux;
    double most = 0, all = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      most = std::max(most, sums[static_cast<std::size_t>(e)]);
      all += sums[static_cast<std::size_t>(e)];
    }
    last_load = most / (all / static_cast<double>(E));
    last_z = sums[static_cast<std::size_t>(2 * E)] / tokens;
    ctx.z_grad = static_cast<S>(options.z_coef * 2.0 / tokens);
  }

  StepStats step_stats_;
  std::int64_t first_expert_ = 0;  // the global index of this rank's first expert

  static S* probs(Ctx& c) { return static_cast<S*>(c.probs.data()); }
  static std::int32_t* index(Ctx& c) { return static_cast<std::int32_t*>(c.index.data()); }
  static S* weight(Ctx& c) { return static_cast<S*>(c.weight.data()); }
  static S* lse(Ctx& c) { return static_cast<S*>(c.lse.data()); }
  static std::int32_t* slot(Ctx& c) { return static_cast<std::int32_t*>(c.slot.data()); }
  static std::int32_t* rows(Ctx& c) { return static_cast<std::int32_t*>(c.rows.data()); }
  static T* hp(Ctx& c) { return static_cast<T*>(c.h.data()); }
  static T* ap(Ctx& c) { return static_cast<T*>(c.a.data()); }
  static T* ypp(Ctx& c) { return static_cast<T*>(c.yp.data()); }
};

}  // namespace weft::nn
