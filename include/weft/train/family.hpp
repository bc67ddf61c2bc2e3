// A model family for the trainer (concept train::Family): a model template over the precision, the
// sequence parallelism, the device and the variant, and its presets. The loop (train/loop.hpp), the
// command line (train/main.hpp), weft-plan and weft-export read nothing else of the model; weft's own
// families are models/<name>/family.hpp, a user's is a dozen lines
// (examples/03_custom_model_family.hpp).
//
//   struct MyFamily {
//     template <class P, bool SP, class D> using model = nn::StagedModel<MySpec<P, SP, D>>;
//     static std::string name() { return "mine"; }                       // --model mine
//     static std::vector<std::string> preset_names() { return {"tiny"}; }
//     static MyConfig preset(std::string_view name);                      // name is one of them
//   };
//
// Variants. A family whose model comes in more than one form (its attention over the context axis,
// its LM head tied to the embedding table) writes its model over a fourth parameter, the variant
// (train::Variant<Cx, Tied>), and lists the variants it has; the trainer takes the one the run asks
// for (--context and --attention; the configuration's `tied`):
//
//     template <class P, bool SP, class D, class V> using model = Model<P, SP, D, V::tied, typename V::context>;
//     using variants = train::List<train::Variant<>, train::Variant<context::None, true>,
//                                  train::Variant<context::Ring>, train::Variant<context::AllGather>>;
//
// A variant with a context runs on the host in f32 (context parallelism's attention is the host's,
// so far). A family without `variants` has one, train::Variant<>, and a three-parameter model.
//
// Optional members, found by requires-expressions:
//   summary(cfg) -> std::string              the run's header line (default: the record's fields)
//   flops_per_token(cfg) -> double           for MFU (default: from the parameters the layers declare,
//                                            train/flops.hpp)
//   import_hf(file, dir, cfg)                --init-from: a Hugging Face file as a weft checkpoint in dir
//   config_from_hf(from, base) -> config     --init-from without --preset: the run's configuration
//                                            from the Hugging Face files (base: the sequence and
//                                            seed; train/main.hpp refuses size options that differ)
//   export_hf(checkpoint, out, options)      weft-export: a checkpoint in Hugging Face's form
//   strategies, host_precisions, cuda_precisions (train::List<...>): what the binary compiles
//                                            (default: every strategy; f32, bf16 and f64 on the host,
//                                            f32 and bf16 on the GPU)
//   plan(o, cfg, host) / print_plan(o, cfg, device) / cluster_cost(...): the plain variant's plan in
//                                            closed form (default, and for every other variant: the
//                                            step measured on the Meta device, train/plan.hpp, which
//                                            needs a Meta specialization of every op the
//                                            model uses)
//   data<E>                                  the family reads its own data, not tokens (concept
//                                            OwnsData: DiT's latents): a class over the model's
//                                            element type, made on each rank from (options, config,
//                                            global micro-batch, data degree, data rank,
//                                            micro-batches a step), with next(step, i, scale) ->
//                                            the model's micro-batch, validation_batches(),
//                                            validation(k) -> (name, micro-batch), describe()
//                                            (models/dit/family.hpp)
//   measured_plan = false                    no plan: the fits check skipped, --plan refused
//   gpu = false                              no GPU path: --device cuda refused, auto the host
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/context/attention.hpp"
#include "weft/core/error.hpp"
#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/ops/math.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/train/sizes.hpp"

namespace weft {
class Cuda;  // device/cuda/device.hpp; named here by the lists of what runs on the GPU
}

