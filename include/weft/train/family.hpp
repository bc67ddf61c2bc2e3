// A model family for the trainer (concept train::Family): a model template over the precision, the
// sequence parallelism and the device, and its presets. The loop
// (train/loop.hpp), the command line (train/main.hpp) and the checkpoints read nothing else of the
// model; GPT-2's family is models/gpt2/train.hpp, a user's is a dozen lines
// (examples/03_custom_model_train.cpp).
//
//   struct MyFamily {
//     template <class P, bool SP, class D> using model = nn::StagedModel<MySpec<P, SP, D>>;
//     static std::string name() { return "mine"; }                       // --model mine
//     static std::vector<std::string> preset_names() { return {"tiny"}; }
//     static MyConfig preset(std::string_view name);                      // name is one of them
//   };
//
// Optional members, found by requires-expressions:
//   summary(cfg) -> std::string              the run's header line (default: the record's fields)
//   flops_per_token(cfg) -> double           for MFU (default: from the parameters the layers declare,
//                                            train/flops.hpp)
//   import_hf(file, dir, cfg)                --init-from: a Hugging Face file as a weft checkpoint in dir
//   config_from_hf(from, base) -> config     --init-from without --preset: the run's configuration
//                                            from the Hugging Face files (base: the sequence and
//                                            seed; train/main.hpp refuses size options that differ)
//   strategies, host_precisions, cuda_precisions (train::List<...>): what the binary compiles
//                                            (default: every strategy; f32, bf16 and f64 on the host)
//   plan(o, cfg, host) / print_plan(o, cfg, device) / approximate_elements(o, cfg): train/main.hpp
//                                            checks the run fits and prints --plan with them
//                                            (default: the step measured on the Meta device,
//                                            train/plan.hpp, which needs a Meta specialization of
//                                            every op family the model uses)
//   measured_plan = false                    no plan: the fits check skipped, --plan refused
//   gpu = false                              no GPU path: --device cuda refused, auto the host
//   with_context<Cx> (a family template)     --context > 1: the family whose models split the sequence
//                                            over the context axis with attention Cx (context::Ring,
//                                            context::AllGather); without it --context is refused
//   context_compiled = false                 with_context's loops left out of this binary: --context
//                                            refused naming the build option
//   with_tied_head (a family)                where the configuration has `tied` (--tie-embeddings, the
//                                            preset's): the family whose model's LM head reads the
//                                            embedding table, trained and planned in F's place where
//                                            it is set (declares_tied_head)
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/train/options.hpp"

