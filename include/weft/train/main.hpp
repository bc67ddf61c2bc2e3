// The command line of a trainer, over the loop (train/loop.hpp), for one or more model families:
//
//   int main(int argc, char** argv) {
//     return weft::train::main<gpt2::Family>(argc, argv, "train_gpt", "weft train_gpt: ...");
//   }
//
// Every option of docs/training.md (--model picks the family, --preset its size; --layers, --width,
// --heads, --seq, --vocab override the preset), checked before anything is built: a bad option
// exits 2 with a weft::Error naming it, a run that fails exits 1, a diverged one 3, a stopped one
// 128 + the signal. The loop's instantiations (one per strategy, precision and sequence parallelism)
// are compiled where the binary says (WEFT_TRAIN_HOST in train/loop.hpp; by default beside main); a CUDA build's
// GPU half defines train_on_cuda<F> (train/devices.cuh).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/launch.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/context/attention.hpp"
#include "weft/data/corpus.hpp"
#include "weft/optim/schedule.hpp"
#include "weft/pipeline/pipelined.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/train/command_line.hpp"
#include "weft/train/corpus.hpp"
#include "weft/train/family.hpp"
#include "weft/train/init_dir.hpp"
#include "weft/train/loop.hpp"
#include "weft/train/options.hpp"
#include "weft/train/plan.hpp"
#include "weft/train/signals.hpp"
#include "weft/train/strategies.hpp"
#ifdef WEFT_ENABLE_CUDA
#include "weft/device/cuda/device.hpp"
#endif
#ifdef WEFT_ENABLE_MPI
#include "weft/comm/mpi/session.hpp"
#endif

