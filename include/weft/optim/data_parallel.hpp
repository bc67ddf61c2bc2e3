// Data parallelism as one protocol over a model's units, the strategy a layout type.
//
// DataLayout<Params, Grads, State> says how each unit's parameters, gradients and optimizer state
// lie on the data axis: Replicate (every data rank holds all of it) or Shard<0> (data rank d holds
// elements [d S, (d + 1) S) of the unit's flat buffer, S = padded / dp):
//
//   strategy   params     grads      state      per step, per unit
//   Ddp        Replicate  Replicate  Replicate  all-reduce grads as the unit's backward ends; update all
//   Zero1      Replicate  Replicate  Shard<0>   all-reduce grads; update the slice; all-gather values
//   Zero2      Replicate  Shard<0>   Shard<0>   full grads only during the unit's backward, then
//                                               reduce-scatter into the slice; update; all-gather values
//   Fsdp       Shard<0>   Shard<0>   Shard<0>   values gathered just before the unit's stage and freed
//                                               after it; grads as Zero2; update the slice in place
//
// The executor (pipeline/executor.hpp) calls acquire() before a stage uses a unit and release()
// after its last use in a pass; step() then
//   1. all-reduces, over the tensor axis, the gradients whose layout is Partial there (sequence-
//      parallel LayerNorm and position gradients): one collective for the whole model;
//   2. takes the global gradient norm, each global element counted once: every data rank sums its
//      slice of each unit, and tensor-replicated entries count on tensor rank 0 only (parameters
//      moved by a sign step, nn::SignStep, not at all: their buffers hold loads, not gradients);
//   3. skips the update on every rank when the norm is not finite (an Inf or NaN anywhere in the
//      gradients: the norm is the same number everywhere, so is the decision), counting the skip;
//   4. applies the update rule (optimizer.hpp) to the range of each unit this rank owns, with the
//      clipping factor folded into the gradient (a SignStep parameter's range: p -= rate sign(g)
//      instead), and gathers the values where the strategy keeps them whole.
//
// Mixed precision (Precision<bf16, float>): gradients are f32 in every buffer and collective; the
// rank keeps f32 master weights for the range it updates (sharded with the optimizer state, as
// ZeRO does), updates them, and rounds them once into the bf16 values that are gathered.
// Every buffer (slices, gathered units, state, transfer space) comes from the device allocator.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "weft/comm/redistribute.hpp"
#include "weft/optim/optimizer.hpp"
#include "weft/pipeline/executor.hpp"

namespace weft::optim {

template <class P>
concept DataPlacement = IsReplicate<P> || std::same_as<P, Shard<0>>;

template <class Params, class Grads, class State>
struct DataLayout {
  static_assert(DataPlacement<Params> && DataPlacement<Grads> && DataPlacement<State>,
                "DataLayout: each placement over the data axis must be Replicate or Shard<0> (of the unit's flat "
                "buffer)");
  static_assert(!(IsShard<Params> && IsReplicate<Grads>),
                "DataLayout: sharded parameters need sharded gradients (each rank updates only its slice); use "
                "Shard<0> for the gradients");
  static_assert(!(IsShard<Grads> && IsReplicate<State>),
                "DataLayout: sharded gradients need sharded optimizer state (a rank has only its slice of the "
                "gradient to update with); use Shard<0> for the state");
  using params = Params;
  using grads = Grads;
  using state = State;
  static std::string name() {
    return cat("DataLayout<", Params::name(), ", ", Grads::name(), ", ", State::name(), ">");
  }
};

using Ddp = DataLayout<Replicate, Replicate, Replicate>;
using Zero1 = DataLayout<Replicate, Replicate, Shard<0>>;
using Zero2 = DataLayout<Replicate, Shard<0>, Shard<0>>;
using Fsdp = DataLayout<Shard<0>, Shard<0>, Shard<0>>;

template <class Strategy, UpdateRule Rule, Element T, AxisComms M, class D = Host>
class DataParallel {
  static constexpr bool shard_params = IsShard<typename Strategy::params>;
  static constexpr bool shard_grads = IsShard<typename Strategy::grads>;
  static constexpr bool shard_state = IsShard<typename Strategy::state>;
  using S = state_t<T>;
  using G = master_t<T>;  // gradients and master weights
  static constexpr bool mixed = !std::same_as<T, G>;
  static_assert(std::same_as<S, G>, "DataParallel: the optimizer state type must be the master type");
  using Unit = nn::Unit<T, D>;
  using Pass = pipeline::Pass;

