// The command line of a trainer, over the loop (train/loop.hpp), for one or more model families:
//
//   int main(int argc, char** argv) {                       // a trainer in one file
//     return weft::train::main<my::Family>(argc, argv, "my_train", "my_train: ...");
//   }
//   return weft::train::main_of<weft_units::units>(...);    // over a build's units (train/unit.hpp)
//
// Every option of docs/training.md (--model picks the family, --preset its size; --layers, --width,
// --heads, --seq, --vocab override the preset), checked before anything is built: a bad option
// exits 2 with a weft::Error naming it, a run that fails exits 1, a diverged one 3, a stopped one
// 128 + the signal. The dispatch (train/dispatch.hpp) picks the family's variant and the unit that
// trains it; the units' loops are compiled where the build says (cmake/WeftTrainer.cmake), or, for
// train::main<F...>, beside main.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/launch.hpp"
#include "weft/data/corpus.hpp"  // ByteTokenizer
#include "weft/train/checks.hpp"
#include "weft/train/command_line.hpp"
#include "weft/train/corpus.hpp"
#include "weft/train/dispatch.hpp"
#include "weft/train/family.hpp"
#include "weft/train/init_dir.hpp"
#include "weft/train/loop.hpp"
#include "weft/train/options.hpp"
#include "weft/train/plan.hpp"
#include "weft/train/signals.hpp"
#include "weft/train/strategies.hpp"
#ifdef WEFT_ENABLE_CUDA
#include "weft/device/cuda/device.hpp"  // free_bytes
#endif
#ifdef WEFT_ENABLE_MPI
#include "weft/comm/mpi/session.hpp"
#endif

namespace weft::train {

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
inline double host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

// --init-from without --preset, for a family that reads a Hugging Face directory's configuration
// (F::config_from_hf): the model's sizes, rotary parameters and head tie from its config.json, the
// sequence and seed from the options. A size option that contradicts the file is refused by name.
template <Family F>
config_t<F> configure_from_hf(const Options& o) {
  config_t<F> base = F::preset(F::preset_names().front());  // the sequence length, where --seq is not given
  if (o.model.sizes.seq) base.seq = *o.model.sizes.seq;
  base.seed = o.model.seed;
  const config_t<F> cfg = F::config_from_hf(o.checkpoint.init_from, base);
  const auto text = [](const auto& v) -> std::string {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>) return v ? "true" : "false";
    else return cat(v);
  };
  const auto agree = [&](const char* option, const char* field, const auto& given, const auto& has) {
    if (!given || static_cast<std::int64_t>(*given) == static_cast<std::int64_t>(has)) return;
    throw Error(o.where(cat(option, " ", text(*given))),
                cat("the model in ", o.checkpoint.init_from, " has ", field, " ", text(has), " (its config.json)"),
                cat("leave out ", option,
                    ": with --init-from and no --preset the model's sizes come from config.json (or give "
                    "--preset and sizes that match it)"));
  };
  agree("--layers", "layers", o.model.sizes.layers, cfg.layers);
  agree("--width", "width", o.model.sizes.width, cfg.width);
  agree("--vocab", "vocab", o.model.sizes.vocab, cfg.vocab);
  if constexpr (requires { cfg.heads; }) agree("--heads", "heads", o.model.sizes.heads, cfg.heads);
  if constexpr (requires { cfg.kv_heads; }) agree("--kv-heads", "kv_heads", o.model.sizes.kv_heads, cfg.kv_heads);
  if constexpr (requires { cfg.hidden; }) agree("--hidden", "hidden", o.model.sizes.hidden, cfg.hidden);
  if constexpr (requires { cfg.tied; }) agree("--tie-embeddings", "tied", o.model.sizes.tied, cfg.tied);
  if constexpr (requires { cfg.experts; }) agree("--experts", "experts", o.model.sizes.experts, cfg.experts);
  if constexpr (requires { cfg.top_k; }) agree("--top-k", "top_k", o.model.sizes.top_k, cfg.top_k);
  return cfg;
}

// The run's configuration: the family's preset with the options' overrides, or a Hugging Face
// directory's (configure_from_hf).
template <Family F>
config_t<F> configure(const Options& o) {
  if constexpr (requires { F::config_from_hf(o.checkpoint.init_from, config_t<F>{}); })
    if (!o.checkpoint.init_from.empty() && !o.model.preset_given) return configure_from_hf<F>(o);
  Sizes sizes = o.model.sizes;
  if (!OwnsData<F> && !o.data.text.empty() && !sizes.vocab) sizes.vocab = data::ByteTokenizer::vocab;
  config_t<F> cfg = preset_config<F>(o.program, o.model.preset, sizes);
  cfg.seed = o.model.seed;
  return cfg;
}

