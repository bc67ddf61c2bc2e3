// ZeRO stage 1 over the data axis, with AdamW (stage 2 and FSDP are optim::Zero2 and optim::Fsdp,
// fsdp.hpp).
//
// The flat parameter vector of a rank is every local parameter shard concatenated in
// for_each_param order (P elements), padded to a multiple of the data degree dp; data rank d owns
// elements [d S, (d + 1) S), S = padded P / dp. Per step:
//   stage 1: all-reduce the gradients over data (as DDP); take this rank's slice
// then the global gradient norm (each global element counted once: the slices are disjoint over
// data, and tensor-replicated parameters count on tensor rank 0), clipping, AdamW on the slice with
// state (m, v) for the slice only, and an all-gather of the updated slices into every rank's
// parameters. The optimizer state per rank is 2 S values instead of 2 P: about 1/dp.

#pragma once

#include <cmath>
#include <vector>

#include "weft/optim/optimizer.hpp"

namespace weft::optim {

template <class Model, int Stage>
class ZeroAdamW {
  static_assert(Stage == 1, "ZeroAdamW: stage must be 1; stages 2 and 3 are optim::Zero2 and optim::Fsdp (fsdp.hpp)");

 public:
  using Config = AdamWConfig;

  template <AxisComms M>
  ZeroAdamW(Model& model, Config c, M& mesh) : model_(&model), config_(c) {
    auto& data = mesh.comm(Axis::data);
    auto& tensor = mesh.comm(Axis::tensor);
    const Spread s{data.size(), tensor.size(), data.rank(), tensor.rank()};
    dp_ = s.data_degree;
    index_ = s.data_index;
    model.for_each_param([&](const std::string& name, auto& p) {
      using P = std::remove_cvref_t<decltype(p)>;
      const auto n = static_cast<std::size_t>(p.value.numel());
      decay_.insert(decay_.end(), n, decays(name, p) ? 1 : 0);
      count_.insert(count_.end(), n, replica_weight<typename P::layout>(Spread{1, s.tensor_degree, 0, s.tensor_index}) > 0 ? 1 : 0);
    });
    total_ = static_cast<std::int64_t>(decay_.size());
    shard_ = (total_ + dp_ - 1) / dp_;
    decay_.resize(static_cast<std::size_t>(shard_ * dp_), 0);
    count_.resize(decay_.size(), 0);
    Host& dev = first_param_device(model);
    state_ = dev.allocate(2 * shard_ * static_cast<std::int64_t>(sizeof(S)), Category::optimizer_state);
    std::fill_n(static_cast<S*>(state_.data()), 2 * shard_, S(0));
  }

  // Reduces the gradients, clips them to max_norm (0: no clipping), steps at lr and gathers the
  // parameters. Returns the global gradient norm before clipping.
  template <AxisComms M>
  double step(double lr, double max_norm, M& mesh) {
    ++t_;
    auto& data = mesh.comm(Axis::data);
    std::vector<E> flat(static_cast<std::size_t>(shard_ * dp_), E(0)), slice(static_cast<std::size_t>(shard_));
    pack_grads(flat);
    if constexpr (Stage == 1) {
      data.all_reduce(std::span<E>(flat));
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(index_ * shard_), shard_, slice.begin());
    } else {
      data.reduce_scatter(std::span<const E>(flat), std::span<E>(slice));
    }
    // The norm over disjoint slices (data) and tensor shards, each global element once.
    std::vector<double> sq{0.0};
    for (std::int64_t i = 0; i < shard_; ++i)
      if (count_[static_cast<std::size_t>(index_ * shard_ + i)])
        sq[0] += static_cast<double>(slice[static_cast<std::size_t>(i)]) * static_cast<double>(slice[static_cast<std::size_t>(i)]);
    mesh.comm(Axis::tensor).all_reduce(std::span<double>(sq));
    data.all_reduce(std::span<double>(sq));
    const double norm = std::sqrt(sq[0]);
    const double scale = (max_norm > 0 && norm > max_norm) ? max_norm / (norm + 1e-6) : 1.0;

    // AdamW on this rank's slice of the parameters.
    std::vector<E> params(static_cast<std::size_t>(shard_ * dp_), E(0));
    pack_values(params);
    const auto a = adamw_params<S>(config_, lr, t_);
    S* m = static_cast<S*>(state_.data());
    S* v = m + shard_;
    E* mine = params.data() + index_ * shard_;
    for (std::int64_t i = 0; i < shard_; ++i) {
      const auto g = static_cast<S>(static_cast<double>(slice[static_cast<std::size_t>(i)]) * scale);
      math::adamw_step(mine[i], g, m[i], v[i], a, decay_[static_cast<std::size_t>(index_ * shard_ + i)] != 0);
    }
    std::vector<E> gathered(params.size());
    data.all_gather(std::span<const E>(mine, static_cast<std::size_t>(shard_)), std::span<E>(gathered));
    unpack_values(gathered);
    return norm;
  }

  std::int64_t shard_elements() const { return shard_; }

 private:
  using E = typename std::remove_cvref_t<decltype(std::declval<Model&>().wte.weight.value)>::value_type;
  using S = state_t<E>;

  static Host& first_param_device(Model& model) { return model.wte.weight.value.dev(); }

  void pack_grads(std::vector<E>& flat) {
    std::size_t at = 0;
    model_->for_each_param([&](const std::string&, auto& p) {
      std::copy_n(p.grad.data(), p.grad.numel(), flat.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<std::size_t>(p.grad.numel());
    });
  }
  void pack_values(std::vector<E>& flat) {
    std::size_t at = 0;
    model_->for_each_param([&](const std::string&, auto& p) {
      std::copy_n(p.value.data(), p.value.numel(), flat.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<std::size_t>(p.value.numel());
    });
  }
  void unpack_values(const std::vector<E>& flat) {
    std::size_t at = 0;
    model_->for_each_param([&](const std::string&, auto& p) {
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), p.value.numel(), p.value.data());
      at += static_cast<std::size_t>(p.value.numel());
    });
  }

  Model* model_;
  Config config_;
  int dp_ = 1, index_ = 0;
  std::int64_t total_ = 0, shard_ = 0, t_ = 0;
  std::vector<unsigned char> decay_, count_;  // per flat element: weight decay; counted in the norm
  Allocation state_;                          // m, then v, for this rank's slice
};

}  // namespace weft::optim
