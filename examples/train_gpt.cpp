// train_gpt: trains a GPT on thread ranks (tensor x data parallel), on the host or on one GPU that
// the ranks share, in f32, bf16 mixed precision or (host) f64, on the built-in Markov corpus (whose
// entropy rate is the loss floor), an llm.c token file, or a text file.
//
//   train_gpt                                   a tiny GPT, tensor 2 x data 2, on the built-in corpus
//   train_gpt --device cuda --dtype bf16        the same on the GPU in mixed precision
//   train_gpt --text book.txt --sample 200      byte-level GPT on a text, then 200 sampled bytes
//   train_gpt --help                            every option
//
// Run-time choices (device, strategy, dtype) cross into types in one place, dispatch() below (and
// its GPU half in train_gpt_cuda.cu); everything under it is typed.
#include "train_gpt.hpp"
#include "train_gpt_plan.hpp"

#include "cli.hpp"
#include <cmath>
#include <filesystem>
#include <fstream>

#ifdef WEFT_ENABLE_MPI
#include <weft/comm/mpi/session.hpp>
#endif

using namespace weft;
using namespace train_gpt;
using examples::above;
using examples::at_least;
using examples::at_most;

namespace train_gpt {

// The GPU half (train_gpt_cuda.cu), present in CUDA builds.
#ifdef WEFT_ENABLE_CUDA
int cuda_devices();
std::int64_t cuda_free_bytes(int gpu);
int train_on_cuda(const Options& o, const gpt2::Config& cfg, const Corpus& corpus, const Launch& launch);
#endif

}  // namespace train_gpt

