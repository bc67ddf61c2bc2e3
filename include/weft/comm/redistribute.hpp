// redistribute<To>(x, mesh): the same global tensor in another layout, and its adjoint.
//
// The steps come from Transition<From, To> (layout/transition.hpp), decided at compile time; each runs on the
// communicator of its axis. The adjoint, for the backward pass, is the redistribution between the
// dual layouts, dual(To) -> dual(From) (dual: Replicate <-> Partial, Shard<d> fixed):
//
//   forward step        adjoint step
//   slice               embed (zero-pad the shard; local)
//   all_gather          reduce_scatter
//   all_to_all a -> b   all_to_all b -> a
//   all_reduce          all_reduce
//   reduce_scatter      all_gather
//   keep_one            keep_one
//
// With x in From and y in dual(To): sum over ranks <redistribute(x), y> = sum over ranks
// <x, redistribute_adjoint(y)>, which tests check to 1e-12 in double. A step needs its sharded
// extents divisible by the degree; collectives get contiguous buffers, so a shard of a dim other
// than the first is packed into rank-ordered chunks first.
//
// This header is plain C++20: it reaches devices only through Tensor and communicators only
// through the Communicator concept.
#pragma once

#include <span>
#include <type_traits>

#include "weft/comm/communicator.hpp"
#include "weft/layout/transition.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft {

// Something that hands out the communicator of a mesh axis (weft::Mesh does).
template <class M>
concept AxisComms = requires(M& m, Axis a) {
  { m.comm(a) };
  requires Communicator<std::remove_cvref_t<decltype(m.comm(a))>>;
};

