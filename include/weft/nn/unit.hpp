// Unit<T, D>: the flat state of one part of a model (a block, the embedding stage, the head stage).
//
// A unit owns one flat buffer for the parameters of its layers and one for their gradients; each
// layer's Param keeps views into them. Entries are laid out one after another in for_each_param
// order, each in its own layout (this rank's local shard), and the buffers are padded to a multiple
// of the data degree so that a data-parallel strategy can slice them evenly:
//
//   values  [ h0.ln1.weight (C) | h0.ln1.bias (C) | h0.attn.qkv.weight (3C/tp, C) | ... | pad ]
//   grads   the same offsets, in master_t<T> (f32 under bf16 compute)
//
// Why views and not per-parameter allocations: the data-parallel protocol (optim/data_parallel.hpp)
// reduces, slices, gathers and updates whole units with one call each, ZeRO and FSDP shard one
// buffer per unit, and checkpoints enumerate the entries. When a strategy moves a unit's storage
// (FSDP gathers the values for a stage and frees them after it), rebind() re-points every view of
// the unit in one pass; nothing else holds a parameter's address.
//
// A unit's parameters are either all on the expert axis (Shard on expert: a mixture of experts'
// expert weights, nn/moe.hpp) or none of them: a data-parallel strategy reduces and slices an expert
// unit over its expert-data group, the others over the data x context group. A model keeps a
// block's experts in a unit of their own (add_part).
//
// A unit records where its Params live, so the layers it adopted must stay where they are (the
// model that owns both is neither copied nor moved).
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/precision.hpp"
#include "weft/layout/layout.hpp"
#include "weft/nn/param.hpp"
#include "weft/ops/all.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::nn {

// One parameter of a unit: where it lies in the flat buffers and how it is spread.
struct UnitEntry {
  std::string name;                    // "h0.attn.qkv.weight"
  Shape global, local;                 // the global tensor, and this rank's shard of it
  std::int64_t offset = 0, numel = 0;  // in elements, into the unit's buffers
  std::string layout, grad_layout;     // Layout<...>::name() of the value and of the gradient
  bool tensor_sharded = false;         // tensor ranks hold distinct elements (else replicas)
  bool grad_tensor_partial = false;    // the gradient is Partial over the tensor axis until reduced
  Shape box_offset;                    // where this rank's shard starts in the global tensor
  Shape logical;                       // the part of the global tensor the model uses (wte: the
                                       // unpadded vocabulary's rows); checkpoints save and load it
  bool decay = false;                  // in the optimizer's weight-decayed group (Param::decay,
                                       // or the model's override: Unit::set_decay)
  std::optional<SignStep> sign_step;   // moved by a sign step, not the optimizer (Param::sign_step)
};

template <Element T, class D>
class Unit {
 public:
  using G = master_t<T>;  // the gradients' type (f32 under bf16 compute)

  Unit(std::string name, D& dev) : name_(std::move(name)), dev_(&dev) {}
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;
  Unit(Unit&&) noexcept = default;
  Unit& operator=(Unit&&) noexcept = default;

  // Records every parameter of `layer` (its for_each_param(prefix, f)). Call before build().
  template <class Layer>
  void add(const std::string& prefix, Layer& layer) {
    if (built_) throw Error(cat("Unit ", name_), "add() after build()", "add every layer before building the unit");
    layer.for_each_param(prefix, [&](const std::string& n, auto& p) { record(n, p); });
  }

  // Records the parameters of `layer` that lie on the expert axis (experts true) or those that do
  // not (false). Call before build().
  template <class Layer>
  void add_part(const std::string& prefix, Layer& layer, bool experts) {
    if (built_)
      throw Error(cat("Unit ", name_), "add_part() after build()", "add every layer before building the unit");
    layer.for_each_param(prefix, [&](const std::string& n, auto& p) {
      if (on_experts(p) == experts) record(n, p);
    });
  }
  // Whether parameter p lies on the expert axis (its layout shards it there).
  template <class P>
  static constexpr bool on_experts(const P&) {
    return IsShard<typename P::layout::expert>;
  }
  // Whether `layer` has a parameter on the expert axis.
  template <class Layer>
  static bool has_experts(Layer& layer) {
    bool any = false;
    layer.for_each_param("", [&](const std::string&, auto& p) { any = any || on_experts(p); });
    return any;
  }

  // Records one parameter under `name`. Call before build().
  template <class P>
  void add_param(const std::string& name, P& p) {
    if (built_)
      throw Error(cat("Unit ", name_), "add_param() after build()", "add every parameter before building the unit");
    record(name, p);
  }

  // Allocates the flat buffers (padded to a multiple of `pad`), moves every parameter's values into
  // them, zeroes the gradients, and leaves the Params as views. The Params' own storage is freed.
  void build(int pad) {
    if (pad < 1) throw Error(cat("Unit ", name_), cat("padding multiple ", pad), "pass the data degree (>= 1)");
    padded_ = (numel_ + pad - 1) / pad * pad;
    values_ = dev_->allocate(padded_ * static_cast<std::int64_t>(sizeof(T)), Category::parameters);
    grads_ = dev_->allocate(padded_ * static_cast<std::int64_t>(sizeof(G)), Category::gradients);
    T* v = static_cast<T*>(values_.data());
    for (Slot& s : slots_) s.adopt(s.param, v + s.offset);
    ops::Memory<D>::zero(*dev_, v + numel_, padded_ - numel_);
    zero_grad();
    built_ = true;
    rebind();
  }