namespace weft::train {

// A list of types: the strategies, precisions or variants a family compiles.
template <class... Ts>
struct List {};

// One form of a family's model: its attention over the context axis (context::None: the sequence
// whole on every rank; context::Ring, context::AllGather: docs/context.md) and whether its LM head
// reads the embedding table (the configuration's `tied`).
template <context::Choice Cx = context::None, bool Tied = false>
struct Variant {
  using context = Cx;
  static constexpr bool tied = Tied;
  static constexpr bool context_parallel = weft::context::Kind<Cx>;
  // "plain", "tied head", "ring", "all-gather", "ring, tied head"
  static std::string name() {
    std::string out = context_parallel ? Cx::name : "";
    if (Tied) out += out.empty() ? "tied head" : ", tied head";
    return out.empty() ? "plain" : out;
  }
};
using Plain = Variant<>;

template <class V>
concept VariantType = requires {
  typename V::context;
  { V::tied } -> std::convertible_to<bool>;
  { V::context_parallel } -> std::convertible_to<bool>;
};

namespace detail {
// The family's model over (P, SP, D, V): its four-parameter model, or its three-parameter one for the
// plain variant.
template <class F, class P, bool SP, class D, class V>
struct model_of {};
template <class F, class P, bool SP, class D, class V>
  requires requires { typename F::template model<P, SP, D, V>; }
struct model_of<F, P, SP, D, V> {
  using type = typename F::template model<P, SP, D, V>;
};
template <class F, class P, bool SP, class D, class V>
  requires(
      !requires { typename F::template model<P, SP, D, V>; } && std::same_as<V, Plain> &&
      requires { typename F::template model<P, SP, D>; })
struct model_of<F, P, SP, D, V> {
  using type = typename F::template model<P, SP, D>;
};
template <class F> struct variants_of {
  using type = List<Plain>;
};
template <class F>
  requires requires { typename F::variants; }
struct variants_of<F> {
  using type = typename F::variants;
};
}  // namespace detail

template <class F, class P, bool SP, class D, class V = Plain>
using family_model_t = typename detail::model_of<F, P, SP, D, V>::type;

template <class F>
concept Family = requires(std::string_view name) {
  typename family_model_t<F, F32, false, Host>;
  typename family_model_t<F, F32, true, Host>;
  { F::name() } -> std::convertible_to<std::string>;
  { F::preset_names() } -> std::convertible_to<std::vector<std::string>>;
  { F::preset(name) } -> std::same_as<typename family_model_t<F, F32, false, Host>::config_type>;
};

template <Family F>
using config_t = typename family_model_t<F, F32, false, Host>::config_type;

template <Family F, class P, bool SP, class D>
using model_t = family_model_t<F, P, SP, D>;

// The variants a family has (train::Variant<> where it lists none).
template <class F>
using variants_t = typename detail::variants_of<F>::type;

// Type lists: membership, filtering, index.
template <class T, class L> struct contains;
template <class T, class... Ts> struct contains<T, List<Ts...>> : std::bool_constant<(std::same_as<T, Ts> || ...)> {};
template <class T, class L> inline constexpr bool contains_v = contains<T, L>::value;

template <class L, template <class> class Keep> struct filter;
template <template <class> class Keep> struct filter<List<>, Keep> {
  using type = List<>;
};
template <class T, class... Ts, template <class> class Keep>
struct filter<List<T, Ts...>, Keep> {
  using rest = typename filter<List<Ts...>, Keep>::type;
  template <class R> struct prepend;
  template <class... Rs> struct prepend<List<Rs...>> {
    using type = List<T, Rs...>;
  };
  using type = std::conditional_t<Keep<T>::value, typename prepend<rest>::type, rest>;
};
template <class L, template <class> class Keep> using filter_t = typename filter<L, Keep>::type;

// The types of A that are also in B, in A's order.
template <class A, class B>
struct intersect {
  template <class T> struct in_b : contains<T, B> {};
  using type = filter_t<A, in_b>;
};
template <class A, class B> using intersect_t = typename intersect<A, B>::type;

template <class... Ls> struct concat {
  using type = List<>;
};
template <class... A> struct concat<List<A...>> {
  using type = List<A...>;
};
template <class... A, class... B, class... Rest>
struct concat<List<A...>, List<B...>, Rest...> : concat<List<A..., B...>, Rest...> {};
template <class... Ls> using concat_t = typename concat<Ls...>::type;

template <class L> inline constexpr std::size_t size_v = 0;
template <class... Ts> inline constexpr std::size_t size_v<List<Ts...>> = sizeof...(Ts);

template <class T, class L> inline constexpr std::size_t index_v = 0;
template <class T, class U, class... Ts>
inline constexpr std::size_t index_v<T, List<U, Ts...>> = std::same_as<T, U> ? 0 : 1 + index_v<T, List<Ts...>>;

// f.template operator()<T>() for the type at run-time index i of L (i < size_v<L>).
template <class... Ts, class Fn>
auto with_index(List<Ts...>, std::size_t i, Fn&& f) {
  using R = decltype(f.template operator()<std::tuple_element_t<0, std::tuple<Ts...>>>());
  std::size_t k = 0;
  if constexpr (std::is_void_v<R>) {
    (void)((k++ == i ? (f.template operator()<Ts>(), true) : false) || ...);
  } else {
    std::optional<R> out;
    (void)((k++ == i ? (out.emplace(f.template operator()<Ts>()), true) : false) || ...);
    return std::move(*out);
  }
}

namespace detail {
template <class F> struct strategies_of {
  using type = List<optim::Ddp, optim::Zero1, optim::Zero2, optim::Fsdp>;
};
template <class F>
  requires requires { typename F::strategies; }
struct strategies_of<F> {
  using type = typename F::strategies;
};
template <class F> struct host_precisions_of {
  using type = List<F32, Bf16Mixed, F64>;
};
template <class F>
  requires requires { typename F::host_precisions; }
struct host_precisions_of<F> {
  using type = typename F::host_precisions;
};
template <class F> struct cuda_precisions_of {
  using type = List<F32, Bf16Mixed>;
};
template <class F>
  requires requires { typename F::cuda_precisions; }
struct cuda_precisions_of<F> {
  using type = typename F::cuda_precisions;
};
template <class F> struct cuda_precisions_of_gpu {
  using type = typename cuda_precisions_of<F>::type;
};
template <class F>
  requires requires { F::gpu; } && (!F::gpu)
struct cuda_precisions_of_gpu<F> {
  using type = List<>;
};

// The precisions variant V of F runs in on device D: the family's, f32 only on the host for a
// context-parallel variant (and not on the GPU).
template <class F, class V, class D>
struct precisions_of {
  using type = std::conditional_t<V::context_parallel, intersect_t<typename host_precisions_of<F>::type, List<F32>>,
                                  typename host_precisions_of<F>::type>;
};
template <class F, class V>
struct precisions_of<F, V, Cuda> {
  using type = std::conditional_t<V::context_parallel, List<>, typename cuda_precisions_of_gpu<F>::type>;
};
}  // namespace detail

template <Family F> using strategies_t = typename detail::strategies_of<F>::type;
template <Family F> using host_precisions_t = typename detail::host_precisions_of<F>::type;
template <Family F> using cuda_precisions_t = typename detail::cuda_precisions_of<F>::type;
// What variant V of F runs in on device D (an empty list: V does not run on D).
template <Family F, class V, class D> using precisions_t = typename detail::precisions_of<F, V, D>::type;

// Whether the trainer runs the family on the GPU (unless it sets `static constexpr bool gpu = false`).
template <class F>
inline constexpr bool on_gpu = [] {
  if constexpr (requires { F::gpu; }) return static_cast<bool>(F::gpu);
  else return true;
}();

// Family F's variant V as a family of its own, which the loop, the plans and the checks take: its
// model is F's over V; it runs in V's precisions; everything else is F's. A family's plan in closed
// form (plan, print_plan, cluster_cost, recomputed) is its plain variant's: the other variants are
// planned on the Meta device.
namespace detail {
template <class F, class V>
struct BoundBase : F {
  using family = F;
  using variant = V;
  template <class P, bool SP, class D>
  using model = family_model_t<F, P, SP, D, V>;
  using host_precisions = precisions_t<F, V, Host>;
  using cuda_precisions = precisions_t<F, V, Cuda>;
};
}  // namespace detail

template <Family F, VariantType V>
struct Bound : detail::BoundBase<F, V> {};
template <Family F, VariantType V>
  requires(!std::same_as<V, Plain>)
struct Bound<F, V> : detail::BoundBase<F, V> {
  // F's closed forms describe its plain model: hidden, so that this variant is measured.
  static void plan() = delete;
  static void print_plan() = delete;
  static void cluster_cost() = delete;
  static void cluster_peak_note() = delete;
  static constexpr bool recomputed = false;
};

// The family's model over any device, as footprint::measure and the planners take it
// (ModelOn<F, P, SP>::on<D>).
template <Family F, class P, bool SP>
struct ModelOn {
  template <class D>
  using on = model_t<F, P, SP, D>;
};

// The family's preset `preset` with `sizes` over it. Errors name `program` and the option: a preset
// the family does not have, or --heads for a family whose config has none.
template <Family F>
config_t<F> preset_config(const std::string& program, const std::string& preset, const Sizes& sizes) {
  const auto names = F::preset_names();
  if (std::find(names.begin(), names.end(), preset) == names.end())
    throw Error(cat(program, " --preset"), cat("the model family '", F::name(), "' has no preset '", preset, "'"),
                cat("use one of: ", join(names)));
  config_t<F> c = F::preset(preset);
  if (sizes.layers) c.layers = *sizes.layers;
  if (sizes.heads) {
    if constexpr (requires { c.heads = *sizes.heads; }) c.heads = *sizes.heads;
    else
      throw Error(cat(program, " --heads"), cat("the model family '", F::name(), "' has no heads to set"),
                  "leave out --heads");
  }
  if (sizes.kv_heads) {
    if constexpr (requires { c.kv_heads = *sizes.kv_heads; }) c.kv_heads = *sizes.kv_heads;
    else
      throw Error(cat(program, " --kv-heads"), cat("the model family '", F::name(), "' has no key-value heads to set"),
                  "leave out --kv-heads");
  }
  if (sizes.hidden) {
    if constexpr (requires { c.hidden = *sizes.hidden; }) c.hidden = *sizes.hidden;
    else
      throw Error(cat(program, " --hidden"), cat("the model family '", F::name(), "' has no hidden width to set"),
                  "leave out --hidden");
  }
  if (sizes.tied) {
    if constexpr (requires { c.tied = *sizes.tied; }) c.tied = *sizes.tied;
    else
      throw Error(cat(program, " --tie-embeddings"),
                  cat("the model family '", F::name(), "' has no choice of a tied head"), "leave out --tie-embeddings");
  }
  if (sizes.experts || sizes.top_k || sizes.capacity_factor || sizes.sigmoid || sizes.expert_bias || sizes.groups ||
      sizes.top_groups) {
    if constexpr (requires {
                    c.experts = 1, c.top_k = 1, c.capacity_factor = 0.0, c.score, c.expert_bias = true, c.groups = 1,
                    c.top_groups = 1;
                  }) {
      if (sizes.experts) c.experts = *sizes.experts;
      if (sizes.top_k) c.top_k = *sizes.top_k;
      if (sizes.capacity_factor) c.capacity_factor = *sizes.capacity_factor;
      if (sizes.sigmoid) {
        c.score = *sizes.sigmoid ? math::Score::sigmoid : math::Score::softmax;
        if (*sizes.sigmoid) c.z_coef = 0;  // no z-loss on sigmoid scores (nn/moe.hpp)
      }
      if (sizes.expert_bias) c.expert_bias = true, c.bias_rate = *sizes.expert_bias;
      if (sizes.groups) c.groups = *sizes.groups;
      if (sizes.top_groups) c.top_groups = *sizes.top_groups;
    } else {
      throw Error(cat(program, sizes.experts           ? " --experts"
                               : sizes.top_k           ? " --top-k"
                               : sizes.capacity_factor ? " --capacity-factor"
                               : sizes.sigmoid         ? " --router"
                               : sizes.expert_bias     ? " --expert-bias"
                               : sizes.groups          ? " --expert-groups"
                                                       : " --top-groups"),
                  cat("the model family '", F::name(), "' has no experts"),
                  "leave out --experts, --top-k, --capacity-factor, --router, --expert-bias, --expert-groups and "
                  "--top-groups");
    }
  }
  if (sizes.width) c.width = *sizes.width;
  if (sizes.seq) c.seq = *sizes.seq;
  if (sizes.vocab) {
    if constexpr (requires { c.vocab = *sizes.vocab; }) c.vocab = *sizes.vocab;
    else
      throw Error(cat(program, " --vocab"), cat("the model family '", F::name(), "' has no vocabulary"),
                  "leave out --vocab");
  }
  return c;
}

// A family that reads its own data (F::data), and the type of it for a model of element type E
// (NoData where the family reads tokens).
template <class F>
concept OwnsData = requires { typename F::template data<float>; };
struct NoData {};
template <class F, class E>
struct family_data {
  using type = NoData;
};
template <OwnsData F, class E>
struct family_data<F, E> {
  using type = typename F::template data<E>;
};
template <class F, class E>
using family_data_t = typename family_data<F, E>::type;

// The model's vocabulary: a language model's, 0 for a family without one.
template <class C>
std::int64_t vocab_of(const C& c) {
  if constexpr (requires { c.vocab; }) return c.vocab;
  else return 0;
}

// Whether the family is planned by measuring its step on the Meta device (train/plan.hpp): unless
// it sets `static constexpr bool measured_plan = false` (its ops have no Meta
// specializations, so its model does not compile on Meta; then the fits check is skipped and
// --plan refused).
template <class F>
concept measurable = !requires { F::measured_plan; } || F::measured_plan;

// The run's header line: the family's summary, or the fields of its record.
template <Family F>
std::string summary(const config_t<F>& c) {
  if constexpr (requires {
                  { F::summary(c) } -> std::convertible_to<std::string>;
                }) {
    return F::summary(c);
  } else {
    std::string out;
    for (const auto& [k, v] : model_t<F, F32, false, Host>::spec::record(c))
      out += cat(out.empty() ? "" : ", ", k, " ", v);
    return out;
  }
}

}  // namespace weft::train
