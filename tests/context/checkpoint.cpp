// Checkpoints of context-parallel runs: GPT-2 with the sequence over the context axis saves what
// each data x context rank holds (its slice of the units, sliced over data x context under a
// sharded strategy) and loads into any mesh with or without a context axis, and back; the round
// trips of checkpoint/reshard.hpp (bit for bit, and one more step's loss under both meshes within
// 1e-5 in f32).
#include "checkpoint/reshard.hpp"

using namespace weft;
using namespace weft::test;

namespace {
template <class P, bool SP>
using Ring = gpt2::Model<P, SP, recompute::None, Host, context::Ring>;
template <class P, bool SP>
using AllGather = gpt2::Model<P, SP, recompute::None, Host, context::AllGather>;
}  // namespace

TEST_CASE("reshard round trips: context parallelism, to and from meshes without a context axis") {
  using checkpoint::Sharded, checkpoint::Consolidated;
  round_trip(config<float, optim::Fsdp, false, Sharded, Ring>("fsdp_d2c2_ring", {.data = 2, .context = 2}),
             config<float, optim::Zero1>("zero1_d2", {.data = 2}));
  round_trip(config<float, optim::Ddp, false, Consolidated, AllGather>("ddp_c4_gather", {.context = 4}),
             config<float, optim::Fsdp, false, Sharded, Ring>("fsdp_c2t2_ring", {.tensor = 2, .context = 2}));
}
