// train_gpt's training loop, written once over the device: examples/train_gpt.cpp instantiates it
// for the host, examples/train_gpt_cuda.cu (nvcc, in CUDA builds) for the GPU.
#pragma once

#include <weft/weft_host.hpp>

#include <weft/core/precision.hpp>
#include <weft/checkpoint/checkpoint.hpp>
#include <weft/models/gpt2/hf.hpp>
#include <weft/comm/fingerprint.hpp>
#include <weft/comm/launch.hpp>
#include <weft/data/corpus.hpp>
#include <weft/data/loader.hpp>
#include <weft/data/synthetic.hpp>
#include <weft/models/gpt2/model.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/optim/schedule.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/pipelined.hpp>
#include <weft/plan/memory.hpp>
#include <weft/nn/describe.hpp>
#include <weft/train/metrics.hpp>
#include <weft/train/stop.hpp>
#include <weft/version.hpp>
#ifdef WEFT_ENABLE_MPI
#include <weft/comm/mpi/mpi_comm.hpp>
#endif

#include <sched.h>
#include <signal.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

namespace train_gpt {

using namespace weft;


struct Options {
  std::string preset = "tiny";
  std::optional<std::int64_t> layers, heads, width, seq, vocab;
  int data = 2, tensor = 2, pipe = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  std::string strategy = "ddp";
  std::int64_t batch = 16, micro_batch = 0, steps = 600, eval_every = 100, sample = 0;
  std::optional<std::int64_t> warmup;  // default: 5% of the steps
  double lr = 3e-3, min_lr = 3e-4, clip = 1.0;
  std::uint64_t seed = 1;
  std::string data_file, text, dtype = "f32", log, device = "auto", trace;
  std::string save_dir, resume, save_policy = "sharded", init_from;
  std::int64_t save_every = 0;
  int keep = 0;
  bool async_save = false;
  std::string launcher = "auto";
  double deadline = 60;  // seconds any collective waits for the other ranks
};

// How this process runs the ranks: all of them as threads, or one as a process of mpirun (or, on
// GPUs, of a launcher that sets RANK and WORLD_SIZE).
struct Launch {
  Launcher kind = Launcher::threads;
  int process = 0, processes = 1;  // this process among the processes (0 of 1 with threads)
  int gpu = 0;                     // the launcher's local rank: the GPU of this process (modulo the GPUs)
  std::function<void()> barrier;   // all processes (MPI_Barrier); empty with threads and env
  bool lead() const { return process == 0; }  // prints and writes the log
};

inline std::chrono::milliseconds deadline_of(const Options& o) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(o.deadline * 1000));
}

template <class D>
struct DeviceSupport;

// Runs body(world) on every rank: threads of this process, or this process's one rank. A rank that
// throws ends the world for all (a weft::Error on the others naming it, or the deadline's). The GPU
// half (DeviceSupport<Cuda>::run_ranks) makes its processes' NCCL world.
template <class D, class Body>
void run_ranks(const Launch& l, int ranks, const Options& o, Body&& body) {
  if constexpr (std::same_as<D, Host>) {
#ifdef WEFT_ENABLE_MPI
    if (l.kind == Launcher::mpi) {
      auto world = mpi::MpiComm::world({.deadline = deadline_of(o)});
      mpi::run(world, body);
      return;
    }
#endif
    run_threads(ranks, std::forward<Body>(body), {.deadline = deadline_of(o)});
  } else {
    DeviceSupport<D>::run_ranks(l, ranks, o, std::forward<Body>(body));
  }
}

// A source of training sequences and of held-out ones, whatever the corpus.
struct Corpus {
  std::unique_ptr<data::MarkovSource> markov;
  std::unique_ptr<data::TokenFile> file;
  std::unique_ptr<data::WindowCorpus> windows;

  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t n) const {
    if (markov) markov->sequence(k, out, n);
    else windows->sequence(k, out, n);
  }
  void held_out(std::uint64_t k, std::int32_t* out, std::int64_t n) const {
    if (markov) markov->sequence((std::uint64_t{1} << 40) + k, out, n);  // sequences training never reads
    else windows->held_out(static_cast<std::int64_t>(k % static_cast<std::uint64_t>(windows->held_out_sequences(n))), out, n);
  }
  std::optional<double> floor() const { return markov ? std::optional(markov->entropy_rate()) : std::nullopt; }
};

