// The context-parallel path of the attention layer (GroupedQueryAttention, in each of its forms,
// with Cx = context::Ring or context::AllGather), written once.
//
// x (B, T, C) is a context rank's T / c rows (Shard<1> on context: the chunks of context::Chunks).
// The projections run on those rows as on a sequence of their own; `rotate` turns the queries and
// keys at the rows' positions (Llama's rotary; nothing for GPT-2, whose positions were added in
// the embedding); the attention runs over the mesh's context group, Cx's way, masked by m (the
// layer's mask::Kind). What backward keeps
// is the attention's output and each query row's log-sum-exp (B, H/tp, T/c), never the (T/c, T)
// probabilities: the layer's Ctx has qkv_ctx, proj_ctx, qkv, core and lse for it. The attention's
// buffers (the travelling key-value blocks, the accumulators) come from the layer's device, for the
// length of the call, so the allocator counts them; on the Meta device (the plan) the same buffers
// and collectives run without the arithmetic, and the rank's attention FLOPs are noted.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "weft/comm/redistribute.hpp"
#include "weft/context/attention.hpp"
#include "weft/core/error.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/roles.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::nn::detail {

// The attention's buffers from a device's allocator, held until this is destroyed; the device's
// ops::ContextBlock computes in them (none on the Meta device).
template <class D>
class DeviceBuffers {
 public:
  static constexpr bool compute = !is_meta<D>;
  using device_type = D;
  explicit DeviceBuffers(D& dev) : dev_(&dev) {}
  D& device() { return *dev_; }
  template <class E>
  E* take(std::size_t n, Category c) {
    held_.push_back(dev_->allocate(static_cast<std::int64_t>(n * sizeof(E)), c));
    return static_cast<E*>(held_.back().data());
  }

 private:
  D* dev_;
  std::vector<Allocation> held_;
};

template <context::Kind Cx>
struct ContextAttention {
  // What forward and backward start from: the chunks of x's sequence over the context group (the
  // group checked against x's spread), this rank's index, its B and T/c rows, and the global shape
  // under which the layers this one calls see those rows, (B, T/c, C), whole on the context axis.
  struct Local {
    context::Chunks ch;
    int rank;
    std::int64_t B, Tl;
    Shape rows;
    ops::Positions positions() const { return ch.positions(rank); }
  };
  template <Communicator G, class X>
  static Local local(G& cg, const X& x, const std::string& where) {
    const Spread& s = x.spread();
    if (cg.size() != s.context_degree || cg.rank() != s.context_index)
      throw Error(
          where,
          cat("a context group of ", cg.size(), " ranks (this one ", cg.rank(), ") for an activation spread over ",
              s.context_degree, " (this rank's index ", s.context_index, ")"),
          "pass the mesh whose context axis the activation is sharded over");
    const Shape& g = x.global_shape();
    const std::int64_t B = x.local_shape()[0], Tl = x.local_shape()[1];
    return {context::Chunks::of(g[1], cg.size()), cg.rank(), B, Tl, Shape{g[0], Tl, g[2]}};
  }

  // Cx's collectives on the context axis added to row r, describe's row of the attention's core
  // (nn/comm_walk.hpp): act the global (B, T, C); G the key-value groups on a tensor rank of heads
  // of hd; e the bytes of T.
  template <class T>
  static void add_steps(CommRow& r, const Shape& act, const Spread& s, std::int64_t e, std::int64_t G,
                        std::int64_t hd) {
    Cx::comm_steps(r.forward, r.backward, {act[0] / s.data_degree, act[1] / s.context_degree, G, 2, hd},
                   s.context_degree, e, static_cast<std::int64_t>(sizeof(accumulate_t<T>)));
  }

  // layer.qkv (ColumnParallel) -> rotate -> attention over the context group -> layer.proj
  // (RowParallel): out (B, T, C) Partial over tensor, the rank's rows. H the local heads of size hd
  // in groups of g sharing a key and a value.
  template <class Out, class Layer, class Ctx, class X, AxisComms M, class Rotate>
  static auto forward(Layer& layer, Ctx& ctx, const X& x, M& mesh, std::int64_t H, std::int64_t hd, std::int64_t g,
                      const ops::Mask& m, Rotate&& rotate, const std::string& where) {
    using T = typename X::value_type;
    using D = typename X::device;
    using S = accumulate_t<T>;
    auto& cg = mesh.comm(Axis::context);
    const Local r = local(cg, x, where);
    ctx.qkv = layer.qkv.forward(
        ctx.qkv_ctx, Tensor<T, act::Full, D>::view(x.dev(), const_cast<T*>(x.data()), r.rows, x.spread()), mesh);
    rotate(ctx.qkv.data(), r.B, r.Tl, r.positions(), 1);
    auto y = Tensor<T, act::Features, D>::empty(x.dev(), {r.rows[0], r.rows[1], H * hd * x.spread().tensor_degree},
                                                x.spread(), Category::activations);
    ctx.lse = x.dev().allocate(r.B * H * r.Tl * static_cast<std::int64_t>(sizeof(S)), Category::activations);
    {
      DeviceBuffers<D> work(x.dev());
      Cx::forward(cg, r.ch, y.data(), static_cast<S*>(ctx.lse.data()), ctx.qkv.data(), r.B, r.Tl, H, hd, g, m, work);
    }
    if constexpr (is_meta<D>)
      x.dev().work.attention_flops += context::forward_flops(r.ch, r.rank, r.B, H, hd, m.causal);
    auto out = layer.proj.forward(ctx.proj_ctx, y, mesh);
    ctx.core = std::move(y);
    return Tensor<T, Out, D>::relabel(std::move(out), x.global_shape());
  }

  // dy (B, T, C) Replicate over tensor, the rank's rows -> dx Partial over tensor.
  template <class GradIn, class Layer, class Ctx, class DY, AxisComms M, class Rotate>
  static auto backward(Layer& layer, Ctx& ctx, const DY& dy, M& mesh, std::int64_t H, std::int64_t hd, std::int64_t g,
                       const ops::Mask& m, Rotate&& rotate, const std::string& where) {
    using T = typename DY::value_type;
    using D = typename DY::device;
    using S = accumulate_t<T>;
    auto& cg = mesh.comm(Axis::context);
    const Local r = local(cg, dy, where);
    auto dcore = layer.proj.backward(
        ctx.proj_ctx, Tensor<T, act::Full, D>::view(dy.dev(), const_cast<T*>(dy.data()), r.rows, dy.spread()), mesh);
    auto dqkv =
        Tensor<T, act::Features, D>::empty(dy.dev(), ctx.qkv.global_shape(), dy.spread(), Category::activations);
    {
      DeviceBuffers<D> work(dy.dev());
      Cx::backward(cg, r.ch, dqkv.data(), dcore.data(), ctx.core.data(), static_cast<const S*>(ctx.lse.data()),
                   ctx.qkv.data(), r.B, r.Tl, H, hd, g, m, work);
    }
    if constexpr (is_meta<D>)
      dy.dev().work.attention_flops += 2 * context::forward_flops(r.ch, r.rank, r.B, H, hd, m.causal);
    rotate(dqkv.data(), r.B, r.Tl, r.positions(), -1);
    auto dx = layer.qkv.backward(ctx.qkv_ctx, dqkv, mesh);
    ctx.qkv = {};  // the projections' contexts stay where their weight gradients are deferred
    ctx.core = {};
    ctx.lse.reset();
    return Tensor<T, GradIn, D>::relabel(std::move(dx), dy.global_shape());
  }
};

}  // namespace weft::nn::detail
