// ZeRO-2 and FSDP (ZeRO-3) over the data axis, with AdamW: Sharded<Model, Mesh, Stage>.
//
// Stage 2 keeps every parameter whole on every rank but shards gradients and optimizer state:
// each unit's full gradients exist only during its backward, then are reduce-scattered into the
// slice; after the update the slices are all-gathered into the parameters. Stage 3 (FSDP) shards
// the parameters too, as below.
//
// Parameters are grouped in units: one per block, and one for the rest (embeddings, final
// LayerNorm). Each unit's parameters are flattened (for_each_param order), padded to a multiple of
// the data degree dp, and data rank d keeps only its slice: values, gradients and AdamW state for
// 1/dp of the unit. A block's full parameters exist only while it runs: gathered (all-gather) just
// before its forward and freed after it, gathered again before its backward, whose full gradients
// are then reduce-scattered into the slice and freed. The rest-unit is gathered for the whole
// forward and backward (the embedding is used at both ends). Parameter memory per rank is therefore
// about P / dp plus the rest-unit plus one block.
//
// Use: s.zero_grad(); for each micro-batch { s.begin(); gpt.forward_backward(...); s.end(); }
// s.step(lr, clip). The model's own zero_grad() must not be called: outside a unit's window its
// gradient (and, in stage 3, parameter) tensors are views of nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "weft/nn/gpt.hpp"
#include "weft/optim/optimizer.hpp"

namespace weft::optim {

template <class Model, AxisComms M, int Stage>
class Sharded final : public nn::BlockHooks {
  static_assert(Stage == 2 || Stage == 3, "Sharded: stage 2 (ZeRO-2) or 3 (FSDP); stage 1 is ZeroAdamW");
  static constexpr bool shard_params = Stage == 3;

  using E = typename std::remove_cvref_t<decltype(std::declval<Model&>().wte.weight.value)>::value_type;
  using S = state_t<E>;

 public:
  using Config = AdamWConfig;

  Sharded(Model& model, Config c, M& mesh) : model_(&model), mesh_(&mesh), config_(c), dev_(&model.wte.weight.value.dev()) {
    auto& data = mesh.comm(Axis::data);
    auto& tensor = mesh.comm(Axis::tensor);
    dp_ = data.size();
    index_ = data.rank();
    tensor_index_ = tensor.rank();
    units_.resize(model.blocks.size() + 1);
    for (std::size_t l = 0; l < model.blocks.size(); ++l)
      model.blocks[l].for_each_param(cat("h", l), [&](const std::string& n, auto& p) { add(units_[l], n, p); });
    Unit& rest = units_.back();
    model.wte.for_each_param("wte", [&](const std::string& n, auto& p) { add(rest, n, p); });
    model.wpe.for_each_param("wpe", [&](const std::string& n, auto& p) { add(rest, n, p); });
    model.ln_f.for_each_param("ln_f", [&](const std::string& n, auto& p) { add(rest, n, p); });
    for (Unit& u : units_) shard(u);
    model.hooks = this;
  }
  ~Sharded() override {
    if (model_->hooks == this) model_->hooks = nullptr;
  }

  void zero_grad() {
    for (Unit& u : units_) std::fill_n(static_cast<E*>(u.grad_shard.data()), u.shard, E(0));
  }
  // Around each micro-batch's forward_backward.
  void begin() { gather(units_.back(), true); }
  void end() { scatter_grads(units_.back()); }

  // Clipping by the global norm, AdamW on every slice; returns the norm before clipping.
  double step(double lr, double max_norm) {
    ++t_;
    std::vector<double> sq{0.0};
    for (Unit& u : units_) {
      const E* g = static_cast<const E*>(u.grad_shard.data());
      for (std::int64_t i = 0; i < u.shard; ++i)
        if (u.count[static_cast<std::size_t>(index_ * u.shard + i)])
          sq[0] += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    }
    mesh_->comm(Axis::tensor).all_reduce(std::span<double>(sq));
    mesh_->comm(Axis::data).all_reduce(std::span<double>(sq));
    const double norm = std::sqrt(sq[0]);
    const double scale = (max_norm > 0 && norm > max_norm) ? max_norm / (norm + 1e-6) : 1.0;
    const auto a = adamw_params<S>(config_, lr, t_);
    for (Unit& u : units_) {
      E* p = static_cast<E*>(u.value_shard.data());
      const E* g = static_cast<const E*>(u.grad_shard.data());
      S* m = static_cast<S*>(u.state.data());
      S* v = m + u.shard;
      for (std::int64_t i = 0; i < u.shard; ++i)
        math::adamw_step(p[i], static_cast<S>(static_cast<double>(g[i]) * scale), m[i], v[i], a,
                         u.decay[static_cast<std::size_t>(index_ * u.shard + i)] != 0);
      if constexpr (!shard_params) {  // ZeRO-2: every rank's parameters get every updated slice
        std::vector<E> full(static_cast<std::size_t>(u.shard * dp_));
        mesh_->comm(Axis::data).all_gather(std::span<const E>(p, static_cast<std::size_t>(u.shard)), std::span<E>(full));
        std::int64_t at = 0;
        for (Slot& s : u.slots) {
          std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(at), s.n, s.values);
          at += s.n;
        }
      }
    }
    return norm;
  }

  // Gathers every unit's parameters (values and gradients) and leaves them bound, for inspection
  // through the model's for_each_param; release() undoes it.
  void materialize() {
    for (Unit& u : units_) gather(u, true, /*with_shard_grads=*/true);
  }
  void release() {
    for (Unit& u : units_) drop(u);
  }