// Refuses (exit 2) a configuration whose ranks in this process need more than the device has,
// from the plan of the step peak, before anything is allocated: the family's own plan, or the step
// measured on the Meta device (train/plan.hpp; exact on the host, without the CUDA back end's
// workspaces on the GPU).
template <Family F>
void check_fits(const Options& o, const config_t<F>& given, const std::string& device, const Launch& launch) {
  // A step too long to plan whole (train/rank_plan.hpp) is planned over as many of its layers as a
  // plan replays: more layers never need less memory, so that plan is a lower bound, and a run it
  // already does not fit is refused as "at least".
  config_t<F> cfg = given;
  const std::int64_t m = o.optim.batch / (o.optim.micro_batch > 0 ? o.optim.micro_batch : o.optim.batch),
                     stages = std::int64_t{o.mesh.pipe} * o.mesh.virtual_stages;
  const bool partial = plan_too_long(cfg.layers, m).has_value();
  if (partial) {
    cfg.layers = static_cast<std::int64_t>(kMaxPlanPasses) / std::max<std::int64_t>(m, 1) / stages * stages;
    if (cfg.layers < stages) return;  // not even one layer a stage: not checked
  }
  const std::string fix =
      cat("use a smaller model, batch or micro-batch, more tensor or pipeline ranks, or a sharded strategy "
          "(zero1, zero2, fsdp); ",
          o.program, " --plan prints the plan");
  const bool host = device != "cuda";
  std::vector<RankPlan> plan;
  if constexpr (requires { F::plan(o, cfg, true); }) {
    plan = F::plan(o, cfg, host);  // refuses sizes past what a plan counts
  } else if constexpr (measurable<F>) {
    if (o.mesh.ranks() > kMaxMeasuredRanks) return;  // a thread per rank: past that, not checked
    plan = measured_plan<F>(o, cfg, host);
  } else {
    return;  // the family opted out of the measured plan: not checked
  }
  double available = -1;
  std::string what;
  if (device == "cuda") {
#ifdef WEFT_ENABLE_CUDA
    available = static_cast<double>(weft::cuda::free_bytes(launch.gpu % std::max(1, weft::cuda::device_count())));
    what = cat("GPU ", launch.gpu, " has ", gib(available), " free");
#endif
  } else {
    available = host_available_bytes();
    what = cat("the host has ", gib(available), " available (MemAvailable)");
  }
  if (available < 0) return;
  // Every rank of this process: threads, all of them; a process, its own pipe rank's.
  const bool threads = launch.kind == Launcher::threads;
  double need = 0;
  if (!threads)
    need = static_cast<double>(plan[static_cast<std::size_t>(mesh_coord(o.mesh.shape(), launch.process).pipe)].total);
  else
    for (const auto& p : plan) need += static_cast<double>(p.total) * o.mesh.data * o.mesh.context * o.mesh.tensor;
  const int here = threads ? o.mesh.ranks() : 1;
  if (need > available)
    throw Error(o.where(),
                cat(partial ? cat("the plan of ", cfg.layers, " of its ", given.layers, " layers needs at least ")
                            : cat("the plan needs ", plan[0].exact ? "" : "at least "),
                    gib(need), " for the ", here, here == 1 ? " rank" : " ranks",
                    " of this process (the peak of a training step), but ", what),
                fix);
}

// --plan: the family's, or the step measured on the Meta device (train/plan.hpp).
template <Family F>
int print_plan(const Options& o, const config_t<F>& cfg, const std::string& device) {
  if constexpr (requires { F::print_plan(o, cfg, device); }) {
    return F::print_plan(o, cfg, device);
  } else if constexpr (measurable<F>) {
    return print_measured_plan<F>(o, cfg, device);
  } else {
    throw Error(o.where("--plan"),
                cat("the model family '", F::name(), "' has no plan (it sets measured_plan = false)"),
                "give its ops Meta specializations (docs/layers.md, \"Writing an op\") and drop measured_plan");
  }
}

