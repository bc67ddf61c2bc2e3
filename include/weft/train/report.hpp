// defines: train::Report, what a run says while it trains: the header, one progress line and one
// JSON record per step (--log, JSON lines), the lines of a stop or a divergence, and the final
// summary. Only the lead process's lead rank reports; the others hold an inactive Report.
//
// Every record is flushed whole as soon as it is written (a killed run keeps every finished step),
// and a record that fails to write (a full device) ends the run: a log that silently lost its
// records is worse than none.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/train/devices.hpp"
#include "weft/train/options.hpp"
#include "weft/train/signals.hpp"
#include "weft/train/trainer.hpp"  // Routing

namespace weft::train {

// What the run is, for its header: the model and where it runs.
struct RunHeader {
  std::string family, summary;                          // F::name(), train::summary<F>(cfg)
  std::string device, precision;                        // "host", "bf16 (f32 master weights)", ...
  double gemm_peak = 0;                                 // FLOP/s all ranks reach together: the MFU ceiling
  std::optional<std::pair<std::string, double>> dense;  // the device's datasheet peak (name, FLOP/s)
  std::optional<double> floor;                          // the built-in corpus's entropy rate
  std::int64_t seq = 0;
};

// One finished step, as the progress line and the log record say it.
struct StepLine {
  std::int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, flops_per_token = 0;
  std::int64_t peak_bytes = 0;
  bool skipped = false;
  std::optional<double> eval;
  std::optional<Routing> routing;  // a mixture of experts' routers (train/trainer.hpp)
};

class Report {
 public:
  Report() = default;
  // The lead: prints, and writes --log (appended to when resuming).
  Report(const Options& o, RunHeader h) : o_(&o), h_(std::move(h)) {
    if (o.logging.log.empty()) return;
    log_.open(o.logging.log, o.checkpoint.resume.empty() ? std::ios::trunc : std::ios::app);
    if (!log_)
      throw Error(o.where("--log"), cat("cannot write the log file ", o.logging.log, " (", std::strerror(errno), ")"),
                  "check the path");
  }
  bool active() const { return o_ != nullptr; }

  void header(std::int64_t micro) const {
    const Options& o = *o_;
    std::printf("%s: %s | %s %s on %s | %s%s | batch %lld (micro %lld x %lld) | %lld steps | GEMM %.1f GFLOP/s\n",
                o.program.c_str(), h_.summary.c_str(), o.mesh.strategy.c_str(), h_.precision.c_str(), h_.device.c_str(),
                o.mesh.text().c_str(), o.mesh.context > 1 ? cat(" (", o.mesh.attention, " attention)").c_str() : "",
                static_cast<long long>(o.optim.batch), static_cast<long long>(micro),
                static_cast<long long>(o.optim.batch / micro), static_cast<long long>(o.optim.steps),
                h_.gemm_peak / 1e9);
    if (h_.dense)
      std::printf("MFU is reported against the measured GEMM ceiling and against the %s (%.0f TFLOP/s)\n",
                  h_.dense->first.c_str(), h_.dense->second / 1e12);
    if (h_.floor) std::printf("built-in Markov corpus: entropy rate (the loss floor) %.4f nats\n", *h_.floor);
    std::fflush(stdout);  // the header before the first step, also through a pipe
  }

