// dit::Model<Precision, SequenceParallel, Recompute, Device, Cx>: the DiT family (a class-conditional
// Diffusion Transformer over latent patches, Peebles and Xie 2023; diffusers' DiTTransformer2DModel
// with adaLN-Zero) as an instance of nn::StagedModel, built from weft's generic layers:
//
//   stage 0       Conditioning: the patches' projection and the fixed 2D sin-cos positions onto the
//                 stream; beside it the side input c = SiLU(t_embedder(t_emb) + y_embedder[y]),
//                 t_embedder = fc2(SiLU(fc1(.))): what every adaLN projection reads    "embedding"
//   stage 1 .. L  blocks.l: x = x + gate1(c) attn(mod1(c, norm1(x)));                  "blocks.<l>"
//                           x = x + gate2(c) mlp(mod2(c, norm2(x)))
//                 norms without parameters (nn::Normalize, eps 1e-6 and norm_eps), attention
//                 bidirectional with biases, the MLP GELU (tanh) of 4 C
//   stage L + 1   FinalLayer: norm, mod(c), out_proj, and the mean squared error against the
//                 batch's target (nn::MseHeadStage)                                    "head"
//
//   x, target  (B, N, p^2 Cin)     patches (dit::patchify), split over data
//   stream     (B, N, C)           Replicate, or Shard<1> with sequence parallelism; the rank's rows
//                                  (two chunks) under context parallelism
//   c          (B, C)              act::Full on every tensor, context and pipe rank
//
// Every layout, schedule, strategy, recompute policy and checkpoint layout applies as to any
// StagedModel. Parameter ids: patch 0-1, t_embedder 2-5, y_embedder 6, the head's out_proj 8-9 and
// modulation 10-11, block l from 16 + 32 l (mod1 +0, attn +2, gate1 +6, mod2 +8, mlp +10, gate2 +14).
// Weights are normal(0, init_std); with zero_init (DiT's adaLN-Zero) every modulation, gate and the
// output projection start at zero.
//
// defines: dit::Conditioning, dit::FinalNorm, dit::Spec, dit::Model
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/context/attention.hpp"
#include "weft/core/precision.hpp"
#include "weft/models/dit/config.hpp"
#include "weft/models/dit/embeddings.hpp"
#include "weft/models/dit/inputs.hpp"
#include "weft/nn/feature_stages.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/nn/layernorm.hpp"
#include "weft/nn/mlp.hpp"
#include "weft/nn/modulation.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/ops/silu.hpp"
#include "weft/recompute/checkpointed.hpp"

namespace weft::dit {

// The first stage: the stream from the patches, and the conditioning vector c beside it.
template <Floating T, bool SP, class D = Host, context::Choice Cx = context::None>
class Conditioning {
  using Patches = nn::FeatureEmbeddingStage<T, SP, &Inputs<T>::x, D, Cx>;
  using S = master_t<T>;
  using Weight = nn::Param<T, Replicated, Replicated, D>;  // every rank the same c, the same gradient

 public:
  using A = typename Patches::A;

  struct Ctx {
    typename Patches::Ctx patches;
    Allocation h, a, c;               // (B/dp, C) each: fc1's output, SiLU of it, c before its SiLU
    const T* t_emb = nullptr;         // (B/dp, frequencies), the batch's
    const std::int32_t* y = nullptr;  // (B/dp)
    std::int64_t B = 0;
  };

  Patches patches;                    // in_proj (C, p^2 Cin), (C)
  Tensor<T, Replicated, D> pos;       // (N, C): fixed, not a parameter
  Weight fc1_w, fc1_b, fc2_w, fc2_b;  // (C, frequencies), (C), (C, C), (C)
  Weight table;                       // (classes + 1, C)

