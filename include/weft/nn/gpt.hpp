// Gpt<T, SequenceParallel, Recompute>: token and position embeddings, N blocks, final LayerNorm,
// an LM head tied to the token embedding, and the vocab-parallel cross-entropy fused with it.
//
//   tokens  (B, T) int32                          batch split over data
//   wte     (Vp, C)     Shard<0> on tensor        Vp = vocab padded to a multiple of the tensor degree
//   wpe     (T, C)      Replicate
//   x       (B, T, C)   the residual stream: Replicate, or Shard<1> with sequence parallelism
//   logits  (B, T, Vp/tp) Shard<-1>               never gathered: the loss needs two small
//                                                 all-reduces (row max; sum of exp with the target
//                                                 logit packed beside it)
//
// Padding rows of wte (vocab ids >= V) are never looked up and are masked out of the softmax, so
// they get no gradient and change no result. The loss is the mean over every token of the global
// batch; forward_backward() returns it and accumulates every parameter gradient.
#pragma once

#include <cmath>
#include <array>
#include <limits>
#include <vector>

#include "weft/nn/block.hpp"
#include "weft/nn/embedding.hpp"

namespace weft::nn {

struct GptConfig {
  std::int64_t vocab = 64;
  std::int64_t seq = 16;      // T, the sequence length (and the number of positions)
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t width = 32;    // C
  std::uint64_t seed = 1234;
  double init_std = 0.02;     // GPT-2: normal(0, 0.02); residual projections scaled by 1/sqrt(2 layers)
};

// Checks a configuration against the mesh's degrees before anything is allocated.
inline void validate(const GptConfig& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  auto divisors = [](std::int64_t n) {
    std::vector<std::int64_t> d;
    for (std::int64_t i = 1; i <= n; ++i)
      if (n % i == 0) d.push_back(i);
    return join(d);
  };
  if (c.vocab < 1 || c.seq < 1 || c.layers < 1 || c.heads < 1 || c.width < 1)
    throw Error("Gpt", cat("vocab ", c.vocab, ", seq ", c.seq, ", layers ", c.layers, ", heads ", c.heads, ", width ",
                           c.width, " include one below 1"),
                "use sizes >= 1");
  if (c.width % c.heads != 0)
    throw Error("Gpt", cat("width ", c.width, " is not divisible by ", c.heads, " heads"),
                cat("use a head count that divides the width (", divisors(c.width), ")"));
  if (c.heads % s.tensor_degree != 0)
    throw Error("Gpt", cat("tensor degree ", s.tensor_degree, " does not divide ", c.heads, " heads"),
                cat("use a tensor degree in ", divisors(c.heads)));
  if (sequence_parallel && c.seq % s.tensor_degree != 0)
    throw Error("Gpt", cat("sequence parallelism needs the tensor degree ", s.tensor_degree,
                           " to divide the sequence length ", c.seq),
                cat("use a tensor degree in ", divisors(c.seq), ", or a sequence length that it divides"));
  if (batch % s.data_degree != 0)
    throw Error("Gpt", cat("data degree ", s.data_degree, " does not divide the batch of ", batch),
                cat("use a batch that is a multiple of ", s.data_degree));
}

// The vocabulary padded to a multiple of the tensor degree.
constexpr std::int64_t padded_vocab(std::int64_t vocab, int tensor_degree) {
  return (vocab + tensor_degree - 1) / tensor_degree * tensor_degree;
}

// Called around each block's forward and backward (FSDP gathers the block's parameters there).
struct BlockHooks {
  virtual void before_forward(std::size_t) {}
  virtual void after_forward(std::size_t) {}
  virtual void before_backward(std::size_t) {}
  virtual void after_backward(std::size_t) {}
  virtual ~BlockHooks() = default;
};

template <Floating T, bool SP = false, recompute::Policy Recompute = recompute::None>
class Gpt {
 public:
  using A = typename stream<SP>::layout;
  using Enter = typename stream<SP>::enter;
  using Leave = typename stream<SP>::leave;

