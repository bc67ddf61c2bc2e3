// What a DiT reads (its micro-batch, nn/batch.hpp) and how the host makes it from latents: the
// patches, the diffusion objectives that noise them, and the timestep features.
//
//   dit::Inputs<E>    x       (B/dp, N, p^2 Cin)  the noised latents' patches (patchify)
//                     t_emb   (B/dp, frequencies)  the timesteps' sinusoidal features
//                                                  (timestep_features, in double on the host)
//                     y       (B/dp) int32         class labels; `classes` is the null label
//                     target  (B/dp, N, p^2 Cin)  what the model predicts: the noise, or the velocity
//   patchify(img, B, Cin, H, W, p)   (B, Cin, H, W) -> (B, N, p^2 Cin): patch (i, j) row-major, its
//                                    features (row in patch, column in patch, channel), the order of
//                                    diffusers' output (its input convolution's weight is permuted to
//                                    it on import: models/dit/diffusers.hpp)
//   unpatchify(...)                  its inverse
//   Ddpm                             epsilon prediction: x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps
//                                    on a linear-beta schedule of `steps` (DiT's 1000, 1e-4 .. 0.02),
//                                    t an integer step, the target eps
//   RectifiedFlow                    velocity: x_t = (1 - s) x0 + s eps with s in [0, 1], the
//                                    target eps - x0, the model's timestep 1000 s (SD3's)
//   Noised<E>                        a micro-batch's storage, filled by noise(): from clean latents,
//                                    labels and each sample's (fraction of the schedule, noise seed)
//   SyntheticLatents<E>              micro-batches of synthetic latents (tests, benchmarks, a first
//                                    run): class k's latents its own fixed pattern plus a little
//                                    noise, so that a model has something to learn; labels dropped
//                                    to the null label at label_dropout (classifier-free guidance's
//                                    training); next(step, i, scale) draws micro-batch i of a step,
//                                    at(u, i) a validation batch with every sample at the fraction u
//
// Each sample is a function of its own seed, so every data rank draws the samples it holds of the
// same global batch, whatever the mesh.
//
// defines: dit::Inputs, dit::patchify, dit::unpatchify, dit::Ddpm, dit::RectifiedFlow, dit::Objective,
//   dit::Noised, dit::SyntheticLatents
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/models/dit/config.hpp"
#include "weft/models/dit/embeddings.hpp"
#include "weft/nn/batch.hpp"

namespace weft::dit {

template <class E>
struct Inputs {
  std::span<const E> x;             // (B/dp, N, p^2 Cin)
  std::span<const E> t_emb;         // (B/dp, frequencies)
  std::span<const std::int32_t> y;  // (B/dp)
  std::span<const E> target;        // (B/dp, N, p^2 Cin)

  template <class F>
  void for_each_field(F&& f) {
    f("x", x);
    f("t_emb", t_emb);
    f("y", y);
    f("target", target);
  }
  static std::vector<std::int64_t> per_sample(const Config& c) {
    return {c.seq * c.patch_features(), c.frequencies, 1, c.seq * c.patch_features()};
  }
  void check(const Config& c, std::int64_t b, const std::string& where) const {
    const std::string patches = cat("patches (", c.seq, ") x patch features (", c.patch_features(), ")");
    nn::check_field(x, b * c.seq * c.patch_features(), "x", where, patches);
    nn::check_field(t_emb, b * c.frequencies, "t_emb", where, cat("frequencies (", c.frequencies, ")"));
    nn::check_field(y, b, "y", where, "1");
    nn::check_field(target, b * c.seq * c.patch_features(), "target", where, patches);
    for (std::size_t i = 0; i < y.size(); ++i)
      if (y[i] < 0 || y[i] > c.classes)
        throw Error(where, cat("sample ", i, " has the label ", y[i], " of ", c.classes, " classes"),
                    cat("pass labels in [0, ", c.classes, "], ", c.classes, " the null label"));
  }
};

// (B, Cin, H, W) -> (B, (H/p)(W/p), p p Cin).
template <class E, class F>
void patchify(E* out, const F* img, std::int64_t B, std::int64_t Cin, std::int64_t H, std::int64_t W, std::int64_t p) {
  const std::int64_t gh = H / p, gw = W / p;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < gh; ++i)
      for (std::int64_t j = 0; j < gw; ++j)
        for (std::int64_t r = 0; r < p; ++r)
          for (std::int64_t q = 0; q < p; ++q)
            for (std::int64_t c = 0; c < Cin; ++c)
              *out++ = static_cast<E>(img[((b * Cin + c) * H + i * p + r) * W + j * p + q]);
}

