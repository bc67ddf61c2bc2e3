// A walk over a built layer's parts, for what the trainer reads of layers after a step (the
// routers' statistics of a mixture of experts), through the layers of the protocol:
//
//   Sequential<Ls...>             each layer in order
//   Residual<Inner>               Inner
//   Either<A, B>                  the layer it holds (contains_layer: A and B, at compile time)
//   Named<"x", L>                 L (Named derives from it)
//   TokenWise<L> (context)        L
//   recompute::Checkpointed<L>    L (it derives from it)
//   any other layer               itself, to f
//
//   for_each_layer(layer, f)      f(leaf) for every leaf layer in order (const or not, as given)
//   contains_layer<L, Pred>       whether a leaf of type L satisfies Pred, at compile time (so that
//                                 a collective about those leaves is made by every rank or none)
//
// defines: nn::for_each_layer, nn::contains_layer, nn::Routes, nn::is_router, nn::RouterStats,
// nn::take_router_stats
#pragma once

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "weft/nn/either.hpp"
#include "weft/nn/sequential.hpp"
#include "weft/nn/token_wise.hpp"
#include "weft/recompute/checkpointed.hpp"

namespace weft::nn {

// The protocol's wrappers, as every walk over layers tells them apart (this one, nn/comm_walk.hpp's
// rows): base<L>::type is the layer a Named or a Checkpointed derives from (void for others).
namespace walk {
template <class T> inline constexpr bool sequential = false;
template <class... Ls> inline constexpr bool sequential<Sequential<Ls...>> = true;
template <class T> inline constexpr bool residual = detail::is_residual<T>;
template <class T> inline constexpr bool token_wise = false;
template <class L> inline constexpr bool token_wise<TokenWise<L>> = true;
template <class T> inline constexpr bool either = false;
template <class A, class B> inline constexpr bool either<Either<A, B>> = true;
template <class T> inline constexpr bool checkpointed = false;
template <class L, class T, class D> inline constexpr bool checkpointed<recompute::Checkpointed<L, T, D>> = true;

template <class T> struct base {
  using type = void;
};
template <Label N, class L> struct base<Named<N, L>> {
  using type = L;
};
template <class L, class T, class D> struct base<recompute::Checkpointed<L, T, D>> {
  using type = L;
};
}  // namespace walk

template <class L, class F>
void for_each_layer(L& layer, F&& f) {
  using B = std::remove_const_t<L>;
  if constexpr (walk::sequential<B>) {
    std::apply([&](auto&... ls) { (for_each_layer(ls, f), ...); }, layer.layers);
  } else if constexpr (walk::residual<B> || walk::token_wise<B>) {
    for_each_layer(layer.inner, f);
  } else if constexpr (walk::either<B>) {
    layer.visit([&](auto& held) { for_each_layer(held, f); });
  } else if constexpr (!std::is_void_v<typename walk::base<B>::type>) {
    using Base =
        std::conditional_t<std::is_const_v<L>, const typename walk::base<B>::type, typename walk::base<B>::type>;
    for_each_layer(static_cast<Base&>(layer), f);
  } else {
    f(layer);
  }
}

namespace walk {
template <class L, template <class> class Pred>
consteval bool contains() {
  if constexpr (sequential<L>) {
    return []<class... Ls>(std::type_identity<Sequential<Ls...>>) {
      return (contains<Ls, Pred>() || ...);
    }(std::type_identity<L>{});
  } else if constexpr (residual<L> || token_wise<L>) {
    return contains<std::remove_cvref_t<decltype(std::declval<L&>().inner)>, Pred>();
  } else if constexpr (either<L>) {
    return contains<typename L::first_type, Pred>() || contains<typename L::second_type, Pred>();
  } else if constexpr (!std::is_void_v<typename base<L>::type>) {
    return contains<typename base<L>::type, Pred>();
  } else {
    return Pred<L>::value;
  }
}
}  // namespace walk

template <class L, template <class> class Pred>
inline constexpr bool contains_layer = walk::contains<L, Pred>();

// A mixture of experts' router, as the walk sees it (nn::MoeMlp): the statistics of its last forward,
// and of the micro-batches its backward ran on since they were last taken.
template <class L>
concept Routes = requires(L& l) {
  { l.last_aux } -> std::convertible_to<double>;
  { l.last_z } -> std::convertible_to<double>;
  { l.last_load } -> std::convertible_to<double>;
  { l.last_dropped } -> std::convertible_to<std::int64_t>;
  l.take_step_stats();
};
template <class L> struct is_router : std::bool_constant<Routes<L>> {};

// The routers of some layers over the micro-batches of a step (each's backward's since they were
// last taken; its last forward's where no backward ran): their load-balancing and z-losses summed
// over the routers (each the mean over the micro-batches, before their coefficients), the largest
// expert load (the most slots an expert got over the mean, each router's mean over the
// micro-batches), and the slots dropped (past a capacity) on this rank, summed. Taking them starts
// the next step's.
struct RouterStats {
  double aux = 0, z = 0, load = 0;
  std::int64_t routers = 0, dropped = 0;
};

template <class L>
void take_router_stats(RouterStats& s, L& layer) {
  for_each_layer(layer, [&](auto& leaf) {
    if constexpr (Routes<std::remove_cvref_t<decltype(leaf)>>) {
      const auto t = leaf.take_step_stats();
      const double n = static_cast<double>(t.batches);
      s.aux += t.batches ? t.aux / n : leaf.last_aux;
      s.z += t.batches ? t.z / n : leaf.last_z;
      s.load = std::max(s.load, t.batches ? t.load / n : leaf.last_load);
      s.dropped += t.batches ? t.dropped : leaf.last_dropped;
      ++s.routers;
    }
  });
}

}  // namespace weft::nn