namespace detail {

// Copies chunk `r` of `n` along dim d of a (shape) row-major block into a contiguous chunk, or back:
// one strided copy on the device (`outer` runs of one chunk each).
template <class T, class D>
void copy_chunk(D& dev, const T* src, T* dst, const Shape& shape, int d, int n, int r, bool to_chunk) {
  const std::int64_t outer = shape.outer(d), inner = shape.inner(d);
  const auto len = static_cast<std::size_t>(shape[d] / n * inner);  // one chunk's run per outer index
  const auto full = static_cast<std::size_t>(shape[d] * inner), at = static_cast<std::size_t>(r) * len;
  if (to_chunk)
    dev.copy_2d(dst, len * sizeof(T), src + at, full * sizeof(T), len * sizeof(T), static_cast<std::size_t>(outer));
  else dev.copy_2d(dst + at, full * sizeof(T), src, len * sizeof(T), len * sizeof(T), static_cast<std::size_t>(outer));
}

// Packs the n chunks along dim d of `src` (shape) into n contiguous chunks in rank order.
template <class T, class D>
void pack(D& dev, const T* src, T* dst, const Shape& shape, int d, int n) {
  const std::int64_t chunk = shape.numel() / n;
  for (int r = 0; r < n; ++r) copy_chunk(dev, src, dst + r * chunk, shape, d, n, r, true);
}
// The inverse: n contiguous chunks into `dst` of (shape), chunk r at position r along dim d.
template <class T, class D>
void unpack(D& dev, const T* src, T* dst, const Shape& shape, int d, int n) {
  const std::int64_t chunk = shape.numel() / n;
  for (int r = 0; r < n; ++r) copy_chunk(dev, src + r * chunk, dst, shape, d, n, r, false);
}

template <Element T, class D>
Allocation scratch(D& dev, std::int64_t n) {
  return dev.allocate(n * static_cast<std::int64_t>(sizeof(T)), Category::communication);
}

// Runs one step on local data `in` of shape `in_shape`; returns the output block (owned) and shape.
template <Element T, class D, Communicator C>
Allocation run_step(const StepKind& k, D& dev, C& comm, const T* in, const Shape& in_shape, Shape& out_shape) {
  const int n = comm.size(), me = comm.rank();
  out_shape = step_shape(k, in_shape, n);
  Allocation out = scratch<T>(dev, out_shape.numel());
  T* o = static_cast<T*>(out.data());
  const std::int64_t in_count = in_shape.numel(), out_count = out_shape.numel();
  const auto cin = [](const T* p, std::int64_t c) { return std::span<const T>(p, static_cast<std::size_t>(c)); };
  const auto mut = [](T* p, std::int64_t c) { return std::span<T>(p, static_cast<std::size_t>(c)); };
  switch (k.collective) {
    case Collective::none: dev.copy(o, in, static_cast<std::size_t>(in_count) * sizeof(T)); break;
    case Collective::slice: copy_chunk(dev, in, o, in_shape, in_shape.normalize_dim(k.to_dim), n, me, true); break;
    case Collective::keep_one:
      if (me == 0) dev.copy(o, in, static_cast<std::size_t>(in_count) * sizeof(T));
      else dev.zero(o, static_cast<std::size_t>(out_count) * sizeof(T));
      break;
    case Collective::embed:
      dev.zero(o, static_cast<std::size_t>(out_count) * sizeof(T));
      copy_chunk(dev, in, o, out_shape, out_shape.normalize_dim(k.from_dim), n, me, false);
      break;
    case Collective::all_reduce:
      dev.copy(o, in, static_cast<std::size_t>(in_count) * sizeof(T));
      comm.all_reduce(mut(o, out_count), ReduceOp::sum);
      break;
    case Collective::all_gather: {
      const int d = out_shape.normalize_dim(k.from_dim);
      if (out_shape.outer(d) == 1) {
        comm.all_gather(cin(in, in_count), mut(o, out_count));
      } else {
        Allocation tmp = scratch<T>(dev, out_count);
        comm.all_gather(cin(in, in_count), mut(static_cast<T*>(tmp.data()), out_count));
        unpack(dev, static_cast<const T*>(tmp.data()), o, out_shape, d, n);
      }
      break;
    }
    case Collective::reduce_scatter: {
      const int d = in_shape.normalize_dim(k.to_dim);
      if (in_shape.outer(d) == 1) {
        comm.reduce_scatter(cin(in, in_count), mut(o, out_count), ReduceOp::sum);
      } else {
        Allocation tmp = scratch<T>(dev, in_count);
        pack(dev, in, static_cast<T*>(tmp.data()), in_shape, d, n);
        comm.reduce_scatter(cin(static_cast<const T*>(tmp.data()), in_count), mut(o, out_count), ReduceOp::sum);
      }
      break;
    }
    case Collective::send_recv:  // never a step of a Transition (a row of describe only)
      throw Error("redistribute", "a send_recv step", "redistribution steps are collectives between layouts");
    case Collective::all_to_all: {
      // Send chunk j along the new shard dim b to rank j; what rank j sends back is its block along
      // the old shard dim a, which lands at position j along a.
      const int a = in_shape.normalize_dim(k.from_dim), b = in_shape.normalize_dim(k.to_dim);
      Allocation send = scratch<T>(dev, in_count), recv = scratch<T>(dev, in_count);
      pack(dev, in, static_cast<T*>(send.data()), in_shape, b, n);
      comm.all_to_all(cin(static_cast<const T*>(send.data()), in_count), mut(static_cast<T*>(recv.data()), in_count));
      unpack(dev, static_cast<const T*>(recv.data()), o, out_shape, a, n);
      break;
    }
  }
  return out;
}

template <LayoutType To, LayoutType From, Element T, class D, AxisComms M>
Tensor<T, To, D> execute(const Tensor<T, From, D>& x, M& mesh) {
  using Tr = Transition<From, To>;
  // The steps run on the mesh's groups; the tensor's shards were cut for its spread's degrees.
  for (const StepKind& k : Tr::steps)
    if (k.collective != Collective::none && mesh.comm(k.axis).size() != x.spread().degree(k.axis))
      throw Error("redistribute",
                  cat("the tensor's spread has ", name(k.axis), " degree ", x.spread().degree(k.axis),
                      " but the mesh's ", name(k.axis), " group has ", mesh.comm(k.axis).size(), " ranks"),
                  "build the tensor with the spread of the mesh it is redistributed on (mesh.spread())");
  // The result is counted where the input is (an activation stays one); the steps' buffers are
  // communication.
  Tensor<T, To, D> y = Tensor<T, To, D>::empty(x.dev(), x.global_shape(), x.spread(), x.category());
  Allocation held;  // the latest intermediate block
  const T* cur = x.data();
  Shape shape = x.local_shape();
  for (const StepKind& k : Tr::steps) {
    if (k.collective == Collective::none) continue;
    Shape next;
    held = run_step<T>(k, x.dev(), mesh.comm(k.axis), cur, shape, next);
    cur = static_cast<const T*>(held.data());
    shape = next;
  }
  x.dev().copy(y.data(), cur, y.bytes());
  return y;
}

// Refusals, as class templates so the compiler's message names both layouts.
template <LayoutType From, LayoutType To>
struct check_redistribute {
  static_assert(!Transition<From, To>::uses_embed,
                "redistribute: Shard -> Partial is not a redistribution (it would zero-pad every shard to the full "
                "size); redistribute to Replicate, or use redistribute_adjoint where this is a gradient step");
  static_assert(!Transition<From, To>::crosses_stages,
                "redistribute: one layout is StageLocal on the pipe axis and the other is not; tensors move "
                "between pipeline stages by send/recv (the pipeline executor), not by redistribution");
  static_assert(Transition<From, To>::crosses_stages || Transition<From, To>::possible,
                "redistribute: every order of the per-axis steps from From to To passes through a layout that shards "
                "one dim on both axes; redistribute through an intermediate layout (Replicate on one axis)");
  static constexpr bool ok = true;
};

template <class X>
struct check_tensor {
  static_assert(LayoutType<X>,
                "redistribute: the target is not a Layout; write redistribute<Layout<DataPlacement, "
                "TensorPlacement>>(x, mesh)");
  static constexpr bool ok = true;
};

}  // namespace detail

// x in layout From -> the same global tensor in layout To, on the same device.
// (The return type is deduced so that a To that is not a Layout reaches the static_assert below
// instead of failing overload resolution with a less helpful message.)
template <class To, Element T, LayoutType From, class D, AxisComms M>
auto redistribute(const Tensor<T, From, D>& x, M& mesh) {
  static_assert(detail::check_tensor<To>::ok);
  if constexpr (LayoutType<To>) {
    static_assert(detail::check_redistribute<From, To>::ok);
    return detail::execute<To>(x, mesh);
  }
}

// The adjoint of redistribute<From -> To>: a gradient y in dual(To) -> the gradient in dual(From).
template <LayoutType From, LayoutType To, Element T, class D, AxisComms M>
Tensor<T, dual_layout<From>, D> redistribute_adjoint(const Tensor<T, dual_layout<To>, D>& y, M& mesh) {
  static_assert(Transition<dual_layout<To>, dual_layout<From>>::possible,
                "redistribute_adjoint: the adjoint passes through a layout that shards one dim on both axes");
  return detail::execute<dual_layout<From>>(y, mesh);
}

}  // namespace weft