  Conditioning() = default;
  Conditioning(D& dev, const Config& c, const Spread& s)
      : patches(dev, c.patch_features(), c.width, s, c.seed, c.init_std),
        pos(Tensor<T, Replicated, D>::empty(dev, {c.seq, c.width}, s, Category::other)),
        fc1_w(dev, {c.width, c.frequencies}, s, 2, {nn::Init::normal, c.init_std}, c.seed, nn::Decay::yes),
        fc1_b(dev, {c.width}, s, 3, {nn::Init::zeros}, c.seed, nn::Decay::no),
        fc2_w(dev, {c.width, c.width}, s, 4, {nn::Init::normal, c.init_std}, c.seed, nn::Decay::yes),
        fc2_b(dev, {c.width}, s, 5, {nn::Init::zeros}, c.seed, nn::Decay::no),
        table(dev, {c.classes + 1, c.width}, s, 6, {nn::Init::normal, c.init_std}, c.seed, nn::Decay::no) {
    const auto p = sincos_2d(c.width, c.grid(), c.grid());
    std::vector<T> v(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) v[i] = static_cast<T>(p[i]);
    dev.from_host(pos.data(), v.data(), v.size() * sizeof(T));
  }

  std::int64_t width() const { return fc2_w.value.global_shape()[0]; }

  template <class Batch, AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const Batch& in, Tensor<T, nn::act::Full, D>& side, M& mesh) {
    D& dev = side.dev();
    const Spread& s = side.spread();
    const std::int64_t C = width(), Fq = fc1_w.value.global_shape()[1], B = side.local_shape()[0];
    auto x = patches.forward(ctx.patches, in, mesh);  // (B, N, C) in A, the rank's rows
    const std::int64_t Bl = x.local_shape()[0], Tl = x.local_shape()[1], N = x.global_shape()[1];
    ops::Position<D>::forward(dev, x.data(), pos.data(), Bl, Tl, C, nn::row_positions<A>(s, N, Tl));
    ctx.B = B;
    ctx.t_emb = in.t_emb.data();
    ctx.y = in.y.data();
    const auto bytes = B * C * static_cast<std::int64_t>(sizeof(T));
    ctx.h = dev.allocate(bytes, Category::activations);
    ctx.a = dev.allocate(bytes, Category::activations);
    ctx.c = dev.allocate(bytes, Category::activations);
    T *h = static_cast<T*>(ctx.h.data()), *a = static_cast<T*>(ctx.a.data()), *cv = static_cast<T*>(ctx.c.data());
    ops::Gemm<D>::run(dev, Trans::no, Trans::yes, B, C, Fq, S(1), ctx.t_emb, Fq, fc1_w.value.data(), Fq, S(0), h, C);
    ops::Bias<D>::add(dev, h, fc1_b.value.data(), B, C);
    ops::Silu<D>::forward(dev, a, h, B * C);
    const std::int64_t rows = table.value.global_shape()[0];
    ops::Embedding<D>::forward(dev, cv, ctx.y, table.value.data(), B, C, 0, rows);
    ops::Gemm<D>::run(dev, Trans::no, Trans::yes, B, C, C, S(1), a, C, fc2_w.value.data(), C, S(1), cv, C);
    ops::Bias<D>::add(dev, cv, fc2_b.value.data(), B, C);
    ops::Silu<D>::forward(dev, side.data(), cv, B * C);
    return x;
  }

