// Linear<T, Role, Epilogue>: y = x W^T + b (W is (out, in), as in PyTorch), with its parallel role a
// type.
//
//   role            W (out, in)           b (out)              x            y
//   ColumnParallel  Shard<0> on tensor    Shard<0>             Replicate    Shard<-1>
//   RowParallel     Shard<1> on tensor    Replicate            Shard<-1>    Partial
//   NoParallel      Replicate             Replicate            Replicate    Replicate
//
// A RowParallel output is a pending sum, so its bias is added by tensor rank 0 only; its gradient
// (the sum of dy over rows) is computed identically on every rank from the Replicate dy.
// Backward writes dx and accumulates dW, db. With epilogue::Gelu the pre-activation is saved and
// the GELU backward is applied first. No collective runs inside a Linear: the communication
// between layers is the caller's (comm.hpp), which keeps each layer's backward a local computation.
//
// G, the precision's GEMMs (core/precision.hpp): ExactGemms, in T; or fp8::Gemms<...>, each of the
// three GEMMs (forward, dgrad, wgrad) on float8 casts of its operands (ops::ScaledGemm; which
// operand is cast how: core/float8_gemms.hpp). The one exception to "no collective inside": on
// tensor-parallel FP8 layers, an operand whose scale block spans the tensor shards has its amaxes
// reduced (max) over the tensor ranks before its cast (fp8::Gemms::reduces), so that every layout
// casts as one rank does. Which operands those are (K: the GEMM's reduction dimension):
//
//   GEMM     operand  ColumnParallel sharded along   RowParallel sharded along
//   forward  x        -                              K
//            W        rows                           K
//   dgrad    dy       K                              -
//            W^T      K                              rows
//   wgrad    dy^T     rows                           -
//            x^T      -                              rows
//
// K-sharded operands reduce tensorwise and rowwise (a row's amax), row-sharded ones tensorwise only;
// blockwise none. A tensorwise amax is reduced once: forward's W and x and dgrad's dy are kept in
// the context for the GEMMs that read the same tensor again (so the deferred weight pass of
// zero-bubble schedules needs no collective). Per layer and micro-batch: 2 all-reduces of one float
// tensorwise; rowwise 2, of (tokens) and (in) floats (Column's dgrad) or (tokens) and (out) (Row's
// forward). The mesh reaches the layer through forward(ctx, x, mesh) and backward(ctx, dy, mesh);
// without one, a layer that must reduce is refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/param.hpp"
#include "weft/nn/roles.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/scaled_gemm.hpp"

namespace weft::nn {

// The mesh argument of a layer called without one (forward(ctx, x) on a layer that has forward(ctx,
// x, mesh)): it has no groups.
struct NoMesh {};

template <class Role> struct linear_layouts;
template <> struct linear_layouts<ColumnParallel> {
  using weight = Layout<Replicate, Shard<0>>;
  using bias = Layout<Replicate, Shard<0>>;
  using in = act::Full;
  using out = act::Features;
  using grad_out = act::Features;
  using grad_in = act::Partial;  // dx = dy W_local: each tensor rank holds an addend
};
template <> struct linear_layouts<RowParallel> {
  using weight = Layout<Replicate, Shard<1>>;
  using bias = Replicated;
  using in = act::Features;
  using out = act::Partial;
  using grad_out = act::Full;
  using grad_in = act::Features;
};
template <> struct linear_layouts<NoParallel> {
  using weight = Replicated;
  using bias = Replicated;
  using in = act::Full;
  using out = act::Full;
  using grad_out = act::Full;
  using grad_in = act::Full;
};

template <Floating T, LinearRole Role, class Epilogue = epilogue::None, class D = Host, GemmPolicy G = ExactGemms>
class Linear {
  static_assert(!G::fp8 || ops::ImplementedOn<ops::ScaledGemm, D>,
                "Linear: the precision's FP8 GEMMs need ops::ScaledGemm on this device, which has none here (the "
                "GPU's is in ops/scaled_gemm.cuh, which ops/all.cuh includes); include it, train FP8 on the host, "
                "or use Precision<bf16, float> here");
  static_assert(std::same_as<Epilogue, epilogue::None> || std::same_as<Epilogue, epilogue::Gelu>,
                "Linear: unknown epilogue; use epilogue::None or epilogue::Gelu");
  static_assert(!(std::same_as<Role, RowParallel> && std::same_as<Epilogue, epilogue::Gelu>),
                "Linear: a RowParallel output is a partial sum, so GELU cannot be fused into it; apply GELU after "
                "the reduction, or fuse it into the ColumnParallel layer before");