 public:
  using rule_type = Rule;
  DataParallel(std::span<Unit> units, Rule rule, M& mesh) : units_(units), rule_(rule), mesh_(&mesh) {
    tensor_degree_ = mesh.comm(Axis::tensor).size();
    tensor_index_ = mesh.comm(Axis::tensor).rank();
    held_.resize(units.size());
    for (std::size_t i = 0; i < units.size(); ++i) {
      Unit& u = units[i];
      Held& h = held_[i];
      h.experts = u.experts();
      h.dp = group(i).size();
      h.index = group(i).rank();
      if (u.padded() % h.dp != 0)
        throw Error("DataParallel",
                    cat("unit ", u.name(), " has ", u.padded(), " elements, not a multiple of the ",
                        h.experts ? "expert-data" : "data", " degree ", h.dp),
                    "build the model with the spread of the mesh it trains on");
      h.shard = u.padded() / h.dp;
      const std::int64_t n = shard_state ? h.shard : u.padded();
      h.state = dev().allocate(Rule::states * n * static_cast<std::int64_t>(sizeof(S)), Category::optimizer_state);
      ops::Memory<D>::zero(dev(), static_cast<S*>(h.state.data()), Rule::states * n);
      if constexpr (shard_grads) {
        h.grad_slice = dev().allocate(h.shard * static_cast<std::int64_t>(sizeof(G)), Category::gradients);
        ops::Memory<D>::zero(dev(), static_cast<G*>(h.grad_slice.data()), h.shard);
        u.grad_buffer().reset();
      }
      if constexpr (mixed) {  // the f32 master weights of the range this rank updates
        h.master = dev().allocate(n * static_cast<std::int64_t>(sizeof(G)), Category::master_weights);
        ops::Memory<D>::convert(dev(), static_cast<G*>(h.master.data()),
                                u.values() + (shard_state ? h.index * h.shard : 0), n);
      }
      if constexpr (shard_params) {
        h.value_slice = dev().allocate(h.shard * static_cast<std::int64_t>(sizeof(T)), Category::parameters);
        ops::Memory<D>::copy(dev(), slice_values(i), u.values() + h.index * h.shard, h.shard);
        u.value_buffer().reset();
      }
      u.rebind();
    }
  }

  void zero_grad() {
    for (std::size_t i = 0; i < units_.size(); ++i) {
      units_[i].zero_grad();
      if (held_[i].grad_slice.data())
        ops::Memory<D>::zero(dev(), static_cast<G*>(held_[i].grad_slice.data()), held_[i].shard);
    }
  }

  // Before a stage of `pass` uses unit u.
  void acquire(std::size_t u, Pass pass) {
    Unit& unit = units_[u];
    bool moved = false;
    if constexpr (shard_params) {
      if (pass != Pass::weight && !unit.values()) {
        unit.value_buffer() =
            dev().allocate(unit.padded() * static_cast<std::int64_t>(sizeof(T)), Category::parameters);
        group(u).all_gather(std::span<const T>(slice_values(u), static_cast<std::size_t>(held_[u].shard)),
                            std::span<T>(unit.values(), static_cast<std::size_t>(unit.padded())));
        moved = true;
      }
    }
    if constexpr (shard_grads) {
      if (pass != Pass::forward && !unit.grads()) {
        unit.grad_buffer() = dev().allocate(unit.padded() * static_cast<std::int64_t>(sizeof(G)), Category::gradients);
        unit.zero_grad();
        moved = true;
      }
    }
    if (moved) unit.rebind();
  }

  // After the last stage of `pass` that uses unit u; last: no micro-batch follows before step().
  void release(std::size_t u, Pass pass, bool last) {
    Unit& unit = units_[u];
    if (pass != Pass::forward) {
      if constexpr (shard_grads) {
        const std::int64_t n = held_[u].shard;
        Allocation part = dev().allocate(n * static_cast<std::int64_t>(sizeof(G)), Category::communication);
        G* mine = static_cast<G*>(part.data());
        group(u).reduce_scatter(std::span<const G>(unit.grads(), static_cast<std::size_t>(unit.padded())),
                                std::span<G>(mine, static_cast<std::size_t>(n)));
        ops::Memory<D>::add(dev(), static_cast<G*>(held_[u].grad_slice.data()), static_cast<const G*>(mine), n);
        unit.grad_buffer().reset();
      } else if (last && held_[u].dp > 1) {
        group(u).all_reduce(std::span<G>(unit.grads(), static_cast<std::size_t>(unit.padded())));
      }
    }
    if constexpr (shard_params) unit.value_buffer().reset();
    unit.rebind();
  }