struct HeldOut {
  const Corpus* c;
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t n) const { c->held_out(k, out, n); }
};

// SIGINT, SIGTERM and SIGUSR1: the first asks the run to stop after the current step (every rank at
// the same step: the flag travels in the step's all-reduce), or part-way through it when steps take
// over half a second (train/stop.hpp: polled about every 0.25 s, the step abandoned on every rank at
// the same point), writing a checkpoint when --save-dir is set; a second ends the process at once.
// Installed by main. Under mpirun only SIGUSR1 is: mpirun answers SIGINT and SIGTERM by sending SIGTERM to every rank and killing the job moments later
// (mpi::Session turns that SIGTERM into an error on every rank), but forwards SIGUSR1 and lets the
// job run on, so `kill -USR1 <mpirun>` is the clean stop there.
inline std::atomic<int>& stop_requested() {
  static std::atomic<int> signal{0};
  return signal;
}

// When the first signal came (CLOCK_MONOTONIC nanoseconds, steady_clock's on Linux).
inline std::atomic<std::int64_t>& stop_time_ns() {
  static std::atomic<std::int64_t> ns{0};
  return ns;
}

inline void on_stop_signal(int sig) {
  if (stop_requested().exchange(sig) != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  stop_time_ns().store(static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec);
  static const char line[] =
      "train_gpt: stopping after this step, or within a second if it is long (a second signal stops at once)\n";
  (void)!::write(2, line, sizeof line - 1);
}

inline void install_stop_handlers(bool under_mpirun) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // file and socket calls resume rather than fail with EINTR
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  if (under_mpirun) return;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

inline const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

inline pipeline::Kind schedule_kind(const std::string& name) {
  if (name == "gpipe") return pipeline::Kind::gpipe;
  if (name == "interleaved") return pipeline::Kind::interleaved;
  if (name == "zb") return pipeline::Kind::zero_bubble_h1;
  return pipeline::Kind::one_f_one_b;
}

// footprint::approximate_elements of the run (one micro-batch): sizes beyond footprint::kMaxElements
// are refused before the plan, whose 64-bit counts they would overflow.
inline double elements_of(const Options& o, const gpt2::Config& c) {
  return footprint::approximate_elements(c, static_cast<double>(o.micro_batch > 0 ? o.micro_batch : o.batch), o.tensor);
}

// `path` made absolute and canonical as far as it exists ("" stays "").
inline std::string absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

inline std::string gib(double bytes) { return cat(std::round(bytes / (1 << 30) * 100) / 100, " GiB"); }

inline std::string mib(double bytes) { return cat(std::round(bytes / (1 << 20) * 10) / 10, " MiB"); }

// What the loop needs of a device beyond the Device concept, specialized per device: each rank's
// device (and the communicator's memory for it), and the ceilings MFU is measured against.
template <>
struct DeviceSupport<Host> {
  template <class C>
  static std::shared_ptr<Host> make(C&) { return std::make_shared<Host>(); }
  // The GEMM rate all ranks reach together on this machine (bf16 computes in f32 on the host).
  template <class T>
  static double gemm_ceiling(int ranks, int /*gpu*/) {
    if constexpr (std::same_as<T, double>) return train::gemm_rate<double>(ranks);
    else return train::gemm_rate<float>(ranks);
  }
  // The processor's dense peak is not known to weft: MFU is against the measured ceiling only.
  template <class T>
  static std::optional<std::pair<std::string, double>> dense_peak() { return std::nullopt; }
  static void ranges(pipeline::Trace&) {}  // no profiler ranges on the host
};

// What the loop holds for a pipeline on a communicator without isend: nothing, and never called.
struct NoPipeline {
  void set_trace(pipeline::Trace*, int) {}
  double evaluate(const nn::MicroBatch&) { return never(); }
  template <class P>
  double run(std::span<const nn::MicroBatch>, P&) { return never(); }
  static double never() {
    throw Error("train_gpt --pipe", "this communicator has no isend for the pipeline's activations",
                "run the pipeline on thread ranks or under mpirun on the host");
  }
};

// A stream that failed to write (a full device, an I/O error) ends the run: a log that silently
// lost its records is worse than none.
inline void check_written(std::ofstream& f, const std::string& path) {
  if (!f) throw Error("train_gpt --log", cat("writing '", path, "' failed (", std::strerror(errno), ")"),
                      "free space on its device, or give --log a path elsewhere");
}

// A temporary directory, removed with everything in it when the object goes. Named
// weft_init_<pid>_XXXXXX under the temporary directory (TMPDIR, else /tmp), so that the next run
// can tell one a killed process left (remove_stale_init_dirs).
struct TempDir {
  std::string path;
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&& o) noexcept : path(std::exchange(o.path, {})) {}
  TempDir& operator=(TempDir&& o) noexcept {
    if (this != &o) {
      remove();
      path = std::exchange(o.path, {});
    }
    return *this;
  }
  ~TempDir() { remove(); }
  void remove() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
    path.clear();
  }
  static TempDir make(const std::string& where) {
    std::error_code ec;
    const auto base = std::filesystem::temp_directory_path(ec);
    std::string tmpl = ((ec ? std::filesystem::path("/tmp") : base) / cat("weft_init_", ::getpid(), "_XXXXXX")).string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(where, cat("cannot create a temporary directory like ", tmpl, " (", std::strerror(errno), ")"),
                  "set TMPDIR to a writable directory with room for the model");
    TempDir t;
    t.path = tmpl;
    return t;
  }
};

