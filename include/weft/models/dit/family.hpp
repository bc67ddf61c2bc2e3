// DiT for the trainer (concept train::Family, train/family.hpp): weft-train --model dit. The model
// over the precision, the sequence parallelism and the device; the presets ("tiny" to DiT-XL/8);
// the FLOPs per patch (the trainer's "tokens" are a DiT's patches); and its data (train::OwnsData):
// the latents it trains on and the batches it validates on.
//
//   weft-train --model dit [--preset DiT-XL/2] [--objective ddpm|flow]
//              [--records LATENTS --labels LABELS]      record files (data/records.hpp): latents
//                                                      (in_channels, sample, sample) f32 and
//                                                      labels (1) i32, sample k of each together;
//                                                      without them synthetic latents
//                                                      (dit::SyntheticLatents)
//
// Step s's micro-batch i reads global samples (s a + i) B .. + B - 1 of the records (a micro-batches
// of B a step; each pass over the file an epoch in the same order), noised at fractions of the
// schedule and with noise drawn from the seed and the sample's place: a resumed run reads and draws
// what an uninterrupted one would. Labels are dropped to the null label at 10% (classifier-free
// guidance's training). Validation: 4 micro-batches at each of 0.25, 0.5 and 0.75 of the schedule
// (the same latents each time), their losses named and their mean the run's eval loss.
//
// The plan (--plan, and the check that a run fits) is the step measured on the Meta device, on a
// micro-batch of zeros of the inputs' sizes (nn::ZeroInputs). --init-from DIR starts from a diffusers
// DiTTransformer2DModel directory whose config.json is the run's model (import_hf). Not yet:
// weft-train's GPU units for DiT (its layers on the GPU are compiled by tests/nn/gpu.cu).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/data/records.hpp"
#include "weft/models/dit/config.hpp"
#include "weft/models/dit/diffusers.hpp"
#include "weft/models/dit/inputs.hpp"
#include "weft/models/dit/model.hpp"
#include "weft/train/family.hpp"
#include "weft/train/options.hpp"

namespace weft::dit {

// One rank's data for weft-train (train::OwnsData): E the model's element type.
template <class E>
class TrainData {
 public:
  TrainData(const train::Options& o, const Config& c, std::int64_t micro, int data_degree, int data_rank,
            std::int64_t accumulation)
      : c_(c),
        objective_(objective_of(o)),
        micro_(micro),
        dp_(data_degree),
        rank_(data_rank),
        accum_(accumulation),
        seed_(o.model.seed) {
    if (o.data.records.empty()) {
      synthetic_.emplace(c, objective_, micro, data_degree, data_rank, static_cast<int>(accumulation), 0.1,
                         o.model.seed);
      what_ = cat("synthetic latents (", c.classes, " class patterns), ", o.data.objective);
      return;
    }
    latents_ = std::make_unique<data::RecordFile>(o.data.records,
                                                  data::RecordShape{DType::f32, {c.in_channels, c.sample, c.sample}});
    labels_ = std::make_unique<data::RecordFile>(o.data.labels, data::RecordShape{DType::i32, {1}});
    if (labels_->size() != latents_->size())
      throw Error(o.where("--labels"),
                  cat(o.data.labels, " holds ", labels_->size(), " labels for ", latents_->size(), " latents in ",
                      o.data.records),
                  "give one label a latent, in the same order");
    store_.resize(static_cast<std::size_t>(accumulation) + 1);
    latent_loader_.emplace(*latents_, micro, data_degree, data_rank);
    label_loader_.emplace(*labels_, micro, data_degree, data_rank);
    what_ = cat("records ", o.data.records, " (", latents_->size(), " latents), labels ", o.data.labels, ", ",
                o.data.objective);
  }

  const std::string& describe() const { return what_; }

  // Micro-batch i of step `step`, weighted `scale`.
  nn::Batch<Inputs<E>> next(std::int64_t step, std::int64_t i, double scale) {
    if (synthetic_) return synthetic_->next(static_cast<int>(step), static_cast<int>(i), scale);
    return from_records(step * accum_ + i, static_cast<std::size_t>(i), -1, scale, 0.1);
  }

  // Validation: batch k of validation_batches(), named by its fraction of the schedule.
  static constexpr int kPerFraction = 4;
  int validation_batches() const { return 3 * kPerFraction; }
  std::pair<std::string, nn::Batch<Inputs<E>>> validation(int k) {
    const double u = 0.25 * (1 + k / kPerFraction);
    const std::string name = cat("t=", u);
    if (synthetic_) return {name, synthetic_->at(u, k % kPerFraction)};
    return {name, from_records(k % kPerFraction, store_.size() - 1, u, 1.0, 0.0)};
  }

