// The training loop of any model family (train/family.hpp), as ordinary code over train::Trainer
// (train/trainer.hpp): data and micro-batches, the learning-rate schedule, evaluation, sampling,
// checkpoints (resume on any mesh, save on a schedule, stop on a signal with a checkpoint), the
// stop and divergence agreement, and the report (train/report.hpp). It reads top-down:
//
//   train<F, D, P, SP, S>     the one template: the run's header values, then on every rank a
//                             TrainerOf (train/trainer_of.hpp) and train_rank over it
//   train_rank                the fingerprint, the start (init, resume), the steps, the sample
//   train_step                one step: its micro-batches, the step, the agreement, eval, save, report
//
// train/main.hpp is the command line over it; docs/training.md describes both. A binary instantiates
// train<F, D, P, SP, S> through its units (train_unit<U>, train/unit.hpp); a CUDA unit includes
// train/devices.cuh (DeviceSupport<Cuda>), which includes this header.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "weft/checkpoint/common.hpp"
#include "weft/comm/fingerprint.hpp"
#include "weft/core/philox.hpp"
#include "weft/core/precision.hpp"
#include "weft/data/corpus.hpp"
#include "weft/data/loader.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/optim/schedule.hpp"
#include "weft/pipeline/trace.hpp"
#include "weft/train/corpus.hpp"
#include "weft/train/devices.hpp"
#include "weft/train/family.hpp"
#include "weft/train/init_dir.hpp"
#include "weft/train/options.hpp"
#include "weft/train/report.hpp"
#include "weft/train/signals.hpp"
#include "weft/train/stop.hpp"
#include "weft/train/strategies.hpp"
#include "weft/train/trainer.hpp"
#include "weft/train/trainer_of.hpp"
#include "weft/train/unit.hpp"
#include "weft/version.hpp"

namespace weft::train {

// `path` made absolute and canonical as far as it exists ("" stays "").
inline std::string absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// What every rank of this process shares: what the run is, its report (the lead's), and how it
// ended (written by one rank per process: world rank 0 of the threads, or the process's own).
struct Run {
  Run(const Options& options, const Corpus& c, const Launch& l) : o(options), corpus(c), launch(l) {}

  const Options& o;
  const Corpus& corpus;
  const Launch& launch;
  std::int64_t seq = 0, vocab = 0;
  std::string family;                      // "gpt2": the checkpoints' family
  std::string model;                       // "gpt2: layers 2, ..., seed 1": the fingerprint's
  std::string device_precision;            // "host f32"
  std::string init_dir;                    // --init-from converted to a weft checkpoint
  std::unique_ptr<pipeline::Trace> trace;  // --trace
  Report report;                           // active in the lead process

  enum class Outcome { finished, stopped, diverged } outcome = Outcome::finished;
  int end_signal = 0;
  std::int64_t end_step = 0;
  double final_loss = 0, final_eval = NAN, seconds = 0;
  std::int64_t peak_bytes = 0;       // the largest rank's peak
  std::vector<std::int32_t> sample;  // --sample's tokens

  std::int64_t micro() const { return o.optim.micro(); }
  std::int64_t accumulation() const { return o.optim.batch / o.optim.micro(); }
  // The rank that says how the run ended for this process.
  bool tells(const Trainer& t) const { return t.rank() == 0 || launch.kind != Launcher::threads; }
};

// The learning-rate schedule, a function of the step; a checkpoint records its parameters.
inline optim::Schedule schedule_of(const Options& o) {
  return optim::Schedule::warmup_cosine(o.optim.lr, o.optim.warmup.value_or(o.optim.steps / 20), o.optim.steps,
                                        o.optim.min_lr);
}
inline nlohmann::json schedule_record(const optim::Schedule& s) {
  return {
      {"kind", "warmup_cosine"}, {"max_lr", s.max_lr}, {"min_lr", s.min_lr}, {"warmup", s.warmup}, {"total", s.total}};
}

// One rank's place in the run: its data, the steps done, and the stop polling's spacing.
struct RankState {
  RankState(data::Loader<Corpus> l, optim::Schedule s) : loader(l), schedule(s), schedule_json(schedule_record(s)) {}