// Removes the weft_init_<pid>_* directories of processes that are gone (a run killed while it held
// its --init-from copy); returns how many.
inline int remove_stale_init_dirs() {
  std::error_code ec;
  const auto base = std::filesystem::temp_directory_path(ec);
  if (ec) return 0;
  int removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("weft_init_") || !e.is_directory() || e.is_symlink()) continue;
    const std::string pid = n.substr(10, n.find('_', 10) - 10);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code rm;
    std::filesystem::remove_all(e.path(), rm);
    removed += rm ? 0 : 1;
  }
  return removed;
}

// D: Host or Cuda; P: a precision policy; Strategy: optim::Ddp, Zero1, Zero2 or Fsdp over the data
// axis. Every rank is a thread (on the GPU they share it, each with its own stream), or a process.
template <class D, class P, bool SP, class Strategy>
int train(const Options& o, const gpt2::Config& cfg, const Corpus& corpus, const Launch& launch) {
  using T = typename precision_t<P>::compute;
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  const std::int64_t accum = o.batch / micro;
  const int ranks = o.data * o.pipe * o.tensor;
  const bool speak = launch.lead();
  if constexpr (std::same_as<D, Host>) {
    // A lone thread rank runs its host ops on every core the process is given (the same bits).
    cpu_set_t given;
    const int cores = sched_getaffinity(0, sizeof(given), &given) == 0 ? CPU_COUNT(&given) : 1;
    if (launch.kind == Launcher::threads && ranks == 1 && cores > 1) {
      host::set_threads(std::min(cores, 256));
      if (speak) std::printf("one rank: its host ops on %d threads\n", host::threads());
    }
  }
  if (speak) {
    std::string library;
    if constexpr (std::same_as<D, Host>) library = cat(" (", host::gemm_library(), ")");
    std::printf("measuring the %s GEMM rate%s of %d ranks (the MFU ceiling)...\n", D::name, library.c_str(), ranks);
  }
  // Every process measures its own ranks at the same time (under MPI one each, started together).
  const int here = launch.kind == Launcher::threads ? ranks : 1;
  if (launch.barrier) launch.barrier();
  const double peak = DeviceSupport<D>::template gemm_ceiling<T>(here, launch.gpu) * (ranks / here);
  const auto dense = DeviceSupport<D>::template dense_peak<T>();
  const double flops_token = train::flops_per_token(cfg);
  if (speak)
    std::printf("train_gpt: %s | %s %s on %s | data %d x tensor %d | batch %lld (micro %lld x %lld) | %lld steps | GEMM %.1f GFLOP/s\n",
              cat("layers ", cfg.layers, ", heads ", cfg.heads, ", width ", cfg.width, ", seq ", cfg.seq, ", vocab ", cfg.vocab).c_str(),
              o.strategy.c_str(), precision_t<P>::name().c_str(), D::name, o.data, o.tensor,
              static_cast<long long>(o.batch), static_cast<long long>(micro), static_cast<long long>(accum),
              static_cast<long long>(o.steps), peak / 1e9);
  if (dense && speak)
    std::printf("MFU is reported against the measured GEMM ceiling and against the %s (%.0f TFLOP/s)\n",
                dense->first.c_str(), dense->second / 1e12);
  if (auto f = corpus.floor(); f && speak) std::printf("built-in Markov corpus: entropy rate (the loss floor) %.4f nats\n", *f);
  std::fflush(stdout);  // the header before the first step, also through a pipe

  std::ofstream log;
  if (!o.log.empty() && speak) {
    log.open(o.log, o.resume.empty() ? std::ios::trunc : std::ios::app);  // a resumed run appends
    if (!log) throw Error("train_gpt --log", cat("cannot write the log file ", o.log, " (", std::strerror(errno), ")"), "check the path");
  }
  double final_loss = 0, final_eval = NAN, total_time = 0;
  enum class Outcome { finished, stopped, diverged } outcome = Outcome::finished;  // written by the lead rank
  int end_signal = 0;
  std::int64_t end_step = 0;
  std::vector<std::int32_t> sample_out;
  const auto schedule = optim::Schedule::warmup_cosine(o.lr, o.warmup.value_or(o.steps / 20), o.steps, o.min_lr);
  // The schedule is a function of the step: a checkpoint records its parameters and the step.
  const nlohmann::json schedule_json{{"kind", "warmup_cosine"}, {"max_lr", schedule.max_lr}, {"min_lr", schedule.min_lr},
                                     {"warmup", schedule.warmup}, {"total", schedule.total}};
  std::int64_t peak_bytes_all = 0;  // the largest rank's peak, on the lead
  std::unique_ptr<pipeline::Trace> trace;
  if (!o.trace.empty()) {
    trace = std::make_unique<pipeline::Trace>(ranks);
    DeviceSupport<D>::ranges(*trace);
  }

  // --init-from: the Hugging Face file as a weft checkpoint of step 0 (weights only), that every
  // rank loads into its shards, in a temporary directory removed on every way out of this function
  // (and, when the process was killed, by the next run: remove_stale_init_dirs).
  TempDir init_dir;
  if (!o.init_from.empty()) {
    init_dir = TempDir::make("train_gpt --init-from");
    gpt2::import_hf(o.init_from, init_dir.path, cfg);
    if (speak) std::printf("initial weights: %s (Hugging Face GPT-2 layout)\n", o.init_from.c_str());
  }

  run_ranks<D>(launch, ranks, o, [&](auto& world) {
    const auto dev = DeviceSupport<D>::make(world);
    Mesh mesh{world, {.data = o.data, .pipe = o.pipe, .tensor = o.tensor}};
    using Model = gpt2::Model<P, SP, recompute::None, D>;
    // With --pipe > 1 this rank holds its stages' blocks only, and a schedule's table runs them.
    const auto part = pipeline::Partition::even(o.pipe, o.virtual_stages, cfg.layers);
    Model gpt(*dev, cfg, mesh.spread(), micro, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{.config = {.lr = o.lr}}, mesh);
    // The executor sends activations with isend, which the NCCL back end does not offer: its
    // processes refuse --pipe > 1 before training (main), and never hold a pipeline.
    using Comm = std::remove_cvref_t<decltype(world)>;
    constexpr bool pipelines = requires { typename Comm::SendHandle; };
    std::optional<std::conditional_t<pipelines, pipeline::Pipeline<Model, decltype(mesh)>, NoPipeline>> pp;
    if constexpr (pipelines) {
      if (o.pipe > 1) pp.emplace(gpt, pipeline::make_table(schedule_kind(o.schedule), o.pipe, static_cast<int>(accum), o.virtual_stages), part, mesh);
    }
    if (pp && trace) pp->set_trace(trace.get(), world.rank());
    // One micro-batch forward and backward; last: the last one before the step (DDP reduces then).
    // `protocol`: dp, or dp polled for a stop request (train::Polled).
    auto micro_batch = [&](const std::vector<std::int32_t>& xs, const std::vector<std::int32_t>& ys, double scale,
                           bool last, auto& protocol) {
      auto ctx = gpt.context({xs, ys, micro, scale});
      return pipeline::forward_backward(gpt, ctx, mesh, protocol, last);
    };
    // The forward alone, keeping nothing for backward (evaluation, sampling).
    auto evaluate_one = [&](const std::vector<std::int32_t>& xs, const std::vector<std::int32_t>& ys) {
      if (pp) return pp->evaluate({xs, ys, micro});
      auto ctx = gpt.context({xs, ys, micro});
      pipeline::forward(gpt, ctx, mesh, dp, nn::Mode::infer);
      return ctx.loss;
    };
    auto infer = [&](const std::vector<std::int32_t>& xs, const std::vector<std::int32_t>& ys) {
      auto ctx = gpt.context({xs, ys, micro});
      pipeline::forward(gpt, ctx, mesh, dp, nn::Mode::infer);
      return ctx;
    };
    // Every rank runs the same build, types, sizes and options as rank 0, or none starts.
    {
      Fingerprint fp;
      fp.add("weft version", version);
      fp.add("device and precision", cat(D::name, " ", precision_t<P>::name()));
      fp.add("strategy", o.strategy);
      fp.add("model", cat("vocab ", cfg.vocab, ", seq ", cfg.seq, ", layers ", cfg.layers, ", heads ", cfg.heads, ", width ",
                          cfg.width, ", seed ", cfg.seed));
      fp.add("mesh", cat("data ", o.data, " x pipe ", o.pipe, " x tensor ", o.tensor, ", ", o.virtual_stages,
                         " virtual stages, schedule ", o.schedule));
      fp.add("batch", cat(o.batch, " in micro-batches of ", micro));
      fp.add("optimization", cat(o.steps, " steps, lr ", o.lr, " to ", o.min_lr, ", warm-up ", schedule.warmup, ", clip ", o.clip));
      fp.add("data", cat(o.data_file.empty() && o.text.empty() ? "built-in Markov corpus" : o.data_file + o.text,
                         ", eval every ", o.eval_every));
      // Absolute paths: ranks started in other working directories resolve relative ones elsewhere.
      fp.add("checkpoints", cat("save to '", absolute(o.save_dir), "' every ", o.save_every, ", resume '",
                                o.resume.empty() ? std::string() : absolute(checkpoint::resolve(o.resume == "latest" ? o.save_dir : o.resume)),
                                "', init '", absolute(o.init_from), "'"));
      if (o.pipe == 1) fp.add("collectives of one micro-batch", nn::describe<gpt2::Model<T, SP>>(cfg, micro, mesh.spread()));
      fp.agree(world);
    }
    data::Loader<Corpus> loader(corpus, cfg.seq, micro, o.data, mesh.coord().data);
    const HeldOut held{&corpus};
    std::vector<std::int32_t> x, y;
    const bool lead = world.rank() == 0;

    auto evaluate = [&] {
      data::Loader<HeldOut> eval(held, cfg.seq, micro, o.data, mesh.coord().data);
      double sum = 0;
      const int batches = 16;  // 16 micro-batches: the standard error of the mean is ~0.01 nats on the tiny preset
      for (int i = 0; i < batches; ++i) {
        eval.next(x, y);
        sum += evaluate_one(x, y);
      }
      return sum / batches;
    };

    // Checkpoints: resume first (any mesh, strategy and precision), then save as the options say.
    std::int64_t first_step = 0;
    if (!init_dir.path.empty()) checkpoint::load(init_dir.path, gpt, dp, mesh, {.optimizer = false});
    if (!o.resume.empty()) {
      const std::string from = o.resume == "latest" ? o.save_dir : o.resume;
      const auto l0 = std::chrono::steady_clock::now();
      const auto st = checkpoint::load(from, gpt, dp, mesh);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
      if (st.seed != o.seed)
        throw Error("train_gpt --resume", cat("the checkpoint was saved by a run with --seed ", st.seed, ", this one has ", o.seed),
                    cat("pass --seed ", st.seed, " (the seed chooses the data)"));
      first_step = st.step;
      loader.seek(st.loader_position);
      if (lead && st.extra.contains("schedule") && st.extra["schedule"] != schedule_json)
        std::printf("note: the learning-rate schedule differs from the checkpoint's (%s); continuing with this run's (%s)\n",
                    st.extra["schedule"].dump().c_str(), schedule_json.dump().c_str());
      if (lead)
        std::printf("resumed from %s at step %lld (data position %lld) in %.2f s\n", checkpoint::resolve(from).c_str(),
                    static_cast<long long>(st.step), static_cast<long long>(st.loader_position), took);
    }
    std::optional<checkpoint::Saver<checkpoint::Sharded>> sharded;
    std::optional<checkpoint::Saver<checkpoint::Consolidated>> consolidated;
    if (!o.save_dir.empty()) {
      if (o.save_policy == "consolidated") consolidated.emplace(o.save_dir, checkpoint::SaveOptions{.keep = o.keep}, o.async_save);
      else sharded.emplace(o.save_dir, checkpoint::SaveOptions{.keep = o.keep}, o.async_save);
    }
    auto with_saver = [&](auto&& f) {
      if (sharded) f(*sharded);
      if (consolidated) f(*consolidated);
    };

    const auto start = std::chrono::steady_clock::now();
    std::int64_t step_peak_max = 0;  // the largest step peak of every rank (peak_bytes resets each step)
    bool ended = false;  // stopped by a signal, or diverged: the same step on every rank
    // A long step is polled for a stop request part-way (train/stop.hpp), spaced by the previous
    // step's time (the largest rank's, agreed below) and its points.
    train::StopPoints points;
    double previous_seconds = -1;
    std::int64_t last_saved = first_step;  // the step of the newest checkpoint (or where the run began)
    // Step `step` + 1 abandoned on every rank: the weights are step `step`'s, saved (unless that
    // checkpoint exists, or no step ran) with the data position the abandoned step began at.
    auto end_abandoned = [&](std::int64_t step, std::int64_t position, int signal) {
      dev->synchronize();
      const double after = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() -
                           static_cast<double>(stop_time_ns().load()) * 1e-9;
      if (!o.save_dir.empty() && step > last_saved)
        with_saver([&](auto& saver) {
          saver.save(gpt, dp, mesh, {.step = step, .loader_position = position, .seed = o.seed,
                                     .extra = {{"strategy", o.strategy}, {"dtype", o.dtype}, {"schedule", schedule_json}}});
        });
      if (world.rank() == 0 || launch.kind != Launcher::threads) {  // one rank per process says how it ended
        outcome = Outcome::stopped;
        end_signal = signal;
        end_step = step;
      }
      if (!lead) return;
      const bool timed = stop_time_ns().load() != 0;  // this process saw the signal itself
      std::printf("abandoned step %lld on %s%s\n", static_cast<long long>(step + 1), signal_name(signal),
                  timed ? cat(", ", std::round(after * 1000) / 1000, " s after it").c_str() : "");
      std::fflush(stdout);
      if (log.is_open()) {
        nlohmann::json last{{"step", step}, {"stopped", signal_name(signal)}, {"abandoned_step", step + 1}};
        if (timed) last["abandoned_after_s"] = after;
        log << last.dump() << std::endl;
        check_written(log, o.log);
      }
    };
    for (std::int64_t step = first_step; step < o.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      dp.zero_grad();
      dev->reset_peak();  // peak_bytes: this step's (the plan's step peak, weft/plan/step.hpp)
      points.begin_step(previous_seconds, points.counted());
      const std::int64_t position = loader.position();  // where an abandoned step's data began
      double loss = 0;
      if (pp) {  // the schedule runs every micro-batch of the step
        std::vector<std::vector<std::int32_t>> xs(static_cast<std::size_t>(accum)), ys(xs.size());
        std::vector<nn::MicroBatch> mbs;
        for (std::size_t a = 0; a < xs.size(); ++a) {
          loader.next(xs[a], ys[a]);
          mbs.push_back({xs[a], ys[a], micro, 1.0 / static_cast<double>(accum)});
        }
        loss = pp->run(mbs, dp);
      } else {
        train::Polled polled(dp, world, stop_requested(), points);
        int abandoned = 0;
        try {
          for (std::int64_t a = 0; a < accum; ++a) {
            loader.next(x, y);
            const pipeline::Trace::Scope traced(trace.get(), world.rank(), "forward+backward", "compute", -1, static_cast<int>(a));
            loss += micro_batch(x, y, 1.0 / static_cast<double>(accum), a + 1 == accum, polled) / static_cast<double>(accum);
          }
        } catch (const train::Abandoned& stop) {
          abandoned = stop.signal;  // every rank, at the same point
        }
        if (abandoned != 0) {
          end_abandoned(step, position, abandoned);
          ended = true;
          break;
        }
      }
      const double lr = schedule.lr(step);
      const std::int64_t skipped_before = dp.skipped();
      double norm = 0;
      {
        const pipeline::Trace::Scope traced(trace.get(), world.rank(), "optimizer step", "step");
        norm = dp.step(lr, o.clip);
      }
      const bool skipped = dp.skipped() > skipped_before;  // a non-finite norm: the same on every rank
      dev->synchronize();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // One all-reduce (max) agrees on the step's peak bytes, a stop signal seen by any rank, and a
      // loss that is not finite: every rank then stops after the same step.
      std::vector<std::int64_t> agreed{dev->memory().total_peak, stop_requested().load(), std::isfinite(loss) ? 0 : 1,
                                       static_cast<std::int64_t>(dt * 1e6)};
      world.all_reduce(std::span<std::int64_t>(agreed), ReduceOp::max);
      const std::int64_t peak_bytes = agreed[0];
      previous_seconds = static_cast<double>(agreed[3]) * 1e-6;  // the slowest rank's step
      step_peak_max = std::max(step_peak_max, peak_bytes);
      const int stop = static_cast<int>(agreed[1]);
      const bool diverged = agreed[2] != 0;
      const bool eval_now = !diverged && o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps);
      const double eval_loss = eval_now ? evaluate() : NAN;
      // A stopped run saves where it stopped (a diverged one does not: its weights are not finite).
      const bool save_now = !o.save_dir.empty() && !diverged &&
                            ((o.save_every > 0 && (step + 1) % o.save_every == 0) || step + 1 == o.steps || stop != 0);
      with_saver([&](auto& saver) {
        if (save_now) {
          const auto s0 = std::chrono::steady_clock::now();
          saver.save(gpt, dp, mesh, {.step = step + 1, .loader_position = loader.position(), .seed = o.seed,
                                     .extra = {{"strategy", o.strategy}, {"dtype", o.dtype}, {"schedule", schedule_json}}});
          last_saved = step + 1;
          const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
          if (lead)
            std::printf("checkpoint: step %lld %s %s (training waited %.2f s)\n", static_cast<long long>(step + 1),
                        o.async_save ? "being written to" : "saved in", o.save_dir.c_str(), took);
        } else {
          saver.poll(mesh);  // publishes an asynchronous save once every rank's file is written
        }
      });
      if (stop || diverged) {
        ended = true;
        if (world.rank() == 0 || launch.kind != Launcher::threads) {  // one rank per process says how it ended
          outcome = diverged ? Outcome::diverged : Outcome::stopped;
          end_signal = stop;
          end_step = step + 1;
        }
      }
      if (!lead) {
        if (ended) break;
        continue;
      }
      const double tokens_s = static_cast<double>(o.batch * cfg.seq) / dt;
      const double mfu = tokens_s * flops_token / peak;
      const double mfu_peak = dense ? tokens_s * flops_token / dense->second : NAN;
      std::string floor_note;
      if (auto f = corpus.floor()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " (floor %+.3f)", loss - *f);
        floor_note = buf;
      }
      std::string mfu_note = cat(std::round(1000 * mfu) / 10, "%");
      if (dense) mfu_note += cat(" (", std::round(1000 * mfu_peak) / 10, "% of peak)");
      std::printf("step %5lld/%lld | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | MFU %s | peak %s/rank%s%s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(o.steps), loss, floor_note.c_str(), lr, norm,
                  tokens_s, mfu_note.c_str(), mib(static_cast<double>(peak_bytes)).c_str(),
                  eval_now ? cat(" | eval ", std::round(eval_loss * 10000) / 10000).c_str() : "",
                  skipped ? " | step skipped: the gradient norm is not finite" : "");
      std::fflush(stdout);
      if (log.is_open()) {
        nlohmann::json rec{{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}, {"tokens_per_s", tokens_s},
                           {"mfu", mfu}, {"peak_bytes", peak_bytes}, {"skipped", skipped}};
        if (dense) rec["mfu_of_peak"] = mfu_peak;
        log << rec.dump() << "\n";
        if (eval_now) log << nlohmann::json{{"step", step + 1}, {"eval_loss", eval_loss}}.dump() << "\n";
        log.flush();  // whole records, each as soon as it is written (a killed run keeps every finished step)
        check_written(log, o.log);
      }
      final_loss = loss;
      if (ended) {
        const nlohmann::json last = diverged ? nlohmann::json{{"step", step + 1}, {"diverged", true}, {"loss", cat(loss)}}
                                             : nlohmann::json{{"step", step + 1}, {"stopped", signal_name(stop)}};
        if (log.is_open()) {
          log << last.dump() << std::endl;
          check_written(log, o.log);
        }
        break;
      }
      if (eval_now) final_eval = eval_loss;
    }
    with_saver([&](auto& saver) { saver.wait(mesh); });
    if (lead) total_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Sampling: the last position's logits, gathered over the tensor axis, sampled with Philox.
    if (o.sample > 0 && !ended) {
      std::vector<std::int32_t> window(static_cast<std::size_t>(cfg.seq));
      corpus.held_out(0, window.data(), cfg.seq);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(micro / o.data * cfg.seq)), targets(tokens.size(), 0);
      const std::int64_t Vl = nn::padded_vocab(cfg.vocab, o.tensor) / o.tensor;
      for (std::int64_t i = 0; i < o.sample; ++i) {
        for (std::int64_t b = 0; b < micro / o.data; ++b) std::copy(window.begin(), window.end(), tokens.begin() + b * cfg.seq);
        const auto ctx = infer(tokens, targets);
        const auto logits = ctx.head.ce.logits.to_host();  // (B/dp, T, Vp/tp) Shard<-1>
        std::vector<T> all(static_cast<std::size_t>(Vl * o.tensor));
        mesh.tensor().all_gather(std::span<const T>(logits.data() + logits.size() - Vl, static_cast<std::size_t>(Vl)),
                                 std::span<T>(all));
        double mx = -1e300, z = 0;
        const auto at = [&](std::int64_t v) { return static_cast<double>(static_cast<accumulate_t<T>>(all[static_cast<std::size_t>(v)])); };
        for (std::int64_t v = 0; v < cfg.vocab; ++v) mx = std::max(mx, at(v));
        for (std::int64_t v = 0; v < cfg.vocab; ++v) z += std::exp(at(v) - mx);
        double u = weft::uniform(o.seed, 99, static_cast<std::uint64_t>(i)) * z, c = 0;
        std::int32_t next = static_cast<std::int32_t>(cfg.vocab - 1);
        for (std::int64_t v = 0; v < cfg.vocab; ++v)
          if ((c += std::exp(at(v) - mx)) >= u) {
            next = static_cast<std::int32_t>(v);
            break;
          }
        window.erase(window.begin());
        window.push_back(next);
        if (lead) sample_out.push_back(next);
      }
    }
    std::vector<std::int64_t> peak_all{std::max(step_peak_max, dev->memory().total_peak)};
    world.all_reduce(std::span<std::int64_t>(peak_all), ReduceOp::max);
    if (lead) peak_bytes_all = peak_all[0];
  });
  if (outcome == Outcome::diverged) {
    if (speak)
      std::printf("diverged: the loss of step %lld is not finite; stopped (no checkpoint written)\n",
                  static_cast<long long>(end_step));
    std::fflush(stdout);
    return 3;
  }
  if (outcome == Outcome::stopped) {
    if (speak)
      std::printf("stopped by %s after step %lld of %lld%s\n", signal_name(end_signal), static_cast<long long>(end_step),
                  static_cast<long long>(o.steps), o.save_dir.empty() ? "" : cat("; checkpoint in ", o.save_dir).c_str());
    std::fflush(stdout);
    return 128 + end_signal;
  }
  if (!speak) return 0;

  if (trace) {
    trace->write(o.trace);
    std::printf("trace: %s (Chrome / Perfetto trace events, one track per rank)\n", o.trace.c_str());
  }
  std::printf("done: %lld steps in %.1f s, final loss %.4f", static_cast<long long>(o.steps), total_time, final_loss);
  if (!std::isnan(final_eval)) std::printf(", held-out loss %.4f", final_eval);
  if (auto f = corpus.floor()) std::printf(" (floor %.4f; %+.4f nats from it)", *f, (std::isnan(final_eval) ? final_loss : final_eval) - *f);
  std::printf(", peak memory %s per rank\n", mib(static_cast<double>(peak_bytes_all)).c_str());
  if (!sample_out.empty())
    std::printf("sample:\n%s\n", data::ByteTokenizer::decode(std::span<const std::int32_t>(sample_out)).c_str());
  return 0;
}


// f.template operator()<Strategy, SP>() for the strategy named by o.strategy (checked before).
template <class F>
decltype(auto) with_strategy(const Options& o, F&& f) {
  const bool sp = o.strategy.ends_with("-sp");
  auto pick = [&]<class S>() { return sp ? f.template operator()<S, true>() : f.template operator()<S, false>(); };
  if (o.strategy.starts_with("zero1")) return pick.template operator()<optim::Zero1>();
  if (o.strategy.starts_with("zero2")) return pick.template operator()<optim::Zero2>();
  if (o.strategy.starts_with("fsdp")) return pick.template operator()<optim::Fsdp>();
  return pick.template operator()<optim::Ddp>();
}

}  // namespace train_gpt
