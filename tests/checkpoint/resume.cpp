// Resume is exact: 20 steps straight equal 10 steps, a save, a load into fresh ranks and 10 more
// steps, bit for bit on the host: every loss, and every parameter and optimizer-state element of
// the checkpoints both runs save at step 20. For DDP, ZeRO-1, ZeRO-2 and FSDP, with and without
// tensor parallelism (and sequence parallelism, bf16 mixed precision and a pipeline once each).
#include <doctest/doctest.h>

#include "checkpoint/support.hpp"

using namespace weft;
using namespace weft::test;

namespace {

template <class P, class S, bool SP = false>
void resume_is_exact(MeshDegrees m, const std::string& tag) {
  CAPTURE(tag);
  const std::string straight = scratch(tag + "_straight"), split = scratch(tag + "_split");
  const auto all = ckpt_run<P, S, SP>(m, RunPlan::fresh(straight, 20));
  const auto first = ckpt_run<P, S, SP>(m, RunPlan::fresh(split, 10));
  const auto second = ckpt_run<P, S, SP>(m, RunPlan::resumed(split, split, 20));
  REQUIRE(all.size() == 20);
  REQUIRE(first.size() == 10);
  REQUIRE(second.size() == 10);
  for (std::size_t i = 0; i < 20; ++i) {
    const double resumed = i < 10 ? first[i] : second[i - 10];
    CAPTURE(i);
    CHECK(std::memcmp(&all[i], &resumed, sizeof(double)) == 0);  // bit for bit
  }
  CHECK(all.back() < all.front() - 0.1);  // it trains (3.4 -> ~3.0 in 20 steps)
  CHECK(compare_checkpoints(straight, split) == "");
  // Both directories hold step 20 under latest; the split one kept step 10 too.
  CHECK(checkpoint::complete_checkpoints(straight).size() == 1);
  CHECK(checkpoint::complete_checkpoints(split).size() == 2);
  std::filesystem::remove_all(straight);
  std::filesystem::remove_all(split);
}

}  // namespace

TEST_CASE("resume is exact: DDP, ZeRO-1, ZeRO-2, FSDP on data 2") {
  resume_is_exact<float, optim::Ddp>({.data = 2}, "ddp_d2");
  resume_is_exact<float, optim::Zero1>({.data = 2}, "zero1_d2");
  resume_is_exact<float, optim::Zero2>({.data = 2}, "zero2_d2");
  resume_is_exact<float, optim::Fsdp>({.data = 2}, "fsdp_d2");
}

TEST_CASE("resume is exact: DDP, ZeRO-1, ZeRO-2, FSDP on data 2 x tensor 2") {
  resume_is_exact<float, optim::Ddp>({.data = 2, .tensor = 2}, "ddp_d2t2");
  resume_is_exact<float, optim::Zero1>({.data = 2, .tensor = 2}, "zero1_d2t2");
  resume_is_exact<float, optim::Zero2>({.data = 2, .tensor = 2}, "zero2_d2t2");
  resume_is_exact<float, optim::Fsdp>({.data = 2, .tensor = 2}, "fsdp_d2t2");
}

TEST_CASE("resume is exact: sequence parallelism, bf16 with f32 master weights, a pipeline") {
  resume_is_exact<float, optim::Zero2, true>({.data = 2, .tensor = 2}, "zero2_sp_d2t2");
  resume_is_exact<Bf16Mixed, optim::Fsdp>({.data = 2, .tensor = 2}, "fsdp_bf16_d2t2");
  resume_is_exact<float, optim::Zero1>({.data = 2, .pipe = 2}, "zero1_d2p2");
}
