// Optimizers over a model's parameters (anything with for_each_param(f), visited in a fixed order):
// AdamW with decoupled weight decay and SGD with momentum; parameter groups; global-norm clipping
// that counts every global element exactly once; data-parallel gradient reduction (DDP) in buckets.
//
// State lives beside each parameter shard, in the parameter's layout, counted as optimizer_state:
// float for float parameters (the training path), double for double parameters (the host's
// checking path, so that strategies agree to 1e-12).
//
// Parameter groups (as in GPT-2 and nanoGPT): weight decay applies to the matrices of Linear layers;
// biases, LayerNorm parameters and the embeddings (wte, wpe) are not decayed.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "weft/layout/redistribute.hpp"
#include "weft/nn/param.hpp"
#include "weft/ops/math.hpp"

namespace weft::optim {

template <class T>
using state_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Whether a parameter is weight-decayed: Linear matrices only.
template <class P>
bool decays(const std::string& name, const P& p) {
  return p.value.global_shape().rank() >= 2 && name != "wte" && name != "wpe";
}

// How many times the elements of a parameter with layout L are counted when local values are summed
// over every rank of a data x tensor mesh: once per replica. Returns this rank's weight (1 or 0) so
// that the sum counts each global element exactly once: a Replicate axis counts only its rank 0.
template <LayoutType L>
double replica_weight(const Spread& s) {
  const bool tensor_rep = !IsShard<typename L::tensor>, data_rep = !IsShard<typename L::data>;
  return ((tensor_rep && s.tensor_index != 0) || (data_rep && s.data_index != 0)) ? 0.0 : 1.0;
}

// The global L2 norm of every gradient, each global element counted once (replicated LayerNorm
// weights once, not once per tensor rank; the tied embedding once). Same value on every rank.
// Requires: gradients already reduced over the data axis (replicated there), or sharded there.
template <class Model, AxisComms M>
double grad_norm(Model& model, M& mesh) {
  std::vector<double> sq{0.0};
  model.for_each_param([&](const std::string&, auto& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    const double w = replica_weight<typename P::layout>(p.grad.spread());
    if (w == 0.0) return;
    for (std::int64_t i = 0; i < p.grad.numel(); ++i) sq[0] += static_cast<double>(p.grad[i]) * static_cast<double>(p.grad[i]);
  });
  mesh.comm(Axis::tensor).all_reduce(std::span<double>(sq));
  mesh.comm(Axis::data).all_reduce(std::span<double>(sq));
  return std::sqrt(sq[0]);
}

// Scales every gradient so that the global norm is at most max_norm; returns the norm before.
template <class Model, AxisComms M>
double clip_grad_norm(Model& model, M& mesh, double max_norm) {
  const double norm = grad_norm(model, mesh);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    model.for_each_param([&](const std::string&, auto& p) {
      using T = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
      for (std::int64_t i = 0; i < p.grad.numel(); ++i) p.grad[i] = static_cast<T>(static_cast<double>(p.grad[i]) * scale);
    });
  }
  return norm;
}

// DDP: sums every gradient over the data axis in buckets of about `bucket_bytes`, in parameter
// order (E is the gradients' element type). After it, gradients are replicated over data.
template <Element E, class Model, AxisComms M>
void reduce_gradients(Model& model, M& mesh, std::int64_t bucket_bytes = 25 << 20) {
  auto& comm = mesh.comm(Axis::data);
  if (comm.size() == 1) return;
  std::vector<E> bucket;
  std::vector<std::pair<E*, std::int64_t>> members;  // the gradients packed in the current bucket
  auto flush = [&] {
    if (bucket.empty()) return;
    comm.all_reduce(std::span<E>(bucket));
    const E* at = bucket.data();
    for (auto [ptr, n] : members) {
      std::copy(at, at + n, ptr);
      at += n;
    }
    members.clear();
    bucket.clear();
  };
  model.for_each_param([&](const std::string&, auto& p) {
    static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(p.grad)>::value_type, E>,
                  "reduce_gradients: a gradient's element type differs from E; pass the model's element type");
    bucket.insert(bucket.end(), p.grad.data(), p.grad.data() + p.grad.numel());
    members.emplace_back(p.grad.data(), p.grad.numel());
    if (static_cast<std::int64_t>(bucket.size() * sizeof(E)) >= bucket_bytes) flush();
  });
  flush();
}

