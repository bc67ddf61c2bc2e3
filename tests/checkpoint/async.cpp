// Asynchronous saves (Saver with async = true): the files are written by a thread while training
// goes on, published by a later step's poll(). Saving every 2 of 8 steps, keeping 2, gives the same
// losses as a run without saves and the same step-8 checkpoint, bit for bit, as synchronous saves;
// steps 6 and 8 are kept and latest names 8. Under the tsan preset this also checks the writer
// thread against the training threads.
#include <doctest/doctest.h>

#include "checkpoint/support.hpp"

using namespace weft;
using namespace weft::test;

TEST_CASE("asynchronous saves equal synchronous ones and leave training unchanged") {
  const std::string sync_dir = scratch("async_sync"), async_dir = scratch("async_async");
  RunPlan sync{"", sync_dir, 8, 20, true, 2, 2, false}, async{"", async_dir, 8, 20, true, 2, 2, true};
  const auto plain = ckpt_run<float, optim::Zero2>({.data = 2, .tensor = 2}, RunPlan::fresh("", 8));
  const auto a = ckpt_run<float, optim::Zero2>({.data = 2, .tensor = 2}, sync);
  const auto b = ckpt_run<float, optim::Zero2>({.data = 2, .tensor = 2}, async);
  CHECK(a == plain);
  CHECK(b == plain);
  CHECK(compare_checkpoints(sync_dir, async_dir) == "");
  const auto kept = checkpoint::complete_checkpoints(async_dir);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].first == 6);
  CHECK(kept[1].first == 8);
  CHECK(checkpoint::Reader(async_dir).manifest().step == 8);
  // The step-6 checkpoint written beside steps 7 and 8 resumes to the same end.
  const auto resumed =
      ckpt_run<float, optim::Zero2>({.data = 2, .tensor = 2}, RunPlan::resumed(async_dir + "/step_00000006", "", 8));
  REQUIRE(resumed.size() == 2);
  CHECK(resumed[0] == plain[6]);
  CHECK(resumed[1] == plain[7]);
  std::filesystem::remove_all(sync_dir);
  std::filesystem::remove_all(async_dir);
}
