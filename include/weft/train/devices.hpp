// What the training loop needs of a device beyond the Device concept (DeviceSupport<D>): each
// rank's device (and the communicator's memory for it), how the ranks run, the ceilings MFU is
// measured against, and profiler ranges. The host's is here; the GPU's in train/devices.cuh.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "weft/comm/threads/run.hpp"
#include "weft/core/error.hpp"
#include "weft/device/host/host.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/pipeline/trace.hpp"
#include "weft/train/metrics.hpp"
#include "weft/train/options.hpp"
#ifdef WEFT_ENABLE_MPI
#include "weft/comm/mpi/mpi_comm.hpp"
#endif

namespace weft::train {

template <class D>
struct DeviceSupport;

template <>
struct DeviceSupport<Host> {
  template <class C>
  static std::shared_ptr<Host> make(C&) {
    return std::make_shared<Host>();
  }
  // The GEMM rate all ranks reach together on this machine (bf16 computes in f32 on the host).
  template <class T>
  static double gemm_ceiling(int ranks, int /*gpu*/) {
    if constexpr (std::same_as<T, double>) return gemm_rate<double>(ranks);
    else return gemm_rate<float>(ranks);
  }
  // The processor's dense peak is not known to weft: MFU is against the measured ceiling only.
  template <class T>
  static std::optional<std::pair<std::string, double>> dense_peak() {
    return std::nullopt;
  }
  static void ranges(pipeline::Trace&) {}  // no profiler ranges on the host
};

// Runs body(world) on every rank: threads of this process, or this process's one rank. A rank that
// throws ends the world for all (a weft::Error on the others naming it, or the deadline's). The GPU
// half (DeviceSupport<Cuda>::run_ranks) makes its processes' NCCL world.
template <class D, class Body>
void run_ranks(const Launch& l, int ranks, const Options& o, Body&& body) {
  if constexpr (std::same_as<D, Host>) {
#ifdef WEFT_ENABLE_MPI
    if (l.kind == Launcher::mpi) {
      auto world = mpi::MpiComm::world({.deadline = deadline_of(o.launch)});
      mpi::run(world, body);
      return;
    }
#endif
    (void)l;
    run_threads(ranks, std::forward<Body>(body), {.deadline = deadline_of(o.launch)});
  } else {
    DeviceSupport<D>::run_ranks(l, ranks, o, std::forward<Body>(body));
  }
}

// What the loop holds for a pipeline on a communicator without isend: nothing, and never called.
struct NoPipeline {
  void set_trace(pipeline::Trace*, int) {}
  double evaluate(const nn::MicroBatch&) { return never(); }
  template <class P, class H>
  double run(std::span<const nn::MicroBatch>, P&, H&) {
    return never();
  }
  static double never() {
    throw Error("train --pipe", "this communicator has no isend for the pipeline's activations",
                "run the pipeline on thread ranks or under mpirun on the host");
  }
};

// A stream that failed to write (a full device, an I/O error) ends the run: a log that silently
// lost its records is worse than none.
inline void check_written(std::ofstream& f, const std::string& path, const std::string& where) {
  if (!f)
    throw Error(where, cat("writing '", path, "' failed (", std::strerror(errno), ")"),
                "free space on its device, or give --log a path elsewhere");
}

inline std::string gib(double bytes) { return cat(std::round(bytes / (1 << 30) * 100) / 100, " GiB"); }
inline std::string mib(double bytes) { return cat(std::round(bytes / (1 << 20) * 10) / 10, " MiB"); }

}  // namespace weft::train