  void before_forward(std::size_t l) override { gather(units_[l], false); }
  void after_forward(std::size_t l) override { drop(units_[l]); }
  void before_backward(std::size_t l) override { gather(units_[l], true); }
  void after_backward(std::size_t l) override { scatter_grads(units_[l]); }

 private:
  struct Slot {
    std::function<void(E*, E*)> bind;  // points the parameter's value (stage 3) and gradient at buffers
    std::int64_t n;
    E* values;  // stage 2: the parameter's own (whole) values
  };
  struct Unit {
    std::vector<Slot> slots;
    std::vector<E> initial;                     // the values at construction, until sharded
    std::vector<unsigned char> decay, count;    // per padded element
    std::int64_t total = 0, shard = 0;
    Allocation value_shard, grad_shard, state;  // this rank's slice
    Allocation full_value, full_grad;           // while gathered
  };

  template <class P>
  void add(Unit& u, const std::string& name, P& p) {
    using TT = std::remove_cvref_t<decltype(p.value)>;
    const auto n = p.value.numel();
    u.initial.insert(u.initial.end(), p.value.data(), p.value.data() + n);
    u.decay.insert(u.decay.end(), static_cast<std::size_t>(n), decays(name, p) ? 1 : 0);
    const bool counted = IsShard<typename P::layout::tensor> || tensor_index_ == 0;
    u.count.insert(u.count.end(), static_cast<std::size_t>(n), counted ? 1 : 0);
    Host* dev = dev_;
    u.slots.push_back({[&p, dev](E* v, E* g) {
                         const Shape shape = p.value.global_shape();
                         const Spread spread = p.value.spread();
                         if constexpr (shard_params) p.value = TT::view(*dev, v, shape, spread);
                         p.grad = TT::view(*dev, g, shape, spread);
                       },
                       n, p.value.data()});
    u.total += n;
  }

  void shard(Unit& u) {
    u.shard = (u.total + dp_ - 1) / dp_;
    const auto padded = static_cast<std::size_t>(u.shard * dp_);
    u.initial.resize(padded, E(0));
    u.decay.resize(padded, 0);
    u.count.resize(padded, 0);
    const auto bytes = u.shard * static_cast<std::int64_t>(sizeof(E));
    u.value_shard = dev_->allocate(bytes, Category::parameters);
    u.grad_shard = dev_->allocate(bytes, Category::gradients);
    u.state = dev_->allocate(2 * u.shard * static_cast<std::int64_t>(sizeof(S)), Category::optimizer_state);
    std::copy_n(u.initial.begin() + static_cast<std::ptrdiff_t>(index_ * u.shard), u.shard, static_cast<E*>(u.value_shard.data()));
    std::fill_n(static_cast<E*>(u.grad_shard.data()), u.shard, E(0));
    std::fill_n(static_cast<S*>(u.state.data()), 2 * u.shard, S(0));
    u.initial = {};
    drop(u);  // frees the layers' own full tensors: from now on they are views
  }

  void bind(Unit& u, E* values, E* grads) {
    std::int64_t at = 0;
    for (Slot& s : u.slots) {
      s.bind(values ? values + at : nullptr, grads ? grads + at : nullptr);
      at += s.n;
    }
  }

  void gather(Unit& u, bool with_grads, bool with_shard_grads = false) {
    auto& data = mesh_->comm(Axis::data);
    const std::int64_t padded = u.shard * dp_;
    if (!shard_params && !with_grads) return;  // stage 2: the values are always there
    if constexpr (shard_params) {
      u.full_value = dev_->allocate(padded * static_cast<std::int64_t>(sizeof(E)), Category::parameters);
      data.all_gather(std::span<const E>(static_cast<const E*>(u.value_shard.data()), static_cast<std::size_t>(u.shard)),
                      std::span<E>(static_cast<E*>(u.full_value.data()), static_cast<std::size_t>(padded)));
    }
    if (with_grads) {
      u.full_grad = dev_->allocate(padded * static_cast<std::int64_t>(sizeof(E)), Category::gradients);
      E* g = static_cast<E*>(u.full_grad.data());
      if (with_shard_grads)  // for inspection: the reduced gradient slices, gathered
        data.all_gather(std::span<const E>(static_cast<const E*>(u.grad_shard.data()), static_cast<std::size_t>(u.shard)),
                        std::span<E>(g, static_cast<std::size_t>(padded)));
      else
        std::fill_n(g, padded, E(0));
    }
    bind(u, static_cast<E*>(u.full_value.data()), with_grads ? static_cast<E*>(u.full_grad.data()) : nullptr);
  }

  void scatter_grads(Unit& u) {
    std::vector<E> slice(static_cast<std::size_t>(u.shard));
    mesh_->comm(Axis::data).reduce_scatter(
        std::span<const E>(static_cast<const E*>(u.full_grad.data()), static_cast<std::size_t>(u.shard * dp_)),
        std::span<E>(slice));
    E* g = static_cast<E*>(u.grad_shard.data());
    for (std::int64_t i = 0; i < u.shard; ++i) g[i] += slice[static_cast<std::size_t>(i)];
    drop(u);
  }

  void drop(Unit& u) {
    bind(u, nullptr, nullptr);
    u.full_value.reset();
    u.full_grad.reset();
  }

  Model* model_;
  M* mesh_;
  Config config_;
  Host* dev_;
  int dp_ = 1, index_ = 0, tensor_index_ = 0;
  std::vector<Unit> units_;
  std::int64_t t_ = 0;
};

template <class Model, AxisComms M>
using Zero2 = Sharded<Model, M, 2>;
template <class Model, AxisComms M>
using Fsdp = Sharded<Model, M, 3>;

}  // namespace weft::optim