  data::Loader<Corpus> loader;
  optim::Schedule schedule;
  nlohmann::json schedule_json;
  std::int64_t first_step = 0, last_saved = 0;  // where the run began; the step of the newest checkpoint
  StopPoints points;                            // a long step is polled for a stop request part-way (train/stop.hpp)
  double previous_seconds = -1;                 // the slowest rank's last step
  std::int64_t step_peak_max = 0;               // the largest step peak of every rank (peak_bytes resets each step)
  bool lead = false;
};

// Collective: every rank runs the same build, types, sizes and options as rank 0, or none starts.
inline void agree_on_the_run(const Run& run, Trainer& t) {
  const Options& o = run.o;
  const auto s = schedule_of(o);
  Fingerprint fp;
  fp.add("weft version", version);
  fp.add("device and precision", run.device_precision);
  fp.add("strategy", o.mesh.strategy);
  fp.add("model", run.model);
  fp.add("mesh", cat(o.mesh.text(), ", ", o.mesh.virtual_stages, " virtual stages, schedule ", o.mesh.schedule,
                     o.mesh.context > 1 ? cat(", ", o.mesh.attention, " attention") : std::string()));
  fp.add("batch", cat(o.optim.batch, " in micro-batches of ", o.optim.micro()));
  fp.add("optimization", cat(o.optim.steps, " steps, lr ", o.optim.lr, " to ", o.optim.min_lr, ", warm-up ", s.warmup,
                             ", clip ", o.optim.clip));
  const std::string data = t.owns_data()                                ? t.describe_data()
                           : o.data.file.empty() && o.data.text.empty() ? std::string("built-in Markov corpus")
                                                                        : o.data.file + o.data.text;
  fp.add("data", cat(data, ", eval every ", o.data.eval_every));
  // Absolute paths: ranks started in other working directories resolve relative ones elsewhere.
  fp.add("checkpoints",
         cat("save to '", absolute(o.checkpoint.save_dir), "' every ", o.checkpoint.save_every, ", resume '",
             o.checkpoint.resume.empty()
                 ? std::string()
                 : absolute(checkpoint::resolve(o.checkpoint.resume == "latest" ? o.checkpoint.save_dir
                                                                                : o.checkpoint.resume)),
             "', init '", absolute(o.checkpoint.init_from), "'"));
  t.agree(fp);
}

// Collective: the rank's state at the first step: the initial weights (--init-from), or a
// checkpoint resumed (any mesh, strategy and precision) with its step and data position.
inline RankState start(const Run& run, Trainer& t) {
  const Options& o = run.o;
  RankState r(data::Loader<Corpus>(run.corpus, run.seq, run.micro(), o.mesh.data, t.data_rank()), schedule_of(o));
  r.lead = t.rank() == 0 && run.report.active();
  if (!run.init_dir.empty()) t.load(run.init_dir, {.optimizer = false});
  if (o.checkpoint.resume.empty()) return r;
  const std::string from = o.checkpoint.resume == "latest" ? o.checkpoint.save_dir : o.checkpoint.resume;
  const auto l0 = std::chrono::steady_clock::now();
  const auto st = t.load(from, {});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
  if (st.seed != o.model.seed)
    throw Error(o.where("--resume"),
                cat("the checkpoint was saved by a run with --seed ", st.seed, ", this one has ", o.model.seed),
                cat("pass --seed ", st.seed, " (the seed chooses the data)"));
  r.first_step = r.last_saved = st.step;
  r.loader.seek(st.loader_position);
  if (r.lead && st.extra.contains("schedule") && st.extra["schedule"] != r.schedule_json)
    std::printf(
        "note: the learning-rate schedule differs from the checkpoint's (%s); continuing with this run's (%s)\n",
        st.extra["schedule"].dump().c_str(), r.schedule_json.dump().c_str());
  if (r.lead)
    std::printf("resumed from %s at step %lld (data position %lld) in %.2f s\n", checkpoint::resolve(from).c_str(),
                static_cast<long long>(st.step), static_cast<long long>(st.loader_position), took);
  return r;
}

// Collective: a checkpoint of the weights after `step` steps, the data at `position`.
inline void save_at(const Run& run, Trainer& t, const RankState& r, std::int64_t step, std::int64_t position) {
  t.save({.step = step,
          .loader_position = position,
          .seed = run.o.model.seed,
          .extra = {{"strategy", run.o.mesh.strategy}, {"dtype", run.o.model.dtype}, {"schedule", r.schedule_json}},
          .family = run.family});
}

// Collective: the mean loss of 16 held-out micro-batches (a standard error of about 0.01 nats on
// the tiny preset).
inline double evaluate(const Run& run, Trainer& t, bool lead) {
  if (t.owns_data()) {  // the family's validation batches, by name; their mean
    const auto named = t.validate();
    double sum = 0;
    std::string line;
    for (const auto& [name, loss] : named) {
      sum += loss;
      line += cat(line.empty() ? "" : ", ", name, " ", loss);
    }
    if (lead && named.size() > 1) std::printf("validation loss: %s\n", line.c_str());
    return named.empty() ? NAN : sum / static_cast<double>(named.size());
  }
  const HeldOut held{&run.corpus};
  data::Loader<HeldOut> eval(held, run.seq, run.micro(), run.o.mesh.data, t.data_rank());
  std::vector<std::int32_t> x, y;
  double sum = 0;
  const int batches = 16;
  for (int i = 0; i < batches; ++i) {
    eval.next(x, y);
    sum += t.evaluate({x, y});
  }
  return sum / batches;
}

// Step `step` + 1 abandoned on every rank: the weights are step `step`'s, saved (unless that
// checkpoint exists, or no step ran) with the data position the abandoned step began at.
inline void end_abandoned(Run& run, Trainer& t, const RankState& r, std::int64_t step, std::int64_t position,
                          int signal) {
  t.synchronize();
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() -
                       static_cast<double>(stop_time_ns().load()) * 1e-9;
  if (!run.o.checkpoint.save_dir.empty() && step > r.last_saved) save_at(run, t, r, step, position);
  if (run.tells(t)) {
    run.outcome = Run::Outcome::stopped;
    run.end_signal = signal;
    run.end_step = step;
  }
  if (!r.lead) return;
  const bool timed = stop_time_ns().load() != 0;  // this process saw the signal itself
  run.report.abandoned(step, signal, timed ? std::optional(after) : std::nullopt);
}

// Collective: the checkpoint after `done` steps where --save-every asks for one, at the last step,
// and where the run stopped (a diverged run saves none: its weights are not finite); otherwise an
// asynchronous save published once every rank's file is written.
inline void save_on_schedule(const Run& run, Trainer& t, RankState& r, std::int64_t done, bool stopped, bool diverged) {
  const Options& o = run.o;
  if (o.checkpoint.save_dir.empty()) return;
  const bool due = !diverged && ((o.checkpoint.save_every > 0 && done % o.checkpoint.save_every == 0) ||
                                 done == o.optim.steps || stopped);
  if (!due) return t.poll_saves();
  const auto s0 = std::chrono::steady_clock::now();
  save_at(run, t, r, done, t.owns_data() ? done : r.loader.position());
  r.last_saved = done;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
  if (r.lead)
    std::printf("checkpoint: step %lld %s %s (training waited %.2f s)\n", static_cast<long long>(done),
                o.checkpoint.async_save ? "being written to" : "saved in", o.checkpoint.save_dir.c_str(), took);
}

// Collective: step `step` + 1. Returns false when the run ends after it (stopped by a signal,
// abandoned part-way, or diverged: the same step on every rank).
inline bool train_step(Run& run, Trainer& t, RankState& r, std::int64_t step, double flops_per_token) {
  const Options& o = run.o;
  const auto t0 = std::chrono::steady_clock::now();
  t.reset_peak();  // peak_bytes: this step's, as the plan's step peak counts it
  r.points.begin_step(r.previous_seconds, r.points.counted());
  // Where an abandoned step's data began: the loader's position, or the step for a family's own data.
  const std::int64_t position = t.owns_data() ? step : r.loader.position();
  const double lr = r.schedule.lr(step);
  StepResult s;
  if (t.owns_data()) {
    s = t.step_at(step, run.accumulation(), lr, o.optim.clip, r.points);
  } else {
    std::vector<std::vector<std::int32_t>> xs(static_cast<std::size_t>(run.accumulation())), ys(xs.size());
    std::vector<Tokens> micro;
    for (std::size_t a = 0; a < xs.size(); ++a) {
      r.loader.next(xs[a], ys[a]);
      micro.push_back({xs[a], ys[a]});
    }
    s = t.step(micro, lr, o.optim.clip, r.points);
  }
  if (s.abandoned != 0) {
    end_abandoned(run, t, r, step, position, s.abandoned);
    return false;
  }
  t.synchronize();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // One all-reduce (max) agrees on the step's peak bytes, a stop signal seen by any rank, a loss
  // that is not finite, and the slowest rank's time: every rank then stops after the same step.
  std::vector<std::int64_t> agreed{t.peak_bytes(), stop_requested().load(), std::isfinite(s.loss) ? 0 : 1,
                                   static_cast<std::int64_t>(dt * 1e6)};
  t.agree_max(agreed);
  r.previous_seconds = static_cast<double>(agreed[3]) * 1e-6;
  r.step_peak_max = std::max(r.step_peak_max, agreed[0]);
  const int stop = static_cast<int>(agreed[1]);
  const bool diverged = agreed[2] != 0;
  const bool eval_now =
      !diverged && o.data.eval_every > 0 && ((step + 1) % o.data.eval_every == 0 || step + 1 == o.optim.steps);
  const std::optional<double> eval = eval_now ? std::optional(evaluate(run, t, r.lead)) : std::nullopt;
  save_on_schedule(run, t, r, step + 1, stop != 0, diverged);
  const bool ended = stop != 0 || diverged;
  if (ended && run.tells(t)) {
    run.outcome = diverged ? Run::Outcome::diverged : Run::Outcome::stopped;
    run.end_signal = stop;
    run.end_step = step + 1;
  }
  if (!r.lead) return !ended;
  run.report.step({.step = step + 1,
                   .loss = s.loss,
                   .lr = lr,
                   .grad_norm = s.grad_norm,
                   .tokens_per_s = static_cast<double>(o.optim.batch * run.seq) / dt,
                   .flops_per_token = flops_per_token,
                   .peak_bytes = agreed[0],
                   .skipped = s.skipped,
                   .eval = eval,
                   .routing = s.routing});
  run.final_loss = s.loss;
  if (ended) run.report.ended(step + 1, stop, diverged, s.loss);
  else if (eval) run.final_eval = *eval;
  return !ended;
}

// Collective: --sample's tokens after training on --text: the last position's logits, sampled
// with Philox, one token at a time, over a window of the held-out text.
inline void sample(Run& run, Trainer& t, const RankState& r) {
  const Options& o = run.o;
  std::vector<std::int32_t> window(static_cast<std::size_t>(run.seq));
  run.corpus.held_out(0, window.data(), run.seq);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(run.micro() / o.mesh.data * run.seq)),
      targets(tokens.size(), 0);
  for (std::int64_t i = 0; i < o.data.sample; ++i) {
    for (std::int64_t b = 0; b < run.micro() / o.mesh.data; ++b)
      std::copy(window.begin(), window.end(), tokens.begin() + b * run.seq);
    const std::vector<double> logits = t.next_logits({tokens, targets});
    const double mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (double l : logits) z += std::exp(l - mx);
    double u = weft::uniform(o.model.seed, 99, static_cast<std::uint64_t>(i)) * z, c = 0;
    auto next = static_cast<std::int32_t>(logits.size() - 1);
    for (std::size_t v = 0; v < logits.size(); ++v)
      if ((c += std::exp(logits[v] - mx)) >= u) {
        next = static_cast<std::int32_t>(v);
        break;
      }
    window.erase(window.begin());
    window.push_back(next);
    if (r.lead) run.sample.push_back(next);
  }
}

