// A training-shaped loop on a 2 x 2 mesh of MPI processes in which one rank fails on purpose, for
// tests/comm/mpi_faults.sh: mpi_faults MODE RANK DEADLINE_MS, MODE one of
//   kill      the rank dies by SIGKILL before its 5th step
//   stall     the rank sleeps for ten deadlines before its 5th step
//   mismatch  the rank calls all_gather where the others call all_reduce in the 5th step
// Every other rank must print a weft::Error naming the rank, the operation and its sequence number
// and exit non-zero within the deadline plus a few seconds. The failing rank prints the moment of
// its fault ("mpi_faults: fault at MS") and every rank the moment it caught its error
// ("mpi_faults: error at MS"), both in milliseconds of the system clock, which the processes of one
// machine share: the script bounds the time from the fault to the last report, not mpirun's start-up.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/mpi/mpi_comm.hpp"
#include "weft/comm/mpi/session.hpp"

using namespace weft;

namespace {
long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
void say(const char* what) {
  std::fprintf(stderr, "mpi_faults: %s at %lld\n", what, now_ms());
  std::fflush(stderr);
}
}  // namespace

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: mpi_faults kill|stall|mismatch RANK DEADLINE_MS\n");
    return session.finish(2);
  }
  const std::string mode = argv[1];
  const int bad = std::atoi(argv[2]);
  const std::chrono::milliseconds deadline(std::atoi(argv[3]));
  try {
    auto world = mpi::MpiComm::world({.deadline = deadline});
    Mesh mesh{world, {.data = 2, .tensor = 2}};
    std::vector<float> act(4096, 1.0f), grad(8192, 0.5f), out(2 * 4096);
    for (int step = 1; step <= 8; ++step) {
      if (step == 5 && world.rank() == bad) {
        say("fault");
        if (mode == "kill") ::raise(SIGKILL);
        if (mode == "stall") std::this_thread::sleep_for(10 * deadline);
      }
      mesh.tensor().all_reduce(std::span<float>(act));  // a row-parallel layer
      mesh.data().all_reduce(std::span<float>(grad));   // the gradients
      std::vector<double> loss{1.0};
      if (step == 5 && world.rank() == bad && mode == "mismatch")
        world.all_gather(std::span<const float>(act.data(), 1), std::span<float>(out.data(), 4));
      else world.all_reduce(std::span<double>(loss));  // the logged loss
    }
    if (world.rank() == 0) std::printf("mpi_faults: all steps ran\n");
    return session.finish(0);
  } catch (const std::exception& e) {
    say("error");
    std::fprintf(stderr, "weft error: %s\n", e.what());
    return session.finish(1);
  }
}
