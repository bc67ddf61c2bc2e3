// defines: train::Trainer, one rank's training of a model behind a small virtual interface, and
// what the loop hands it and gets back (Tokens, StepResult).
//
// The loop (train/loop.hpp) is ordinary code compiled once: it reads the data, keeps the cadence
// of evaluation and checkpoints, agrees with the other ranks on stopping, and reports. Everything
// that depends on the model's types (the model, its data-parallel protocol, its pipeline, its
// checkpoint savers) lives behind Trainer, in one class template, TrainerOf
// (train/trainer_of.hpp), instantiated per family, device, precision, sequence parallelism and
// strategy. This is tiny-cuda-nn's type-erased Module over templated networks: the lines of the
// loop are compiled once per translation unit, not once per instantiation.
//
// Every call below that says "collective" is made by every rank, in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/checkpoint/common.hpp"
#include "weft/checkpoint/load.hpp"
#include "weft/comm/fingerprint.hpp"

namespace weft::train {

class StopPoints;

// One micro-batch of this data rank's sequences: tokens and next-token targets, (B/dp, T) each.
struct Tokens {
  std::span<const std::int32_t> x, y;
};

// What one step did: the mean loss over its micro-batches, the gradient norm before clipping,
// whether the optimizer skipped it (a norm that is not finite, the same on every rank), and the
// signal whose stop request abandoned it part-way (0: it finished; then loss and norm are set).
// A model with mixture-of-experts routers also says what they did in the step's micro-batches:
// their load-balancing and z-losses (the mean over the routers and micro-batches, before the
// coefficients), the largest expert load (the most (token, expert) slots an expert got over the
// mean, each router's mean over the micro-batches) and the slots dropped past a capacity (summed),
// over the whole mesh.
struct Routing {
  double aux = 0, z = 0, load = 0;
  std::int64_t dropped = 0;
};
struct StepResult {
  double loss = 0, grad_norm = 0;
  bool skipped = false;
  int abandoned = 0;
  std::optional<Routing> routing;
};

class Trainer {
 public:
  virtual ~Trainer() = default;

  // This rank's place: its world rank, and its coordinate on the data axis (which sequences it reads).
  virtual int rank() const = 0;
  virtual int data_rank() const = 0;

  // Collective: every rank's fields equal rank 0's, or every rank throws Error naming the first
  // that differs. The trainer adds what only it knows (the collectives of one micro-batch).
  virtual void agree(Fingerprint& fp) = 0;
  // Collective: the element-wise maximum over the world, in place.
  virtual void agree_max(std::span<std::int64_t> values) = 0;
  // The model's FLOPs per token for MFU: the family's count, or what its layers declare (collective).
  virtual double flops_per_token() = 0;

  // Collective: the step's micro-batches (accum of them, each weighted 1/accum), forward and
  // backward, then the optimizer step at `lr` with the gradient norm clipped to `clip` (0: off).
  // A long step is polled for a stop request at the points `points` spaces (train/stop.hpp); a
  // request seen there abandons the step on every rank with the weights of the step before.
  virtual StepResult step(std::span<const Tokens> micro_batches, double lr, double clip, StopPoints& points) = 0;
  // Collective: the mean loss of one micro-batch, forward only, keeping nothing for backward.
  virtual double evaluate(const Tokens& micro_batch) = 0;

  // A family that reads its own data (train::OwnsData: latents, images) has the trainer read it:
  // step_at is step() over the step's micro-batches of that data (its position is the step), and
  // validate the family's validation batches' mean losses by name ("t=0.25": their mean is the
  // run's eval loss). describe_data names the data for the run's fingerprint.
  virtual bool owns_data() const { return false; }
  virtual StepResult step_at(std::int64_t step, std::int64_t accumulation, double lr, double clip,
                             StopPoints& points) = 0;
  virtual std::vector<std::pair<std::string, double>> validate() = 0;
  virtual std::string describe_data() const { return {}; }
  // Whether the model's head keeps its logits (next_logits can sample).
  virtual bool has_logits() const = 0;
  // Collective: the whole vocabulary's logits at the last position of the first sequence, gathered
  // over the tensor axis (in the model's element type, as double).
  virtual std::vector<double> next_logits(const Tokens& micro_batch) = 0;

  // Collective: loads a checkpoint (a step directory or a directory with latest) into what this
  // rank holds, whatever mesh, strategy and precision saved it.
  virtual checkpoint::RunState load(const std::string& path, checkpoint::LoadOptions opt) = 0;
  // Collective, with a save directory: a checkpoint of this step (written beside the next steps
  // with --async-save); poll publishes a finished asynchronous save, wait_saves waits for all.
  virtual void save(const checkpoint::RunState& state) = 0;
  virtual void poll_saves() = 0;
  virtual void wait_saves() = 0;

  // The device: wait for its queued work; the peak of bytes in use since reset_peak.
  virtual void synchronize() = 0;
  virtual void reset_peak() = 0;
  virtual std::int64_t peak_bytes() const = 0;
};

}  // namespace weft::train
