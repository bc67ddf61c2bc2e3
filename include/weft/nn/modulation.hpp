// Layers driven by the model's side input (nn/side.hpp), per sample: DiT's adaLN-Zero in two parts.
//
//   Modulation<T, A, D>   [shift | scale] = c W^T + b  (W (2C, K), b (2C));  y = x (1 + scale) + shift
//   Gate<T, A, D>         gate = c W^T + b  (W (C, K), b (C));               y = x gate
//
//   c     (B, K)      the side input, act::Full (every tensor and context rank)
//   x, y  (B, T, C)   in the stream's layout A (each keeps it: SameLayout<A>), the rows the rank holds
//
// A DiT block is x + Gate(attn(Modulation(norm(x)))) and the same around the MLP: the six vectors
// adaLN-Zero makes with one projection of c are these layers' three projections, its rows split.
// Weights start as init_std says (0: adaLN-Zero's start, every gate closed).
//
// Backward (ops::Modulate): dx; the per-sample vectors' gradients summed over the rank's rows; dW
// and db from them (Partial on tensor under sequence parallelism, shares over context:
// replicated_param_grad<A>); and this rank's share of c's gradient, dv W (adds_side_share<A>: one
// tensor rank where every one computed the same sums).
//
// They read the side input through their mesh argument: in a model that produces none they do not
// compile, and their static_assert says so.
//
// defines: nn::Modulation, nn::Gate
#pragma once

#include <string>

#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/nn/side.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/modulate.hpp"

namespace weft::nn {

namespace detail {

// v = c W^T + b (B/dp, n) from the side input c (B/dp, K), and its backward.
template <Floating T, LayoutType A, class D>
struct SideProjection {
  using S = master_t<T>;
  Param<T, Replicated, replicated_param_grad<A>, D> weight;  // (n, K)
  Param<T, Replicated, replicated_param_grad<A>, D> bias;    // (n)

  SideProjection() = default;
  SideProjection(D& dev, std::int64_t n, std::int64_t K, const Spread& s, std::uint64_t id, std::uint64_t seed,
                 double init_std)
      : weight(dev, {n, K}, s, id, {init_std > 0 ? Init::normal : Init::zeros, init_std}, seed, Decay::yes),
        bias(dev, {n}, s, id + 1, {Init::zeros}, seed, Decay::no) {}

  std::int64_t n() const { return weight.value.global_shape()[0]; }
  std::int64_t K() const { return weight.value.global_shape()[1]; }

  template <class C>
  Allocation forward(D& dev, const C& c, std::int64_t B, const char* layer) const {
    if (c.local_shape().rank() != 2 || c.local_shape()[0] != B || c.local_shape()[1] != K())
      throw Error(cat("nn::", layer, "::forward"),
                  cat("a side input of local shape ", c.local_shape(), " for ", B, " samples of ", K()),
                  "make the model's side input (batch, side_width) with the width the layer was built for");
    Allocation v = dev.allocate(B * n() * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    auto* p = static_cast<T*>(v.data());
    ops::Gemm<D>::run(dev, Trans::no, Trans::yes, B, n(), K(), S(1), c.data(), K(), weight.value.data(), K(), S(0), p,
                      n());
    ops::Bias<D>::add(dev, p, bias.value.data(), B, n());
    return v;
  }
  // dv (B/dp, n): dW += dv^T c, db += the rows of dv, dc += dv W where this rank adds its share.
  template <class C, class DC>
  void backward(D& dev, const T* dv, std::int64_t B, const C& c, DC& dc, const Spread& s) {
    ops::Gemm<D>::run(dev, Trans::yes, Trans::no, n(), K(), B, S(1), dv, n(), c.data(), K(), S(1), weight.grad.data(),
                      K());
    ops::Bias<D>::backward(dev, bias.grad.data(), dv, B, n());
    if (adds_side_share<A>(s))
      ops::Gemm<D>::run(dev, Trans::no, Trans::no, B, K(), n(), S(1), dv, n(), weight.value.data(), K(), S(1),
                        dc.data(), K());
  }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + ".weight", weight);
    f(prefix + ".bias", bias);
  }
};

template <class M>
constexpr void require_side_mesh() {
  static_assert(SideMesh<M>,
                "nn::Modulation, nn::Gate: the layer reads the model's side input, and no stage produces one; give "
                "the model's Spec side_width(config) and its first stage a forward(ctx, in, side, mesh)");
}

}  // namespace detail

