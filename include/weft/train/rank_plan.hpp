// train::RankPlan: one pipe rank's plan of a run, as the check that a run fits and --plan read it,
// whichever plan made it (a family's own, as GPT-2's constexpr replay; or the step measured on the
// Meta device, train/plan.hpp). Light: the command line and a family's header include it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "weft/comm/threads/world.hpp"
#include "weft/core/error.hpp"
#include "weft/cost/memory.hpp"
#include "weft/layout/layout.hpp"

namespace weft::train {

// The persistent state and the peak of a step (of the pipe rank's data and tensor ranks, the one
// with the largest peak).
struct RankPlan {
  int pipe_rank = 0;
  footprint::Memory state;  // before the first step
  footprint::Memory peak;   // each category's peak during a step
  std::int64_t total = 0;   // the peak of their sum
  // on the host: the allocator's counts; on the GPU, without (or with an estimate of) its workspaces
  bool exact = false;
  std::array<threads::Counters, kAxes.size()> collectives{};  // a step's, per mesh axis (measured plans only)
};

// A plan replays (or measures on the Meta device) every layer of every micro-batch of a step: past
// kMaxPlanPasses layer passes it would take minutes (GPT-2's replay runs about 1.4 us a pass in an
// optimized build and some 40 us under the dev preset's sanitizers, the Meta device's more), so it
// is refused by name instead (--plan: exit 2; weft-plan: the layout left out, saying why). 2^16
// passes: 128 layers of 512 micro-batches, past any run's step.
inline constexpr double kMaxPlanPasses = 1 << 16;

// Why a plan of `layers` layers over `micro_batches` micro-batches per step is not made, or nothing.
inline std::optional<std::string> plan_too_long(std::int64_t layers, std::int64_t micro_batches) {
  const double passes = static_cast<double>(layers) * static_cast<double>(micro_batches);
  if (passes <= kMaxPlanPasses) return std::nullopt;
  return cat(layers, " layers x ", micro_batches, " micro-batches per step = ", passes,
             " layer passes to replay, more than a plan makes in seconds (2^16)");
}

}  // namespace weft::train