 public:
  using L = linear_layouts<Role>;
  using In = typename L::in;
  using Out = typename L::out;
  using GradIn = typename L::grad_in;
  using GradOut = typename L::grad_out;
  static constexpr bool has_gelu = std::same_as<Epilogue, epilogue::Gelu>;

  using S = master_t<T>;  // parameter gradients, GEMM accumulation

  struct Ctx {
    Tensor<T, In, D> x;        // the input, saved for dW
    Tensor<T, Out, D> pre;     // the pre-activation (Gelu only)
    Tensor<T, GradOut, D> dy;  // the output gradient (after the GELU's), kept for a deferred backward_weight
    // FP8 tensorwise: the amaxes of x, W and dy (over the tensor ranks), for the GEMMs that read them again.
    float x_amax = 0, w_amax = 0, dy_amax = 0;
  };

  // Zero-bubble pipeline schedules split the backward: with defer_weight(true), backward() computes
  // the input gradient only and keeps what backward_weight() needs to add dW and db later.
  void defer_weight(bool on) { deferring_ = on; }

  Param<T, typename L::weight, typename L::weight, D> weight;
  Param<T, typename L::bias, typename L::bias, D> bias;

  Linear() = default;
  // in, out: global feature counts. ids: weight id and id + 1 for the bias. Without a bias the
  // layer holds an empty bias parameter and for_each_param skips it.
  Linear(D& dev, std::int64_t in, std::int64_t out, const Spread& s, std::uint64_t id, std::uint64_t seed,
         double init_std = 0.02, bool with_bias = true)
      : weight(dev, {out, in}, s, id, {Init::normal, init_std}, seed, Decay::yes),
        bias(dev, {with_bias ? out : 0}, s, id + 1, {Init::zeros}, seed, Decay::no),
        tensor_index_(s.tensor_index),
        tensor_degree_(s.tensor_degree),
        has_bias_(with_bias) {}

  bool has_bias() const { return has_bias_; }

  Shape out_shape(const Shape& in) const { return {in[0], in[1], weight.value.global_shape()[0]}; }
  static std::string name() {
    const char* role = std::same_as<Role, ColumnParallel> ? "ColumnParallel"
                       : std::same_as<Role, RowParallel>  ? "RowParallel"
                                                          : "NoParallel";
    return cat("Linear<", role, has_gelu ? ", Gelu>" : ">");
  }

  std::int64_t in_local() const { return weight.value.local_shape()[1]; }
  std::int64_t out_local() const { return weight.value.local_shape()[0]; }

  // x (B, T, in) in layout In -> y (B, T, out) in layout Out. mesh: the tensor group of FP8 casts
  // (the top of this file); NoMesh where there is none.
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x) {
    NoMesh none;
    return forward(ctx, x, none);
  }
  template <class M>
  Tensor<T, Out, D> forward(Ctx& ctx, const Tensor<T, In, D>& x, M& mesh) {
    const Shape g = x.global_shape();
    const std::int64_t N = x.local_shape()[0] * x.local_shape()[1];
    auto y = Tensor<T, Out, D>::empty(x.dev(), {g[0], g[1], weight.value.global_shape()[0]}, x.spread(),
                                      Category::activations);
    gemm<fp8::Operand::activation, fp8::Operand::weight>(
        x.dev(), "forward", Trans::no, Trans::yes, N, out_local(), in_local(), x.data(), in_local(),
        weight.value.data(), in_local(), S(0), y.data(), out_local(), amaxes(mesh, kCasts[0], &ctx.x_amax, nullptr),
        amaxes(mesh, kCasts[1], &ctx.w_amax, nullptr));
    if (has_bias_ && (!std::same_as<Role, RowParallel> || tensor_index_ == 0))
      ops::Bias<D>::add(x.dev(), y.data(), bias.value.data(), N, out_local());
    ctx.x = x.clone(Category::activations);
    if constexpr (has_gelu) {  // the pre-activation is saved, and the output is a new buffer (no copy)
      ctx.pre = std::move(y);
      y = Tensor<T, Out, D>::empty(x.dev(), ctx.pre.global_shape(), ctx.pre.spread(), Category::activations);
      ops::Gelu<D>::forward(x.dev(), y.data(), ctx.pre.data(), y.numel());
    }
    return y;
  }

