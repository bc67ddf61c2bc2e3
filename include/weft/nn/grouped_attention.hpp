// GroupedQueryAttention: the attention layer of every weft model. A fused QKV projection
// (ColumnParallel: whole key-value groups per tensor rank), rotary position embeddings on the
// queries and keys where the model has them, softmax attention in which each group's
// g = heads / kv_heads queries share its key and value, causal or bidirectional as the Mask policy
// says (mask::Causal, the default: language models; mask::Bidirectional: DiT, ViT, encoders), the
// padded keys hidden from every query where the model's batch is padded (nn/padding.hpp), and
// the output projection (RowParallel: out is Partial). kv_heads = heads is multi-head attention; kv_heads = 1 is
// multi-query attention.
//
//   Llama's       GroupedQueryAttention(dev, C, H, KV, rope, ...): no biases, rotary positions
//   GPT-2's       GroupedQueryAttention::multi_head(dev, C, H, ...): kv_heads = heads, biased
//                 projections, no rotation (its positions are learned, added by the embedding)
//   Qwen3's       GroupedQueryAttention(dev, C, H, KV, QkNorm{hd, eps}, rope, ...): heads of hd (not
//                 C / H: the core is H hd wide), each head's queries and keys RMS-normalised over
//                 hd before the rotation, by q_norm and k_norm (hd) that every head shares
//
// The QKV weight ((KV (g + 2) hd), C) orders its output features (group, {q_0 .. q_{g-1}, k, v}, hd),
// so that a contiguous shard of rows holds whole groups (Hugging Face's q_proj, k_proj and v_proj
// are interleaved into it by models/llama/hf.hpp; GPT-2's c_attn, (q|k|v, head, hd), is permuted to
// (head, {q, k, v}, hd) by models/gpt2/hf.hpp); the tensor degree must divide kv_heads.
//
//   x     (B, T, C)                  Replicate
//   qkv   (B, T, KV (g + 2) hd / tp)  Shard<-1> = (B, T, KV/tp, g + 2, hd), q and k normalised
//                                    (QK norm) and rotated in place
//   probs (B, H/tp, T, T)            per rank; kept, or recomputed in backward (Recompute = Selective)
//   y     (B, T, H hd / tp)          Shard<-1>
//   out   (B, T, C)                  Partial
//
// With context parallelism (Cx = context::Ring or context::AllGather, docs/context.md) the
// sequence is sharded over the context axis in every layout above (Shard<1> on context): each rank
// holds its T / c rows, the two chunks of context::Chunks. The projections run on those rows as on
// any rows; the rotation turns each row by its own position (Chunks::positions); the attention runs
// over the mesh's context group, Cx's way. What backward keeps is the attention's output y and
// each query row's log-sum-exp (B, H/tp, T/c), never the (T/c, T) probabilities, under every
// recompute policy. On the host, and compiled for the Cuda device (ops::ContextBlock).
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>

#include "weft/context/attention.hpp"
#include "weft/core/divisors.hpp"
#include "weft/core/error.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/context_attention.hpp"
#include "weft/nn/layer.hpp"
#include "weft/nn/linear.hpp"
#include "weft/nn/padding.hpp"
#include "weft/nn/param.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/mask.hpp"
#include "weft/ops/rmsnorm.hpp"
#include "weft/ops/rotary.hpp"
#include "weft/recompute/policies.hpp"

