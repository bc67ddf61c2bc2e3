// The one closed dispatch: a run's choices (--model, --context and --attention, the configuration's
// tied head, --device, --strategy with or without -sp, --dtype) into the types of what this binary
// compiled (Units: a train::List of train::Unit, train/unit.hpp). Every choice it cannot honour is an
// Error that names the option and ends with what the binary compiled.
//
//   with_family<Families>(name, where, f)      f.template operator()<F>() for --model
//   with_run<Units, F>(o, cfg, device, f)      f.template operator()<V, U>(): F's variant V that the
//                                              run asks for, and the unit U that trains it on the
//                                              device (auto: the GPU where U has it), SP, strategy
//                                              and precision all checked against U
//
// The family is chosen first (its configuration, whose `tied` picks the variant, is the family's
// type); everything after it is one function.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "weft/context/attention.hpp"
#include "weft/core/error.hpp"
#include "weft/train/family.hpp"
#include "weft/train/options.hpp"
#include "weft/train/strategies.hpp"
#include "weft/train/unit.hpp"

namespace weft::train {

template <class D> inline constexpr const char* device_name = D::name;
template <> inline constexpr const char* device_name<Cuda> = "cuda";

// The families of a list of units, each once, in order.
template <class Units, class Seen = List<>> struct families_of;
template <class Seen> struct families_of<List<>, Seen> {
  using type = Seen;
};
template <class U, class... Us, class... Fs>
struct families_of<List<U, Us...>, List<Fs...>> {
  using F = typename U::family;
  using type = typename families_of<List<Us...>,
                                    std::conditional_t<contains_v<F, List<Fs...>>, List<Fs...>, List<Fs..., F>>>::type;
};
template <class Units> using families_t = typename families_of<Units>::type;

// f.template operator()<F>() for the family of the list named `name` (the first where it is empty).
template <class... Fs, class Fn>
int with_family(List<Fs...>, const std::string& name, const std::string& where, Fn&& f) {
  int out = 0;
  bool found = false;
  const std::vector<std::string> names{Fs::name()...};
  (void)((((name.empty() && !found) || name == Fs::name()) ? (out = f.template operator()<Fs>(), found = true)
                                                           : false) ||
         ...);
  if (!found) throw Error(where, cat("no model family '", name, "'"), cat("use one of: ", join(names)));
  return out;
}

namespace detail {

// "f32, bf16" for a list of precisions.
template <class... P>
std::string names_of(List<P...>) {
  return join(std::vector<std::string>{dtype_name<P>()...});
}

// "gpt2 on host (sp and not): plain in f32, bf16; ring in f32", one unit's share.
template <class U>
std::string unit_text() {
  std::string out =
      cat(U::family::name(), " on ", device_name<typename U::device>, U::sequence_parallel ? " with SP" : "", ": ");
  bool first = true;
  [&]<class... V>(List<V...>) {
    ((out += cat(first ? "" : "; ", V::name(), " in ", names_of(typename U::template precisions<V>{})), first = false),
     ...);
  }(typename U::variants{});
  return first ? out + "nothing" : out;
}

// Whether any unit of family F keeps variant V (on device D, with SP; any where void / -1).
template <class Units, class F, class V, class D = void, int SP = -1> inline constexpr bool compiles = false;
template <class... Us, class F, class V, class D, int SP>
inline constexpr bool compiles<List<Us...>, F, V, D, SP> =
    ((std::same_as<typename Us::family, F> && contains_v<V, typename Us::variants> &&
      (std::is_void_v<D> || std::same_as<typename Us::device, D>) && (SP < 0 || Us::sequence_parallel == (SP == 1))) ||
     ...);

}  // namespace detail

// What a binary compiled, for the end of an error: "this binary compiled gpt2 on host: plain in f32,
// bf16; ... | llama on host: ...".
template <class... Us>
std::string compiled_text(List<Us...>) {
  std::vector<std::string> parts;
  (parts.push_back(detail::unit_text<Us>()), ...);
  std::string out = "this binary compiled ";
  for (std::size_t i = 0; i < parts.size(); ++i) out += cat(i ? " | " : "", parts[i]);
  return out;
}

// What the run asks of the family: its attention over the context axis ("none", "ring",
// "all-gather") and whether its head is tied (the configuration's `tied`, where it has one).
struct Wanted {
  std::string context = "none";
  bool tied = false;
  template <VariantType V>
  bool is() const {
    return context == V::context::name && tied == V::tied;
  }
};

template <Family F>
Wanted wanted(const Options& o, const config_t<F>& cfg) {
  Wanted w;
  if (o.mesh.context > 1) w.context = o.mesh.attention;
  if constexpr (requires {
                  { cfg.tied } -> std::convertible_to<bool>;
                })
    w.tied = cfg.tied;
  return w;
}

namespace detail {

// The error for a variant that F does not list: the context or the head it lacks, named.
template <Family F, class Units>
Error no_variant(const Options& o, const Wanted& w) {
  const auto context_variants = []<class... V>(List<V...>) {
    return (0 + ... + (V::context_parallel ? 1 : 0));
  }(variants_t<F>{});
  const std::string compiled = compiled_text(Units{});
  if (w.context != "none" && context_variants == 0)
    return Error(
        o.where(cat("--context ", o.mesh.context)),
        cat("the model family '", F::name(), "' has no context-parallel attention"),
        cat("leave out --context, or give the family context-parallel variants (train::Variant<context::Ring>, "
            "docs/context.md); ",
            compiled));
  if (w.tied && w.context != "none")
    return Error(o.where("--tie-embeddings true"),
                 cat("a tied LM head (the preset's, or --tie-embeddings) in the model family '", F::name(),
                     "' with --context, whose context-parallel model unties it"),
                 cat("give --tie-embeddings false, or leave out --context; ", compiled));
  const std::string head = w.tied ? "a tied LM head" : "an untied LM head";
  return Error(o.where(cat("--tie-embeddings ", w.tied ? "true" : "false")),
               cat(head, " in the model family '", F::name(), "', whose model ", w.tied ? "unties" : "ties", " it"),
               cat("give --tie-embeddings ", w.tied ? "false" : "true", "; ", compiled));
}

}  // namespace detail

namespace detail {

// The refusals of with_run: a variant this binary did not compile, and a variant without a GPU unit
// asked for on the GPU.
template <Family F, class V>
[[noreturn]] void refuse_variant(const Options& o, const std::string& compiled) {
  if (V::context_parallel)
    throw Error(o.where(cat("--context ", o.mesh.context)),
                cat("the context-parallel loops of the model family '", F::name(), "' are not compiled in this binary"),
                cat("leave out --context, or rebuild with them (weft_add_trainer without NO_CONTEXT; weft-train: CMake "
                    "-DWEFT_TRAIN_CONTEXT=ON); ",
                    compiled));
  throw Error(o.where(),
              cat("the variant '", V::name(), "' of the model family '", F::name(), "' is not compiled in this binary"),
              cat("rebuild with it; ", compiled));
}
template <Family F, class V>
[[noreturn]] void refuse_gpu(const Options& o, const std::string& compiled) {
  if (V::context_parallel)
    throw Error(o.where(cat("--context ", o.mesh.context)),
                "context parallelism on the GPU (its attention runs on the host so far)",
                cat("use --device host with --context; ", compiled));
  throw Error(o.where("--device cuda"), cat("the model family '", F::name(), "' has no GPU path in this binary"),
              cat("train it on the host (--device host); ", compiled));
}

}  // namespace detail

// The one closed dispatch, after the family: f.template operator()<V, U>() for F's variant V that the
// options and the configuration ask for and the unit U of Units that trains it on `device` ("host"
// or "cuda", as train/checks.hpp resolved --device; with --device auto a variant the GPU does not run
// falls back to the host) with the options' sequence parallelism; U compiles the options' strategy
// and precision. Throws an Error naming the option for anything else.
template <class Units, Family F, class Fn>
int with_run(const Options& o, const config_t<F>& cfg, const std::string& device, Fn&& f) {
  const Wanted w = wanted<F>(o, cfg);
  const std::string compiled = compiled_text(Units{});
  int out = 0;
  bool found = false;
  const auto run = [&]<class V>() {
    if constexpr (!detail::compiles<Units, F, V>) {
      detail::refuse_variant<F, V>(o, compiled);
    } else {
      const bool gpu = detail::compiles<Units, F, V, Cuda>;
      if (device == "cuda" && !gpu && o.launch.device != "auto") detail::refuse_gpu<F, V>(o, compiled);
      const bool on_cuda = device == "cuda" && gpu;
      if (on_cuda && o.model.dtype == "f64")
        throw Error(o.where(), "--dtype f64 on the GPU", "f64 is the host's checking precision: use f32 or bf16");
      if (on_cuda && o.model.dtype.starts_with("fp8-"))
        throw Error(o.where(), cat("--dtype ", o.model.dtype, " on the GPU"),
                    "FP8 trains on the host for now (its GPU GEMMs, cuBLASLt's, are not written yet): use --device "
                    "host, or bf16 on the GPU");
      const bool sp = o.mesh.sequence_parallel();
      const auto strategies = strategy_names(strategies_t<F>{});
      if (std::find(strategies.begin(), strategies.end(), o.mesh.strategy) == strategies.end())
        throw Error(o.where(), cat("strategy '", o.mesh.strategy, "' is not available"),
                    cat("use one of: ", join(strategies), "; ", compiled));
      const auto unit = [&]<class U>() {
        if constexpr (std::same_as<typename U::family, F> && contains_v<V, typename U::variants>) {
          if (found || U::sequence_parallel != sp) return;
          if ((std::same_as<typename U::device, Cuda>) != on_cuda) return;
          const auto dtypes = dtype_names(typename U::template precisions<V>{});
          if (std::find(dtypes.begin(), dtypes.end(), o.model.dtype) == dtypes.end())
            throw Error(o.where("--dtype"),
                        cat("precision '", o.model.dtype, "' is not compiled for the model family '", F::name(), "'"),
                        cat("use one of: ", join(dtypes), "; ", compiled));
          found = true;
          out = f.template operator()<V, U>();
        }
      };
      [&]<class... Us>(List<Us...>) { (unit.template operator()<Us>(), ...); }(Units{});
      if (!found)
        throw Error(o.where(cat("--strategy ", o.mesh.strategy)),
                    cat("the model family '", F::name(), "' is not compiled ", sp ? "with" : "without",
                        " sequence parallelism on ", on_cuda ? "the GPU" : "the host"),
                    cat("choose a strategy ", sp ? "without" : "with", " -sp; ", compiled));
    }
  };
  bool listed = false;
  [&]<class... V>(List<V...>) {
    (void)((w.is<V>() ? (listed = true, run.template operator()<V>(), true) : false) || ...);
  }(variants_t<F>{});
  if (!listed) throw detail::no_variant<F, Units>(o, w);
  return out;
}

// The units of families compiled beside main (a trainer in one file, train::main<MyFamily>): each
// family on the host, with and without sequence parallelism, everything it has.
template <Family... Fs>
using host_units_t = concat_t<List<Unit<Fs, Host, false>, Unit<Fs, Host, true>>...>;

}  // namespace weft::train