  // dy (B, T, out) in GradOut -> dx (B, T, in) in GradIn; accumulates the parameter gradients.
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy_in) {
    NoMesh none;
    return backward(ctx, dy_in, none);
  }
  template <class M>
  Tensor<T, GradIn, D> backward(Ctx& ctx, const Tensor<T, GradOut, D>& dy_in, M& mesh) {
    const Tensor<T, In, D>& x = ctx.x;
    const std::int64_t N = x.local_shape()[0] * x.local_shape()[1];
    const T* dy = dy_in.data();
    Tensor<T, GradOut, D> dpre;
    if constexpr (has_gelu) {
      dpre = Tensor<T, GradOut, D>::empty(dy_in.dev(), dy_in.global_shape(), dy_in.spread(), Category::activations);
      ops::Gelu<D>::backward(dy_in.dev(), dpre.data(), ctx.pre.data(), dy_in.data(), dpre.numel());
      dy = dpre.data();
    }
    // dx (N, in) = dy W;  then (now, or in backward_weight) dW (out, in) += dy^T x, db += sum of dy.
    auto dx = Tensor<T, GradIn, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    gemm<fp8::Operand::gradient, fp8::Operand::weight>(
        x.dev(), "dgrad", Trans::no, Trans::no, N, in_local(), out_local(), dy, out_local(), weight.value.data(),
        in_local(), S(0), dx.data(), in_local(), amaxes(mesh, kCasts[2], &ctx.dy_amax, nullptr),
        amaxes(mesh, kCasts[3], nullptr, &ctx.w_amax));
    if (deferring_) {
      ctx.dy = has_gelu ? std::move(dpre) : dy_in.clone(Category::activations);
      ctx.pre = {};
      return dx;
    }
    weight_grads(ctx, x, dy, N);
    ctx = Ctx{};
    return dx;
  }

  // The deferred weight gradients (defer_weight(true)): dW += dy^T x, db += sum of dy; frees the context.
  void backward_weight(Ctx& ctx) {
    if (ctx.dy.data()) weight_grads(ctx, ctx.x, ctx.dy.data(), ctx.x.local_shape()[0] * ctx.x.local_shape()[1]);
    ctx = Ctx{};
  }

  // f(name, param) for each parameter, in a fixed order.
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + ".weight", weight);
    if (has_bias_) f(prefix + ".bias", bias);
  }

  // describe's row (nn/comm_walk.hpp): the layouts, and the amax all-reduces of tensor-parallel FP8
  // casts. act: the input's global shape (B, T, in), T a rank's rows.
  void comm_rows(std::vector<CommRow>& out, const std::string& label, const Shape& act, const Spread& s,
                 std::int64_t) const {
    CommRow r{cat(label, " (", name(), ")"), In::name(), Out::name(), {}, {}};
    add_amax_steps(r, act, s);
    out.push_back(std::move(r));
  }
  // The amax all-reduces of this layer's casts (the table at the top: forward's x and W, dgrad's
  // dy and W^T, wgrad's dy^T and x^T; a kept tensorwise amax is not reduced again), added to r.
  void add_amax_steps(CommRow& r, const Shape& act, const Spread& s) const {
    if constexpr (G::fp8) {
      if (s.tensor_degree < 2) return;
      const std::int64_t N = act[0] / s.data_degree * act[1];
      for (const Cast& c : kCasts) {
        if ((tensorwise && c.kept) || !G::reduces(c.k_sharded, c.rows_sharded)) continue;
        const std::int64_t rows = c.rows == Rows::tokens ? N : c.rows == Rows::out ? out_local() : in_local();
        (c.pass == Pass::forward ? r.forward : r.backward)
            .push_back(detail::reduction(Axis::tensor, s.tensor_degree,
                                         static_cast<std::int64_t>(sizeof(float)) * (tensorwise ? 1 : rows)));
      }
    }
  }

 private:
  static constexpr bool column = std::same_as<Role, ColumnParallel>, row = std::same_as<Role, RowParallel>;
  static constexpr bool tensorwise = [] {
    if constexpr (G::fp8) return std::same_as<typename G::scaling_rule, fp8::scaling::Tensorwise>;
    else return false;
  }();

  // The six casts of an FP8 layer (the table at the top), which the hooks below and describe's rows
  // (add_amax_steps) both read: the GEMM, whether the operand is sharded over the tensor ranks along
  // K and along its rows, whether its tensorwise amax was kept by an earlier cast, and its rows.
  enum class Pass { forward, backward };
  enum class Rows { tokens, out, in };
  struct Cast {
    const char* gemm;
    Pass pass;
    bool k_sharded, rows_sharded, kept;
    Rows rows;
  };
  static constexpr Cast kCasts[6] = {
      {"forward", Pass::forward, row, false, false, Rows::tokens},    // x
      {"forward", Pass::forward, row, column, false, Rows::out},      // W
      {"dgrad", Pass::backward, column, false, false, Rows::tokens},  // dy
      {"dgrad", Pass::backward, column, row, true, Rows::in},         // W^T
      {"wgrad", Pass::backward, false, column, true, Rows::out},      // dy^T
      {"wgrad", Pass::backward, false, row, true, Rows::in},          // x^T
  };

  // The hook of an FP8 operand's cast (ops::ScaledGemm): its amaxes reduced over the tensor ranks
  // where its scale blocks span the shards (kCasts); tensorwise, the amax kept for the GEMMs that
  // read the tensor again (keep), or the one kept taken (kept).
  template <class M>
  auto amaxes(M& mesh, const Cast& c, float* keep, const float* kept) const {
    if constexpr (!G::fp8) {
      return fp8::KeepAmaxes{};
    } else {
      const char* which = c.gemm;
      const bool k_sharded = c.k_sharded, rows_sharded = c.rows_sharded;
      return [=, this, &mesh](std::span<float> a) {
        if (tensorwise && kept) {
          a[0] = *kept;
          return;
        }
        if (tensor_degree_ > 1 && G::reduces(k_sharded, rows_sharded)) {
          if constexpr (std::same_as<M, NoMesh>)
            throw Error(cat(name(), "'s ", which, " GEMM under ", G::name()),
                        cat("its operand is sharded over ", tensor_degree_,
                            " tensor ranks and its amaxes must be reduced over them, but the layer was called "
                            "without a mesh"),
                        "call forward(ctx, x, mesh) and backward(ctx, dy, mesh)");
          else if constexpr (!D::host_memory)  // the hook's amaxes are on the host (ops/scaled_gemm.cuh)
            throw Error(cat(name(), "'s ", which, " GEMM under ", G::name()),
                        cat("its operand is sharded over ", tensor_degree_,
                            " tensor ranks, and reducing FP8 amaxes over GPU ranks is not written yet"),
                        "train FP8 on one tensor rank on the GPU (data, pipe and FSDP ranks are fine), blockwise "
                        "scaling (nothing to reduce), or on the host");
          else mesh.comm(Axis::tensor).all_reduce(a, ReduceOp::max);
        }
        if (tensorwise && keep) *keep = a[0];
        (void)mesh;  // NoMesh: nothing to reduce over
      };
    }
  }

  // C = op(A) op(B) + beta C in T, or on float8 casts (ra, rb: what op(A) and op(B) are; on_a, on_b:
  // their amaxes' hooks).
  template <fp8::Operand ra, fp8::Operand rb, class C, class FA, class FB>
  void gemm(D& dev, const char* which, Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
            std::int64_t lda, const T* b, std::int64_t ldb, S beta, C* c, std::int64_t ldc, const FA& on_a,
            const FB& on_b) const {
    if constexpr (G::fp8)
      ops::ScaledGemm<D>::template run<G, ra, rb>(dev, ta, tb, m, n, k, S(1), a, lda, b, ldb, beta, c, ldc,
                                                  cat(name(), "'s ", which, " GEMM"), on_a, on_b);
    else ops::Gemm<D>::run(dev, ta, tb, m, n, k, S(1), a, lda, b, ldb, beta, c, ldc);
  }

  // dW += dy^T x, db += sum of dy: the tensorwise amaxes are those forward and dgrad kept.
  void weight_grads(Ctx& ctx, const Tensor<T, In, D>& x, const T* dy, std::int64_t N) {
    NoMesh none;
    gemm<fp8::Operand::gradient, fp8::Operand::activation>(
        x.dev(), "wgrad", Trans::yes, Trans::no, out_local(), in_local(), N, dy, out_local(), x.data(), in_local(),
        S(1), weight.grad.data(), in_local(), amaxes(none, kCasts[4], nullptr, &ctx.dy_amax),
        amaxes(none, kCasts[5], nullptr, &ctx.x_amax));
    if (has_bias_) ops::Bias<D>::backward(x.dev(), bias.grad.data(), dy, N, out_local());
  }

 private:
  int tensor_index_ = 0;
  int tensor_degree_ = 1;
  bool deferring_ = false;
  bool has_bias_ = true;
};

}  // namespace weft::nn