// Collective: one rank's whole run over its trainer.
inline void train_rank(Run& run, Trainer& t) {
  const double flops = t.flops_per_token();  // a collective where the layers declare it
  agree_on_the_run(run, t);
  RankState r = start(run, t);
  const auto began = std::chrono::steady_clock::now();
  bool ended = false;
  for (std::int64_t step = r.first_step; step < run.o.optim.steps && !ended; ++step)
    ended = !train_step(run, t, r, step, flops);
  t.wait_saves();
  if (r.lead) run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  if (run.o.data.sample > 0 && !ended && t.has_logits()) sample(run, t, r);
  std::vector<std::int64_t> peak{std::max(r.step_peak_max, t.peak_bytes())};
  t.agree_max(peak);
  if (r.lead) run.peak_bytes = peak[0];
}

// Before the ranks start: a lone host rank's op threads, the GEMM ceiling (every process measures
// its own ranks at once; `ceiling(ranks here)` measures), the report's header, the trace.
inline void begin(Run& run, RunHeader h, bool host, const std::function<double(int)>& ceiling) {
  const Options& o = run.o;
  const Launch& l = run.launch;
  const bool speak = l.lead();
  const int ranks = o.mesh.ranks();
  if (host) {  // a lone thread rank runs its host ops on every core the process is given (the same bits)
    cpu_set_t given;
    const int cores = sched_getaffinity(0, sizeof(given), &given) == 0 ? CPU_COUNT(&given) : 1;
    if (l.kind == Launcher::threads && ranks == 1 && cores > 1) {
      host::set_threads(std::min(cores, 256));
      if (speak) std::printf("one rank: its host ops on %d threads\n", host::threads());
    }
  }
  if (speak)
    std::printf("measuring the %s GEMM rate%s of %d ranks (the MFU ceiling)...\n", h.device.c_str(),
                host ? cat(" (", host::gemm_library(), ")").c_str() : "", ranks);
  const int here = l.kind == Launcher::threads ? ranks : 1;
  if (l.barrier) l.barrier();
  h.gemm_peak = ceiling(here) * (ranks / here);
  h.floor = run.corpus.floor();
  h.seq = run.seq;
  run.device_precision = cat(h.device, " ", h.precision);
  if (speak) {
    run.report = Report(o, h);
    run.report.header(o.optim.micro());
  }
  if (!o.logging.trace.empty()) run.trace = std::make_unique<pipeline::Trace>(ranks);
}