  GptConfig config;
  VocabParallelEmbedding<T> wte;  // (Vp, C), also the LM head
  PositionEmbedding<T, A> wpe;    // (T, C)
  std::vector<Block<T, SP, Recompute>> blocks;
  LayerNorm<T, A> ln_f;
  BlockHooks* hooks = nullptr;  // not owned

  Gpt(Host& dev, const GptConfig& c, const Spread& s, std::int64_t batch) : config((validate(c, s, SP, batch), c)) {
    wte = VocabParallelEmbedding<T>(dev, padded_vocab(c.vocab, s.tensor_degree), c.width, s, 0, c.seed, c.init_std);
    wpe = PositionEmbedding<T, A>(dev, c.seq, c.width, s, 1, c.seed, c.init_std / 2);
    blocks.reserve(static_cast<std::size_t>(c.layers));
    for (std::int64_t l = 0; l < c.layers; ++l)
      blocks.emplace_back(dev, c.width, c.heads, c.layers, s, static_cast<std::uint64_t>(16 + 16 * l), c.seed,
                          c.init_std);
    ln_f = LayerNorm<T, A>(dev, c.width, s, 8, c.seed);
  }

  // One forward and backward over tokens and targets (B/dp, T) of this data rank. Returns the mean
  // loss over the global batch (the same on every rank) and accumulates the gradients.
  // logits_out, when given, receives this rank's logits (B/dp, T, Vp/tp) Shard<-1>, padding included.
  // grad_scale multiplies every gradient (1/k when accumulating k micro-batches).
  template <AxisComms M>
  double forward_backward(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                          std::int64_t batch, M& mesh, std::vector<T>* logits_out = nullptr, double grad_scale = 1.0) {
    Host& dev = wte.weight.value.dev();
    const Spread s = wte.weight.value.spread();
    const std::int64_t Tn = config.seq, C = config.width, Bl = batch / s.data_degree, N = Bl * Tn;
    check_tokens(tokens, targets, N);
    const std::int64_t Vl = wte.rows(), begin = wte.begin();
    const std::int64_t valid = std::clamp<std::int64_t>(config.vocab - begin, 0, Vl);
    const Param<T, Layout<Replicate, Shard<0>>>& table = wte.weight;

    // Embeddings: the vocab-parallel lookup is Partial; the position rows are added after the reduction.
    typename VocabParallelEmbedding<T>::Ctx wte_ctx;
    auto x = Leave::forward(wte.forward(wte_ctx, tokens, batch, Tn), mesh);
    wpe.forward(x);

    std::vector<typename Block<T, SP, Recompute>::Ctx> ctx(blocks.size());
    for (std::size_t l = 0; l < blocks.size(); ++l) {
      if (hooks) hooks->before_forward(l);
      x = blocks[l].forward(ctx[l], x, mesh);
      if (hooks) hooks->after_forward(l);
    }
    typename LayerNorm<T, A>::Ctx lnf_ctx;
    auto xr = Enter::forward(ln_f.forward(lnf_ctx, x), mesh);  // (B, T, C) Replicate

    // LM head and vocab-parallel cross-entropy.
    std::vector<T> logits(static_cast<std::size_t>(N * Vl)), rowmax(static_cast<std::size_t>(N)),
        stats(static_cast<std::size_t>(2 * N));
    host::gemm<T>(host::Trans::no, host::Trans::yes, N, Vl, C, T(1), xr.data(), C, table.value.data(), C, T(0),
                  logits.data(), Vl);
    if (logits_out) *logits_out = logits;
    host::ce_row_max(rowmax.data(), logits.data(), N, Vl, valid);
    mesh.comm(Axis::tensor).all_reduce(std::span<T>(rowmax), ReduceOp::max);
    host::ce_row_stats(stats.data(), logits.data(), rowmax.data(), targets.data(), N, Vl, valid, begin);
    mesh.comm(Axis::tensor).all_reduce(std::span<T>(stats), ReduceOp::sum);
    std::vector<T> sumexp(static_cast<std::size_t>(N));
    double loss_sum = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const auto i = static_cast<std::size_t>(n);
      sumexp[i] = stats[2 * i];
      loss_sum += static_cast<double>(std::log(stats[2 * i]) + rowmax[i] - stats[2 * i + 1]);
    }
    std::vector<double> total{loss_sum};
    mesh.comm(Axis::data).all_reduce(std::span<double>(total));
    const double tokens_global = static_cast<double>(batch * Tn);

