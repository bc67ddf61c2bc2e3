// Stopping a long step part-way, with every rank at the same point.
//
// A stop request (a signal handler's flag) is agreed at the end of every step by the trainer's own
// all-reduce. A long step (the previous one took 2 x `every` or more, or none was measured yet) is
// also polled inside: at the executor's stop points (pipeline::StopHook: before each stage of each
// micro-batch in a plain step; at the table's cuts in a pipelined one, pipeline::cuts), which every
// rank passes in the same order with no message pending across them, one small all-reduce (max) of
// the flags decides, for all ranks at once, whether to go on.
// When it says stop, every rank throws Abandoned from the same point; the weights and optimizer
// state are those of the last finished step (the optimizer step is never interrupted: it runs after
// the last point).
//
// Polling costs one all-reduce of 8 bytes, so the points polled are spaced from the previous step's
// time and point count (both the same on every rank): about `every` seconds apart. The first step
// (nothing measured yet) polls at every point. A step shorter than 2 x `every` polls nowhere: it
// finishes within that, and the step-end agreement stops it. On an NCCL world the poll's
// all-reduce of a host value also waits for the device's queued work: the spacing keeps that to a
// few times a second (not yet measured on a GPU).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <span>

#include "weft/comm/communicator.hpp"
#include "weft/pipeline/executor.hpp"

namespace weft::train {

// Thrown on every rank at the same point when the agreed poll finds a stop request.
struct Abandoned : pipeline::StepStopped {
  int signal = 0;  // the largest signal number any rank saw
  explicit Abandoned(int s) : signal(s) {}
  const char* what() const noexcept override { return "train: the step was abandoned on a stop request"; }
};

// Which points of a step poll (the same answer on every rank for the same inputs).
class StopPoints {
 public:
  explicit StopPoints(double every_seconds = 0.25) : every_(every_seconds) {}

  // Before a step: the previous step's seconds (the largest rank's; < 0: none measured yet) and
  // how many points it passed.
  void begin_step(double previous_seconds, std::int64_t previous_points) {
    counted_ = 0;
    if (previous_seconds < 0 || previous_points <= 0) {
      spacing_ = 1;
    } else if (previous_seconds < 2 * every_) {
      spacing_ = kNever;
    } else {
      const double per_point = previous_seconds / static_cast<double>(previous_points);
      const double k = every_ / per_point;
      spacing_ = k < 1 ? 1 : k > static_cast<double>(previous_points) ? previous_points : static_cast<std::int64_t>(k);
    }
  }
  // Counts one point; true when it polls.
  bool due() {
    ++counted_;
    return spacing_ != kNever && counted_ % spacing_ == 0;
  }
  std::int64_t counted() const { return counted_; }  // points passed this step
  std::int64_t spacing() const { return spacing_; }  // points between polls (kNever: none)

  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

 private:
  double every_;
  std::int64_t spacing_ = 1, counted_ = 0;
};

// The executor's stop hook (pipeline::StopHook) for a step: at a point that StopPoints says is
// due, all-reduces (max) this rank's flag over `world`; a non-zero result throws Abandoned on every
// rank.
template <class World>
class Polling {
 public:
  Polling(World& world, const std::atomic<int>& flag, StopPoints& points)
      : world_(&world), flag_(&flag), points_(&points) {}

  void point() {
    if (!points_->due()) return;
    std::int64_t agreed[1] = {flag_->load()};
    world_->all_reduce(std::span<std::int64_t>(agreed), ReduceOp::max);
    if (agreed[0] != 0) throw Abandoned(static_cast<int>(agreed[0]));
  }

 private:
  World* world_;
  const std::atomic<int>* flag_;
  StopPoints* points_;
};

}  // namespace weft::train