// The command line's options, by section (docs/training.md lists them all).
inline void add_model_options(CLI::App& app, ModelOptions& o, const std::vector<std::string>& models,
                              const std::vector<std::string>& presets) {
  app.add_option("--model", o.family, cat("model family: ", join(models), " (default: ", models[0], ")"))
      ->check(CLI::IsMember(models));
  app.add_option("--preset", o.preset, cat("model size: ", join(presets), " (of the family's presets)"))
      ->check(CLI::IsMember(presets));
  cli::add_sizes(app, o.sizes);
  app.add_option("--dtype", o.dtype,
                 "f32, bf16 (mixed precision: bf16 compute, f32 master weights), f64 (host), or FP8 on the host: "
                 "fp8-tensorwise, fp8-rowwise, fp8-blockwise (bf16 with the linear layers' GEMMs on float8 casts)")
      ->check(CLI::IsMember({"f32", "bf16", "f64", "fp8-tensorwise", "fp8-rowwise", "fp8-blockwise"}));
  app.add_option("--seed", o.seed, "seed of the weights and the built-in corpus (0 to 2^64 - 1)")
      ->check(cli::at_least(0));
}

inline void add_mesh_options(CLI::App& app, MeshOptions& o, const std::vector<std::string>& strategies) {
  using cli::at_least;
  app.add_option("--data", o.data, "data-parallel degree")->check(at_least(1));
  app.add_option("--tensor", o.tensor, "tensor-parallel degree")->check(at_least(1));
  app.add_option("--pipe", o.pipe, "pipeline-parallel degree (the layers split evenly over pipe x virtual stages)")
      ->check(at_least(1));
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved or zb (ZB-H1)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb"}));
  app.add_option("--virtual-stages", o.virtual_stages, "virtual stages per pipe rank (interleaved: >= 2)")
      ->check(at_least(1));
  app.add_option("--context", o.context,
                 "context-parallel degree: each rank holds 2 of the sequence's 2N chunks (docs/context.md; host, f32)")
      ->check(at_least(1));
  app.add_option("--expert", o.expert,
                 "expert-parallel degree: a mixture of experts' experts sharded over groups of this many of the data x "
                 "context ranks (docs/moe.md)")
      ->check(at_least(1));
  app.add_option("--attention", o.attention,
                 "with --context: ring (keys and values passed around the context ranks) or all-gather (gathered once)")
      ->check(CLI::IsMember({"ring", "all-gather"}));
  app.add_option("--strategy", o.strategy, cat(join(strategies), " (-sp: with sequence parallelism)"));
}

inline void add_optim_options(CLI::App& app, OptimOptions& o) {
  using cli::above;
  using cli::at_least;
  app.add_option("--batch", o.batch, "global batch, in sequences")->check(at_least(1));
  app.add_option("--micro-batch", o.micro_batch, "global micro-batch (gradient accumulation); default: the batch")
      ->check(at_least(0));
  app.add_option("--steps", o.steps, "optimizer steps")->check(at_least(1));
  app.add_option("--lr", o.lr, "peak learning rate")->check(above(0));
  app.add_option("--warmup", o.warmup, "linear warm-up steps (default: 5% of the steps)")->check(at_least(0));
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine")->check(at_least(0));
  app.add_option("--clip", o.clip, "global gradient-norm clip (0: off)")->check(at_least(0));
}

inline void add_data_options(CLI::App& app, DataOptions& o) {
  using cli::at_least;
  auto* file = app.add_option("--data-file", o.file, "llm.c token file (.bin)");
  app.add_option("--text", o.text, "plain-text file, byte-level tokens")->excludes(file);
  app.add_option("--eval-every", o.eval_every, "held-out loss every N steps (0: never)")->check(at_least(0));
  app.add_option("--sample", o.sample, "after training on --text, print N sampled bytes")->check(at_least(0));
  auto* records = app.add_option("--records", o.records,
                                 "a record file of the model's inputs (--model dit: latents, f32 (C, H, W))");
  app.add_option("--labels", o.labels, "with --records: a record file of their labels (i32 (1))")->needs(records);
  app.add_option("--objective", o.objective, "--model dit: ddpm (epsilon, linear betas) or flow (rectified flow)")
      ->check(CLI::IsMember({"ddpm", "flow"}));
}

inline void add_checkpoint_options(CLI::App& app, CheckpointOptions& o) {
  using cli::at_least;
  app.add_option("--save-dir", o.save_dir, "directory of checkpoints (step_N/ and latest; docs/checkpoints.md)");
  app.add_option("--save-every", o.save_every, "save every N steps and at the end (0: only at the end)")
      ->check(at_least(0));
  app.add_option("--keep", o.keep, "keep the newest N checkpoints (0: all)")->check(at_least(0));
  app.add_flag("--async-save", o.async_save, "write checkpoint files beside the next steps");
  app.add_option("--save-policy", o.save_policy, "sharded (a file per rank) or consolidated (one file, rank 0)")
      ->check(CLI::IsMember({"sharded", "consolidated"}));
  app.add_option(
      "--init-from", o.init_from,
      "initial weights from Hugging Face: a GPT-2 safetensors file (weft-export writes one), a Llama model directory "
      "(config.json, model.safetensors)");
  app.add_option(
      "--resume", o.resume,
      "resume from a checkpoint: 'latest' (of --save-dir), a directory with a latest pointer, or a step directory; any "
      "mesh, strategy and precision");
}