namespace weft::train {

#ifdef WEFT_ENABLE_CUDA
// The GPU half: defined by train/devices.cuh in the binary's CUDA translation unit.
template <Family F>
int train_on_cuda(const Options& o, const config_t<F>& cfg, const Corpus& corpus, const Launch& launch);
#endif

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

// The family's preset with the options' overrides.
template <Family F>
config_t<F> configure(const Options& o) {
  Sizes sizes = o.sizes;
  if (!o.text.empty() && !sizes.vocab) sizes.vocab = data::ByteTokenizer::vocab;
  config_t<F> cfg = preset_config<F>(o.program, o.preset, sizes);
  cfg.seed = o.seed;
  return cfg;
}

// The options' strategy and precision are among those the family compiles.
template <Family F>
void check_compiled(const Options& o) {
  const auto strategies = strategy_names(strategies_t<F>{});
  if (std::find(strategies.begin(), strategies.end(), o.strategy) == strategies.end())
    throw Error(o.where(), cat("strategy '", o.strategy, "' is not available"), cat("use one of: ", join(strategies)));
  const auto dtypes = dtype_names(host_precisions_t<F>{});
  if (std::find(dtypes.begin(), dtypes.end(), o.dtype) == dtypes.end())
    throw Error(o.where("--dtype"), cat("precision '", o.dtype, "' is not compiled for the model family '", F::name(), "'"),
                cat("use one of: ", join(dtypes)));
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
  const std::int64_t m = o.batch / (o.micro_batch > 0 ? o.micro_batch : o.batch), stages = std::int64_t{o.pipe} * o.virtual_stages;
  const bool partial = plan_too_long(cfg.layers, m).has_value();
  if (partial) {
    cfg.layers = static_cast<std::int64_t>(kMaxPlanPasses) / std::max<std::int64_t>(m, 1) / stages * stages;
    if (cfg.layers < stages) return;  // not even one layer a stage: not checked
  }
  const std::string fix = cat("use a smaller model, batch or micro-batch, more tensor or pipeline ranks, or a sharded strategy "
                              "(zero1, zero2, fsdp); ", o.program, " --plan prints the plan");
  const bool host = device != "cuda";
  std::vector<RankPlan> plan;
  if constexpr (requires { F::plan(o, cfg, true); }) {
    plan = F::plan(o, cfg, host);  // refuses sizes past what a plan counts
  } else if constexpr (measurable<F>) {
    if (o.ranks() > kMaxMeasuredRanks) return;  // a thread per rank: past that, not checked
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
  if (!threads) need = static_cast<double>(plan[static_cast<std::size_t>(mesh_coord(o.mesh(), launch.process).pipe)].total);
  else
    for (const auto& p : plan) need += static_cast<double>(p.total) * o.data * o.context * o.tensor;
  const int here = threads ? o.ranks() : 1;
  if (need > available)
    throw Error(o.where(),
                cat(partial ? cat("the plan of ", cfg.layers, " of its ", given.layers, " layers needs at least ")
                            : cat("the plan needs ", plan[0].exact ? "" : "at least "),
                    gib(need), " for the ", here,
                    here == 1 ? " rank" : " ranks", " of this process (the peak of a training step), but ", what),
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
    throw Error(o.where("--plan"), cat("the model family '", F::name(), "' has no plan (it sets measured_plan = false)"),
                "give its op families Meta specializations (docs/layers.md, \"Writing an op\") and drop measured_plan");
  }
}

// The device a run uses: --device, with auto meaning the GPU when one is present. Throws for a
// device this binary or machine does not have (exit 2).
inline std::string resolve_device(const Options& o) {
#ifdef WEFT_ENABLE_CUDA
  const int gpus = weft::cuda::device_count();
  if (o.device == "cuda" && gpus == 0)
    throw Error(o.where(), "--device cuda but no GPU was found (no CUDA device is visible, or no driver)",
                "run on a machine with an NVIDIA GPU, or use --device host");
  if (o.device == "auto") return gpus > 0 ? "cuda" : "host";
#else
  if (o.device == "cuda")
    throw Error(o.where(), "--device cuda but this binary was built without CUDA",
                "rebuild with a CUDA compiler (the cuda preset), or use --device host");
  if (o.device == "auto") return "host";
#endif
  return o.device;
}

// A family whose model shards the sequence over the context axis (F::with_context<Cx>'s, which the
// trainer takes in F's place under --context): the host only, so far.
template <class F>
concept context_parallel = requires { typename F::attention; };
// A family that has one, unless it sets `static constexpr bool context_compiled = false` (a binary
// that leaves the context-parallel loops out: --context is refused, naming the build option).
template <class F>
concept declares_context = requires { typename F::template with_context<context::Ring>; };
template <class F>
concept has_context = declares_context<F> && (!requires { F::context_compiled; } || F::context_compiled);

// f.template operator()<G>() for the family a run trains: F, or under --context > 1 F's
// context-parallel family for --attention (F without one: f<F>, whose checks refuse --context).
template <Family F, class Fn>
int with_context_family(const Options& o, Fn&& f) {
  if constexpr (has_context<F>) {
    if (o.context > 1) {
      if (o.attention == "all-gather") return f.template operator()<typename F::template with_context<context::AllGather>>();
      return f.template operator()<typename F::template with_context<context::Ring>>();
    }
  }
  return f.template operator()<F>();
}

// f.template operator()<G>() for the family G whose model has the head the run's configuration asks
// for (with_head_family; a configuration that cannot be built leaves F, whose run reports it).
template <Family F, class Fn>
int with_run_head(const Options& o, Fn&& f) {
  bool tied = false;
  if constexpr (declares_tied_head<F>) {
    try {
      tied = configure<F>(o).tied;
    } catch (const Error&) {
    }
  }
  return with_head_family<F>(tied, std::forward<Fn>(f));
}

// A configuration whose head (tied to the embedding table or not) the family's model does not have:
// a context-parallel family's, or a family without with_tied_head (exit 2, naming the option).
template <Family F>
void check_head(const Options& o, const config_t<F>& cfg) {
  if constexpr (requires { { cfg.tied } -> std::convertible_to<bool>; { model_t<F, F32, false, Host>::tied } -> std::convertible_to<bool>; }) {
    constexpr bool ties = model_t<F, F32, false, Host>::tied;
    if (static_cast<bool>(cfg.tied) == ties) return;
    const std::string where = o.where(cat("--tie-embeddings ", cfg.tied ? "true" : "false"));
    if (cfg.tied)
      throw Error(where, cat("a tied LM head (the preset's, or --tie-embeddings) in the model family '", F::name(), "'",
                             context_parallel<F> ? " with --context, whose context-parallel model unties it" : ", whose model unties it"),
                  cat("give --tie-embeddings false", context_parallel<F> ? ", or leave out --context" : ""));
    throw Error(where, cat("an untied LM head in the model family '", F::name(), "', whose model ties it"),
                "give --tie-embeddings true");
  }
}

// --context and --attention against the family and the other options (exit 2, naming the values).
template <Family F>
void check_context(const Options& o, const config_t<F>& cfg, const std::string& device) {
  if (o.context == 1) {
    if (o.attention_given)  // ring too: an attention type is a choice only with --context
      throw Error(o.where(), cat("--attention ", o.attention, " without --context"),
                  "the attention type shards the sequence over context ranks: give --context >= 2");
    return;
  }
  if constexpr (!context_parallel<F> && declares_context<F>) {
    throw Error(o.where(cat("--context ", o.context)),
                cat("the context-parallel loops of the model family '", F::name(), "' are not compiled in this binary"),
                "leave out --context, or rebuild with them (train_gpt: CMake -DWEFT_TRAIN_GPT_CONTEXT=ON)");
  } else if constexpr (!context_parallel<F>) {
    throw Error(o.where(cat("--context ", o.context)), cat("the model family '", F::name(), "' has no context-parallel attention"),
                "leave out --context, or give the family a context-parallel model (with_context, docs/context.md)");
  } else {
    if (device == "cuda")
      throw Error(o.where(cat("--context ", o.context)), "context parallelism on the GPU (its attention runs on the host so far)",
                  "use --device host with --context");
    if (cfg.seq % (2 * static_cast<std::int64_t>(o.context)) != 0)
      throw Error(o.where(cat("--context ", o.context)),
                  cat("a sequence of ", cfg.seq, " tokens does not split into 2 x ", o.context, " = ", 2 * o.context,
                      " equal chunks (each context rank holds two)"),
                  cat("use --seq a multiple of ", 2 * o.context, ", or another --context"));
    if (o.sample > 0)
      throw Error(o.where(cat("--context ", o.context)), "--sample with --context", "sample from a run without --context");
  }
}

// Run-time choices into types: the loop for the options' device, strategy and precision.
template <Family F>
int dispatch(const Options& o, const config_t<F>& cfg, const Corpus& corpus, const Launch& launch, const std::string& device) {
  if constexpr (context_parallel<F>) {  // check_context refused the GPU
    return sequence_parallel_name(o.strategy) ? train_on_host<F, true>(o, cfg, corpus, launch)
                                              : train_on_host<F, false>(o, cfg, corpus, launch);
  } else {
    if (device == "cuda") {
#ifdef WEFT_ENABLE_CUDA
      if constexpr (on_gpu<F>) return train_on_cuda<F>(o, cfg, corpus, launch);
#endif
    }
    return sequence_parallel_name(o.strategy) ? train_on_host<F, true>(o, cfg, corpus, launch)
                                              : train_on_host<F, false>(o, cfg, corpus, launch);
  }
}

// The whole program: parses argv, checks every option, and trains. `program` names the binary in
// errors; `about` heads --help.
template <Family First, Family... Rest>
int main(int argc, char** argv, const std::string& program, const std::string& about) {
  Options o;
  o.program = program;
  using cli::above;
  using cli::at_least;
  using cli::at_most;
  CLI::App app{about};
  const std::vector<std::string> models{First::name(), Rest::name()...};
  std::vector<std::string> presets;
  for (const auto& names : {First::preset_names(), Rest::preset_names()...})
    for (const auto& n : names)
      if (std::find(presets.begin(), presets.end(), n) == presets.end()) presets.push_back(n);
  app.add_option("--model", o.model, cat("model family: ", join(models), " (default: ", models[0], ")"))->check(CLI::IsMember(models));
  app.add_option("--preset", o.preset, cat("model size: ", join(presets), " (of the family's presets)"))->check(CLI::IsMember(presets));
  cli::add_sizes(app, o.sizes);
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
  app.add_option("--attention", o.attention,
                 "with --context: ring (keys and values passed around the context ranks) or all-gather (gathered once)")
      ->check(CLI::IsMember({"ring", "all-gather"}));
  app.add_option("--strategy", o.strategy,
                 cat(join(strategy_names(strategies_t<First>{})), " (-sp: with sequence parallelism)"));
  app.add_option("--batch", o.batch, "global batch, in sequences")->check(at_least(1));
  app.add_option("--micro-batch", o.micro_batch, "global micro-batch (gradient accumulation); default: the batch")
      ->check(at_least(0));
  app.add_option("--steps", o.steps, "optimizer steps")->check(at_least(1));
  app.add_option("--lr", o.lr, "peak learning rate")->check(above(0));
  app.add_option("--warmup", o.warmup, "linear warm-up steps (default: 5% of the steps)")->check(at_least(0));
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine")->check(at_least(0));
  app.add_option("--clip", o.clip, "global gradient-norm clip (0: off)")->check(at_least(0));
  app.add_option("--seed", o.seed, "seed of the weights and the built-in corpus (0 to 2^64 - 1)")->check(at_least(0));
  auto* file_opt = app.add_option("--data-file", o.data_file, "llm.c token file (.bin)");
  app.add_option("--text", o.text, "plain-text file, byte-level tokens")->excludes(file_opt);
  app.add_option("--eval-every", o.eval_every, "held-out loss every N steps (0: never)")->check(at_least(0));
  app.add_option("--dtype", o.dtype, "f32, bf16 (mixed precision: bf16 compute, f32 master weights) or f64 (host)")
      ->check(CLI::IsMember({"f32", "bf16", "f64"}));
  app.add_option("--device", o.device, "host, cuda (thread ranks share one GPU; processes one GPU each) or auto (the GPU when one is present)")
      ->check(CLI::IsMember({"host", "cuda", "auto"}));
  app.add_option("--log", o.log, "JSON lines, one per step");
  app.add_option("--save-dir", o.save_dir, "directory of checkpoints (step_N/ and latest; docs/checkpoints.md)");
  app.add_option("--save-every", o.save_every, "save every N steps and at the end (0: only at the end)")
      ->check(at_least(0));
  app.add_option("--keep", o.keep, "keep the newest N checkpoints (0: all)")->check(at_least(0));
  app.add_flag("--async-save", o.async_save, "write checkpoint files beside the next steps");
  app.add_option("--save-policy", o.save_policy, "sharded (a file per rank) or consolidated (one file, rank 0)")
      ->check(CLI::IsMember({"sharded", "consolidated"}));
  app.add_option("--init-from", o.init_from, "initial weights from Hugging Face: a GPT-2 safetensors file (weft-export writes one), a Llama model directory (config.json, model.safetensors)");
  app.add_option("--resume", o.resume,
                 "resume from a checkpoint: 'latest' (of --save-dir), a directory with a latest pointer, or a step "
                 "directory; any mesh, strategy and precision");
  app.add_option("--trace", o.trace, "Chrome / Perfetto trace (JSON) of every rank's computes, waits and steps");
  app.add_option("--launcher", o.launcher,
                 "threads (every rank a thread here), mpi (one rank per process of mpirun), env (RANK and WORLD_SIZE, "
                 "GPUs with NCCL) or auto (mpi under mpirun, env when RANK is set, else threads); docs/launch.md")
      ->check(CLI::IsMember({"threads", "mpi", "env", "auto"}));
  app.add_option("--deadline", o.deadline, "seconds a collective waits for the other ranks before naming the missing one")
      ->check(above(0))
      ->check(at_most(1e7));
  bool plan_only = false;
  app.add_flag("--plan", plan_only, "print the plan (each rank's bytes by category, FLOPs, collectives) and exit");
  app.add_option("--sample", o.sample, "after training on --text, print N sampled bytes")->check(at_least(0));
  if (const auto stop = cli::parse(app, argc, argv)) return *stop;
  if (o.model.empty()) o.model = models[0];
  o.attention_given = app.count("--attention") > 0;

  // Bad options: checked before anything is built, exit code 2.
  // The launcher first: under MPI every process initializes MPI, and errors name the rank.
  Launch launch;
  try {
    launch.kind = resolve_launcher(o.launcher);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
#ifdef WEFT_ENABLE_MPI
  std::optional<mpi::Session> session;
  if (launch.kind == Launcher::mpi) {
    session.emplace(argc, argv);
    launch.process = session->rank();
    launch.processes = session->size();
    launch.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
    launch.gpu = local_rank();
  }
  const auto finish = [&](int code) { return session ? session->finish(code) : code; };
#else
  const auto finish = [](int code) { return code; };
#endif
  const auto report = [&](const std::exception& e) {
    if (launch.kind == Launcher::threads) std::fprintf(stderr, "%s\n", e.what());
    else std::fprintf(stderr, "%s (world rank %d): %s\n", o.program.c_str(), launch.process, e.what());
  };

  // The run of family F: the named family, its context-parallel one under --context, or its tied
  // one where the configuration ties the LM head (with_tied_head).
  const auto run = [&]<class F>() -> int {
    std::string device;  // host or cuda, once resolved
    std::optional<checkpoint::DirectoryLock> save_lock;  // the lead process's, for the whole run
    config_t<F> cfg;
    try {
      cfg = configure<F>(o);
      device = resolve_device(o);
      check_context<F>(o, cfg, device);
      check_head<F>(o, cfg);
      if (device == "cuda" && !on_gpu<F>) {  // a family without a GPU path: auto means the host
        if (o.device == "auto") device = "host";
        else
          throw Error(o.where("--device cuda"), cat("the model family '", F::name(), "' has no GPU path in this binary"),
                      "train it on the host (--device host)");
      }
      // The ranks first, in floating point: four int degrees multiply past 64 bits.
      const double world = 1.0 * o.data * o.pipe * o.context * o.tensor;
      char world_text[64];
      std::snprintf(world_text, sizeof world_text, "%.0f", world);
      if (world > (1 << 20))
        throw Error(o.where(), cat(o.mesh_text(), " = ", world_text, " ranks"), "use at most 2^20 = 1048576 ranks");
      if (launch.kind == Launcher::threads && world > 1024)
        throw Error(o.where("--launcher threads"), cat(o.mesh_text(), " = ", world_text, " thread ranks in one process"),
                    "use at most 1024 thread ranks, or one process per rank (mpirun, docs/launch.md)");
      if (launch.kind == Launcher::env) {  // torchrun, srun: one GPU per process
        if (device != "cuda")
          throw Error(o.where("--launcher env"),
                      "RANK and WORLD_SIZE start one process per rank, which the host ranks do only under MPI",
                      "start the ranks with mpirun (--launcher mpi), use --device cuda, or unset RANK and WORLD_SIZE");
        const EnvRanks env = env_ranks();
        launch.process = env.rank;
        launch.processes = env.world;
        launch.gpu = env.local_rank;
      }
      if (launch.kind != Launcher::threads) {
  #ifndef WEFT_ENABLE_MPI
        if (launch.kind == Launcher::mpi)
          throw Error(o.where("--launcher mpi"), "this binary was built without MPI",
                      "install Debian's libopenmpi-dev and rebuild (CMake finds MPI and builds weft::mpi)");
  #endif
        const int ranks = o.ranks();
        const bool mpi = launch.kind == Launcher::mpi;
        if (launch.processes != ranks)
          throw Error(o.where(cat("--launcher ", name(launch.kind))),
                      cat(mpi ? "mpirun started " : "WORLD_SIZE is ", launch.processes, mpi ? " processes" : "", " but ",
                          o.mesh_text(), " = ", ranks, " ranks"),
                      cat(mpi ? cat("run mpirun -np ", ranks) : cat("start ", ranks, " processes"),
                          ", or choose degrees whose product is ", launch.processes));
        if (o.pipe > 1 && device == "cuda")
          throw Error(o.where(cat("--launcher ", name(launch.kind))), "--pipe with GPU processes (NCCL has no isend here yet)",
                      "use --pipe on thread ranks (--launcher threads), or tensor and data parallelism across GPUs");
        if (!o.trace.empty())
          throw Error(o.where(cat("--launcher ", name(launch.kind))), "--trace records thread ranks of one process",
                      "trace a --launcher threads run");
      }
      check_compiled<F>(o);
      const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
      if (o.batch % micro != 0)
        throw Error(o.where(), cat("batch ", o.batch, " is not a multiple of the micro-batch ", micro),
                    "use a micro-batch that divides the batch");
      const Spread spread{.data_degree = o.data, .tensor_degree = o.tensor, .context_degree = o.context};
      if (o.strategy.ends_with("-sp")) model_t<F, F32, true, Host>::spec::validate(cfg, spread, micro);
      else model_t<F, F32, false, Host>::spec::validate(cfg, spread, micro);
      (void)optim::Schedule::warmup_cosine(o.lr, o.warmup.value_or(o.steps / 20), o.steps, o.min_lr);
      validate(o.mesh(), o.ranks());
      if (o.pipe > 1 || o.virtual_stages > 1) {  // the partition and the schedule's table, checked now
        (void)pipeline::Partition::even(o.pipe, o.virtual_stages, cfg.layers);
        (void)pipeline::make_table(schedule_kind(o.schedule), o.pipe, static_cast<int>(o.batch / micro), o.virtual_stages);
        if (o.pipe == 1)
          throw Error(o.where(), cat("--virtual-stages ", o.virtual_stages, " without --pipe"),
                      "virtual stages split a pipeline's ranks: use --pipe >= 2");
        if (o.sample > 0)
          throw Error(o.where(), "--sample with --pipe", "sample from a run without pipeline parallelism");
      }
      if (!o.text.empty() && cfg.vocab < 256)
        throw Error(o.where(), cat("vocabulary ", cfg.vocab, " with --text"), "byte-level text needs a vocabulary of 256");
      if (o.sample > 0 && o.text.empty())
        throw Error(o.where(), "--sample without --text", "sampling prints text: train on --text");
      if (device == "cuda" && o.dtype == "f64")
        throw Error(o.where(), "--dtype f64 on the GPU", "f64 is the host's checking precision: use f32 or bf16");
      if (!o.resume.empty() && !o.init_from.empty())
        throw Error(o.where(), "--init-from with --resume", "resume restores the weights: give one of them");
      if (o.resume == "latest" && o.save_dir.empty())
        throw Error(o.where(), "--resume latest without --save-dir", "give --save-dir, or the checkpoint's path to --resume");
      if ((o.save_every > 0 || o.keep > 0 || o.async_save) && o.save_dir.empty())
        throw Error(o.where(), "--save-every, --keep or --async-save without --save-dir", "give --save-dir");
      if (plan_only) {
        if (const auto why = plan_too_long(cfg.layers, o.batch / (o.micro_batch > 0 ? o.micro_batch : o.batch)))
          throw Error(o.where("--plan"), *why, "plan fewer layers, or fewer micro-batches per step (a larger --micro-batch)");
        return finish(launch.lead() ? print_plan<F>(o, cfg, device) : 0);
      }
      // Training reads a corpus (--plan reads none: a Llama 3 vocabulary plans without a data file).
      if (o.data_file.empty() && o.text.empty() && cfg.vocab > data::MarkovSource::max_vocab)
        throw Error(o.where(), cat("vocabulary ", cfg.vocab, " with the built-in Markov corpus"),
                    cat("use at most ", data::MarkovSource::max_vocab, " tokens, or train on a --data-file"));
      check_fits<F>(o, cfg, device, launch);
      // Where the run writes: checked now (by the printing process), not after the GEMM measurement.
      if (launch.lead()) {
        if (!o.log.empty()) {
          std::ofstream probe(o.log, std::ios::app);  // creates the file; the run truncates it (or appends when resuming)
          if (!probe) throw Error(o.where("--log"), cat("cannot write '", o.log, "'"), "give a path in a writable directory");
        }
        if (!o.trace.empty()) {
          std::ofstream probe(o.trace, std::ios::app);
          if (!probe) throw Error(o.where("--trace"), cat("cannot write '", o.trace, "'"), "give a path in a writable directory");
        }
        if (!o.save_dir.empty()) {
          std::error_code ec;
          std::filesystem::create_directories(o.save_dir, ec);
          if (ec || !std::filesystem::is_directory(o.save_dir))
            throw Error(o.where("--save-dir"), cat("cannot create the directory '", o.save_dir, "'", ec ? cat(": ", ec.message()) : ""),
                        "give a directory that can be created and written");
          // One trainer per save directory; taking the lock also proves the directory writable.
          save_lock.emplace(o.save_dir);
        }
      }
    } catch (const Error& e) {
      report(e);
      return finish(2);
    } catch (const std::bad_alloc&) {  // sizes whose check or plan needs more memory than this machine has
      report(Error(o.where(), "ran out of memory checking or planning these sizes", "use smaller sizes (--layers, --batch, --vocab, ...)"));
      return finish(2);
    } catch (const std::exception& e) {  // never an abort: a library's own exception, said
      report(Error(o.where(), e.what(), "use other sizes, and report this message"));
      return finish(2);
    }

    install_stop_handlers(launch.kind == Launcher::mpi, o.program);
    if (launch.lead() && !o.init_from.empty()) remove_stale_init_dirs();  // left by killed runs
    try {
      if (!o.resume.empty()) {  // exit 1 when not a valid checkpoint; 2 when it is at or past --steps
        // `latest` resolved once for the process: every thread rank loads this step directory, so a
        // `latest` that moves meanwhile (another trainer saving or pruning) cannot split them.
        o.resume = checkpoint::resolve(o.resume == "latest" ? o.save_dir : o.resume);
        const checkpoint::Manifest m = checkpoint::peek(o.resume);
        if (m.step >= o.steps) {
          report(Error(o.where("--resume"), cat("the checkpoint ", o.resume, " is at step ", m.step, ", at or past --steps ", o.steps),
                       cat("pass --steps above ", m.step, " to train on from it")));
          return finish(2);
        }
        // Checkpoints past the resumed step (a run this one rolls back) are kept: --keep prunes
        // only the steps up to the ones this run saves (checkpoint/save.hpp).
        if (launch.lead() && !o.save_dir.empty())
          for (const auto& [step, name] : checkpoint::complete_checkpoints(o.save_dir))
            if (step > m.step)
              std::printf("note: %s/%s is past the resumed step %lld; it is kept (--keep prunes steps up to this run's)\n",
                          o.save_dir.c_str(), name.c_str(), static_cast<long long>(m.step));
      }
      const Corpus corpus = Corpus::open(o, cfg.vocab, cfg.seq);
      return finish(dispatch<F>(o, cfg, corpus, launch, device));
    } catch (const Error& e) {
      report(e);
      return finish(1);
    } catch (const std::exception& e) {  // out of memory, or a library's own exception
      report(e);
      return finish(1);
    }
  };
  return with_family<First, Rest...>(o.model, o.where("--model"),
                                     [&]<class Named>() -> int {
                                       return with_context_family<Named>(o, [&]<class G>() -> int { return with_run_head<G>(o, run); });
                                     });
}

}  // namespace weft::train