  // dside: c's gradient summed over the tensor group (a share over context, nn/side.hpp).
  template <AxisComms M>
  void backward(Ctx& ctx, const Tensor<T, A, D>& dx, const Tensor<T, nn::act::Full, D>& dside, M& mesh) {
    patches.backward(ctx.patches, dx, mesh);  // the positions are fixed: no gradient
    D& dev = dside.dev();
    const std::int64_t C = width(), Fq = fc1_w.value.global_shape()[1], B = ctx.B;
    Allocation g1 = dev.allocate(B * C * static_cast<std::int64_t>(sizeof(T)), Category::activations),
               g2 = dev.allocate(B * C * static_cast<std::int64_t>(sizeof(T)), Category::activations);
    T *dc = static_cast<T*>(g1.data()), *da = static_cast<T*>(g2.data());
    ops::Silu<D>::backward(dev, dc, static_cast<const T*>(ctx.c.data()), dside.data(), B * C);
    const std::int64_t rows = table.value.global_shape()[0];
    ops::Embedding<D>::backward(dev, table.grad.data(), dc, ctx.y, B, C, 0, rows);
    ops::Gemm<D>::run(dev, Trans::yes, Trans::no, C, C, B, S(1), dc, C, static_cast<const T*>(ctx.a.data()), C, S(1),
                      fc2_w.grad.data(), C);
    ops::Bias<D>::backward(dev, fc2_b.grad.data(), dc, B, C);
    ops::Gemm<D>::run(dev, Trans::no, Trans::no, B, C, C, S(1), dc, C, fc2_w.value.data(), C, S(0), da, C);
    ops::Silu<D>::backward(dev, da, static_cast<const T*>(ctx.h.data()), da, B * C);  // dh, in place
    ops::Gemm<D>::run(dev, Trans::yes, Trans::no, C, Fq, B, S(1), da, C, ctx.t_emb, Fq, S(1), fc1_w.grad.data(), Fq);
    ops::Bias<D>::backward(dev, fc1_b.grad.data(), da, B, C);
    ctx = Ctx{};
  }

  static void comm_rows(std::vector<nn::CommRow>& out, const Shape& g, const Spread& s, std::int64_t e) {
    Patches::comm_rows(out, g, s, e);
    out.push_back({"conditioning c (replicated MLP and table)", "batch", "side input", {}, {}});
  }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    patches.for_each_param(prefix + "patch.", f);
    f(prefix + "t_embedder.fc1.weight", fc1_w);
    f(prefix + "t_embedder.fc1.bias", fc1_b);
    f(prefix + "t_embedder.fc2.weight", fc2_w);
    f(prefix + "t_embedder.fc2.bias", fc2_b);
    f(prefix + "y_embedder.table", table);
  }
};

// The final layer's norm: a norm without parameters (eps 1e-6), then the shift and scale from c.
template <Floating T, LayoutType A, class D = Host>
class FinalNorm : public nn::SameLayout<A> {
 public:
  struct Ctx {
    typename nn::Normalize<T, A, D>::Ctx norm;
    typename nn::Modulation<T, A, D>::Ctx mod;
  };
  nn::Normalize<T, A, D> norm;
  nn::Modulation<T, A, D> mod;

  FinalNorm() = default;
  FinalNorm(D& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed, double init_std)
      : norm(dev, C, s), mod(dev, C, C, s, id, seed, init_std) {}