// (B, (H/p)(W/p), p p Cin) -> (B, Cin, H, W).
template <class E, class F>
void unpatchify(E* img, const F* patches, std::int64_t B, std::int64_t Cin, std::int64_t H, std::int64_t W,
                std::int64_t p) {
  const std::int64_t gh = H / p, gw = W / p;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < gh; ++i)
      for (std::int64_t j = 0; j < gw; ++j)
        for (std::int64_t r = 0; r < p; ++r)
          for (std::int64_t q = 0; q < p; ++q)
            for (std::int64_t c = 0; c < Cin; ++c)
              img[((b * Cin + c) * H + i * p + r) * W + j * p + q] = static_cast<E>(*patches++);
}

// DDPM (Ho et al. 2020) on DiT's linear betas: abar_t = prod_{s <= t} (1 - beta_s).
struct Ddpm {
  std::int64_t steps = 1000;
  double beta_start = 1e-4, beta_end = 0.02;

  std::vector<double> alpha_bar() const {
    if (steps < 2 || !(beta_start > 0) || !(beta_end >= beta_start) || !(beta_end < 1))
      throw Error("dit::Ddpm", cat(steps, " steps, betas ", beta_start, " .. ", beta_end),
                  "use 2 or more steps and 0 < beta_start <= beta_end < 1");
    std::vector<double> out(static_cast<std::size_t>(steps));
    double prod = 1;
    for (std::int64_t t = 0; t < steps; ++t) {
      prod *= 1 - (beta_start + (beta_end - beta_start) * static_cast<double>(t) / static_cast<double>(steps - 1));
      out[static_cast<std::size_t>(t)] = prod;
    }
    return out;
  }
  // The integer step at a fraction u in [0, 1) of the schedule.
  std::int64_t step_at(double u) const {
    return std::min<std::int64_t>(steps - 1, static_cast<std::int64_t>(u * static_cast<double>(steps)));
  }
};

struct RectifiedFlow {
  double timestep_scale = 1000;  // the model's timestep for s
};

using Objective = std::variant<Ddpm, RectifiedFlow>;

// One micro-batch's storage (B/dp samples) and its Inputs. noise() fills it from clean latents
// (B/dp, Cin, H, W), labels, and per sample the fraction u in [0, 1) of the schedule it is noised
// to and the seed of its Gaussian noise.
template <class E>
struct Noised {
  std::vector<E> x, t_emb, target;
  std::vector<std::int32_t> y;

  Inputs<E> inputs() const { return {x, t_emb, y, target}; }

