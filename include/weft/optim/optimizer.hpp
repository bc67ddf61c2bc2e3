// Update rules (AdamW with decoupled weight decay, SGD with momentum) and parameter groups. A rule
// holds its hyper-parameters and runs its device operation (ops::Update<D>::adamw, ops::Update<D>::sgd) on a range
// of a unit's flat buffers: the data-parallel protocol (data_parallel.hpp) calls it on whatever
// range a rank updates, the same operation for DDP, ZeRO and FSDP.
//
// State is kept in S = state_t<T>: float for float (and later bf16) parameters, double for double
// parameters (the host's checking path, so that strategies agree to 1e-12).
//
// Parameter groups: each layer declares whether its parameters are weight-decayed (nn::Decay in
// nn/param.hpp). weft's layers follow GPT-2 and nanoGPT: the matrices of Linear layers are decayed;
// biases, LayerNorm parameters and embedding tables (wte, wpe) are not.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "weft/nn/unit.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/math.hpp"

namespace weft::optim {

template <class T>
using state_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Whether a parameter is weight-decayed: as its layer declared it (nn::Decay), or as the model
// overrode that (nn::Unit::set_decay). No name or shape decides it.
inline bool decays(const nn::UnitEntry& e) { return e.decay; }

struct AdamWConfig {
  double lr = 6e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// The per-step constants of AdamW at step t (1-based) and learning rate lr, in state type S.
template <class S>
math::AdamWParams<S> adamw_params(const AdamWConfig& c, double lr, std::int64_t t) {
  return {static_cast<S>(lr),
          static_cast<S>(c.beta1),
          static_cast<S>(c.beta2),
          static_cast<S>(c.eps),
          static_cast<S>(c.weight_decay),
          static_cast<S>(1 - std::pow(c.beta1, static_cast<double>(t))),
          static_cast<S>(1 - std::pow(c.beta2, static_cast<double>(t)))};
}

// A range of a unit's flat buffers for an update rule: parameters (or master weights), gradients,
// the rule's N state buffers, the length, and whether it is weight-decayed.
template <class P, class S, int N>
struct Piece {
  P* p;
  const P* g;
  std::array<S*, N> state;
  std::int64_t n;
  bool decay;
};

// AdamW (PyTorch's): two state tensors per parameter, the first and second moments.
struct AdamW {
  static constexpr const char* name = "adamw";
  static constexpr int states = 2;
  static constexpr std::array<const char*, 2> state_names{"exp_avg", "exp_avg_sq"};
  AdamWConfig config;

  // One step (t, 1-based) over n elements; the gradient is g times grad_scale (the clipping factor).
  template <class D, class T, class S>
  void update(D& dev, T* p, const T* g, std::array<S*, 2> state, std::int64_t n, double grad_scale, double lr,
              std::int64_t t, bool decay) const {
    ops::Update<D>::adamw(dev, p, g, state[0], state[1], n, adamw_params<S>(config, lr, t), decay, grad_scale);
  }
  // Every range of a step at once (one launch on a GPU; the same per-element results).
  template <class D, class T, class S>
  void update_many(D& dev, std::span<const Piece<T, S, 2>> pieces, double grad_scale, double lr, std::int64_t t) const {
    ops::Update<D>::adamw_many(dev, pieces, adamw_params<S>(config, lr, t), grad_scale);
  }
};

// SGD with momentum (PyTorch's form): buf = momentum buf + g (+ wd p where decayed); p -= lr buf.
struct Sgd {
  static constexpr const char* name = "sgd";
  static constexpr int states = 1;
  static constexpr std::array<const char*, 1> state_names{"momentum_buffer"};
  double momentum = 0.9, weight_decay = 0;

  template <class D, class T, class S>
  void update(D& dev, T* p, const T* g, std::array<S*, 1> state, std::int64_t n, double grad_scale, double lr,
              std::int64_t, bool decay) const {
    ops::Update<D>::sgd(dev, p, g, state[0], n, lr, momentum, weight_decay, decay, grad_scale);
  }
};

template <class R>
concept UpdateRule = requires {
  { R::states } -> std::convertible_to<int>;
  R::state_names;
};

}  // namespace weft::optim