    // Backward.
    std::vector<T> dlogits(logits.size());
    host::ce_backward(dlogits.data(), logits.data(), rowmax.data(), sumexp.data(), targets.data(), N, Vl, valid, begin,
                      static_cast<T>(grad_scale / tokens_global));
    host::gemm<T>(host::Trans::yes, host::Trans::no, Vl, C, N, T(1), dlogits.data(), Vl, xr.data(), C, T(1),
                  wte.weight.grad.data(), C);
    auto dxr = Tensor<T, act::Partial, Host>::empty(dev, {batch, Tn, C}, s, Category::activations);
    host::gemm<T>(host::Trans::no, host::Trans::no, N, C, Vl, T(1), dlogits.data(), Vl, table.value.data(), C, T(0),
                  dxr.data(), C);
    const std::vector<T> lnf_before = SP ? snapshot_grads<T>(std::array{&ln_f.weight, &ln_f.bias}) : std::vector<T>{};
    auto dx = ln_f.backward(lnf_ctx, Enter::backward(dxr, mesh));
    if constexpr (SP) reduce_grad_increment<T>(std::array{&ln_f.weight, &ln_f.bias}, lnf_before, mesh);  // partial over sequence slices
    for (std::size_t l = blocks.size(); l-- > 0;) {
      if (hooks) hooks->before_backward(l);
      dx = blocks[l].backward(ctx[l], dx, mesh);
      if (hooks) hooks->after_backward(l);
    }

    // Position gradients: each rank adds its positions' rows (under SP a slice; reduced below).
    const std::vector<T> wpe_before = SP ? snapshot_grads<T>(std::array{&wpe.weight}) : std::vector<T>{};
    wpe.backward(dx);
    if constexpr (SP) reduce_grad_increment<T>(std::array{&wpe.weight}, wpe_before, mesh);
    wte.backward(wte_ctx, Leave::backward(dx, mesh));  // (B, T, C) Replicate
    return total[0] / tokens_global;
  }

  // f(name, param) for every parameter, in a fixed order (the same for every strategy).
  template <class F>
  void for_each_param(F&& f) {
    wte.for_each_param("wte", f);
    wpe.for_each_param("wpe", f);
    for (std::size_t l = 0; l < blocks.size(); ++l) blocks[l].for_each_param(cat("h", l), f);
    ln_f.for_each_param("ln_f", f);
  }

  void zero_grad() {
    wte.zero_grad();
    wpe.zero_grad();
    for (auto& b : blocks) b.zero_grad();
    ln_f.zero_grad();
  }

 private:
  void check_tokens(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                    std::int64_t N) const {
    if (static_cast<std::int64_t>(tokens.size()) != N || static_cast<std::int64_t>(targets.size()) != N)
      throw Error("Gpt::forward_backward",
                  cat(tokens.size(), " tokens and ", targets.size(), " targets for a local batch of ", N,
                      " positions"),
                  "pass (batch / data degree) x seq tokens and targets");
    for (std::int64_t i = 0; i < N; ++i) {
      const auto t = tokens[static_cast<std::size_t>(i)], y = targets[static_cast<std::size_t>(i)];
      if (t < 0 || t >= config.vocab || y < 0 || y >= config.vocab)
        throw Error("Gpt::forward_backward",
                    cat("token ", t, " or target ", y, " at position ", i, " is outside the vocabulary of ",
                        config.vocab),
                    "pass ids in [0, vocab)");
    }
  }
};

}  // namespace weft::nn