namespace weft::nn {

// Qwen3's and OLMo 2's attention: heads of hd features (0: C / H), and each head's queries and keys
// RMS-normalised over them (eps > 0; 0: not normalised).
struct QkNorm {
  std::int64_t head_dim = 0;
  double eps = 0;
};

template <Floating T, recompute::Policy Recompute = recompute::None, class D = Host, context::Choice Cx = context::None,
          mask::Kind Mask = mask::Causal, GemmPolicy G = ExactGemms>
class GroupedQueryAttention {
  static constexpr bool keep_probs = !std::same_as<Recompute, recompute::Selective>;
  static constexpr bool cp = context::Kind<Cx>;  // the sequence sharded over the context axis
  static_assert(
      !cp || is_meta<D> || ops::ImplementedOn<ops::ContextBlock, D>,
      "GroupedQueryAttention: context parallelism (Cx) needs ops::ContextBlock on this device (ops/context_block.hpp; "
      "the Cuda device's in ops/context_block.cuh, which ops/all.cuh includes); include it, or "
      "use context::None");
  using Seq = std::conditional_t<cp, Shard<1>, Replicate>;  // the sequence's placement on the context axis
  static constexpr ops::Mask mask{Mask::causal, nullptr};

 public:
  using In = Layout<Shard<0>, Replicate, StageLocal, Seq>;       // act::Full without context parallelism
  using Out = Layout<Shard<0>, weft::Partial, StageLocal, Seq>;  // act::Partial
  using GradOut = In;
  using GradIn = Out;

  struct Ctx {
    typename Linear<T, ColumnParallel, epilogue::None, D, G>::Ctx qkv_ctx;
    typename Linear<T, RowParallel, epilogue::None, D, G>::Ctx proj_ctx;
    Tensor<T, act::Features, D> qkv;   // rotated
    Allocation probs;                  // (B, H/tp, T, T); empty when the core is recomputed in backward
    Tensor<T, act::Features, D> core;  // context parallelism: y (B, T/c, H hd / tp), the attention's output
    Allocation lse;                    // context parallelism: (B, H/tp, T/c) in S
    Allocation qk, qk_rstd;            // QK norm: the queries' and keys' rows before it (B T KV/tp (g + 1), hd)
                                       // and their 1 / rms in S
  };

  using S = master_t<T>;  // the QK norms' statistics and weight gradients

  Linear<T, ColumnParallel, epilogue::None, D, G> qkv;
  Linear<T, RowParallel, epilogue::None, D, G> proj;
  // QK norm: (hd) each, ones; shared by every head, so each tensor rank's gradient is its heads' part
  // (Partial over tensor), as sequence parallelism's norms' are. Empty without QK norm.
  Param<T, Replicated, Layout<Replicate, weft::Partial>, D> q_norm, k_norm;
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  std::optional<ops::Rope> rope;  // the rotation of q and k; none where positions are added elsewhere
  double qk_eps = 0;              // QK norm's eps; 0: none

  GroupedQueryAttention() = default;
  // C the width, H heads and KV key-value heads of C / H each, rotated by `r`, without biases;
  // parameter ids id (qkv) and id + 2 (proj).
  GroupedQueryAttention(D& dev, std::int64_t C, std::int64_t H, std::int64_t KV, const ops::Rope& r, const Spread& s,
                        std::uint64_t id, std::uint64_t seed, double std, double proj_std)
      : GroupedQueryAttention(dev, C, H, KV, std::optional<ops::Rope>(r), false, s, id, seed, std, proj_std) {}

  // Multi-head attention with biased projections and no rotation (GPT-2's): H heads of C / H, each
  // its own key and value; parameter ids id and id + 1 (qkv), id + 2 and id + 3 (proj).
  static GroupedQueryAttention multi_head(D& dev, std::int64_t C, std::int64_t H, const Spread& s, std::uint64_t id,
                                          std::uint64_t seed, double std, double proj_std) {
    return GroupedQueryAttention(dev, C, H, H, std::nullopt, true, s, id, seed, std, proj_std);
  }

  // Heads of qk.head_dim features (0: C / H), their queries and keys RMS-normalised where qk.eps > 0,
  // rotated by `r`, without biases; parameter ids id (qkv), id + 2 (proj), id + 10 (q_norm) and
  // id + 11 (k_norm).
  GroupedQueryAttention(D& dev, std::int64_t C, std::int64_t H, std::int64_t KV, const QkNorm& qk, const ops::Rope& r,
                        const Spread& s, std::uint64_t id, std::uint64_t seed, double std, double proj_std)
      : GroupedQueryAttention(dev, C, H, KV, std::optional<ops::Rope>(r), false, s, id, seed, std, proj_std, qk) {}

