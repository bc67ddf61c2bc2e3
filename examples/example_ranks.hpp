// How the demo examples start their ranks: as threads of this process, or, when mpirun started it
// (or --launcher mpi), as this process's rank of an MPI world of the same size.
//
//   demo_layouts                              4 thread ranks
//   mpirun -np 4 demo_layouts                 4 processes, one rank each (MpiComm)
//
// The body runs on every rank with that rank's communicator and returns the example's exit code,
// which every rank must agree on (each decides from all-reduced checks); only rank 0 prints.
#pragma once

#include <weft/comm/launch.hpp>
#include <weft/weft_host.hpp>

#include <atomic>
#include <cstdio>
#include <string>

#ifdef WEFT_ENABLE_MPI
#include <weft/comm/mpi/mpi_comm.hpp>
#include <weft/comm/mpi/session.hpp>
#endif

namespace examples {

// body(world) -> int, for world a ThreadComm or an MpiComm. Returns the exit code: the body's, or 2
// for a launch that cannot run (a wrong process count, no MPI in this binary).
template <class Body>
int run_ranks(int argc, char** argv, const std::string& launcher, int ranks, Body&& body) {
  using namespace weft;
  Launcher kind = Launcher::threads;
  try {
    kind = resolve_launcher(launcher);
    if (kind == Launcher::env)
      throw Error("example", "--launcher env: the demo examples start host ranks as threads or under mpirun",
                  "run it with mpirun -np N, or unset RANK and WORLD_SIZE");
#ifndef WEFT_ENABLE_MPI
    if (kind == Launcher::mpi)
      throw Error("example --launcher mpi", "this binary was built without MPI",
                  "install Debian's libopenmpi-dev and rebuild, or run it without mpirun (thread ranks)");
#endif
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
#ifdef WEFT_ENABLE_MPI
  if (kind == Launcher::mpi) {
    mpi::Session session(argc, argv);
    int code = 1;
    try {
      if (session.size() != ranks)
        throw Error("example --launcher mpi",
                    cat("mpirun started ", session.size(), " processes for ", ranks, " ranks"),
                    cat("run mpirun -np ", ranks));
      auto world = mpi::MpiComm::world();
      mpi::run(world, [&](mpi::MpiComm& w) { code = body(w); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "example (world rank %d): %s\n", session.rank(), e.what());
      return session.finish(2);
    }
    return session.finish(code);
  }
#else
  (void)argc;
  (void)argv;
#endif
  std::atomic<int> code{1};
  try {
    run_threads(ranks, [&](ThreadComm& w) {
      const int c = body(w);
      if (w.rank() == 0) code = c;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return code;
}

}  // namespace examples
