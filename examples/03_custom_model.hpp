// A decoder that weft does not ship, on weft's public headers: RMSNorm (Zhang and Sennrich, 2019),
// a ReLU-squared MLP (So et al., 2021), GPT-2's attention and learned positions, an untied head. Its
// two ops are its own (the host's here, the GPU's in 03_custom_model.cu). It is a value of weft's
// templates (nn::StagedModel): every layout, schedule, strategy and checkpoint applies to it.
#pragma once

#include <weft/weft_host.hpp>

#include <cmath>

namespace custom {
using namespace weft;

// ---- ops (ops/op.hpp): each a template, specialized per device -----------------------------
// y = x rstd w per row of C, rstd = 1 / sqrt(mean(x^2) + eps); backward: dx = rstd (g - xh mean(xh g))
// with xh = x rstd, g = w dy; dw += sum over rows of xh dy.
template <class D> struct RmsNorm;
template <>
struct RmsNorm<Host> {
  template <class T, class S>
  static void forward(Host&, T* y, S* rstd, const T* x, const T* w, std::int64_t N, std::int64_t C, S eps) {
    for (std::int64_t i = 0; i < N; ++i) {
      S ss = 0;
      for (std::int64_t c = 0; c < C; ++c) ss += S(x[i * C + c]) * S(x[i * C + c]);
      rstd[i] = S(1) / std::sqrt(ss / S(C) + eps);
      for (std::int64_t c = 0; c < C; ++c) y[i * C + c] = T(S(x[i * C + c]) * rstd[i] * S(w[c]));
    }
  }
  template <class T, class S>
  static void backward(Host&, T* dx, S* dw, const T* dy, const T* x, const T* w, const S* rstd, std::int64_t N,
                       std::int64_t C) {
    for (std::int64_t i = 0; i < N; ++i) {
      const T *xi = x + i * C, *di = dy + i * C;
      S m = 0;
      for (std::int64_t c = 0; c < C; ++c) m += S(xi[c]) * rstd[i] * S(w[c]) * S(di[c]);
      m /= S(C);
      for (std::int64_t c = 0; c < C; ++c) {
        const S xh = S(xi[c]) * rstd[i];
        dx[i * C + c] = T(rstd[i] * (S(w[c]) * S(di[c]) - xh * m));
        dw[c] += xh * S(di[c]);
      }
    }
  }
};

template <class D> struct ReluSquared;  // y = relu(x)^2; dx = 2 relu(x) dy
template <>
struct ReluSquared<Host> {
  template <class T>
  static void forward(Host&, T* y, const T* x, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? T(x[i] * x[i]) : T(0);
  }
  template <class T>
  static void backward(Host&, T* dx, const T* x, const T* dy, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? T(T(2) * x[i] * dy[i]) : T(0);
  }
};

// The plan (weft/cost/measure.hpp) runs the model on the Meta device, whose ops do nothing.
template <class D> struct RmsNorm<Meta<D>> : ops::MetaPass<D> {};
template <class D> struct ReluSquared<Meta<D>> : ops::MetaPass<D> {};

// ---- layers (the protocol of nn/sequential.hpp) -----------------------------------------------------
// RMSNorm over the stream A (Replicate, or Shard<1> under SP: then w's gradient is Partial on tensor).
template <class T, class A, class D = Host>
class RmsNormLayer : public nn::SameLayout<A> {
 public:
  using S = master_t<T>;
  struct Ctx {
    Tensor<T, A, D> x;
    Allocation rstd;  // (rows) in S
  };
  nn::Param<T, Replicated, nn::replicated_param_grad<A>, D> weight;  // (C), ones

  RmsNormLayer() = default;
  RmsNormLayer(D& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed)
      : weight(dev, {C}, s, id, {nn::Init::ones}, seed, nn::Decay::no) {}

  Tensor<T, A, D> forward(Ctx& ctx, const Tensor<T, A, D>& x) {
    const std::int64_t C = x.local_shape()[2], N = x.numel() / C;
    auto y = Tensor<T, A, D>::empty(x.dev(), x.global_shape(), x.spread(), Category::activations);
    ctx.rstd = x.dev().allocate(N * static_cast<std::int64_t>(sizeof(S)), Category::activations);
    RmsNorm<D>::forward(x.dev(), y.data(), static_cast<S*>(ctx.rstd.data()), x.data(), weight.value.data(), N, C,
                        S(1e-5));
    ctx.x = x.clone(Category::activations);
    return y;
  }
  Tensor<T, A, D> backward(Ctx& ctx, const Tensor<T, A, D>& dy) {
    const std::int64_t C = dy.local_shape()[2], N = dy.numel() / C;
    auto dx = Tensor<T, A, D>::empty(dy.dev(), dy.global_shape(), dy.spread(), Category::activations);
    RmsNorm<D>::backward(dy.dev(), dx.data(), weight.grad.data(), dy.data(), ctx.x.data(), weight.value.data(),
                         static_cast<const S*>(ctx.rstd.data()), N, C);
    ctx = Ctx{};
    return dx;
  }
  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "RmsNorm"; }
  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    f(prefix + ".weight", weight);
  }
};