// After the ranks: the exit status (0, 3 when the loss diverged, 128 + the signal when stopped)
// and the last lines.
inline int finish(const Run& run) {
  const Options& o = run.o;
  const bool speak = run.launch.lead();
  if (run.outcome == Run::Outcome::diverged) {
    if (speak)
      std::printf("diverged: the loss of step %lld is not finite; stopped (no checkpoint written)\n",
                  static_cast<long long>(run.end_step));
    std::fflush(stdout);
    return 3;
  }
  if (run.outcome == Run::Outcome::stopped) {
    if (speak)
      std::printf("stopped by %s after step %lld of %lld%s\n", signal_name(run.end_signal),
                  static_cast<long long>(run.end_step), static_cast<long long>(o.optim.steps),
                  o.checkpoint.save_dir.empty() ? "" : cat("; checkpoint in ", o.checkpoint.save_dir).c_str());
    std::fflush(stdout);
    return 128 + run.end_signal;
  }
  if (!speak) return 0;
  if (run.trace) {
    run.trace->write(o.logging.trace);
    std::printf("trace: %s (Chrome / Perfetto trace events, one track per rank)\n", o.logging.trace.c_str());
  }
  run.report.done(run.seconds, run.final_loss, run.final_eval, run.peak_bytes);
  if (!run.sample.empty())
    std::printf("sample:\n%s\n", data::ByteTokenizer::decode(std::span<const std::int32_t>(run.sample)).c_str());
  return 0;
}