inline void add_launch_options(CLI::App& app, LaunchOptions& o, LoggingOptions& logs, bool& plan_only) {
  app.add_option(
         "--device", o.device,
         "host, cuda (thread ranks share one GPU; processes one GPU each) or auto (the GPU when one is present)")
      ->check(CLI::IsMember({"host", "cuda", "auto"}));
  app.add_option(
         "--launcher", o.launcher,
         "threads (every rank a thread here), mpi (one rank per process of mpirun), env (RANK and WORLD_SIZE, GPUs with "
         "NCCL) or auto (mpi under mpirun, env when RANK is set, else threads); docs/launch.md")
      ->check(CLI::IsMember({"threads", "mpi", "env", "auto"}));
  app.add_option("--deadline", o.deadline,
                 "seconds a collective waits for the other ranks before naming the missing one")
      ->check(cli::above(0))
      ->check(cli::at_most(1e7));
  app.add_option("--log", logs.log, "JSON lines, one per step");
  app.add_option("--trace", logs.trace, "Chrome / Perfetto trace (JSON) of every rank's computes, waits and steps");
  app.add_flag("--plan", plan_only, "print the plan (each rank's bytes by category, FLOPs, collectives) and exit");
}

// This process among the run's: its launch (threads, or one rank of mpirun or of RANK and
// WORLD_SIZE), the MPI session it holds, and how it says an error (naming its rank) and exits.
class Process {
 public:
  Process(const Options& o, int& argc, char**& argv) : program_(o.program) {
    // first: under MPI every process initializes MPI, and errors name the rank
    launch.kind = resolve_launcher(o.launch.launcher);
#ifdef WEFT_ENABLE_MPI
    if (launch.kind != Launcher::mpi) return;
    session_.emplace(argc, argv);
    launch.process = session_->rank();
    launch.processes = session_->size();
    launch.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
    launch.gpu = local_rank();
#else
    (void)argc, (void)argv;
#endif
  }
  void report(const std::exception& e) const {
    if (launch.kind == Launcher::threads) std::fprintf(stderr, "%s\n", e.what());
    else std::fprintf(stderr, "%s (world rank %d): %s\n", program_.c_str(), launch.process, e.what());
  }
  int finish(int code) {
#ifdef WEFT_ENABLE_MPI
    if (session_) return session_->finish(code);
#endif
    return code;
  }

  Launch launch;

 private:
  std::string program_;
#ifdef WEFT_ENABLE_MPI
  std::optional<mpi::Session> session_;
#endif
};

// Every check of a run of F (a family's variant) on `device` that the dispatch does not make
// (train/checks.hpp), in order.
template <Family F>
void check_run(const Options& o, const config_t<F>& cfg, Launch& launch, const std::string& device, bool plan_only) {
  check_context<F>(o, cfg);
  check_world(o, launch);
  check_expert<F>(o);
  check_processes(o, launch, device);
  check_batch(o);
  check_model<F>(o, cfg);
  check_schedule(o, cfg.layers);
  check_inputs(o, F::name(), OwnsData<F>);
  if constexpr (!OwnsData<F>) check_data(o, cfg.vocab);
  check_checkpoint_options(o);
  if (!plan_only) {
    if constexpr (!OwnsData<F>) check_corpus(o, cfg.vocab);
    check_resume_model<F>(o, cfg);
  } else if (const auto why = plan_too_long(cfg.layers, o.optim.batch / o.optim.micro())) {
    throw Error(o.where("--plan"), *why, "plan fewer layers, or fewer micro-batches per step (a larger --micro-batch)");
  }
}

