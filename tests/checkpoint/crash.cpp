// Crash safety: a child process resumes from a checkpoint of step 2, trains to step 4 and saves
// (keeping 1), and kills itself with SIGKILL at the k-th durable step of that save (files.hpp's
// point hook): at every step of the protocol's end (the directory's fsync and rename, the manifest,
// latest, the pruning of step 2), at the first step of each kind, and at 8 spread over the rank
// files' bytes and fsyncs. After each kill:
//   - latest names a complete checkpoint that loads and verifies: step 2, or step 4 exactly when
//     the kill came after latest's rename (while pruning);
//   - every step directory with a manifest is complete (it opens and verifies): pruning renames a
//     directory out of the checkpoints' names before it removes a file;
//   - a partial step 4 (step_00000004.tmp, or step_00000004 without its manifest) is refused;
//   - a new run resumes from latest and saves step 4 again, over whatever the kill left.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <atomic>
#include <csignal>
#include <set>

#include "checkpoint/support.hpp"

using namespace weft;
using namespace weft::test;
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_points{0};
std::atomic<int> g_kill_at{-1};
std::vector<std::string> g_names;  // the points of one save, in order (counting run only)
std::mutex g_names_mu;

void count_point(const char* name) {
  ++g_points;
  std::lock_guard lock(g_names_mu);
  g_names.emplace_back(name);
}
void kill_at_point(const char*) {
  if (++g_points == g_kill_at.load()) ::kill(::getpid(), SIGKILL);
}

void resume_and_save(const std::string& root) {
  ckpt_run<float, optim::Zero2>({.data = 2}, {root, root, 4, 20, true, 1, 0, false});
}

}  // namespace

TEST_CASE(
    "a save killed at every kind of durable step leaves the previous checkpoint usable and the partial one refused") {
  const std::string base = scratch("crash_base");
  ckpt_run<float, optim::Zero2>({.data = 2}, RunPlan::fresh(base, 2));

  // Count the durable steps of one save (in this process, nothing killed).
  const std::string counting = scratch("crash_count");
  fs::copy(base, counting, fs::copy_options::recursive);
  checkpoint::set_point_hook(count_point);
  resume_and_save(counting);
  checkpoint::set_point_hook(nullptr);
  const int total = g_points.load();
  const std::vector<std::string> names = g_names;  // names[k - 1]: the k-th durable step
  MESSAGE(cat("one save has ", total,
              " durable steps: ", join(std::vector<std::string>(names.end() - 14, names.end()), ", "), " at its end"));
  // The protocol's end, in order: the directory made durable and renamed, the manifest, latest, the
  // pruning of step 2 (a rename out of the checkpoints' names, then its files).
  REQUIRE(total >= 14);
  CHECK(std::vector<std::string>(names.end() - 14, names.end()) ==
        std::vector<std::string>{"directory fsync", "directory rename", "manifest", "file bytes", "file fsync",
                                 "text written", "latest", "file bytes", "file fsync", "text written", "prune rename",
                                 "prune remove", "prune remove", "prune remove"});
  // latest names step 4 once the rename after its text is written has run: a kill at a later point.
  const int latest_renamed = total - 4;  // the "text written" after "latest"
  fs::remove_all(counting);

  // Every point of the protocol's end, the first point of each kind, and 8 spread over the rank files.
  std::set<int> chosen;
  for (int i = 0; i < 8; ++i) chosen.insert(1 + i * (total - 14) / 8);
  for (int k = total - 13; k <= total; ++k) chosen.insert(k);
  std::set<std::string> kinds;
  for (int k = 1; k <= total; ++k)
    if (kinds.insert(names[static_cast<std::size_t>(k - 1)]).second) chosen.insert(k);
  const std::vector<int> kills(chosen.begin(), chosen.end());
  std::set<std::string> killed_kinds;
  for (const int k : kills) killed_kinds.insert(names[static_cast<std::size_t>(k - 1)]);
  CHECK(killed_kinds == kinds);  // each kind of durable step is killed at least once
  CHECK(kinds.size() >= 9);
  int expect_moved = 0;
  for (const int k : kills) expect_moved += k > latest_renamed ? 1 : 0;

  int latest_moved = 0, partials_seen = 0;
  for (const int k : kills) {
    CAPTURE(k);
    const std::string root = scratch(cat("crash_", k));
    fs::copy(base, root, fs::copy_options::recursive);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      g_points = 0;
      g_kill_at = k;
      checkpoint::set_point_hook(kill_at_point);
      try {
        resume_and_save(root);
      } catch (...) { ::_exit(3); }
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    // latest: a complete, verified checkpoint of step 2 or 4.
    const checkpoint::Reader latest(root);
    const std::int64_t step = latest.manifest().step;
    CHECK(step == (k > latest_renamed ? 4 : 2));
    if (step == 4) ++latest_moved;
    for (const auto& [s, n] : checkpoint::complete_checkpoints(root)) {
      CAPTURE(n);
      CHECK_NOTHROW(checkpoint::Reader(root + "/" + n));  // a manifest means a complete checkpoint
    }
    // A partial step 4 is refused, saying why: an unfinished .tmp directory, or a step directory
    // without its manifest.
    for (const std::string& partial : {root + "/step_00000004.tmp", root + "/step_00000004"}) {
      if (!fs::exists(partial) || (step == 4 && partial.ends_with("4"))) continue;
      if (fs::exists(partial + "/manifest.json")) continue;  // complete, only latest had not moved yet
      ++partials_seen;
      std::string got;
      try {
        checkpoint::Reader r(partial);
      } catch (const Error& e) { got = e.what(); }
      CAPTURE(partial);
      CHECK(got.find(partial.ends_with(".tmp") ? "is an unfinished save (a .tmp directory)"
                                               : "has no manifest.json and no latest pointer") != std::string::npos);
    }
    // A new run resumes from latest and saves over what the kill left.
    resume_and_save(root);
    CHECK(checkpoint::Reader(root).manifest().step == 4);
    CHECK(checkpoint::complete_checkpoints(root).size() == 1);
    CHECK(!fs::exists(root + "/step_00000004.tmp"));
    fs::remove_all(root);
  }
  MESSAGE(
      cat(kills.size(), " kills; latest had moved to step 4 after ", latest_moved, " of them (kills while pruning)"));
  CHECK(latest_moved == expect_moved);
  CHECK(latest_moved == 4);  // the kills at prune rename and its three removes
  // The kills before the directory's rename leave step_00000004.tmp: the refusal above ran.
  MESSAGE(partials_seen, " partial checkpoints refused");
  CHECK(partials_seen > 0);
  fs::remove_all(base);
}
