// Tensor<T, Layout, Device>: this rank's local part of a global tensor.
//
// The global shape and the layout (a type) say what the whole tensor is; the Spread (degrees and
// this rank's index per axis, from the mesh) says which part this rank holds. Storage is row-major
// and contiguous: either owned (an Allocation from the device, counted in its memory statistics)
// or a view of memory someone else owns. Tensors move but do not copy implicitly; clone() copies.
//
// Example, an activation (B, T, C) = (8, 16, 64) on data 2 x tensor 4 with Layout<Shard<0>, Shard<1>>:
//   global (8, 16, 64); local (4, 4, 64) at every rank; rank (data 1, tensor 2) holds rows 4..7,
//   positions 8..11.
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/core/shape.hpp"
#include "weft/device/allocation.hpp"
#include "weft/layout/layout.hpp"

namespace weft {

template <Element T, LayoutType L, class D>
class Tensor {
 public:
  using value_type = T;
  using layout = L;
  using device = D;

  Tensor() = default;

  // An uninitialized tensor on `dev`.
  static Tensor empty(D& dev, const Shape& global, const Spread& s, Category c = Category::other) {
    Tensor t(global, s);
    t.device_ = &dev;
    t.storage_ = dev.allocate(t.local_.numel() * static_cast<std::int64_t>(sizeof(T)), c);
    t.data_ = static_cast<T*>(t.storage_.data());
    return t;
  }
  static Tensor zeros(D& dev, const Shape& global, const Spread& s, Category c = Category::other) {
    Tensor t = empty(dev, global, s, c);
    dev.zero(t.data_, t.bytes());
    return t;
  }
  // A tensor over memory the caller owns (at least local_shape<L>(global, s).numel() elements).
  static Tensor view(D& dev, T* data, const Shape& global, const Spread& s) {
    Tensor t(global, s);
    t.device_ = &dev;
    t.data_ = data;
    return t;
  }

  // The local elements of t, and its storage, under this tensor's layout and the global shape
  // `global`: for the same elements seen under another layout where they have the same local shape,
  // as a layer that computes token by token does with its context rank's rows (the sequence sharded
  // over the context axis in its caller's layout, whole in the layers it calls; nn/grouped_attention.hpp).
  template <LayoutType From>
  static Tensor relabel(Tensor<T, From, D>&& t, const Shape& global) {
    Tensor r(global, t.spread_);
    if (r.local_ != t.local_)
      throw Error("Tensor::relabel",
                  cat("local shape ", t.local_, " under ", From::name(), " is ", r.local_, " under ", L::name(),
                      " (global ", global, ")"),
                  "relabel only between layouts and global shapes with the same local shape");
    r.device_ = t.device_;
    r.storage_ = std::move(t.storage_);
    r.data_ = std::exchange(t.data_, nullptr);
    return r;
  }

  // Re-points a view at other memory of the same size (nullptr: at nothing), as a unit's flat
  // buffers move (nn/unit.hpp). Requires: this tensor is a view, not an owner.
  void rebind(T* data) {
    if (owns_storage())
      throw Error("Tensor::rebind", cat("the tensor of shape ", global_, " owns its storage"),
                  "rebind only views (Tensor::view)");
    data_ = data;
  }

  Tensor clone(Category c = Category::other) const {
    Tensor t = empty(*device_, global_, spread_, c);
    device_->copy(t.data_, data_, bytes());
    return t;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::span<T> span() { return {data_, static_cast<std::size_t>(numel())}; }
  std::span<const T> span() const { return {data_, static_cast<std::size_t>(numel())}; }
  // Elements by index: host memory only (a device tensor is read with to_host()).
  T& operator[](std::int64_t i) { return data_[i]; }
  const T& operator[](std::int64_t i) const { return data_[i]; }

  // A copy of the local elements in host memory, from any device.
  std::vector<T> to_host() const {
    std::vector<T> out(static_cast<std::size_t>(numel()));
    if (numel()) device_->to_host(out.data(), data_, bytes());
    return out;
  }

  const Shape& global_shape() const { return global_; }
  const Shape& local_shape() const { return local_; }
  const Spread& spread() const { return spread_; }
  std::int64_t numel() const { return local_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  D& dev() const { return *device_; }
  bool owns_storage() const { return storage_.data() != nullptr; }
  // The memory category its storage is counted in (a view's: other).
  Category category() const { return owns_storage() ? storage_.category() : Category::other; }

  // The global flat index of local element i (row-major), for layouts without Partial.
  // Requires: L has no Partial placement (a Partial tensor's elements are addends, not positions).
  std::int64_t global_index(std::int64_t i) const
    requires(!has_partial<L>)
  {
    // The first global index of this rank's shard in each dim (local_box's offset, without its
    // checks: this runs once per element when parameters are initialized).
    std::array<std::int64_t, Shape::max_rank> off{};
    for_each_axis([&](auto a) {
      constexpr Axis A = decltype(a)::value;
      const int d = sharded_dim<placement_on<L, A>>(global_);
      if (d >= 0) off[static_cast<std::size_t>(d)] = spread_.index(A) * local_[d];
    });
    std::int64_t g = 0, gstride = 1;
    for (int d = global_.rank() - 1; d >= 0; --d) {
      const std::int64_t idx = (i / local_.inner(d)) % local_[d];
      g += (idx + off[static_cast<std::size_t>(d)]) * gstride;
      gstride *= global_[d];
    }
    return g;
  }

 private:
  Tensor(const Shape& global, const Spread& s) : global_(global), local_(weft::local_shape<L>(global, s)), spread_(s) {}

  Shape global_, local_;
  Spread spread_;
  D* device_ = nullptr;
  Allocation storage_;
  T* data_ = nullptr;

  template <Element, LayoutType, class>
  friend class Tensor;
};

}  // namespace weft
