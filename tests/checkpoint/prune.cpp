// Retention and the save directory: --keep after a rollback keeps what the run just wrote and what
// latest names; a failure on one rank is reported with its cause by every rank; one trainer per
// directory (checkpoint/lock.hpp).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "checkpoint/support.hpp"

using namespace weft;
using namespace weft::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::pair<std::int64_t, std::string>> steps(std::initializer_list<std::int64_t> s) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  for (std::int64_t x : s) out.emplace_back(x, checkpoint::step_name(x));
  return out;
}
std::vector<std::string> names(std::initializer_list<std::int64_t> s) {
  std::vector<std::string> out;
  for (std::int64_t x : s) out.push_back(checkpoint::step_name(x));
  return out;
}

}  // namespace

TEST_CASE("pruning keeps the newest of this run's line, the step just written and latest's target") {
  using checkpoint::detail::pruned;
  // A straight run: the oldest go.
  CHECK(pruned(steps({1, 2, 3, 4}), 4, 2, checkpoint::step_name(4)) == names({1, 2}));
  // Resumed from step 5 of a run that had reached 10: saving 8 with keep 1 removes 5..7 and keeps 10
  // (before, pruning by number kept 10 alone and removed the 8 it had just written).
  CHECK(pruned(steps({5, 6, 7, 8, 10}), 8, 1, checkpoint::step_name(8)) == names({5, 6, 7}));
  // Nothing that latest names is removed, even when it is not the newest.
  CHECK(pruned(steps({2, 4, 6}), 6, 1, checkpoint::step_name(2)) == names({4}));
  // keep covers the line: nothing to remove.
  CHECK(pruned(steps({3, 9}), 3, 1, checkpoint::step_name(3)).empty());
}

TEST_CASE("a run resumed from an earlier step keeps its new checkpoints under --keep") {
  const std::string root = scratch("rollback");
  RunPlan first = RunPlan::fresh(root, 10);
  first.save_every = 5;  // steps 5 and 10
  ckpt_run<float, optim::Zero1>({.data = 2}, first);
  REQUIRE(checkpoint::complete_checkpoints(root) == steps({5, 10}));
  RunPlan again = RunPlan::resumed(root + "/step_00000005", root, 8);
  again.save_every = 1;
  again.keep = 1;
  ckpt_run<float, optim::Zero1>({.data = 2}, again);
  // Step 8, just written, and latest's target; step 10 of the run rolled back from, kept.
  CHECK(checkpoint::complete_checkpoints(root) == steps({8, 10}));
  CHECK(checkpoint::latest_of(root) == checkpoint::step_name(8));
  CHECK(checkpoint::Reader(root).manifest().step == 8);
  fs::remove_all(root);
}

TEST_CASE("a failure on one rank is reported with its cause by every rank") {
  std::mutex mu;
  std::vector<std::string> got;
  run_threads(4, [&](ThreadComm& world) {
    std::string e;
    try {
      checkpoint::detail::agree(
          world, world.rank() == 2 ? "checkpoint(x): writing 8 bytes failed (No space left on device)" : "",
          "writing a checkpoint file", checkpoint::detail::kSaveUnchanged);
    } catch (const Error& err) { e = err.what(); }
    std::lock_guard lock(mu);
    got.push_back(e);
  });
  REQUIRE(got.size() == 4);
  for (const std::string& e : got) {
    CAPTURE(e);  // before: "failed on rank 2; see rank 2's error" on ranks 0, 1 and 3
    CHECK(
        e ==
        "checkpoint: writing a checkpoint file failed on world rank 2: checkpoint(x): writing 8 bytes failed (No space "
        "left on device); the previous checkpoint is unchanged");
  }

  // In a save: rank 0 alone cannot move latest (latest.tmp is a directory); whichever rank's error
  // run_threads reports names that cause.
  const std::string root = scratch("rank0_fails");
  fs::create_directories(root + "/latest.tmp/x");
  std::string e;
  try {
    ckpt_run<float, optim::Ddp>({.data = 2, .tensor = 2}, RunPlan::fresh(root, 1));
  } catch (const Error& err) { e = err.what(); }
  CAPTURE(e);
  CHECK(e.find("publishing the checkpoint failed on world rank 0: checkpoint(" + root +
               "/latest.tmp): cannot open (Is a directory)") != std::string::npos);
  fs::remove_all(root);
}

TEST_CASE("one trainer per save directory: a second process is refused, naming the first") {
  const std::string root = scratch("locked");
  int ready[2], release[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(release) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // holds the lock until the parent writes to `release`
    int code = 0;
    try {
      const checkpoint::DirectoryLock lock(root);
      char c = 1;
      if (::write(ready[1], &c, 1) != 1 || ::read(release[0], &c, 1) != 1) code = 2;
    } catch (...) { code = 3; }
    ::_exit(code);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  std::string refused;
  try {
    const checkpoint::DirectoryLock second{root};
  } catch (const Error& err) { refused = err.what(); }
  CHECK(refused.find(cat("checkpoint(", root, "): is in use by another trainer (pid ", child, " on ")) !=
        std::string::npos);
  // A Saver in this process is refused at its first save, with the holder named on every rank.
  std::string e;
  try {
    ckpt_run<float, optim::Ddp>({.data = 2}, RunPlan::fresh(root, 1));
  } catch (const Error& err) { e = err.what(); }
  CHECK(e.find(cat("preparing the checkpoint directory failed on world rank 0: checkpoint(", root,
                   "): is in use by another trainer (pid ", child)) != std::string::npos);
  CHECK(checkpoint::complete_checkpoints(root).empty());
  REQUIRE(::write(release[1], &c, 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  // Once it is gone, the directory is free; within one process the lock is shared.
  {
    const checkpoint::DirectoryLock a(root), b(root);
    CHECK((a.held() && b.held()));
    ckpt_run<float, optim::Ddp>({.data = 2}, RunPlan::fresh(root, 1));
  }
  CHECK(checkpoint::complete_checkpoints(root).size() == 1);
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
  fs::remove_all(root);
}