 private:
  static Objective objective_of(const train::Options& o) {
    if (o.data.objective == "flow") return RectifiedFlow{};
    return Ddpm{};
  }

  // The records' global micro-batch `index` (modulo the file), noised into store_[slot]; u < 0:
  // each sample its own fraction, drawn.
  nn::Batch<Inputs<E>> from_records(std::int64_t index, std::size_t slot, double u, double scale, double dropout) {
    latent_loader_->seek(index);
    label_loader_->seek(index);
    std::vector<float> x;
    std::vector<std::int32_t> y;
    latent_loader_->next(x);
    label_loader_->next(y);
    const std::int64_t local = micro_ / dp_;
    std::vector<double> latents(x.begin(), x.end()), fractions;
    std::vector<std::uint64_t> seeds;
    for (std::int64_t b = 0; b < local; ++b) {
      auto& label = y[static_cast<std::size_t>(b)];
      if (label < 0 || label >= c_.classes)
        throw Error(cat("dit: ", labels_->path()), cat("label ", label, " of ", c_.classes, " classes"),
                    cat("write labels in [0, ", c_.classes, ")"));
      std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(index) * 1000003ULL +
                          static_cast<std::uint64_t>(rank_ * local + b) + (u >= 0 ? (1ULL << 50) : 0));
      std::uniform_real_distribution<double> uniform;
      if (uniform(rng) < dropout) label = static_cast<std::int32_t>(c_.classes);
      fractions.push_back(u >= 0 ? u : uniform(rng));
      seeds.push_back(rng());
    }
    store_[slot].noise(c_, objective_, latents, y, fractions, seeds);
    return {store_[slot].inputs(), micro_, scale};
  }

  Config c_;
  Objective objective_;
  std::int64_t micro_;
  int dp_, rank_;
  std::int64_t accum_;
  std::uint64_t seed_;
  std::string what_;
  std::optional<SyntheticLatents<E>> synthetic_;
  std::unique_ptr<data::RecordFile> latents_, labels_;
  std::optional<data::RecordLoader<float>> latent_loader_;
  std::optional<data::RecordLoader<std::int32_t>> label_loader_;
  std::vector<Noised<E>> store_;  // a micro-batch of the step each, the last for validation
};

struct Family {
  template <class P, bool SP, class D, class V>
  using model = Model<P, SP, recompute::None, D, typename V::context>;
  // The patches over the context axis by ring attention (--context); all-gather attention is the
  // library's (dit::Model<..., context::AllGather>), not compiled into weft-train.
  using variants = train::List<train::Variant<>, train::Variant<context::Ring>>;
  template <class E>
  using data = TrainData<E>;
  using host_precisions = train::List<F32, Bf16Mixed>;
  static constexpr bool gpu = false;  // weft-train's GPU units for DiT: not yet

  static std::string name() { return "dit"; }
  static std::vector<std::string> preset_names() { return dit::preset_names(); }
  static Config preset(std::string_view n) { return dit::preset(n); }
  // A patch's share of a sample's FLOPs, forward and backward (3x the forward).
  static double flops_per_token(const Config& c) {
    return 3 * forward_flops_per_sample(c) / static_cast<double>(c.seq);
  }
  // --init-from DIR: a diffusers DiTTransformer2DModel directory, whose config.json must describe the
  // run's model (every field of the record; the first that differs is named), imported before
  // anything trains (dit::import_diffusers).
  static void import_hf(const std::string& from, const std::string& dir, const Config& c) {
    const Config got = diffusers_config(from, c);
    const auto want = record(c), have = record(got);
    for (std::size_t i = 0; i < want.size(); ++i)
      if (want[i] != have[i])
        throw Error(
            cat("dit::import(", from, ")"),
            cat("its config.json has ", have[i].first, " ", have[i].second, "; the run's model has ", want[i].second),
            "choose the preset and sizes of the model in the directory (--preset, --layers, --width, --heads)");
    import_diffusers(from, dir, c);
  }
  static std::string summary(const Config& c) {
    return cat("latents ", c.in_channels, " x ", c.sample, " x ", c.sample, " in patches of ", c.patch, " (", c.seq,
               "), layers ", c.layers, ", heads ", c.heads, ", width ", c.width, ", classes ", c.classes);
  }
};

}  // namespace weft::dit