  void noise(const Config& c, const Objective& objective, std::span<const double> latents,
             std::span<const std::int32_t> labels, std::span<const double> u, std::span<const std::uint64_t> seeds) {
    const std::int64_t B = static_cast<std::int64_t>(labels.size()), P = c.in_channels * c.sample * c.sample;
    if (static_cast<std::int64_t>(latents.size()) != B * P || u.size() != labels.size() ||
        seeds.size() != labels.size())
      throw Error("dit::Noised::noise",
                  cat(latents.size(), " latent values, ", labels.size(), " labels, ", u.size(), " fractions and ",
                      seeds.size(), " seeds"),
                  cat("pass ", P, " values (in_channels x sample x sample) and one label, fraction and seed a sample"));
    const std::vector<double> abar =
        std::holds_alternative<Ddpm>(objective) ? std::get<Ddpm>(objective).alpha_bar() : std::vector<double>{};
    std::vector<double> xt(static_cast<std::size_t>(B * P)), tgt(xt.size()), t(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) {
      const auto at = static_cast<std::size_t>(b);
      if (!(u[at] >= 0 && u[at] < 1))
        throw Error("dit::Noised::noise", cat("sample ", b, " at the fraction ", u[at], " of the schedule"),
                    "pass fractions in [0, 1)");
      std::mt19937_64 rng(seeds[at]);
      std::normal_distribution<double> normal;
      double keep = 0, mix = 0;  // x_t = keep x0 + mix eps
      bool velocity = false;
      if (const auto* d = std::get_if<Ddpm>(&objective)) {
        const std::int64_t step = d->step_at(u[at]);
        keep = std::sqrt(abar[static_cast<std::size_t>(step)]);
        mix = std::sqrt(1 - abar[static_cast<std::size_t>(step)]);
        t[at] = static_cast<double>(step);
      } else {
        keep = 1 - u[at];
        mix = u[at];
        velocity = true;
        t[at] = u[at] * std::get<RectifiedFlow>(objective).timestep_scale;
      }
      for (std::int64_t i = 0; i < P; ++i) {
        const auto k = static_cast<std::size_t>(b * P + i);
        const double eps = normal(rng), x0 = latents[k];
        xt[k] = keep * x0 + mix * eps;
        tgt[k] = velocity ? eps - x0 : eps;
      }
    }
    const std::int64_t F = c.patch_features() * c.seq;
    x.resize(static_cast<std::size_t>(B * F));
    target.resize(x.size());
    patchify(x.data(), xt.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    patchify(target.data(), tgt.data(), B, c.in_channels, c.sample, c.sample, c.patch);
    const auto f = timestep_features(t, c.frequencies);
    t_emb.resize(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) t_emb[i] = static_cast<E>(f[i]);
    y.assign(labels.begin(), labels.end());
  }
};

template <class E>
class SyntheticLatents {
 public:
  // The micro-batches of `micro` samples that data rank `data_rank` of `data` holds its share of;
  // m micro-batches a step.
  SyntheticLatents(const Config& c, Objective o, std::int64_t micro, int data, int data_rank, int m,
                   double label_dropout = 0.1, std::uint64_t seed = 1)
      : c_(c),
        o_(o),
        micro_(micro),
        data_(data),
        rank_(data_rank),
        dropout_(label_dropout),
        seed_(seed),
        store_(static_cast<std::size_t>(m + 1)) {
    if (micro < 1 || data < 1 || micro % data != 0 || m < 1 || data_rank < 0 || data_rank >= data)
      throw Error("dit::SyntheticLatents",
                  cat("a micro-batch of ", micro, " over ", data, " data ranks, ", m, " a step"),
                  "use a micro-batch that the data degree divides and 1 or more micro-batches");
    const std::int64_t P = c.in_channels * c.sample * c.sample;
    std::mt19937_64 rng(seed ^ 0x5eedULL);
    std::normal_distribution<double> normal;
    patterns_.resize(static_cast<std::size_t>(c.classes * P));
    for (auto& v : patterns_) v = normal(rng);
  }

  nn::Batch<Inputs<E>> next(int step, int i, double scale) {
    return make(static_cast<std::uint64_t>(step) * 4096 + static_cast<std::uint64_t>(i), i, -1, scale);
  }
  // A validation batch (`index` apart from training's): every sample at the fraction u of the schedule.
  nn::Batch<Inputs<E>> at(double u, int index) {
    return make((1ULL << 40) + static_cast<std::uint64_t>(index), static_cast<int>(store_.size()) - 1, u, 1.0);
  }

 private:
  nn::Batch<Inputs<E>> make(std::uint64_t key, int slot, double fixed_u, double scale) {
    const std::int64_t local = micro_ / data_, first = rank_ * local, P = c_.in_channels * c_.sample * c_.sample;
    std::vector<double> latents, u;
    std::vector<std::int32_t> labels;
    std::vector<std::uint64_t> seeds;
    for (std::int64_t b = first; b < first + local; ++b) {
      std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + key * 1000003ULL + static_cast<std::uint64_t>(b));
      std::uniform_real_distribution<double> uniform;
      std::normal_distribution<double> normal;
      const auto k = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c_.classes));
      for (std::int64_t j = 0; j < P; ++j)
        latents.push_back(patterns_[static_cast<std::size_t>(k * P + j)] + 0.1 * normal(rng));
      labels.push_back(uniform(rng) < dropout_ ? static_cast<std::int32_t>(c_.classes) : k);
      const double draw = uniform(rng);
      u.push_back(fixed_u >= 0 ? fixed_u : draw);
      seeds.push_back(rng());
    }
    auto& n = store_[static_cast<std::size_t>(slot)];
    n.noise(c_, o_, latents, labels, u, seeds);
    return {n.inputs(), micro_, scale};
  }

  Config c_;
  Objective o_;
  std::int64_t micro_;
  int data_, rank_;
  double dropout_;
  std::uint64_t seed_;
  std::vector<double> patterns_;  // (classes, Cin, H, W)
  std::vector<Noised<E>> store_;  // one a micro-batch index, the last for validation
};

}  // namespace weft::dit
