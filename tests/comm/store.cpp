// TcpStore on the loopback address with processes of this machine (fork): four ranks meet, share a
// blob the size of an NCCL unique id and pass a barrier; a missing rank 0, a key nobody sets and
// bad RANK/WORLD_SIZE variables are Errors within the deadline, naming what is wrong.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

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
  CHECK_THROWS_WITH_AS(TcpStore({.rank = 1, .world = 2, .local_rank = 1, .master_addr = "127.0.0.1", .master_port = port}, 300ms),
                       doctest::Contains(cat("could not connect to 127.0.0.1:", port, " within the 300 ms deadline").c_str()), Error);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 0.29);
  CHECK(took < 2.0);
  TcpStore zero({.rank = 0, .world = 2, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = port}, 300ms);
  CHECK_THROWS_WITH_AS(zero.get("never/set"),
                       doctest::Contains(cat("TcpStore get 'never/set' at 127.0.0.1:", port,
                                             " from rank 0: no answer within the 300 ms deadline")
                                             .c_str()),
                       Error);
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
  CHECK(resolve_launcher("auto") == (started_by_mpi() ? Launcher::mpi : Launcher::env));
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_PORT"}) ::unsetenv(v);
  CHECK_THROWS_WITH_AS(env_ranks(), "launcher env: WORLD_SIZE is not set; set WORLD_SIZE (torchrun and srun scripts do)", Error);
  CHECK_THROWS_WITH_AS(resolve_launcher("slurm"), "launcher: 'slurm' is not a launcher; use threads, mpi, env or auto", Error);
}
