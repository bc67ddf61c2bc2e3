// The training loop of any model family (train/family.hpp), written once over the device and the
// precision: data and micro-batches, a pipeline schedule, the data-parallel strategy, clipping, the
// learning-rate schedule, evaluation, sampling, checkpoints (resume on any mesh, save on a
// schedule, stop on a signal with a checkpoint), logs (JSON lines), traces (Chrome / Perfetto) and
// MFU. train/main.hpp is the command line over it; docs/training.md describes both.
//
// A binary instantiates train<F, D, P, SP, S> for the strategies and precisions it offers. A CUDA
// build's GPU half includes train/devices.cuh first (DeviceSupport<Cuda>).
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/fingerprint.hpp"
#include "weft/comm/launch.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/core/philox.hpp"
#include "weft/core/precision.hpp"
#include "weft/data/loader.hpp"
#include "weft/data/token_file.hpp"
#include "weft/device/dispatch.hpp"
#include "weft/nn/describe.hpp"
#include "weft/nn/embedding.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/schedule.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/pipeline/pipelined.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/pipeline/trace.hpp"
#include "weft/recompute/policies.hpp"
#include "weft/train/corpus.hpp"
#include "weft/train/devices.hpp"
#include "weft/train/family.hpp"
#include "weft/train/flops.hpp"
#include "weft/train/init_dir.hpp"
#include "weft/train/metrics.hpp"
#include "weft/train/options.hpp"
#include "weft/train/signals.hpp"
#include "weft/train/stop.hpp"
#include "weft/train/strategies.hpp"
#include "weft/version.hpp"