  const std::string& name() const { return name_; }
  D& dev() const { return *dev_; }
  const std::vector<UnitEntry>& entries() const { return entries_; }
  // Marks the part of parameter `name` that the model uses (leading rows of a padded table); the
  // rest is padding that no result reads.
  void set_logical(const std::string& name, const Shape& logical) {
    for (UnitEntry& e : entries_)
      if (e.name == name) {
        if (logical.rank() != e.global.rank())
          throw Error(cat("Unit ", name_),
                      cat("a logical shape of rank ", logical.rank(), " for ", name, " of rank ", e.global.rank()),
                      "give one extent per dim");
        for (int d = 0; d < logical.rank(); ++d)
          if (logical[d] < 0 || logical[d] > e.global[d])
            throw Error(
                cat("Unit ", name_),
                cat("logical extent ", logical[d], " of dim ", d, " of ", name, " outside [0, ", e.global[d], "]"),
                "give a logical shape inside the global shape");
        e.logical = logical;
      }
  }
  // Overrides the weight-decay group that parameter `name`'s layer declared (a model that decays
  // its embeddings, or keeps a matrix out of the decayed group). Returns whether the unit holds it.
  bool set_decay(const std::string& name, Decay d) {
    for (UnitEntry& e : entries_)
      if (e.name == name) {
        e.decay = d == Decay::yes;
        return true;
      }
    return false;
  }
  // Whether the unit's parameters lie on the expert axis (reduced over the expert-data group).
  bool experts() const { return experts_; }
  std::int64_t numel() const { return numel_; }    // the sum of the entries
  std::int64_t padded() const { return padded_; }  // the buffers' length

  // The flat buffers (empty while a strategy keeps them elsewhere, see rebind()).
  Allocation& value_buffer() { return values_; }
  Allocation& grad_buffer() { return grads_; }
  T* values() { return static_cast<T*>(values_.data()); }
  G* grads() { return static_cast<G*>(grads_.data()); }

  // Points every Param's views at the current buffers (at nothing where a buffer is empty).
  void rebind() {
    for (Slot& s : slots_)
      s.bind(s.param, values() ? values() + s.offset : nullptr, grads() ? grads() + s.offset : nullptr);
  }

  void zero_grad() {
    if (grads()) ops::Memory<D>::zero(*dev_, grads(), padded_);
  }

  // f(entry, values, grads): every parameter as spans of this rank's shard (empty spans where the
  // buffer is not held).
  template <class F>
  void for_each_param(F&& f) {
    for (const UnitEntry& e : entries_) {
      const auto n = static_cast<std::size_t>(e.numel);
      f(e, values() ? std::span<T>(values() + e.offset, n) : std::span<T>(),
        grads() ? std::span<G>(grads() + e.offset, n) : std::span<G>());
    }
  }

 private:
  struct Slot {
    void* param;
    std::int64_t offset;
    void (*adopt)(void* param, T* values);           // copy the values in, free the Param's storage
    void (*bind)(void* param, T* values, G* grads);  // re-point the views
  };

  template <class P>
  void record(const std::string& n, P& p) {
    using Value = std::remove_cvref_t<decltype(p.value)>;
    using Grad = std::remove_cvref_t<decltype(p.grad)>;
    static_assert(std::same_as<typename Value::value_type, T>,
                  "Unit: a parameter's element type differs from the unit's");
    using L = typename P::layout;
    using GL = typename P::grad_layout;
    if (p.value.numel() == 0) return;  // an absent bias
    if (!entries_.empty() && on_experts(p) != experts_)
      throw Error(cat("Unit ", name_),
                  cat(n, on_experts(p) ? " lies on the expert axis and " : " does not lie on the expert axis and ",
                      entries_.front().name, on_experts(p) ? " does not" : " does"),
                  "keep a layer's experts in a unit of their own (Unit::add_part)");
    experts_ = on_experts(p);
    if (!names_.insert(n).second)
      throw Error(cat("Unit ", name_), cat("two parameters named ", n),
                  "name the layers apart (Named<\"...\", L> inside a Sequential)");
    UnitEntry e{n,
                p.value.global_shape(),
                p.value.local_shape(),
                numel_,
                p.value.numel(),
                L::name(),
                GL::name(),
                IsShard<typename L::tensor>,
                IsPartial<typename GL::tensor>,
                local_box<L>(p.value.global_shape(), p.value.spread()).offset,
                p.value.global_shape(),
                p.decay == Decay::yes,
                p.sign_step};
    entries_.push_back(e);
    slots_.push_back({&p, numel_,
                      [](void* q, T* v) {
                        P& pp = *static_cast<P*>(q);
                        const Shape g = pp.value.global_shape();
                        const Spread s = pp.value.spread();
                        ops::Memory<D>::copy(pp.value.dev(), v, pp.value.data(), pp.value.numel());
                        pp.value = Value::view(pp.value.dev(), v, g, s);
                        pp.grad = Grad::view(pp.grad.dev(), nullptr, g, s);
                      },
                      [](void* q, T* v, G* g) {
                        P& pp = *static_cast<P*>(q);
                        pp.value.rebind(v);
                        pp.grad.rebind(g);
                      }});
    numel_ += e.numel;
  }

  std::string name_;
  D* dev_;
  std::vector<UnitEntry> entries_;
  std::unordered_set<std::string> names_;  // the entries' names, each once
  std::vector<Slot> slots_;
  std::int64_t numel_ = 0, padded_ = 0;
  bool built_ = false, experts_ = false;
  Allocation values_, grads_;
};

}  // namespace weft::nn
