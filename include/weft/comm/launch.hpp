// How a run's ranks are started, and what the launchers tell each process.
//
//   threads  every rank a thread of this process (run_threads): one machine, no launcher
//   mpi      one rank per process, started by mpirun / mpiexec / srun (comm/mpi, weft::mpi)
//   env      one rank per process, started by torchrun, Slurm or a script that sets RANK,
//            WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (the NCCL bootstrap's TCP store)
//   auto     mpi when an MPI launcher started this process, env when RANK and WORLD_SIZE are set,
//            threads otherwise
//
// This header is plain C++20.
#pragma once

#include <cstdlib>
#include <string>

#include "weft/core/error.hpp"

namespace weft {

enum class Launcher { threads, mpi, env };

constexpr const char* name(Launcher l) {
  return l == Launcher::threads ? "threads" : l == Launcher::mpi ? "mpi" : "env";
}

// Whether an MPI launcher (Open MPI's mpirun, MPICH's Hydra, Slurm's srun with PMI/PMIx) started us.
inline bool started_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

inline Launcher resolve_launcher(const std::string& requested) {
  if (requested == "threads") return Launcher::threads;
  if (requested == "mpi") return Launcher::mpi;
  if (requested == "env") return Launcher::env;
  if (requested != "auto")
    throw Error("launcher", cat("'", requested, "' is not a launcher"), "use threads, mpi, env or auto");
  if (started_by_mpi()) return Launcher::mpi;
  if (std::getenv("RANK") && std::getenv("WORLD_SIZE")) return Launcher::env;
  return Launcher::threads;
}

// The variables torchrun and Slurm-style scripts set for each process.
struct EnvRanks {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

namespace detail {
inline int env_int(const char* var, int lo, int hi, const char* fallback) {
  const char* v = std::getenv(var);
  if (!v) v = fallback;
  if (!v) throw Error("launcher env", cat(var, " is not set"), cat("set ", var, " (torchrun and srun scripts do)"));
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi)
    throw Error("launcher env", cat(var, "='", v, "' is not an integer in [", lo, ", ", hi, "]"),
                cat("set ", var, " to one"));
  return static_cast<int>(x);
}
}  // namespace detail

// This process's rank among those of its machine, as the launcher says (Open MPI, MPICH/Hydra,
// Slurm, torchrun); 0 when none says. Chooses the GPU: one per process.
inline int local_rank() {
  for (const char* v : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* x = std::getenv(v)) return detail::env_int(v, 0, 1 << 20, x);
  return 0;
}

// RANK, WORLD_SIZE, LOCAL_RANK (default 0), MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default
// 29500), each checked; throws Error naming the variable and its value.
inline EnvRanks env_ranks() {
  EnvRanks e;
  e.world = detail::env_int("WORLD_SIZE", 1, 1 << 20, nullptr);
  e.rank = detail::env_int("RANK", 0, e.world - 1, nullptr);
  e.local_rank = detail::env_int("LOCAL_RANK", 0, e.world - 1, "0");
  if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = detail::env_int("MASTER_PORT", 1, 65535, "29500");
  return e;
}

}  // namespace weft