  GroupedQueryAttention(D& dev, std::int64_t C, std::int64_t H, std::int64_t KV, std::optional<ops::Rope> r, bool bias,
                        const Spread& s, std::uint64_t id, std::uint64_t seed, double std, double proj_std,
                        const QkNorm& qk = {})
      : qkv(dev, C, KV * (H / std::max<std::int64_t>(KV, 1) + 2) * check(C, H, KV, qk, r.has_value(), s), s, id, seed,
            std, bias),
        proj(dev, H * (qk.head_dim > 0 ? qk.head_dim : C / H), C, s, id + 2, seed, proj_std, bias),
        heads(H),
        kv_heads(KV),
        head_dim(qk.head_dim > 0 ? qk.head_dim : C / H),
        rope(r),
        qk_eps(qk.eps) {
    if (cp && qk.eps > 0)
      throw Error("GroupedQueryAttention", cat("QK norm (eps ", qk.eps, ") with context parallelism (", Cx::name, ")"),
                  "not yet: train a QK-normalised model without context parallelism");
    if (qk.eps > 0) {
      q_norm = {dev, {head_dim}, s, id + 10, {Init::ones}, seed, Decay::no};
      k_norm = {dev, {head_dim}, s, id + 11, {Init::ones}, seed, Decay::no};
    }
  }

  std::int64_t group() const { return heads / kv_heads; }
  bool normalizes_qk() const { return qk_eps > 0; }
  std::int64_t local_groups() const { return qkv.out_local() / ((group() + 2) * head_dim); }
  std::int64_t local_heads() const { return local_groups() * group(); }