// F: the model family (train/family.hpp); D: Host or Cuda; P: a precision policy; Strategy:
// optim::Ddp, Zero1, Zero2 or Fsdp over the data axis. Every rank is a thread (on the GPU they share
// it, each with its own stream), or a process. Returns the exit status; throws weft::Error for what
// it cannot do.
template <Family F, class D, class P, bool SP, class Strategy>
int train(const Options& o, const config_t<F>& cfg, const Corpus& corpus, const Launch& launch) {
  using T = typename precision_t<P>::compute;
  Run run(o, corpus, launch);
  run.seq = cfg.seq;
  run.vocab = vocab_of(cfg);
  run.family = F::name();
  run.model = cat(F::name(), ": ", summary<F>(cfg), ", seed ", cfg.seed);
  RunHeader h;
  h.family = F::name();
  h.summary = summary<F>(cfg);
  h.device = D::name;
  h.precision = precision_t<P>::name();
  h.dense = DeviceSupport<D>::template dense_peak<T>();
  begin(run, std::move(h), std::same_as<D, Host>,
        [&](int here) { return DeviceSupport<D>::template gemm_ceiling<T>(here, launch.gpu); });
  if (run.trace) DeviceSupport<D>::ranges(*run.trace);
  // --init-from: the Hugging Face file as a weft checkpoint of step 0 (weights only), that every
  // rank loads into its shards, in a temporary directory removed on every way out of this function
  // (and, when the process was killed, by the next run: remove_stale_init_dirs).
  TempDir init_dir;
  if (!o.checkpoint.init_from.empty()) {
    init_dir = TempDir::make(o.where("--init-from"));
    if constexpr (requires { F::import_hf(o.checkpoint.init_from, init_dir.path, cfg); }) {
      F::import_hf(o.checkpoint.init_from, init_dir.path, cfg);
      if (launch.lead()) std::printf("initial weights: %s (Hugging Face layout)\n", o.checkpoint.init_from.c_str());
      run.init_dir = init_dir.path;
    } else {
      throw Error(o.where("--init-from"), cat("the model family '", F::name(), "' has no Hugging Face import"),
                  "start from the seed's initialization, or --resume a weft checkpoint");
    }
  }
  run_ranks<D>(launch, o.mesh.ranks(), o, [&](auto& world) {
    TrainerOf<F, D, P, SP, Strategy, std::remove_cvref_t<decltype(world)>> trainer(world, o, cfg, run.trace.get());
    train_rank(run, trainer);
  });
  return finish(run);
}

// Unit U's loops (train/unit.hpp): the variant at index `variant` of U's, with the options' strategy
// and precision (train/dispatch.hpp chose the unit and checked both against it).
template <class U>
int train_unit(const Options& o, const typename U::config& cfg, const Corpus& corpus, const Launch& launch,
               std::size_t variant) {
  using F = typename U::family;
  if constexpr (size_v<typename U::variants> == 0) {
    throw Error(o.where(),
                cat("the model family '", F::name(), "' has nothing to run on ", U::device::name, " in this unit"),
                "choose another device");
  } else {
    return with_index(typename U::variants{}, variant, [&]<class V>() {
      return with_base_strategy(strategies_t<F>{}, o.mesh.strategy, [&]<class S>() {
        return with_precision(typename U::template precisions<V>{}, o.model.dtype, [&]<class P>() {
          return train<Bound<F, V>, typename U::device, P, U::sequence_parallel, S>(o, cfg, corpus, launch);
        });
      });
    });
  }
}

}  // namespace weft::train