  // Reduces what is left to reduce, clips to max_norm (0: no clipping), updates at learning rate lr.
  // Returns the global gradient norm before clipping (the same on every rank). A norm that is not
  // finite skips the update on every rank (skipped() counts them; the step count does not advance).
  double step(double lr, double max_norm) {
    reduce_tensor_partials();
    // Every range this rank counts, in unit and entry order, summed by one call (one wait on a GPU).
    std::vector<std::pair<const G*, std::int64_t>> counted;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (tied_ && *tied_ == u && tied_copy_) continue;  // the tied table counts once, on the embedding's rank
      const std::int64_t lo = held_[u].index * held_[u].shard;
      const G* g = grads_from(u, lo);
      for_each_piece(u, lo, held_[u].shard, [&](const nn::UnitEntry& e, std::int64_t a, std::int64_t n) {
        if (!e.sign_step && (e.tensor_sharded || tensor_index_ == 0)) counted.emplace_back(g + (a - lo), n);
      });
    }
    std::array<double, 1> sq{
        ops::Norm<D>::sum_squares_many(dev(), std::span<const std::pair<const G*, std::int64_t>>(counted))};
    // An expert unit's slices over its expert-data group, with the other expert groups' experts,
    // tile the data x context group as the other units' slices do: each element counted once.
    mesh_->comm(Axis::tensor).all_reduce(std::span<double>(sq));
    gradient_group(*mesh_).all_reduce(std::span<double>(sq));
    if (mesh_->comm(Axis::pipe).size() > 1) mesh_->comm(Axis::pipe).all_reduce(std::span<double>(sq));
    const double norm = std::sqrt(sq[0]);
    if (!std::isfinite(norm)) {
      ++skipped_;
      return norm;
    }
    ++t_;
    const double scale = (max_norm > 0 && norm > max_norm) ? max_norm / (norm + 1e-6) : 1.0;

