// The data-parallel strategies and precisions a trainer compiles, by name: the one closed dispatch
// from run-time choices (--strategy, --dtype) to instantiations of the loop. Each strategy is also
// compiled with sequence parallelism ("-sp").
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/core/precision.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/train/family.hpp"

namespace weft::train {

template <class S> constexpr const char* strategy_name() = delete;
template <> constexpr const char* strategy_name<optim::Ddp>() { return "ddp"; }
template <> constexpr const char* strategy_name<optim::Zero1>() { return "zero1"; }
template <> constexpr const char* strategy_name<optim::Zero2>() { return "zero2"; }
template <> constexpr const char* strategy_name<optim::Fsdp>() { return "fsdp"; }

template <class P> constexpr const char* dtype_name() = delete;
template <> constexpr const char* dtype_name<F32>() { return "f32"; }
template <> constexpr const char* dtype_name<Bf16Mixed>() { return "bf16"; }
template <> constexpr const char* dtype_name<F64>() { return "f64"; }
template <> constexpr const char* dtype_name<Fp8Tensorwise>() { return "fp8-tensorwise"; }
template <> constexpr const char* dtype_name<Fp8Rowwise>() { return "fp8-rowwise"; }
template <> constexpr const char* dtype_name<Fp8Blockwise>() { return "fp8-blockwise"; }

// "ddp", "ddp-sp", ... for the strategies of the list.
template <class... S>
std::vector<std::string> strategy_names(List<S...>) {
  std::vector<std::string> out;
  ((out.push_back(strategy_name<S>()), out.push_back(cat(strategy_name<S>(), "-sp"))), ...);
  return out;
}
template <class... P>
std::vector<std::string> dtype_names(List<P...>) {
  return {dtype_name<P>()...};
}

// Whether the strategy `name` runs with sequence parallelism ("zero1-sp").
inline bool sequence_parallel_name(const std::string& name) { return name.ends_with("-sp"); }

// f.template operator()<Strategy>() for the strategy `name` of the list, with or without its "-sp"
// (the caller has chosen SP; an unknown name throws).
template <class... S, class F>
auto with_base_strategy(List<S...> list, const std::string& name, F&& f) {
  using R = decltype(f.template operator()<std::tuple_element_t<0, std::tuple<S...>>>());
  std::optional<R> out;
  const std::string base = sequence_parallel_name(name) ? name.substr(0, name.size() - 3) : name;
  (void)((base == strategy_name<S>() ? (out.emplace(f.template operator()<S>()), true) : false) || ...);
  if (!out)
    throw Error("train --strategy", cat("strategy '", name, "' is not available"),
                cat("use one of: ", join(strategy_names(list))));
  return std::move(*out);
}

// f.template operator()<Strategy, SP>() for the strategy `name` of the list (an unknown name throws).
template <class... S, class F>
auto with_strategy(List<S...> list, const std::string& name, F&& f) {
  if (sequence_parallel_name(name))
    return with_base_strategy(list, name, [&]<class St>() { return f.template operator()<St, true>(); });
  return with_base_strategy(list, name, [&]<class St>() { return f.template operator()<St, false>(); });
}

// f.template operator()<P>() for the precision `name` of the list.
template <class... P, class F>
auto with_precision(List<P...> list, const std::string& name, F&& f) {
  using R = decltype(f.template operator()<std::tuple_element_t<0, std::tuple<P...>>>());
  std::optional<R> out;
  (void)((name == dtype_name<P>() ? (out.emplace(f.template operator()<P>()), true) : false) || ...);
  if (!out)
    throw Error("train --dtype", cat("precision '", name, "' is not available"),
                cat("use one of: ", join(dtype_names(list))));
  return std::move(*out);
}

}  // namespace weft::train
