// The doctest entry point of the MPI test binaries (mpirun -np 4): MPI is initialized around the
// tests, ranks other than 0 report failures only, and every rank exits with the worst result.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "weft/comm/mpi/session.hpp"

int main(int argc, char** argv) {
  weft::mpi::Session mpi(argc, argv);
  doctest::Context ctx(argc, argv);
  if (mpi.rank() != 0) ctx.setOption("minimal", true);
  const int failed = ctx.run() != 0 ? 1 : 0;
  int worst = failed;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return mpi.finish(worst);
}