namespace weft::train {

// A list of types: the strategies or precisions a family compiles.
template <class... Ts>
struct List {};

template <class F>
concept Family = requires(std::string_view name) {
  typename F::template model<F32, false, Host>;
  typename F::template model<F32, true, Host>;
  { F::name() } -> std::convertible_to<std::string>;
  { F::preset_names() } -> std::convertible_to<std::vector<std::string>>;
  { F::preset(name) } -> std::same_as<typename F::template model<F32, false, Host>::config_type>;
};

template <Family F>
using config_t = typename F::template model<F32, false, Host>::config_type;

template <Family F, class P, bool SP, class D>
using model_t = typename F::template model<P, SP, D>;

namespace detail {
template <class F> struct strategies_of { using type = List<optim::Ddp, optim::Zero1, optim::Zero2, optim::Fsdp>; };
template <class F> requires requires { typename F::strategies; } struct strategies_of<F> { using type = typename F::strategies; };
template <class F> struct host_precisions_of { using type = List<F32, Bf16Mixed, F64>; };
template <class F> requires requires { typename F::host_precisions; } struct host_precisions_of<F> { using type = typename F::host_precisions; };
template <class F> struct cuda_precisions_of { using type = List<F32, Bf16Mixed>; };
template <class F> requires requires { typename F::cuda_precisions; } struct cuda_precisions_of<F> { using type = typename F::cuda_precisions; };
}  // namespace detail

template <Family F> using strategies_t = typename detail::strategies_of<F>::type;
template <Family F> using host_precisions_t = typename detail::host_precisions_of<F>::type;
template <Family F> using cuda_precisions_t = typename detail::cuda_precisions_of<F>::type;

// Whether the trainer runs the family on the GPU (unless it sets `static constexpr bool gpu = false`).
template <class F>
inline constexpr bool on_gpu = [] {
  if constexpr (requires { F::gpu; }) return static_cast<bool>(F::gpu);
  else return true;
}();

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
    else throw Error(cat(program, " --heads"), cat("the model family '", F::name(), "' has no heads to set"), "leave out --heads");
  }
  if (sizes.kv_heads) {
    if constexpr (requires { c.kv_heads = *sizes.kv_heads; }) c.kv_heads = *sizes.kv_heads;
    else throw Error(cat(program, " --kv-heads"), cat("the model family '", F::name(), "' has no key-value heads to set"),
                     "leave out --kv-heads");
  }
  if (sizes.hidden) {
    if constexpr (requires { c.hidden = *sizes.hidden; }) c.hidden = *sizes.hidden;
    else throw Error(cat(program, " --hidden"), cat("the model family '", F::name(), "' has no hidden width to set"),
                     "leave out --hidden");
  }
  if (sizes.tied) {
    if constexpr (requires { c.tied = *sizes.tied; }) c.tied = *sizes.tied;
    else throw Error(cat(program, " --tie-embeddings"), cat("the model family '", F::name(), "' has no choice of a tied head"),
                     "leave out --tie-embeddings");
  }
  if (sizes.width) c.width = *sizes.width;
  if (sizes.seq) c.seq = *sizes.seq;
  if (sizes.vocab) c.vocab = *sizes.vocab;
  return c;
}

// f.template operator()<F>() for the family named `name`, or for the first when `name` is empty;
// `where` names the option in the error for a name that is none of them.
template <Family F, Family... Rest, class Fn>
int with_family(const std::string& name, const std::string& where, Fn&& f) {
  if (name.empty() || name == F::name()) return f.template operator()<F>();
  if constexpr (sizeof...(Rest) > 0) return with_family<Rest...>(name, where, std::forward<Fn>(f));
  else throw Error(where, cat("no model family '", name, "'"), "see --help");
}

// A family whose configuration chooses whether the LM head reads the embedding table (its `tied`)
// and that names the family whose model ties it (F::with_tied_head, taken in F's place where the
// configuration ties the head: train_gpt, weft-plan).
template <class F>
concept declares_tied_head = requires(config_t<F> c) {
  typename F::with_tied_head;
  { c.tied } -> std::convertible_to<bool>;
};

// f.template operator()<G>() for G the family whose model has the head `tied` asks for: F, or
// F::with_tied_head.
template <Family F, class Fn>
int with_head_family(bool tied, Fn&& f) {
  if constexpr (declares_tied_head<F>)
    if (tied) return f.template operator()<typename F::with_tied_head>();
  return f.template operator()<F>();
}

// Whether the family is planned by measuring its step on the Meta device (train/plan.hpp): unless
// it sets `static constexpr bool measured_plan = false` (its op families have no Meta
// specializations, so its model does not compile on Meta; then the fits check is skipped and
// --plan refused).
template <class F>
concept measurable = !requires { F::measured_plan; } || F::measured_plan;

// The run's header line: the family's summary, or the fields of its record.
template <Family F>
std::string summary(const config_t<F>& c) {
  if constexpr (requires { { F::summary(c) } -> std::convertible_to<std::string>; }) {
    return F::summary(c);
  } else {
    std::string out;
    for (const auto& [k, v] : model_t<F, F32, false, Host>::spec::record(c)) out += cat(out.empty() ? "" : ", ", k, " ", v);
    return out;
  }
}

}  // namespace weft::train