  void step(const StepLine& s) {
    const double mfu = s.tokens_per_s * s.flops_per_token / h_.gemm_peak;
    const double mfu_peak = h_.dense ? s.tokens_per_s * s.flops_per_token / h_.dense->second : NAN;
    std::string note = cat(std::round(1000 * mfu) / 10, "%");
    if (h_.dense) note += cat(" (", std::round(1000 * mfu_peak) / 10, "% of peak)");
    char floor_note[32] = "";
    if (h_.floor) std::snprintf(floor_note, sizeof floor_note, " (floor %+.3f)", s.loss - *h_.floor);
    char routing[96] = "";
    if (s.routing)
      std::snprintf(routing, sizeof routing, " | aux %.4f load %.2f dropped %lld", s.routing->aux, s.routing->load,
                    static_cast<long long>(s.routing->dropped));
    std::printf("step %5lld/%lld | loss %.4f%s%s | lr %.2e | norm %.3f | %8.0f tok/s | MFU %s | peak %s/rank%s%s\n",
                static_cast<long long>(s.step), static_cast<long long>(o_->optim.steps), s.loss, floor_note, routing,
                s.lr, s.grad_norm, s.tokens_per_s, note.c_str(), mib(static_cast<double>(s.peak_bytes)).c_str(),
                s.eval ? cat(" | eval ", std::round(*s.eval * 10000) / 10000).c_str() : "",
                s.skipped ? " | step skipped: the gradient norm is not finite" : "");
    std::fflush(stdout);
    if (!log_.is_open()) return;
    nlohmann::json rec{{"step", s.step},
                       {"loss", s.loss},
                       {"lr", s.lr},
                       {"grad_norm", s.grad_norm},
                       {"tokens_per_s", s.tokens_per_s},
                       {"mfu", mfu},
                       {"peak_bytes", s.peak_bytes},
                       {"skipped", s.skipped}};
    if (h_.dense) rec["mfu_of_peak"] = mfu_peak;
    if (s.routing) {
      rec["aux_loss"] = s.routing->aux;
      rec["z_loss"] = s.routing->z;
      rec["expert_load"] = s.routing->load;
      rec["dropped_tokens"] = s.routing->dropped;
    }
    log_ << rec.dump() << "\n";
    if (s.eval) log_ << nlohmann::json{{"step", s.step}, {"eval_loss", *s.eval}}.dump() << "\n";
    flush();
  }

  // The run ended after step `step`: stopped by `signal`, or diverged with `loss`.
  void ended(std::int64_t step, int signal, bool diverged, double loss) {
    record(diverged ? nlohmann::json{{"step", step}, {"diverged", true}, {"loss", cat(loss)}}
                    : nlohmann::json{{"step", step}, {"stopped", signal_name(signal)}});
  }
  // Step `step` + 1 abandoned part-way on `signal`, `after` seconds after it (when this process saw it).
  void abandoned(std::int64_t step, int signal, std::optional<double> after) {
    std::printf("abandoned step %lld on %s%s\n", static_cast<long long>(step + 1), signal_name(signal),
                after ? cat(", ", std::round(*after * 1000) / 1000, " s after it").c_str() : "");
    std::fflush(stdout);
    nlohmann::json last{{"step", step}, {"stopped", signal_name(signal)}, {"abandoned_step", step + 1}};
    if (after) last["abandoned_after_s"] = *after;
    record(last);
  }

  // The summary of a run that finished its steps.
  void done(double seconds, double final_loss, double final_eval, std::int64_t peak_bytes) const {
    std::printf("done: %lld steps in %.1f s, final loss %.4f", static_cast<long long>(o_->optim.steps), seconds,
                final_loss);
    if (!std::isnan(final_eval)) std::printf(", held-out loss %.4f", final_eval);
    if (h_.floor)
      std::printf(" (floor %.4f; %+.4f nats from it)", *h_.floor,
                  (std::isnan(final_eval) ? final_loss : final_eval) - *h_.floor);
    std::printf(", peak memory %s per rank\n", mib(static_cast<double>(peak_bytes)).c_str());
  }

 private:
  void record(const nlohmann::json& j) {
    if (!log_.is_open()) return;
    log_ << j.dump() << "\n";
    flush();
  }
  void flush() {
    log_.flush();
    check_written(log_, o_->logging.log, o_->where("--log"));
  }

  const Options* o_ = nullptr;
  RunHeader h_;
  std::ofstream log_;
};

}  // namespace weft::train