namespace weft::train {

inline pipeline::Kind schedule_kind(const std::string& name) {
  if (name == "gpipe") return pipeline::Kind::gpipe;
  if (name == "interleaved") return pipeline::Kind::interleaved;
  if (name == "zb") return pipeline::Kind::zero_bubble_h1;
  return pipeline::Kind::one_f_one_b;
}

// `path` made absolute and canonical as far as it exists ("" stays "").
inline std::string absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// F: the model family (train/family.hpp); D: Host or Cuda; P: a precision policy; Strategy:
// optim::Ddp, Zero1, Zero2 or Fsdp over the data axis. Every rank is a thread (on the GPU they share
// it, each with its own stream), or a process. Returns the exit status (0, or 3 when the loss
// diverged, 128 + the signal when stopped); throws weft::Error for what it cannot do.
template <Family F, class D, class P, bool SP, class Strategy>
int train(const Options& o, const config_t<F>& cfg, const Corpus& corpus, const Launch& launch) {
  using T = typename precision_t<P>::compute;
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  const std::int64_t accum = o.batch / micro;
  const int ranks = o.ranks();
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
  // The family's count, or (set by every rank once the model is built) the layers' declarations.
  double flops_token = 0;
  if constexpr (requires { F::flops_per_token(cfg); }) flops_token = F::flops_per_token(cfg);
  if (speak)
    std::printf("%s: %s | %s %s on %s | %s%s | batch %lld (micro %lld x %lld) | %lld steps | GEMM %.1f GFLOP/s\n",
              o.program.c_str(), summary<F>(cfg).c_str(),
              o.strategy.c_str(), precision_t<P>::name().c_str(), D::name, o.mesh_text().c_str(),
              o.context > 1 ? cat(" (", o.attention, " attention)").c_str() : "",
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
    if (!log) throw Error(o.where("--log"), cat("cannot write the log file ", o.log, " (", std::strerror(errno), ")"), "check the path");
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
    init_dir = TempDir::make(o.where("--init-from"));
    if constexpr (requires { F::import_hf(o.init_from, init_dir.path, cfg); }) {
      F::import_hf(o.init_from, init_dir.path, cfg);
      if (speak) std::printf("initial weights: %s (Hugging Face layout)\n", o.init_from.c_str());
    } else {
      throw Error(o.where("--init-from"), cat("the model family '", F::name(), "' has no Hugging Face import"),
                  "start from the seed's initialization, or --resume a weft checkpoint");
    }
  }

  run_ranks<D>(launch, ranks, o, [&](auto& world) {
    const auto dev = DeviceSupport<D>::make(world);
    Mesh mesh{world, o.mesh()};
    using Model = model_t<F, P, SP, D>;
    // With --pipe > 1 this rank holds its stages' blocks only, and a schedule's table runs them.
    const auto part = pipeline::Partition::even(o.pipe, o.virtual_stages, cfg.layers);
    Model gpt(*dev, cfg, mesh.spread(), micro, part.placement(mesh.coord().pipe));
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{.config = {.lr = o.lr}}, mesh);
    if constexpr (!requires { F::flops_per_token(cfg); }) {
      const double f = declared_flops_per_token(gpt, mesh);  // a collective on the pipe axis
      if (world.rank() == 0) flops_token = f;
    }
    // The executor sends activations with isend, which the NCCL back end does not offer: its
    // processes refuse --pipe > 1 before training (main), and never hold a pipeline.
    using Comm = std::remove_cvref_t<decltype(world)>;
    constexpr bool pipelines = PostsSends<Comm>;
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
      fp.add("model", cat(F::name(), ": ", summary<F>(cfg), ", seed ", cfg.seed));
      fp.add("mesh", cat(o.mesh_text(), ", ", o.virtual_stages, " virtual stages, schedule ", o.schedule,
                         o.context > 1 ? cat(", ", o.attention, " attention") : std::string()));
      fp.add("batch", cat(o.batch, " in micro-batches of ", micro));
      fp.add("optimization", cat(o.steps, " steps, lr ", o.lr, " to ", o.min_lr, ", warm-up ", schedule.warmup, ", clip ", o.clip));
      fp.add("data", cat(o.data_file.empty() && o.text.empty() ? "built-in Markov corpus" : o.data_file + o.text,
                         ", eval every ", o.eval_every));
      // Absolute paths: ranks started in other working directories resolve relative ones elsewhere.
      fp.add("checkpoints", cat("save to '", absolute(o.save_dir), "' every ", o.save_every, ", resume '",
                                o.resume.empty() ? std::string() : absolute(checkpoint::resolve(o.resume == "latest" ? o.save_dir : o.resume)),
                                "', init '", absolute(o.init_from), "'"));
      // describe's table (from the types, or walked over this rank's model where the family writes no rows).
      if constexpr (nn::SpecPlanRows<Model> || nn::WalkablePlan<Model>)
        if (o.pipe == 1) fp.add("collectives of one micro-batch", nn::describe(gpt, micro, mesh.spread()));
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
        throw Error(o.where("--resume"), cat("the checkpoint was saved by a run with --seed ", st.seed, ", this one has ", o.seed),
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
        check_written(log, o.log, o.where("--log"));
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
        check_written(log, o.log, o.where("--log"));
      }
      final_loss = loss;
      if (ended) {
        const nlohmann::json last = diverged ? nlohmann::json{{"step", step + 1}, {"diverged", true}, {"loss", cat(loss)}}
                                             : nlohmann::json{{"step", step + 1}, {"stopped", signal_name(stop)}};
        if (log.is_open()) {
          log << last.dump() << std::endl;
          check_written(log, o.log, o.where("--log"));
        }
        break;
      }
      if (eval_now) final_eval = eval_loss;
    }
    with_saver([&](auto& saver) { saver.wait(mesh); });
    if (lead) total_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Sampling: the last position's logits, gathered over the tensor axis, sampled with Philox.
    if constexpr (requires(typename Model::Ctx& c) { c.head.ce.logits; }) {
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

// The loop on the host for one choice of sequence parallelism, with the options' strategy and
// precision picked from the family's lists (train/main.hpp calls it). A trainer binary may compile
// each choice in a translation unit of its own, so that it builds on two cores (WEFT_TRAIN_HOST).
template <Family F, bool SP>
int train_on_host(const Options& o, const config_t<F>& cfg, const Corpus& corpus, const Launch& launch) {
  return with_base_strategy(strategies_t<F>{}, o.strategy, [&]<class S>() {
    return with_precision(host_precisions_t<F>{}, o.dtype,
                          [&]<class P>() { return train<F, Host, P, SP, S>(o, cfg, corpus, launch); });
  });
}

}  // namespace weft::train

// Explicit instantiations of the loop, `template` in the translation unit that compiles them and
// `extern template` in the others. WEFT_TRAIN_HOST(EXTERN, F, SP): the host loop of family F for one
// choice of sequence parallelism, every strategy and precision of the family. A trainer in two units
// (examples/train_gpt.cpp and train_gpt_sp.cpp; worth it where each holds many instantiations, as
// GPT-2's 12 each: each unit compiles the model's layers again):
//
//   // trainer.cpp, beside main:                 // trainer_sp.cpp:
//   WEFT_TRAIN_HOST(extern, my::Family, true)    #include <weft/train/loop.hpp>
//                                                WEFT_TRAIN_HOST(, my::Family, true)
//
// WEFT_TRAIN_INSTANTIATE_ONE names one (device, precision, SP, strategy); WEFT_TRAIN_INSTANTIATE
// both SP choices.
#define WEFT_TRAIN_HOST(EXTERN, F, SP)                                                                       \
  EXTERN template int weft::train::train_on_host<F, SP>(const weft::train::Options&,                        \
                                                        const weft::train::config_t<F>&,                    \
                                                        const weft::train::Corpus&, const weft::train::Launch&);
// The host loops of F's context-parallel families (F::with_context), ring and all-gather, for one SP
// choice.
#define WEFT_TRAIN_HOST_CONTEXT(EXTERN, F, SP)                        \
  WEFT_TRAIN_HOST(EXTERN, F::with_context<weft::context::Ring>, SP) \
  WEFT_TRAIN_HOST(EXTERN, F::with_context<weft::context::AllGather>, SP)
#define WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, F, D, P, SP, S)                                                  \
  EXTERN template int weft::train::train<F, D, P, SP, S>(const weft::train::Options&,                        \
                                                         const weft::train::config_t<F>&,                    \
                                                         const weft::train::Corpus&, const weft::train::Launch&);
#define WEFT_TRAIN_INSTANTIATE(EXTERN, F, D, P, S)      \
  WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, F, D, P, false, S) \
  WEFT_TRAIN_INSTANTIATE_ONE(EXTERN, F, D, P, true, S)
