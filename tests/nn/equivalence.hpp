// Runs a tiny Gpt (or any staged model: run_model) under a strategy and tensor degree, and gathers
// the loss and every global parameter value and gradient on the calling thread, for comparisons
// across strategies.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/gpt_step.hpp"
#include "support/gradcheck.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"

namespace weft::test {

struct GptRun {
  double loss = 0;
  std::map<std::string, std::vector<double>> values, grads;  // global, first `vocab` rows for wte
  threads::Counters tensor_ops;                              // what rank 0 ran on its tensor group
};

// vocab 65 is not a multiple of 2 or 4: the tensor-parallel runs pad it.
inline gpt2::Config tiny_config() {
  return {.vocab = 65, .seq = 16, .layers = 2, .heads = 4, .width = 32, .seed = 42, .init_std = 0.1};
}

template <class Config>
void tiny_batch(std::int64_t batch, const Config& c, std::vector<std::int32_t>& tokens,
                std::vector<std::int32_t>& targets) {
  tokens.resize(static_cast<std::size_t>(batch * c.seq));
  targets.resize(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(weft::philox(7, 1, i)[0] % static_cast<std::uint32_t>(c.vocab));
    targets[i] = static_cast<std::int32_t>(weft::philox(7, 2, i)[0] % static_cast<std::uint32_t>(c.vocab));
  }
}

// The device a thread rank runs on: a Host here; the GPU tests specialize it for Cuda (each rank a
// Cuda device with its own stream on the one GPU, its communicator moving device buffers).
template <class D>
std::unique_ptr<D> rank_device(ThreadComm& world);
template <>
inline std::unique_ptr<Host> rank_device<Host>(ThreadComm&) {
  return std::make_unique<Host>();
}

// A tensor's local elements as doubles, from any device.
template <class X>
std::vector<double> host_doubles(const X& t, std::int64_t n) {
  const auto h = t.to_host();
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(static_cast<float>(h[i]));
  if constexpr (std::same_as<typename X::value_type, double>)
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = h[i];
  return out;
}

// How many of a gathered tensor's elements are the model's: a language model's vocabulary tables
// ("wte", "lm_head") without their padding rows; every element elsewhere.
template <class C>
std::int64_t kept_elements(const C&, const std::string&, std::int64_t n) {
  return n;
}
template <class C>
  requires requires(const C& c) { c.vocab; }
std::int64_t kept_elements(const C& c, const std::string& name, std::int64_t n) {
  return name == "wte" || name == "lm_head" ? c.vocab * c.width : n;
}

// One forward and backward of any staged model (its device's ranks: rank_device) on `tensor`
// thread ranks, on the micro-batch mb (host memory, the whole batch); a language model's vocabulary
// tables ("wte", "lm_head") cut to the real vocabulary's rows.
template <class Model, class Batch>
GptRun run_model_on(int tensor, const typename Model::config_type& c, const Batch& mb) {
  using D = typename Model::device;
  GptRun out;
  std::mutex mu;
  run_threads(tensor, [&](ThreadComm& world) {
    auto dev = rank_device<D>(world);
    Mesh mesh{world, {.tensor = tensor}};
    Model model(*dev, c, mesh.spread(), mb.batch);
    const threads::Counters before = mesh.tensor().counters();
    auto ctx = model.in_flight(mb);
    pipeline::forward(model, ctx, mesh);
    pipeline::backward(model, ctx, mesh);
    const double loss = ctx.loss;
    const threads::Counters ran = mesh.tensor().counters() - before;
    model.for_each_param([&](const std::string& name, auto& p) {
      const auto v = redistribute<Replicated>(p.value, mesh);
      const auto g = redistribute<Replicated>(p.grad, mesh);
      if (world.rank() != 0) return;
      const std::int64_t n = kept_elements(c, name, v.numel());
      std::lock_guard lock(mu);
      out.values[name] = host_doubles(v, n);
      out.grads[name] = host_doubles(g, n);
    });
    if (world.rank() == 0) {
      std::lock_guard lock(mu);
      out.loss = loss;
      out.tensor_ops = ran;
    }
  });
  return out;
}

// The same for a language model on the tiny batch of `batch` sequences.
template <class Model>
GptRun run_model(int tensor, const typename Model::config_type& c, std::int64_t batch = 2) {
  std::vector<std::int32_t> tokens, targets;
  tiny_batch(batch, c, tokens, targets);
  return run_model_on<Model>(tensor, c, nn::MicroBatch{{tokens, targets}, batch});
}

template <class P, bool SP, class Recompute, class D = Host>
GptRun run_gpt(int tensor, const gpt2::Config& c = tiny_config(), std::int64_t batch = 2) {
  return run_model<gpt2::Model<P, SP, Recompute, D>>(tensor, c, batch);
}

// The worst relative error over the loss and every gradient; sizes must match.
inline double worst_error(const GptRun& a, const GptRun& ref, std::string* where = nullptr) {
  double worst = worse(0, std::fabs(a.loss - ref.loss) / std::fabs(ref.loss));  // a NaN loss: infinity
  if (where) *where = "loss";
  for (const auto& [name, g] : ref.grads) {
    const auto it = a.grads.find(name);
    if (it == a.grads.end() || it->second.size() != g.size()) return 1e300;
    const double e = rel_error(it->second, g);  // infinity on any non-finite value
    if (e > worst) {
      worst = e;
      if (where) *where = name;
    }
  }
  return worst;
}

}  // namespace weft::test