    // The update of every range this rank owns: one call for the whole step where the rule takes
    // them all at once (AdamW), else range by range.
    // The parameters moved by a sign step (nn::SignStep: routing biases) take it here instead.
    std::vector<Piece<G, S, Rule::states>> pieces;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const auto [lo, n] = update_range(u);
      G* master = mixed ? static_cast<G*>(held_[u].master.data()) : reinterpret_cast<G*>(values_from(u, lo));
      const G* g = grads_from(u, lo);
      for_each_piece(u, lo, n, [&](const nn::UnitEntry& e, std::int64_t a, std::int64_t len) {
        if (e.sign_step) ops::Update<D>::sign_step(dev(), master + (a - lo), g + (a - lo), len, e.sign_step->rate);
        else pieces.push_back({master + (a - lo), g + (a - lo), state_at(u, n, a - lo), len, decays(e)});
      });
    }
    if constexpr (requires {
                    rule_.update_many(dev(), std::span<const Piece<G, S, Rule::states>>(pieces), scale, lr, t_);
                  }) {
      rule_.update_many(dev(), std::span<const Piece<G, S, Rule::states>>(pieces), scale, lr, t_);
    } else {
      for (const auto& x : pieces) rule_.update(dev(), x.p, x.g, x.state, x.n, scale, lr, t_, x.decay);
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const auto [lo, n] = update_range(u);
      T* p = values_from(u, lo);
      // one rounding per step
      if constexpr (mixed) ops::Memory<D>::convert(dev(), p, static_cast<const G*>(held_[u].master.data()), n);
      if constexpr (shard_params) {  // values gathered before this update are stale now
        units_[u].value_buffer().reset();
        units_[u].rebind();
      } else if constexpr (shard_state) {  // every data rank's values get every updated slice
        Allocation part = dev().allocate(n * static_cast<std::int64_t>(sizeof(T)), Category::communication);
        ops::Memory<D>::copy(dev(), static_cast<T*>(part.data()), p, n);
        group(u).all_gather(std::span<const T>(static_cast<const T*>(part.data()), static_cast<std::size_t>(n)),
                            std::span<T>(units_[u].values(), static_cast<std::size_t>(units_[u].padded())));
      }
    }
    return norm;
  }

  // Gathers every unit's values (FSDP), for inspection through the model's parameters; the next
  // forward's releases free them again.
  void gather_values() {
    for (std::size_t u = 0; u < units_.size(); ++u) acquire(u, Pass::forward);
  }

  // f(unit, entry, state name, values): the optimizer state of every parameter element this rank
  // keeps, as spans in the parameter's flat order (a slice of the entry under ZeRO and FSDP).
  template <class F>
  void for_each_state(F&& f) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const auto [lo, n] = update_range(u);
      for_each_piece(u, lo, n, [&](const nn::UnitEntry& e, std::int64_t a, std::int64_t len) {
        const auto st = state_at(u, n, a - lo);
        for (int k = 0; k < Rule::states; ++k)
          f(units_[u], e, Rule::state_names[static_cast<std::size_t>(k)],
            std::span<S>(st[static_cast<std::size_t>(k)], static_cast<std::size_t>(len)));
      });
    }
  }

  // A table held on two pipeline ranks (the tied embedding on the first and the last stage): unit u
  // holds it here, laid out the same on both ranks; copy: this is the head's copy.
  void set_tied(std::size_t u, bool copy) {
    tied_ = u;
    tied_copy_ = copy;
  }
  // Sums the tied table's gradients over `group` (the two ranks that hold it), after the step's last
  // backward and before step(): the slices where gradients are sharded (they line up), else all of it.
  template <Communicator C>
  void reduce_tied(C& group) {
    if (!tied_) return;
    const std::size_t u = *tied_;
    if constexpr (shard_grads)
      group.all_reduce(
          std::span<G>(static_cast<G*>(held_[u].grad_slice.data()), static_cast<std::size_t>(held_[u].shard)));
    else group.all_reduce(std::span<G>(units_[u].grads(), static_cast<std::size_t>(units_[u].padded())));
  }

  std::int64_t steps() const { return t_; }
  std::int64_t skipped() const { return skipped_; }

  // What this rank holds of unit u, for checkpoints (checkpoint/checkpoint.hpp). Each pointer
  // addresses element `lo` of the unit's flat order:
  //   values  the whole unit [0, padded), or this rank's slice where parameters are sharded (FSDP)
  //   master  the f32 master weights of the update range (mixed precision; else null)
  //   state   the Rule::states buffers of the update range (the slice where state is sharded)
  struct Holding {
    T* values;
    std::int64_t values_lo, values_n;
    G* master;
    std::array<S*, Rule::states> state;
    std::int64_t lo, n;  // the update range, which master and state cover
  };
  Holding holding(std::size_t u) {
    const auto [lo, n] = update_range(u);
    const std::int64_t vlo = shard_params ? held_[u].index * held_[u].shard : 0,
                       vn = shard_params ? held_[u].shard : units_[u].padded();
    return {values_from(u, vlo), vlo, vn, mixed ? static_cast<G*>(held_[u].master.data()) : nullptr,
            state_at(u, n, 0),   lo,  n};
  }
  // This rank's slice of unit u, [index x shard, (index + 1) x shard): the part it saves.
  std::pair<std::int64_t, std::int64_t> data_slice(std::size_t u) const {
    return {held_[u].index * held_[u].shard, held_[u].shard};
  }
  std::size_t units() const { return units_.size(); }
  // After a checkpoint wrote the holdings: the step count and skip count it recorded. Values that
  // FSDP had gathered are stale now and are dropped.
  void restore(std::int64_t steps, std::int64_t skipped) {
    if (steps < 0 || skipped < 0)
      throw Error("DataParallel::restore", cat("step ", steps, ", skipped ", skipped), "pass counts >= 0");
    t_ = steps;
    skipped_ = skipped;
    if constexpr (shard_params) {
      for (Unit& u : units_) {
        u.value_buffer().reset();
        u.rebind();
      }
    }
  }
  static std::string name() { return Strategy::name(); }

 private:
  struct Held {
    bool experts = false;                // an expert unit: its group is the expert-data group
    int dp = 1, index = 0;               // its group's size and this rank's place in it
    std::int64_t shard = 0;              // padded / dp
    Allocation value_slice, grad_slice;  // this rank's slice, where sharded (values in T, grads in G)
    Allocation master;                   // the update range's f32 master weights (mixed precision)
    Allocation state;                    // Rule::states x the update range, in S
  };

  D& dev() { return units_[0].dev(); }
  // The ranks that hold the same parameters and reduce their gradients together, and among which a
  // sharded strategy slices them: the data group, with the context ranks folded in where the mesh
  // has a context axis (Mesh::data_context; Megatron's data-parallel group with context ranks).
  static auto& gradient_group(M& mesh) {
    if constexpr (requires { mesh.data_context(); }) return mesh.data_context();
    else return mesh.comm(Axis::data);
  }
  // Unit u's: the expert-data group for an expert unit (Mesh::expert_data: the data x context ranks
  // of this rank's expert index), else gradient_group.
  auto& group(std::size_t u) {
    if constexpr (requires { mesh_->expert_data(); })
      if (units_[u].experts()) return mesh_->expert_data();
    return gradient_group(*mesh_);
  }

  // The elements of unit u this rank updates: its slice, or the whole unit.
  std::pair<std::int64_t, std::int64_t> update_range(std::size_t u) const {
    if constexpr (shard_state) return {held_[u].index * held_[u].shard, held_[u].shard};
    else return {0, units_[u].padded()};
  }
  T* slice_values(std::size_t u) { return static_cast<T*>(held_[u].value_slice.data()); }
  // Pointers that address element `lo` of unit u (lo inside this rank's slice where sharded).
  T* values_from(std::size_t u, std::int64_t lo) {
    if constexpr (shard_params) return slice_values(u) + (lo - held_[u].index * held_[u].shard);
    else return units_[u].values() + lo;
  }
  G* grads_from(std::size_t u, std::int64_t lo) {
    if constexpr (shard_grads)
      return static_cast<G*>(held_[u].grad_slice.data()) + (lo - held_[u].index * held_[u].shard);
    else return units_[u].grads() + lo;
  }
  std::array<S*, Rule::states> state_at(std::size_t u, std::int64_t n, std::int64_t at) {
    std::array<S*, Rule::states> st{};
    for (int k = 0; k < Rule::states; ++k)
      st[static_cast<std::size_t>(k)] = static_cast<S*>(held_[u].state.data()) + k * n + at;
    return st;
  }

  // f(entry, first, count) for each entry's overlap with elements [lo, lo + n) of unit u.
  template <class F>
  void for_each_piece(std::size_t u, std::int64_t lo, std::int64_t n, F&& f) const {
    for (const nn::UnitEntry& e : units_[u].entries()) {
      const std::int64_t a = std::max(lo, e.offset), b = std::min(lo + n, e.offset + e.numel);
      if (a < b) f(e, a, b - a);
    }
  }

  // Sums over the tensor axis the gradients that are Partial there, in one all-reduce.
  void reduce_tensor_partials() {
    if (tensor_degree_ == 1) return;
    std::vector<std::pair<G*, std::int64_t>> pieces;
    std::int64_t total = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const std::int64_t lo = shard_grads ? held_[u].index * held_[u].shard : 0,
                         n = shard_grads ? held_[u].shard : units_[u].padded();
      G* g = grads_from(u, lo);
      for_each_piece(u, lo, n, [&](const nn::UnitEntry& e, std::int64_t a, std::int64_t len) {
        if (!e.grad_tensor_partial) return;
        pieces.emplace_back(g + (a - lo), len);
        total += len;
      });
    }
    if (total == 0) return;  // no Partial gradients (no SP): every tensor rank has the same entries
    Allocation packed = dev().allocate(total * static_cast<std::int64_t>(sizeof(G)), Category::communication);
    G* at = static_cast<G*>(packed.data());
    for (auto [p, n] : pieces) {
      ops::Memory<D>::copy(dev(), at, p, n);
      at += n;
    }
    mesh_->comm(Axis::tensor).all_reduce(std::span<G>(static_cast<G*>(packed.data()), static_cast<std::size_t>(total)));
    const G* from = static_cast<const G*>(packed.data());
    for (auto [p, n] : pieces) {
      ops::Memory<D>::copy(dev(), p, from, n);
      from += n;
    }
  }

  std::span<Unit> units_;
  Rule rule_;
  M* mesh_;
  int tensor_degree_ = 1, tensor_index_ = 0;
  std::vector<Held> held_;
  std::int64_t t_ = 0, skipped_ = 0;
  std::optional<std::size_t> tied_;
  bool tied_copy_ = false;
};

// data_parallel<Strategy>(model, rule, mesh): the protocol over a model's units.
template <class Strategy, class Model, UpdateRule Rule, AxisComms M>
DataParallel<Strategy, Rule, typename Model::value_type, M, typename Model::device> data_parallel(Model& model,
                                                                                                  Rule rule, M& mesh) {
  DataParallel<Strategy, Rule, typename Model::value_type, M, typename Model::device> dp{model.units(), rule, mesh};
  if constexpr (requires { model.tied_unit(); })
    if (const auto u = model.tied_unit()) dp.set_tied(*u, model.tied_copy());
  return dp;
}

}  // namespace weft::optim