 private:
  static std::int64_t check(std::int64_t C, std::int64_t H, std::int64_t KV, const QkNorm& qk, bool rotary,
                            const Spread& s) {
    const std::int64_t hd = qk.head_dim > 0 ? qk.head_dim : (H >= 1 ? C / H : 0);
    if (H < 1 || KV < 1 || (qk.head_dim <= 0 && C % H != 0) || H % KV != 0 || hd < 1 || (rotary && hd % 2 != 0) ||
        !(qk.eps >= 0))
      throw Error("GroupedQueryAttention",
                  cat("width ", C, ", ", H, " heads of ", hd, " and ", KV, " key-value heads, QK norm eps ", qk.eps),
                  "use heads that divide the width into an even head size (or an even head size of their own), "
                  "key-value heads that divide the heads, and a QK norm eps of 0 (none) or above");
    if (KV % s.tensor_degree != 0)
      throw Error(
          "GroupedQueryAttention", cat("tensor degree ", s.tensor_degree, " does not divide ", KV, " key-value heads"),
          cat("use a tensor degree that divides the key-value heads, such as ", list_divisors(KV, s.tensor_degree)));
    return hd;
  }
  Allocation probs_buffer(D& dev, std::int64_t B, std::int64_t Tn) const {
    return dev.allocate(B * local_heads() * Tn * Tn * static_cast<std::int64_t>(sizeof(T)), Category::activations);
  }
  Shape core_shape(const Shape& x) const { return {x[0], x[1], heads * head_dim}; }  // (B, T, H hd) global
  // The rotation at a context rank's rows' positions, forward (sign 1) or back (-1).
  auto rotation(D& dev) const {
    return [this, &dev](T* qkv, std::int64_t B, std::int64_t Tl, ops::Positions pos, int sign) {
      if (!rope) return;
      if (sign > 0) ops::Rotary<D>::forward(dev, qkv, B, Tl, local_groups(), group(), head_dim, *rope, pos);
      else ops::Rotary<D>::backward(dev, qkv, B, Tl, local_groups(), group(), head_dim, *rope, pos);
    };
  }
  // QK norm over the qkv rows of N tokens, (N, KV/tp, g + 2, hd): each group's g query rows and its
  // key row gathered into (N KV/tp (g + 1), hd) (queries first, then keys), kept, normalised (q_norm
  // for the queries, k_norm for the keys) and written back in place. Its backward does the same to
  // dqkv, adding the weights' gradients.
  void qk_gather(D& dev, T* qk, const T* qkv, std::int64_t N) const {
    const std::size_t R = static_cast<std::size_t>(N * local_groups()), e = sizeof(T),
                      g = static_cast<std::size_t>(group()), hd = static_cast<std::size_t>(head_dim),
                      pitch = (g + 2) * hd * e;
    dev.copy_2d(qk, g * hd * e, qkv, pitch, g * hd * e, R);                // the queries
    dev.copy_2d(qk + R * g * hd, hd * e, qkv + g * hd, pitch, hd * e, R);  // the keys
  }
  void qk_scatter(D& dev, T* qkv, const T* qk, std::int64_t N) const {
    const std::size_t R = static_cast<std::size_t>(N * local_groups()), e = sizeof(T),
                      g = static_cast<std::size_t>(group()), hd = static_cast<std::size_t>(head_dim),
                      pitch = (g + 2) * hd * e;
    dev.copy_2d(qkv, pitch, qk, g * hd * e, g * hd * e, R);
    dev.copy_2d(qkv + g * hd, pitch, qk + R * g * hd, hd * e, hd * e, R);
  }
  void normalize_qk(Ctx& ctx, D& dev, T* qkv_data, std::int64_t N) const {
    if (!normalizes_qk()) return;
    const std::int64_t R = N * local_groups(), g = group(), rows = R * (g + 1);
    ctx.qk = dev.allocate(rows * head_dim * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    ctx.qk_rstd = dev.allocate(rows * static_cast<std::int64_t>(sizeof(S)), Category::activations);
    T* x = static_cast<T*>(ctx.qk.data());
    qk_gather(dev, x, qkv_data, N);
    Allocation y = dev.allocate(rows * head_dim * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    T* yd = static_cast<T*>(y.data());
    S* rstd = static_cast<S*>(ctx.qk_rstd.data());
    ops::RmsNorm<D>::forward(dev, yd, rstd, x, q_norm.value.data(), R * g, head_dim, static_cast<S>(qk_eps));
    ops::RmsNorm<D>::forward(dev, yd + R * g * head_dim, rstd + R * g, x + R * g * head_dim, k_norm.value.data(), R,
                             head_dim, static_cast<S>(qk_eps));
    qk_scatter(dev, qkv_data, yd, N);
  }
  void normalize_qk_backward(Ctx& ctx, D& dev, T* dqkv, std::int64_t N) {
    if (!normalizes_qk()) return;
    const std::int64_t R = N * local_groups(), g = group(), rows = R * (g + 1);
    Allocation dy = dev.allocate(rows * head_dim * static_cast<std::int64_t>(sizeof(T)), Category::activations),
               dx = dev.allocate(rows * head_dim * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    T *dyd = static_cast<T*>(dy.data()), *dxd = static_cast<T*>(dx.data());
    const T* x = static_cast<const T*>(ctx.qk.data());
    const S* rstd = static_cast<const S*>(ctx.qk_rstd.data());
    qk_gather(dev, dyd, dqkv, N);
    ops::RmsNorm<D>::backward(dev, dxd, q_norm.grad.data(), dyd, x, q_norm.value.data(), rstd, R * g, head_dim);
    ops::RmsNorm<D>::backward(dev, dxd + R * g * head_dim, k_norm.grad.data(), dyd + R * g * head_dim,
                              x + R * g * head_dim, k_norm.value.data(), rstd + R * g, R, head_dim);
    qk_scatter(dev, dqkv, dxd, N);
    ctx.qk.reset();
    ctx.qk_rstd.reset();
  }

 public:
  // x (B, T, C) Replicate -> out (B, T, C) Partial. With a padded model's mesh (nn/padding.hpp) the
  // padded keys are hidden from every query.
  Tensor<T, act::Partial, D> forward(Ctx& ctx, const Tensor<T, act::Full, D>& x)
    requires(!cp)
  {
    NoMesh none;
    return forward_with(ctx, x, mask, none);
  }
  template <AxisComms M>
  Tensor<T, act::Partial, D> forward(Ctx& ctx, const Tensor<T, act::Full, D>& x, M& mesh)
    requires(!cp)
  {
    return forward_with(ctx, x, mask_of(mesh), mesh);
  }

  // dy (B, T, C) Replicate -> dx (B, T, C) Partial.
  Tensor<T, act::Partial, D> backward(Ctx& ctx, const Tensor<T, act::Full, D>& dy)
    requires(!cp)
  {
    NoMesh none;
    return backward_with(ctx, dy, mask, none);
  }
  template <AxisComms M>
  Tensor<T, act::Partial, D> backward(Ctx& ctx, const Tensor<T, act::Full, D>& dy, M& mesh)
    requires(!cp)
  {
    return backward_with(ctx, dy, mask_of(mesh), mesh);
  }

 private:
  template <class M>
  static ops::Mask mask_of(M& mesh) {
    return {Mask::causal, lengths_of(mesh)};
  }

  // mesh: the tensor group of the projections' FP8 casts (nn/linear.hpp), or NoMesh.
  template <class M>
  Tensor<T, act::Partial, D> forward_with(Ctx& ctx, const Tensor<T, act::Full, D>& x, const ops::Mask& m, M& mesh) {
    const std::int64_t B = x.local_shape()[0], Tn = x.local_shape()[1];
    ctx.qkv = within([] { return "qkv"; }, [&] { return qkv.forward(ctx.qkv_ctx, x, mesh); });
    normalize_qk(ctx, x.dev(), ctx.qkv.data(), B * Tn);
    if (rope) ops::Rotary<D>::forward(x.dev(), ctx.qkv.data(), B, Tn, local_groups(), group(), head_dim, *rope);
    Allocation probs = probs_buffer(x.dev(), B, Tn);
    auto y =
        Tensor<T, act::Features, D>::empty(x.dev(), core_shape(x.global_shape()), x.spread(), Category::activations);
    ops::Attention<D>::forward(x.dev(), y.data(), static_cast<T*>(probs.data()), ctx.qkv.data(), B, Tn, local_heads(),
                               head_dim, group(), m);
    if (keep_probs) ctx.probs = std::move(probs);
    return within([] { return "proj"; }, [&] { return proj.forward(ctx.proj_ctx, y, mesh); });
  }

  template <class M>
  Tensor<T, act::Partial, D> backward_with(Ctx& ctx, const Tensor<T, act::Full, D>& dy, const ops::Mask& m, M& mesh) {
    const std::int64_t B = dy.local_shape()[0], Tn = dy.local_shape()[1];
    auto dcore = within([] { return "proj"; },
                        [&] { return proj.backward(ctx.proj_ctx, dy, mesh); });  // (B, T, H hd / tp) Shard<-1>
    if (!ctx.probs.data()) {  // Selective recompute: rebuild the probabilities from the saved (rotated) qkv
      ctx.probs = probs_buffer(dy.dev(), B, Tn);
      auto scratch =
          Tensor<T, act::Features, D>::empty(dy.dev(), dcore.global_shape(), dy.spread(), Category::activations);
      ops::Attention<D>::forward(dy.dev(), scratch.data(), static_cast<T*>(ctx.probs.data()), ctx.qkv.data(), B, Tn,
                                 local_heads(), head_dim, group(), m);
    }
    auto dqkv =
        Tensor<T, act::Features, D>::empty(dy.dev(), ctx.qkv.global_shape(), dy.spread(), Category::activations);
    ops::Attention<D>::backward(dy.dev(), dqkv.data(), dcore.data(), ctx.qkv.data(),
                                static_cast<const T*>(ctx.probs.data()), B, Tn, local_heads(), head_dim, group(), m);
    if (rope) ops::Rotary<D>::backward(dy.dev(), dqkv.data(), B, Tn, local_groups(), group(), head_dim, *rope);
    normalize_qk_backward(ctx, dy.dev(), dqkv.data(), B * Tn);
    auto dx = within([] { return "qkv"; }, [&] { return qkv.backward(ctx.qkv_ctx, dqkv, mesh); });
    ctx.qkv = {};  // the projections' contexts stay where their weight gradients are deferred
    ctx.probs.reset();
    return dx;
  }

 public:
  // Context parallelism: x (B, T, C) this rank's rows (nn/context_attention.hpp); out Partial over tensor.
  template <AxisComms M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh)
    requires cp
  {
    return detail::ContextAttention<Cx>::template forward<Out>(*this, ctx, x, mesh, local_heads(), head_dim, group(),
                                                               mask_of(mesh), rotation(x.dev()),
                                                               "GroupedQueryAttention::forward");
  }
  template <AxisComms M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy, M& mesh)
    requires cp
  {
    return detail::ContextAttention<Cx>::template backward<GradIn>(*this, ctx, dy, mesh, local_heads(), head_dim,
                                                                   group(), mask_of(mesh), rotation(dy.dev()),
                                                                   "GroupedQueryAttention::backward");
  }

  // The deferred weight gradients of both projections (Linear::defer_weight).
  void backward_weight(Ctx& ctx) {
    qkv.backward_weight(ctx.qkv_ctx);
    proj.backward_weight(ctx.proj_ctx);
  }
  void defer_weight(bool on) {
    qkv.defer_weight(on);
    proj.defer_weight(on);
  }

  // describe's rows (nn/comm_walk.hpp): the two projections and the core between them, whose keys
  // and values cross the context axis Cx's way under context parallelism. act the global (B, T, C).
  void comm_rows(std::vector<CommRow>& out, const std::string& row, const Shape& act, const Spread& s,
                 std::int64_t e) const {
    // The projections' tokens: a context rank's rows under context parallelism.
    const Shape rows{act[0], cp ? act[1] / s.context_degree : act[1], act[2]};
    out.push_back(detail::local_row<std::remove_cvref_t<decltype(qkv)>>(cat(row, ".qkv (ColumnParallel)")));
    qkv.add_amax_steps(out.back(), rows, s);
    CommRow core{
        cat(row, ".core (", Mask::name, ", local heads", cp ? cat(", over context: ", Cx::name) : std::string(), ")"),
        act::Features::name(),
        act::Features::name(),
        {},
        {}};
    if constexpr (cp)
      detail::ContextAttention<Cx>::template add_steps<T>(core, act, s, e, kv_heads / s.tensor_degree, head_dim);
    out.push_back(std::move(core));
    out.push_back(detail::local_row<std::remove_cvref_t<decltype(proj)>>(cat(row, ".proj (RowParallel)")));
    proj.add_amax_steps(out.back(), rows, s);
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() {
    const std::string bi = std::same_as<Mask, mask::Causal> ? "" : cat(cp ? ", " : "<", Mask::name);
    if constexpr (cp) return cat("GroupedQueryAttention<context ", Cx::name, bi, ">");
    else return cat("GroupedQueryAttention", bi, bi.empty() ? "" : ">");
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    qkv.for_each_param(prefix + ".qkv", f);
    proj.for_each_param(prefix + ".proj", f);
    if constexpr (!cp) {  // QK norm is refused with context parallelism
      if (normalizes_qk()) {
        f(prefix + ".q_norm.weight", q_norm);
        f(prefix + ".k_norm.weight", k_norm);
      }
    }
  }
};

}  // namespace weft::nn
