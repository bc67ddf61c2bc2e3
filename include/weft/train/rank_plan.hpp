// train::RankPlan: one pipe rank's plan of a run, as the check that a run fits and --plan read it,
// whichever plan made it (a family's own, as GPT-2's constexpr replay; or the step measured on the
// Meta device, train/plan.hpp). Light: the command line and a family's header include it.
#pragma once

#include <array>
#include <cstdint>

#include "weft/comm/threads/world.hpp"
#include "weft/layout/layout.hpp"
#include "weft/plan/memory.hpp"

namespace weft::train {

// The persistent state and the peak of a step (of the pipe rank's data and tensor ranks, the one
// with the largest peak).
struct RankPlan {
  int pipe_rank = 0;
  footprint::Memory state;  // before the first step
  footprint::Memory peak;   // each category's peak during a step
  std::int64_t total = 0;   // the peak of their sum
  bool exact = false;       // on the host: the allocator's counts; on the GPU, without (or with an estimate of) its workspaces
  std::array<threads::Counters, kAxes.size()> collectives{};  // a step's, per mesh axis (measured plans only)
};

}  // namespace weft::train