// f(), with its exceptions said and the process finished with `code`: 2 while checking options (a
// library's own exception or running out of memory, said as an Error), 1 once the run has begun (a
// bad option found then, such as a checkpoint past --steps, is still 2).
template <class Fn>
int said(Process& p, const Options& o, int code, Fn&& f) {
  try {
    return f();
  } catch (const BadOption& e) {
    p.report(e);
    return p.finish(2);
  } catch (const Error& e) { p.report(e); } catch (const std::bad_alloc& e) {
    if (code == 2)
      p.report(Error(o.where(), "ran out of memory checking or planning these sizes",
                     "use smaller sizes (--layers, --batch, --vocab, ...)"));
    else p.report(e);
  } catch (const std::exception& e) {  // never an abort
    if (code == 2) p.report(Error(o.where(), e.what(), "use other sizes, and report this message"));
    else p.report(e);
  }
  return p.finish(code);
}

// The run of family F: configured, dispatched to the variant and unit of Units that train it, checked
// (exit 2), then --plan printed or the model trained (exit 1 on an error; the loop's own codes
// otherwise).
template <class Units, Family F>
int run(Options o, Process& p, bool plan_only) {
  std::optional<checkpoint::DirectoryLock> save_lock;  // the lead process's, for the whole run
  std::optional<config_t<F>> cfg;
  std::function<int(const Corpus&)> train;  // the unit's loop the dispatch chose, once every check passed
  const int refused = said(p, o, 2, [&] {
    cfg = configure<F>(o);
    return with_run<Units, F>(o, *cfg, resolve_device(o), [&]<class V, class U>() -> int {
      using G = Bound<F, V>;
      const std::string device = device_name<typename U::device>;
      check_run<G>(o, *cfg, p.launch, device, plan_only);
      if (plan_only) return p.finish(p.launch.lead() ? print_plan<G>(o, *cfg, device) : 0);
      check_fits<G>(o, *cfg, device, p.launch);
      save_lock = claim_outputs(o, p.launch);
      train = [&](const Corpus& corpus) {
        return train_unit<U>(o, *cfg, corpus, p.launch, index_v<V, typename U::variants>);
      };
      return 0;
    });
  });
  if (!train) return refused;  // refused (exit 2), or --plan printed
  install_stop_handlers(p.launch.kind == Launcher::mpi, o.program);
  if (p.launch.lead() && !o.checkpoint.init_from.empty()) remove_stale_init_dirs();  // left by killed runs
  return said(p, o, 1, [&] {
    resolve_resume(o, p.launch, F::name());
    if constexpr (OwnsData<F>) return p.finish(train(Corpus{}));  // the family reads its own data
    else return p.finish(train(Corpus::open(o.data, o.model.seed, cfg->vocab, cfg->seq)));
  });
}

// The whole program over the units a build compiled (train/unit.hpp): parses argv, checks every
// option, and trains. `program` names the binary in errors; `about` heads --help.
template <class Units>
int main_of(int argc, char** argv, const std::string& program, const std::string& about) {
  using Families = families_t<Units>;
  Options o;
  o.program = program;
  CLI::App app{about};
  const std::vector<std::string> models = []<class... Fs>(List<Fs...>) {
    return std::vector<std::string>{Fs::name()...};
  }(Families{});
  std::vector<std::string> presets;
  for (const auto& names : []<class... Fs>(List<Fs...>) {
         return std::vector<std::vector<std::string>>{Fs::preset_names()...};
       }(Families{}))
    for (const auto& n : names)
      if (std::find(presets.begin(), presets.end(), n) == presets.end()) presets.push_back(n);
  bool plan_only = false;
  add_model_options(app, o.model, models, presets);
  add_mesh_options(app, o.mesh,
                   [&]<class F, class... Fs>(List<F, Fs...>) { return strategy_names(strategies_t<F>{}); }(Families{}));
  add_optim_options(app, o.optim);
  add_data_options(app, o.data);
  add_checkpoint_options(app, o.checkpoint);
  add_launch_options(app, o.launch, o.logging, plan_only);
  if (const auto stop = cli::parse(app, argc, argv)) return *stop;
  if (o.model.family.empty()) o.model.family = models[0];
  o.mesh.attention_given = app.count("--attention") > 0;
  o.model.preset_given = app.count("--preset") > 0;
  std::optional<Process> p;
  try {
    p.emplace(o, argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    return with_family(Families{}, o.model.family, o.where("--model"),
                       [&]<class F>() -> int { return run<Units, F>(o, *p, plan_only); });
  } catch (const Error& e) {
    p->report(e);
    return p->finish(2);
  }
}

// A trainer in one file over the families Fs (the first the default): every unit compiled beside
// main, on the host (examples/03_custom_model_train.cpp).
template <Family... Fs>
int main(int argc, char** argv, const std::string& program, const std::string& about) {
  return main_of<host_units_t<Fs...>>(argc, argv, program, about);
}

}  // namespace weft::train