  template <AxisComms M>
  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x, M& mesh) {
    return mod.forward(ctx.mod, norm.forward(ctx.norm, x), mesh);
  }
  template <AxisComms M>
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy, M& mesh) {
    return norm.backward(ctx.norm, mod.backward(ctx.mod, dy, mesh));
  }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    mod.for_each_param(prefix + ".mod", f);
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
struct Spec {
  static constexpr bool cp = context::Kind<Cx>;
  using precision = precision_t<P>;
  using T = typename precision::compute;
  using config = Config;
  using device = D;
  using Inputs = dit::Inputs<T>;
  using Local = nn::stream<SP>;
  using A = typename nn::stream<SP, cp>::layout;
  using Norm = nn::Normalize<T, typename Local::layout, D>;
  using Mod = nn::Modulation<T, typename Local::layout, D>;
  using Gate = nn::Gate<T, typename Local::layout, D>;
  using G = typename precision::gemms;  // the linear layers' GEMMs: in T, or on float8 casts
  using Attn = nn::GroupedQueryAttention<T, Recompute, D, Cx, mask::Bidirectional, G>;
  using Mlp = nn::Mlp<T, D, G>;
  using Enter = typename nn::stream<SP, cp>::enter;
  using Leave = typename nn::stream<SP, cp>::leave;
  template <class L>
  using on_rows = std::conditional_t<cp, nn::TokenWise<L>, L>;
  using AttnInner = nn::Sequential<on_rows<nn::Named<"norm1", Norm>>, on_rows<nn::Named<"mod1", Mod>>, Enter,
                                   nn::Named<"attn", Attn>, Leave, on_rows<nn::Named<"gate1", Gate>>>;
  using MlpSeq = nn::Sequential<nn::Named<"norm2", Norm>, nn::Named<"mod2", Mod>, typename Local::enter,
                                nn::Named<"mlp", Mlp>, typename Local::leave, nn::Named<"gate2", Gate>>;
  using Layer = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<on_rows<MlpSeq>>>;
  using Block = recompute::apply_t<Recompute, Layer, T, D>;
  using Embedding = Conditioning<T, SP, D, Cx>;
  using Head = nn::MseHeadStage<T, SP, &Inputs::target, D, FinalNorm<T, typename Local::layout, D>, Cx>;
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "DiT"; }
  static std::int64_t side_width(const Config& c) { return c.width; }
  static void validate(const Config& c, const Spread& s, std::int64_t batch) { dit::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) { return dit::record(c); }
  static std::string block_name(std::int64_t l) { return cat("blocks.", l); }

  static Embedding make_embedding(D& dev, const Config& c, const Spread& s) { return Embedding(dev, c, s); }
  static Layer make_layer(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 32 * l);
    const double sd = c.init_std, z = c.zero_init ? 0.0 : c.init_std;
    const std::int64_t C = c.width;
    return Layer(
        nn::Residual<AttnInner>(AttnInner(
            on_rows<nn::Named<"norm1", Norm>>(nn::Named<"norm1", Norm>(Norm(dev, C, s))),
            on_rows<nn::Named<"mod1", Mod>>(nn::Named<"mod1", Mod>(Mod(dev, C, C, s, id, c.seed, z))), {},
            nn::Named<"attn", Attn>(Attn(dev, C, c.heads, c.heads, std::nullopt, true, s, id + 2, c.seed, sd, sd)), {},
            on_rows<nn::Named<"gate1", Gate>>(nn::Named<"gate1", Gate>(Gate(dev, C, C, s, id + 6, c.seed, z))))),
        nn::Residual<on_rows<MlpSeq>>(
            on_rows<MlpSeq>(MlpSeq(nn::Named<"norm2", Norm>(Norm(dev, C, s, 0, 0, c.norm_eps)),
                                   nn::Named<"mod2", Mod>(Mod(dev, C, C, s, id + 8, c.seed, z)), {},
                                   nn::Named<"mlp", Mlp>(Mlp(dev, C, s, id + 10, c.seed, sd, sd)), {},
                                   nn::Named<"gate2", Gate>(Gate(dev, C, C, s, id + 14, c.seed, z))))));
  }
  static Block make_block(D& dev, const Config& c, const Spread& s, std::int64_t l) {
    if constexpr (std::same_as<Block, Layer>) return make_layer(dev, c, s, l);
    else return Block(make_layer(dev, c, s, l));
  }
  static Head make_head(D& dev, const Config& c, const Spread& s) {
    const double z = c.zero_init ? 0.0 : c.init_std;
    return Head(FinalNorm<T, typename Local::layout, D>(dev, c.width, s, 10, c.seed, z), dev, c.width,
                c.patch_features(), s, c.seed, 8, z);
  }
};

template <PrecisionLike P, bool SP = false, recompute::Policy Recompute = recompute::None, class D = Host,
          context::Choice Cx = context::None>
using Model = nn::StagedModel<Spec<P, SP, Recompute, D, Cx>>;

}  // namespace weft::dit