// ---- the model: the parts, for nn::StagedModel (concept nn::ModelSpec) ------------------------------
// A block is x = x + attn(norm1(x)); x = x + down(relu(up(norm2(x)))^2), composed by weft's
// Sequential and Residual (layouts checked at compile time, the zero-bubble weight pass passed on).
// GPT-2's sizes and rules fit (gpt2::Config, gpt2::validate); parameter ids: the embedding 0 and 1,
// the head's table 2 and norm 8, block l from 16 + 16 l.
template <PrecisionLike P, bool SP = false, class D = Host>
struct Spec {
  using precision = precision_t<P>;
  using T = typename precision::compute;
  using config = gpt2::Config;
  using device = D;
  using St = nn::stream<SP>;
  using A = typename St::layout;
  using Norm = RmsNormLayer<T, A, D>;
  using G = typename precision::gemms;  // the linear layers' GEMMs: in T, or on float8 casts (FP8 precisions)
  using Attn = nn::GroupedQueryAttention<T, recompute::None, D, context::None, mask::Causal, G>;  // multi-head
  using Up = nn::Linear<T, nn::ColumnParallel, nn::epilogue::None, D, G>;
  using Down = nn::Linear<T, nn::RowParallel, nn::epilogue::None, D, G>;
  using Relu2 = nn::Elementwise<ReluSquared, T, nn::act::Features, D>;
  using AttnInner =
      nn::Sequential<nn::Named<"norm1", Norm>, typename St::enter, nn::Named<"attn", Attn>, typename St::leave>;
  using MlpInner = nn::Sequential<nn::Named<"norm2", Norm>, typename St::enter, nn::Named<"up", Up>, Relu2,
                                  nn::Named<"down", Down>, typename St::leave>;
  using Embedding = nn::EmbeddingStage<T, SP, D>;  // wte, learned positions
  using Block = nn::Sequential<nn::Residual<AttnInner>, nn::Residual<MlpInner>>;
  using Head = nn::HeadStage<T, SP, D, Norm>;  // norm, lm_head, the cross-entropy
  static constexpr bool sequence_parallel = SP;

  static std::string name() { return "CustomDecoder"; }
  static void validate(const config& c, const Spread& s, std::int64_t batch) { gpt2::validate(c, s, SP, batch); }
  static std::vector<std::pair<std::string, std::int64_t>> record(const config& c) {
    auto r = gpt2::record(c);
    r.emplace_back("relu2_mlp", 1);  // a GPT-2 checkpoint is refused, and this one by GPT-2
    return r;
  }
  static std::string block_name(std::int64_t l) { return cat("layers.", l); }
  static Embedding make_embedding(D& dev, const config& c, const Spread& s) {
    return Embedding(dev, nn::padded_vocab(c.vocab, s.tensor_degree), c.seq, c.width, s, c.seed, c.init_std);
  }
  static Block make_block(D& dev, const config& c, const Spread& s, std::int64_t l) {
    const auto id = static_cast<std::uint64_t>(16 + 16 * l);
    const double proj_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.layers));
    return Block(nn::Residual<AttnInner>(AttnInner(nn::Named<"norm1", Norm>(Norm(dev, c.width, s, id, c.seed)), {},
                                                   nn::Named<"attn", Attn>(Attn::multi_head(
                                                       dev, c.width, c.heads, s, id + 1, c.seed, c.init_std, proj_std)),
                                                   {})),
                 nn::Residual<MlpInner>(MlpInner(
                     nn::Named<"norm2", Norm>(Norm(dev, c.width, s, id + 5, c.seed)), {},
                     nn::Named<"up", Up>(Up(dev, c.width, 4 * c.width, s, id + 6, c.seed, c.init_std)), Relu2{},
                     nn::Named<"down", Down>(Down(dev, 4 * c.width, c.width, s, id + 8, c.seed, proj_std)), {})));
  }
  static Head make_head(D& dev, const config& c, const Spread& s) {
    return Head(dev, c.vocab, nn::padded_vocab(c.vocab, s.tensor_degree), c.width, s, c.seed, 8, 2, c.init_std);
  }
  static void finish(nn::Unit<T, D>& u, const config& c) {  // the padded vocabulary's rows
    u.set_logical("wte", {c.vocab, c.width});
    u.set_logical("lm_head", {c.vocab, c.width});
  }
};

template <PrecisionLike P, bool SP = false, class D = Host>
using Model = nn::StagedModel<Spec<P, SP, D>>;

}  // namespace custom
