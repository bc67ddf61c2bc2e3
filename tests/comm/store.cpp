// TcpStore on the loopback address with processes of this machine (fork): four ranks meet, share a
// blob the size of an NCCL unique id and pass a barrier; a missing rank 0, a key nobody sets and
// bad RANK/WORLD_SIZE variables are Errors within the deadline, naming what is wrong.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/ranks.hpp"
#include "weft/comm/store.hpp"

using namespace weft;
using namespace std::chrono_literals;

namespace {

// A port that was free a moment ago (bind to port 0 and read what the kernel gave).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// What rank r of 4 does; returns 0 when everything it read is right.
int rank_main(int r, int port) {
  try {
    TcpStore store({.rank = r, .world = 4, .local_rank = r, .master_addr = "127.0.0.1", .master_port = port}, 10s);
    std::string blob(128, '\0');  // an NCCL unique id's size, with every byte value
    for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 2 + 1);
    if (r == 0) store.set("nccl/unique_id", blob);
    store.set(cat("hello/", r), cat("rank ", r, " says hi"));
    if (store.get("nccl/unique_id") != blob) return 10;
    for (int p = 0; p < 4; ++p)
      if (store.get(cat("hello/", p)) != cat("rank ", p, " says hi")) return 20 + p;
    store.barrier("done");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    return 99;
  }
}

}  // namespace

TEST_CASE("TcpStore: four processes on the loopback address share an id and pass a barrier") {
  const int port = free_port();
  std::vector<pid_t> children;
  for (int r = 1; r < 4; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) std::_Exit(rank_main(r, port));  // the child: a rank, then out (no doctest state)
    children.push_back(pid);
  }
  CHECK(rank_main(0, port) == 0);
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("TcpStore: no rank 0 and a key nobody sets are Errors at the deadline naming the address and key") {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      TcpStore({.rank = 1, .world = 2, .local_rank = 1, .master_addr = "127.0.0.1", .master_port = port}, 300ms),
      doctest::Contains(cat("could not connect to 127.0.0.1:", port, " within the 300 ms deadline").c_str()), Error);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 0.29);                          // it tried until the deadline...
  CHECK(took < 0.3 + test::kSchedulingMargin);  // ...and gave up there (retries every 50 ms)
  TcpStore zero({.rank = 0, .world = 2, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = port}, 300ms);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(zero.get("never/set"),
                       doctest::Contains(cat("TcpStore get 'never/set' at 127.0.0.1:", port,
                                             " from rank 0: no answer within the 300 ms deadline")
                                             .c_str()),
                       Error);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  CHECK(waited >= 0.29);
  CHECK(waited < 0.3 + test::kSchedulingMargin);
  MESSAGE("connect gave up after ", took, " s, get after ", waited, " s (deadline 0.3 s)");
}

TEST_CASE("env_ranks: RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT are checked and named") {
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "5", 1);
  CHECK_THROWS_WITH_AS(env_ranks(), "launcher env: RANK='5' is not an integer in [0, 3]; set RANK to one", Error);
  ::setenv("RANK", "2", 1);
  ::setenv("MASTER_PORT", "http", 1);
  CHECK_THROWS_WITH_AS(env_ranks(), doctest::Contains("MASTER_PORT='http' is not an integer in [1, 65535]"), Error);
  ::setenv("MASTER_PORT", "29511", 1);
  const EnvRanks e = env_ranks();
  CHECK(e.rank == 2);
  CHECK(e.world == 4);
  CHECK(e.local_rank == 0);
  CHECK(e.master_port == 29511);
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_PORT"}) ::unsetenv(v);
  CHECK_THROWS_WITH_AS(env_ranks(),
                       "launcher env: WORLD_SIZE is not set; set WORLD_SIZE (torchrun and srun scripts do)", Error);
  CHECK_THROWS_WITH_AS(resolve_launcher("slurm"), "launcher: 'slurm' is not a launcher; use threads, mpi, env or auto",
                       Error);
}

// "auto" under each launcher's variables, set here (the test's own environment put aside and
// restored), against the rule comm/launch.hpp states: mpi when an MPI launcher started the
// process, env when RANK and WORLD_SIZE are both set, threads otherwise.
TEST_CASE(
    "resolve_launcher: auto is mpi under each MPI launcher's variable, env with RANK and WORLD_SIZE, else threads") {
  const std::vector<std::string> vars{"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                      "MPI_LOCALNRANKS",      "RANK",     "WORLD_SIZE"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const auto& v : vars)
    if (const char* x = std::getenv(v.c_str())) saved.emplace_back(v, x);
  for (const auto& v : vars) ::unsetenv(v.c_str());

  CHECK(resolve_launcher("auto") == Launcher::threads);
  CHECK(resolve_launcher("threads") == Launcher::threads);
  CHECK(resolve_launcher("mpi") == Launcher::mpi);
  CHECK(resolve_launcher("env") == Launcher::env);
  ::setenv("RANK", "1", 1);
  CHECK(resolve_launcher("auto") == Launcher::threads);  // RANK alone is not a launcher
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK(resolve_launcher("auto") == Launcher::env);
  CHECK(resolve_launcher("threads") == Launcher::threads);  // a name given wins over the variables
  for (const char* mpi : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    ::setenv(mpi, "2", 1);
    CHECK_MESSAGE(resolve_launcher("auto") == Launcher::mpi, mpi);  // before env: srun sets RANK-like variables too
    CHECK_MESSAGE(started_by_mpi(), mpi);
    ::unsetenv(mpi);
  }
  CHECK(!started_by_mpi());

  for (const auto& v : vars) ::unsetenv(v.c_str());
  for (const auto& [v, x] : saved) ::setenv(v.c_str(), x.c_str(), 1);
}