template <Floating T, LayoutType A, class D = Host>
class Modulation : public SameLayout<A> {
 public:
  struct Ctx {
    Tensor<T, A, D> x;  // the input, for dscale
    Allocation mod;     // (B/dp, 2C)
  };

  detail::SideProjection<T, A, D> proj;  // (2C, K), (2C)

  Modulation() = default;
  // C the stream's width, K the side input's; parameter ids id (weight) and id + 1 (bias, zeros).
  Modulation(D& dev, std::int64_t C, std::int64_t K, const Spread& s, std::uint64_t id, std::uint64_t seed,
             double init_std)
      : proj(dev, 2 * C, K, s, id, seed, init_std) {}

  std::int64_t width() const { return proj.n() / 2; }

  template <AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x, M& mesh) {
    detail::require_side_mesh<M>();
    if constexpr (SideMesh<M>) {
      D& dev = x.dev();
      const std::int64_t B = x.local_shape()[0], Tl = x.local_shape()[1];
      ctx.mod = proj.forward(dev, mesh.side(), B, "Modulation");
      auto y = Tensor<T, A, D>::empty(dev, x.global_shape(), x.spread(), Category::activations);
      ops::Modulate<D>::forward(dev, y.data(), x.data(), static_cast<const T*>(ctx.mod.data()), B, Tl, width());
      ctx.x = x.clone(Category::activations);
      return y;
    } else {
      return x.clone(Category::activations);  // not reached: the assertion stops the build
    }
  }

  template <SideMesh M>
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, M& mesh) {
    D& dev = dy.dev();
    const std::int64_t B = dy.local_shape()[0], Tl = dy.local_shape()[1];
    auto dx = Tensor<T, A, D>::empty(dev, dy.global_shape(), dy.spread(), Category::activations);
    Allocation dmod = dev.allocate(B * proj.n() * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    ops::Modulate<D>::backward(dev, dx.data(), static_cast<T*>(dmod.data()), dy.data(), ctx.x.data(),
                               static_cast<const T*>(ctx.mod.data()), B, Tl, width());
    proj.backward(dev, static_cast<const T*>(dmod.data()), B, mesh.side(), mesh.side_grad(), dy.spread());
    ctx = Ctx{};
    return dx;
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Modulation"; }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    proj.for_each_param(prefix, f);
  }
};

template <Floating T, LayoutType A, class D = Host>
class Gate : public SameLayout<A> {
 public:
  struct Ctx {
    Tensor<T, A, D> x;  // the input, for dgate
    Allocation gate;    // (B/dp, C)
  };

  detail::SideProjection<T, A, D> proj;  // (C, K), (C)

  Gate() = default;
  Gate(D& dev, std::int64_t C, std::int64_t K, const Spread& s, std::uint64_t id, std::uint64_t seed, double init_std)
      : proj(dev, C, K, s, id, seed, init_std) {}

  template <AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x, M& mesh) {
    detail::require_side_mesh<M>();
    if constexpr (SideMesh<M>) {
      D& dev = x.dev();
      const std::int64_t B = x.local_shape()[0], Tl = x.local_shape()[1];
      ctx.gate = proj.forward(dev, mesh.side(), B, "Gate");
      auto y = Tensor<T, A, D>::empty(dev, x.global_shape(), x.spread(), Category::activations);
      ops::Modulate<D>::gate(dev, y.data(), x.data(), static_cast<const T*>(ctx.gate.data()), B, Tl, proj.n());
      ctx.x = x.clone(Category::activations);
      return y;
    } else {
      return x.clone(Category::activations);  // not reached: the assertion stops the build
    }
  }

  template <SideMesh M>
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, M& mesh) {
    D& dev = dy.dev();
    const std::int64_t B = dy.local_shape()[0], Tl = dy.local_shape()[1];
    auto dx = Tensor<T, A, D>::empty(dev, dy.global_shape(), dy.spread(), Category::activations);
    Allocation dgate = dev.allocate(B * proj.n() * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    ops::Modulate<D>::gate_backward(dev, dx.data(), static_cast<T*>(dgate.data()), dy.data(), ctx.x.data(),
                                    static_cast<const T*>(ctx.gate.data()), B, Tl, proj.n());
    proj.backward(dev, static_cast<const T*>(dgate.data()), B, mesh.side(), mesh.side_grad(), dy.spread());
    ctx = Ctx{};
    return dx;
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Gate"; }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    proj.for_each_param(prefix, f);
  }
};

}  // namespace weft::nn