namespace {

// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
double host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

// Refuses (exit 2) a configuration whose ranks in this process need more than the device has,
// from the plan's step peak (exact on the host; on the GPU an estimated workspace on top), before
// anything is allocated.
void check_fits(const Options& o, const gpt2::Config& cfg, const std::string& device, const Launch& launch) {
  const std::string fix = "use a smaller model, batch or micro-batch, more tensor or pipeline ranks, or a sharded strategy "
                          "(zero1, zero2, fsdp); train_gpt --plan prints the plan";
  if (const double n = elements_of(o, cfg); n > footprint::kMaxElements)
    throw Error("train_gpt", cat("the configuration holds about ", n, " elements (parameters, activations), more than any machine"),
                fix);
  double available = -1;
  std::string what;
  if (device == "cuda") {
#ifdef WEFT_ENABLE_CUDA
    available = static_cast<double>(cuda_free_bytes(launch.gpu));
    what = cat("GPU ", launch.gpu, " has ", gib(available), " free");
#endif
  } else {
    available = host_available_bytes();
    what = cat("the host has ", gib(available), " available (MemAvailable)");
  }
  if (available < 0) return;
  // Every rank of this process: threads, all of them; a process, its own pipe rank's.
  const std::vector<RankPlan> plan = plan_of(o, cfg, device != "cuda");
  const bool threads = launch.kind == Launcher::threads;
  double need = 0;
  if (!threads) need = static_cast<double>(plan[static_cast<std::size_t>((launch.process / o.tensor) % o.pipe)].total);
  else
    for (const RankPlan& p : plan) need += static_cast<double>(p.total) * o.data * o.tensor;
  const int here = threads ? o.data * o.pipe * o.tensor : 1;
  if (need > available)
    throw Error("train_gpt",
                cat("the plan needs ", plan[0].exact ? "" : "at least ", gib(need), " for the ", here,
                    here == 1 ? " rank" : " ranks", " of this process (the peak of a training step), but ", what),
                fix);
}

// --plan: what each rank holds and a step computes, from the types and sizes alone.
int print_plan(const Options& o, const gpt2::Config& cfg, const std::string& device) {
  std::printf("plan: layers %lld, heads %lld, width %lld, seq %lld, vocab %lld | %s, %s | data %d x pipe %d x tensor %d | "
              "batch %lld, micro-batch %lld\n",
              static_cast<long long>(cfg.layers), static_cast<long long>(cfg.heads), static_cast<long long>(cfg.width),
              static_cast<long long>(cfg.seq), static_cast<long long>(cfg.vocab), o.strategy.c_str(), o.dtype.c_str(), o.data,
              o.pipe, o.tensor, static_cast<long long>(o.batch),
              static_cast<long long>(o.micro_batch > 0 ? o.micro_batch : o.batch));
  if (const double n = elements_of(o, cfg); n > footprint::kMaxElements) {
    std::printf("about %.3g elements (parameters, activations): too large to plan, and to fit any machine\n", n);
    return 0;
  }
  const std::vector<RankPlan> plan = plan_of(o, cfg, device != "cuda");
  const char* bound = plan[0].exact ? "" : ">= ";
  std::printf("%-10s %12s %12s %12s %12s %14s %14s %14s\n", "pipe rank", "parameters", "gradients", "master", "optimizer",
              "activations", "communication", "step peak");
  for (const RankPlan& p : plan) {
    const auto at = [&](Category c) { return mib(static_cast<double>(p.peak.of(c))); };
    std::printf("%-10d %12s %12s %12s %12s %14s %14s %14s\n", p.pipe_rank, at(Category::parameters).c_str(),
                at(Category::gradients).c_str(), at(Category::master_weights).c_str(), at(Category::optimizer_state).c_str(),
                cat(bound, at(Category::activations)).c_str(), at(Category::communication).c_str(),
                cat(bound, mib(static_cast<double>(p.total))).c_str());
  }
  if (plan[0].exact) {
    std::printf("(per rank: each category's peak during a training step, and the peak of their sum, replayed from the "
                "types and sizes%s: the host allocator's counts; persistent state %s; step peak %lld bytes%s",
                o.pipe > 1 ? cat(" and the ", o.schedule, " schedule's table").c_str() : "",
                mib(static_cast<double>(plan[0].state.total())).c_str(), static_cast<long long>(plan[0].total),
                o.pipe > 1 ? " on pipe rank 0" : "");
    for (std::size_t r = 1; r < plan.size(); ++r)
      std::printf("; pipe rank %d: %lld bytes", plan[r].pipe_rank, static_cast<long long>(plan[r].total));
    std::printf(")\n");
  }
  else
    std::printf("(per rank: the step replayed as the host allocator counts it, plus an estimate of the CUDA workspace "
                "(cuBLASLt's, the attention scores) in the step peak; step peak %lld bytes)\n",
                static_cast<long long>(plan[0].total));
  const double flops = train::flops_per_token(cfg) * static_cast<double>(o.batch * cfg.seq);
  std::printf("FLOPs per step: %.4g (6 N + 12 L C T per token, %lld tokens)\n", flops,
              static_cast<long long>(o.batch * cfg.seq));
  if (o.pipe == 1) {
    const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
    const Spread s{.data_degree = o.data, .tensor_degree = o.tensor};
    const bool sp = o.strategy.ends_with("-sp");
    auto describe = [&]<class T>() { return sp ? nn::describe<gpt2::Model<T, true>>(cfg, micro, s) : nn::describe<gpt2::Model<T, false>>(cfg, micro, s); };
    const std::string table = o.dtype == "f64" ? describe.operator()<double>()
                              : o.dtype == "bf16" ? describe.operator()<bf16>() : describe.operator()<float>();
    std::printf("collectives of one micro-batch (tensor axis; the data axis adds the strategy's):\n%s", table.c_str());
  }
  if (o.pipe == 1 && device != "cuda") {
    const estimate::Breakdown t = plan_time(o, cfg);
    std::printf("step time: %.2f ms = GEMMs %.2f + attention %.2f + elementwise %.2f + memory %.2f + tensor collectives %.2f "
                "+ data collectives %.2f (rates measured now on this host with %d ranks running; no overlap)\n",
                1e3 * t.total(), 1e3 * t.gemm, 1e3 * t.attention, 1e3 * t.elementwise, 1e3 * t.memory, 1e3 * t.tensor_comm,
                1e3 * t.data_comm, o.data * o.tensor);
  } else if (device != "cuda") {
    const estimate::PipelineTime t = plan_pipeline_time(o, cfg);
    std::string bubbles;
    for (std::size_t r = 0; r < t.bubble.size(); ++r)
      bubbles += cat(r ? ", " : "", std::round(1000 * t.bubble[r]) / 10, "%");
    std::printf("step time: %.2f ms = the %s schedule's forwards, backwards and messages %.2f (idle share per pipe rank: "
                "%s) + after it %.2f (the optimizer step, the data collectives, the tied table's sum); a block's forward and "
                "backward %.3f ms per micro-batch, the embedding and head %.3f; rates measured now on this host with %d ranks "
                "running; no overlap\n",
                1e3 * t.step, o.schedule.c_str(), 1e3 * t.makespan, bubbles.c_str(),
                1e3 * (t.step - t.makespan), 1e3 * t.block, 1e3 * t.ends, o.data * o.pipe * o.tensor);
  } else {
    std::printf("step time: not planned here (the GPU's rates are not measured by --plan); weft-plan estimates GPU "
                "clusters\n");
  }
  return 0;
}

// The compiled strategies, by name. The one closed dispatch from run-time choices to instantiations.
const std::vector<std::string> kStrategies{"ddp", "ddp-sp", "zero1", "zero1-sp", "zero2", "zero2-sp", "fsdp", "fsdp-sp"};

void check_strategy(const std::string& name) {
  if (std::find(kStrategies.begin(), kStrategies.end(), name) == kStrategies.end())
    throw Error("train_gpt", cat("strategy '", name, "' is not available"),
                cat("use one of: ", join(kStrategies)));
}

// The device a run uses: --device, with auto meaning the GPU when one is present. Throws for a
// device this binary or machine does not have (exit 2).
std::string resolve_device(const Options& o) {
#ifdef WEFT_ENABLE_CUDA
  const int gpus = cuda_devices();
  if (o.device == "cuda" && gpus == 0)
    throw Error("train_gpt", "--device cuda but no GPU was found (no CUDA device is visible, or no driver)",
                "run on a machine with an NVIDIA GPU, or use --device host");
  if (o.device == "auto") return gpus > 0 ? "cuda" : "host";
#else
  if (o.device == "cuda")
    throw Error("train_gpt", "--device cuda but this binary was built without CUDA",
                "rebuild with a CUDA compiler (the cuda preset), or use --device host");
  if (o.device == "auto") return "host";
#endif
  return o.device;
}

// device: resolve_device(o), resolved once by main.
int dispatch(const Options& o, const gpt2::Config& cfg, const Corpus& corpus, const Launch& launch, const std::string& device) {
  check_strategy(o.strategy);
  if (device == "cuda") {
#ifdef WEFT_ENABLE_CUDA
    return train_on_cuda(o, cfg, corpus, launch);
#endif
  }
  return with_strategy(o, [&]<class S, bool SP>() {
    if (o.dtype == "f64") return train<Host, F64, SP, S>(o, cfg, corpus, launch);
    if (o.dtype == "bf16") return train<Host, Bf16Mixed, SP, S>(o, cfg, corpus, launch);
    return train<Host, F32, SP, S>(o, cfg, corpus, launch);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"weft train_gpt: a tensor- and data-parallel GPT on thread ranks, on the host or one GPU"};
  app.add_option("--preset", o.preset, "model size: tiny, small, gpt2-124m, gpt2-1.5b")->check(CLI::IsMember(gpt2::preset_names()));
  app.add_option("--layers", o.layers, "override the preset's layers")->check(at_least(1));
  app.add_option("--heads", o.heads, "override the preset's heads")->check(at_least(1));
  app.add_option("--width", o.width, "override the preset's width")->check(at_least(1));
  app.add_option("--seq", o.seq, "override the preset's sequence length")->check(at_least(1));
  app.add_option("--vocab", o.vocab, "override the preset's vocabulary")->check(at_least(1));
  app.add_option("--data", o.data, "data-parallel degree")->check(at_least(1));
  app.add_option("--tensor", o.tensor, "tensor-parallel degree")->check(at_least(1));
  app.add_option("--pipe", o.pipe, "pipeline-parallel degree (the layers split evenly over pipe x virtual stages)")
      ->check(at_least(1));
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved or zb (ZB-H1)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb"}));
  app.add_option("--virtual-stages", o.virtual_stages, "virtual stages per pipe rank (interleaved: >= 2)")
      ->check(at_least(1));
  app.add_option("--strategy", o.strategy, "ddp, zero1, zero2 or fsdp, each also with -sp (sequence parallelism)");
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
  app.add_option("--init-from", o.init_from, "initial weights from a Hugging Face GPT-2 safetensors file (weft-export writes one)");
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
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;

  gpt2::Config cfg = gpt2::preset(o.preset);
  if (!o.text.empty() && !o.vocab) cfg.vocab = data::ByteTokenizer::vocab;
  if (o.layers) cfg.layers = *o.layers;
  if (o.heads) cfg.heads = *o.heads;
  if (o.width) cfg.width = *o.width;
  if (o.seq) cfg.seq = *o.seq;
  if (o.vocab) cfg.vocab = *o.vocab;
  cfg.seed = o.seed;

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
    else std::fprintf(stderr, "train_gpt (world rank %d): %s\n", launch.process, e.what());
  };

  std::string device;  // host or cuda, once resolved
  std::optional<checkpoint::DirectoryLock> save_lock;  // the lead process's, for the whole run
  try {
    device = resolve_device(o);
    // The ranks first, in floating point: three int degrees multiply past 64 bits.
    const double world = 1.0 * o.data * o.pipe * o.tensor;
    char world_text[64];
    std::snprintf(world_text, sizeof world_text, "%.0f", world);
    if (world > (1 << 20))
      throw Error("train_gpt", cat("data ", o.data, " x pipe ", o.pipe, " x tensor ", o.tensor, " = ", world_text, " ranks"),
                  "use at most 2^20 = 1048576 ranks");
    if (launch.kind == Launcher::threads && world > 1024)
      throw Error("train_gpt --launcher threads",
                  cat("data ", o.data, " x pipe ", o.pipe, " x tensor ", o.tensor, " = ", world_text, " thread ranks in one process"),
                  "use at most 1024 thread ranks, or one process per rank (mpirun, docs/launch.md)");
    if (launch.kind == Launcher::env) {  // torchrun, srun: one GPU per process
      if (device != "cuda")
        throw Error("train_gpt --launcher env",
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
        throw Error("train_gpt --launcher mpi", "this binary was built without MPI",
                    "install Debian's libopenmpi-dev and rebuild (CMake finds MPI and builds weft::mpi)");
#endif
      const int ranks = o.data * o.pipe * o.tensor;
      const bool mpi = launch.kind == Launcher::mpi;
      if (launch.processes != ranks)
        throw Error(cat("train_gpt --launcher ", name(launch.kind)),
                    cat(mpi ? "mpirun started " : "WORLD_SIZE is ", launch.processes, mpi ? " processes" : "", " but data ",
                        o.data, " x pipe ", o.pipe, " x tensor ", o.tensor, " = ", ranks, " ranks"),
                    cat(mpi ? cat("run mpirun -np ", ranks) : cat("start ", ranks, " processes"),
                        ", or choose degrees whose product is ", launch.processes));
      if (o.pipe > 1 && device == "cuda")
        throw Error(cat("train_gpt --launcher ", name(launch.kind)), "--pipe with GPU processes (NCCL has no isend here yet)",
                    "use --pipe on thread ranks (--launcher threads), or tensor and data parallelism across GPUs");
      if (!o.trace.empty())
        throw Error(cat("train_gpt --launcher ", name(launch.kind)), "--trace records thread ranks of one process",
                    "trace a --launcher threads run");
    }
    check_strategy(o.strategy);
    const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
    if (o.batch % micro != 0)
      throw Error("train_gpt", cat("batch ", o.batch, " is not a multiple of the micro-batch ", micro),
                  "use a micro-batch that divides the batch");
    gpt2::validate(cfg, {.data_degree = o.data, .tensor_degree = o.tensor}, o.strategy.ends_with("-sp"), micro);
    (void)optim::Schedule::warmup_cosine(o.lr, o.warmup.value_or(o.steps / 20), o.steps, o.min_lr);
    validate(MeshShape{.data = o.data, .pipe = o.pipe, .tensor = o.tensor}, o.data * o.pipe * o.tensor);
    if (o.pipe > 1 || o.virtual_stages > 1) {  // the partition and the schedule's table, checked now
      (void)pipeline::Partition::even(o.pipe, o.virtual_stages, cfg.layers);
      (void)pipeline::make_table(schedule_kind(o.schedule), o.pipe, static_cast<int>(o.batch / micro), o.virtual_stages);
      if (o.pipe == 1)
        throw Error("train_gpt", cat("--virtual-stages ", o.virtual_stages, " without --pipe"),
                    "virtual stages split a pipeline's ranks: use --pipe >= 2");
      if (o.sample > 0)
        throw Error("train_gpt", "--sample with --pipe", "sample from a run without pipeline parallelism");
    }
    if (o.data_file.empty() && o.text.empty() && cfg.vocab > 65536)
      throw Error("train_gpt", cat("vocabulary ", cfg.vocab, " with the built-in Markov corpus"),
                  "use at most 65536 tokens, or train on a --data-file");
    if (!o.text.empty() && cfg.vocab < 256)
      throw Error("train_gpt", cat("vocabulary ", cfg.vocab, " with --text"), "byte-level text needs a vocabulary of 256");
    if (o.sample > 0 && o.text.empty())
      throw Error("train_gpt", "--sample without --text", "sampling prints text: train on --text");
    if (device == "cuda" && o.dtype == "f64")
      throw Error("train_gpt", "--dtype f64 on the GPU", "f64 is the host's checking precision: use f32 or bf16");
    if (!o.resume.empty() && !o.init_from.empty())
      throw Error("train_gpt", "--init-from with --resume", "resume restores the weights: give one of them");
    if (o.resume == "latest" && o.save_dir.empty())
      throw Error("train_gpt", "--resume latest without --save-dir", "give --save-dir, or the checkpoint's path to --resume");
    if ((o.save_every > 0 || o.keep > 0 || o.async_save) && o.save_dir.empty())
      throw Error("train_gpt", "--save-every, --keep or --async-save without --save-dir", "give --save-dir");
    if (plan_only) return finish(launch.lead() ? print_plan(o, cfg, device) : 0);
    check_fits(o, cfg, device, launch);
    // Where the run writes: checked now (by the printing process), not after the GEMM measurement.
    if (launch.lead()) {
      if (!o.log.empty()) {
        std::ofstream probe(o.log, std::ios::app);  // creates the file; the run truncates it (or appends when resuming)
        if (!probe) throw Error("train_gpt --log", cat("cannot write '", o.log, "'"), "give a path in a writable directory");
      }
      if (!o.trace.empty()) {
        std::ofstream probe(o.trace, std::ios::app);
        if (!probe) throw Error("train_gpt --trace", cat("cannot write '", o.trace, "'"), "give a path in a writable directory");
      }
      if (!o.save_dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(o.save_dir, ec);
        if (ec || !std::filesystem::is_directory(o.save_dir))
          throw Error("train_gpt --save-dir", cat("cannot create the directory '", o.save_dir, "'", ec ? cat(": ", ec.message()) : ""),
                      "give a directory that can be created and written");
        // One trainer per save directory; taking the lock also proves the directory writable.
        save_lock.emplace(o.save_dir);
      }
    }
  } catch (const Error& e) {
    report(e);
    return finish(2);
  }

  install_stop_handlers(launch.kind == Launcher::mpi);
  if (launch.lead() && !o.init_from.empty()) remove_stale_init_dirs();  // left by killed runs
  try {
    if (!o.resume.empty()) {  // exit 1 when not a valid checkpoint; 2 when it is at or past --steps
      const std::string from = o.resume == "latest" ? o.save_dir : o.resume;
      const checkpoint::Manifest m = checkpoint::peek(from);
      if (m.step >= o.steps) {
        report(Error("train_gpt --resume", cat("the checkpoint ", checkpoint::resolve(from), " is at step ", m.step, ", at or past --steps ", o.steps),
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
    Corpus corpus;
    if (!o.data_file.empty()) {
      corpus.file = std::make_unique<data::TokenFile>(o.data_file, cfg.vocab);
      corpus.windows = std::make_unique<data::WindowCorpus>(data::WindowCorpus::of_file(*corpus.file, o.seed));
      corpus.windows->require_windows(cfg.seq + 1);
    } else if (!o.text.empty()) {
      corpus.windows = std::make_unique<data::WindowCorpus>(data::WindowCorpus::from_text_file(o.text, o.seed));
      corpus.windows->require_windows(cfg.seq + 1);
    } else {
      corpus.markov = std::make_unique<data::MarkovSource>(cfg.vocab, o.seed);
    }
    return finish(dispatch(o, cfg, corpus, launch, device));
  } catch (const Error& e) {
    report(e);
    return finish(1);
  } catch (const std::exception& e) {  // out of memory, or a library's own exception
    report(e);
    return finish(1);
  }
}