struct AdamWConfig {
  double lr = 6e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// The per-step constants of AdamW at step t (1-based) and learning rate lr, in state type S.
template <class S>
math::AdamWParams<S> adamw_params(const AdamWConfig& c, double lr, std::int64_t t) {
  return {static_cast<S>(lr), static_cast<S>(c.beta1), static_cast<S>(c.beta2), static_cast<S>(c.eps),
          static_cast<S>(c.weight_decay), static_cast<S>(1 - std::pow(c.beta1, static_cast<double>(t))),
          static_cast<S>(1 - std::pow(c.beta2, static_cast<double>(t)))};
}

// AdamW over every parameter of a model.
template <class Model>
class AdamW {
 public:
  using Config = AdamWConfig;

  AdamW(Model& model, Config c) : model_(&model), config_(c) {
    model.for_each_param([&](const std::string&, auto& p) {
      using S = state_t<typename std::remove_cvref_t<decltype(p.value)>::value_type>;
      const auto n = static_cast<std::size_t>(p.value.numel());
      states_.push_back({p.value.dev().allocate(static_cast<std::int64_t>(2 * n * sizeof(S)), Category::optimizer_state), n});
      std::fill_n(static_cast<S*>(states_.back().mem.data()), 2 * n, S(0));
    });
  }

  // One step at learning rate lr (the schedule's value for this step).
  void step(double lr) {
    ++t_;
    std::size_t i = 0;
    model_->for_each_param([&](const std::string& name, auto& p) {
      using P = typename std::remove_cvref_t<decltype(p.value)>::value_type;
      using S = state_t<P>;
      const auto a = adamw_params<S>(config_, lr, t_);
      S* m = static_cast<S*>(states_[i].mem.data());
      S* v = m + states_[i].n;
      const bool decay = decays(name, p);
      for (std::int64_t k = 0; k < p.value.numel(); ++k)
        math::adamw_step(p.value[k], static_cast<S>(p.grad[k]), m[k], v[k], a, decay);
      ++i;
    });
  }
  std::int64_t steps() const { return t_; }

 private:
  struct State {
    Allocation mem;  // m then v
    std::size_t n;
  };
  Model* model_;
  Config config_;
  std::vector<State> states_;
  std::int64_t t_ = 0;
};

// SGD with momentum (PyTorch's form: buf = momentum buf + g; p -= lr (buf + wd p) for decayed params).
template <class Model>
class Sgd {
 public:
  struct Config {
    double lr = 0.1, momentum = 0.9, weight_decay = 0;
  };
  Sgd(Model& model, Config c) : model_(&model), config_(c) {
    model.for_each_param([&](const std::string&, auto& p) { buffers_.emplace_back(static_cast<std::size_t>(p.value.numel()), 0.0); });
  }
  void step(double lr) {
    std::size_t i = 0;
    model_->for_each_param([&](const std::string& name, auto& p) {
      auto& buf = buffers_[i++];
      const bool decay = decays(name, p);
      for (std::int64_t k = 0; k < p.value.numel(); ++k) {
        double g = static_cast<double>(p.grad[k]);
        if (decay) g += config_.weight_decay * static_cast<double>(p.value[k]);
        buf[static_cast<std::size_t>(k)] = config_.momentum * buf[static_cast<std::size_t>(k)] + g;
        p.value[k] = static_cast<std::remove_cvref_t<decltype(p.value[k])>>(static_cast<double>(p.value[k]) - lr * buf[static_cast<std::size_t>(k)]);
      }
    });
  }

 private:
  Model* model_;
  Config config_;
  std::vector<std::vector<double>> buffers_;
};

}  // namespace weft::optim
