// The NCCL world of a process that a launcher started, one GPU per process:
//
//   weft::Cuda dev(weft::nccl::device_for(weft::local_rank()));
//   auto world = weft::nccl::world_from_env(dev, weft::env_ranks());   // torchrun, srun scripts
//   auto world = weft::nccl::world_from_mpi(dev, mpi_world);           // mpirun (weft::mpi)
//
// Rank 0 creates the NCCL unique id; the others receive it over the TCP store at
// MASTER_ADDR:MASTER_PORT (comm/store.hpp) or an MPI broadcast, both with the deadline, so a rank
// that never comes is an Error naming it rather than a hang in ncclCommInitRank.
//
// Include only from .cu translation units.
#pragma once

#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "weft/comm/launch.hpp"
#include "weft/comm/nccl/nccl_comm.cuh"
#include "weft/comm/store.hpp"
#ifdef WEFT_ENABLE_MPI
#include "weft/comm/mpi/mpi_comm.hpp"
#endif

namespace weft::nccl {

// The GPU of the process with this local rank: local_rank modulo the visible devices.
inline int device_for(int local_rank) {
  const int n = weft::cuda::device_count();
  if (n == 0)
    throw Error("nccl::device_for", "no CUDA device is visible to this process",
                "run on a GPU machine, and check CUDA_VISIBLE_DEVICES");
  return local_rank % n;
}

// Over the TCP store of an env launcher. Collective over the WORLD_SIZE processes.
inline NcclComm world_from_env(Cuda& dev, const EnvRanks& me,
                               std::chrono::milliseconds deadline = std::chrono::milliseconds(60'000)) {
  TcpStore store(me, deadline);
  ncclUniqueId id{};
  if (me.rank == 0) {
    id = unique_id();
    store.set("weft/nccl_unique_id", std::string(id.internal, sizeof id.internal));
  }
  const std::string got = store.get("weft/nccl_unique_id");
  if (got.size() != sizeof id.internal)
    throw Error(cat("nccl::world_from_env rank ", me.rank), cat("the store holds an id of ", got.size(), " bytes"),
                "another program uses this MASTER_PORT; choose a free one");
  std::memcpy(id.internal, got.data(), got.size());
  store.barrier("weft/nccl_id_read");  // rank 0's store serves until every rank has the id
  return NcclComm(dev, me.world, me.rank, id, deadline);
}

#ifdef WEFT_ENABLE_MPI
// Over an MPI world (mpirun): rank 0's id broadcast with the MPI back end's deadline.
inline NcclComm world_from_mpi(Cuda& dev, mpi::MpiComm& world) {
  ncclUniqueId id{};
  if (world.rank() == 0) id = unique_id();
  std::vector<std::int32_t> bytes(sizeof id.internal);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(id.internal[i]);
  world.broadcast(std::span<std::int32_t>(bytes), 0);
  for (std::size_t i = 0; i < bytes.size(); ++i) id.internal[i] = static_cast<char>(bytes[i]);
  return NcclComm(dev, world.size(), world.rank(), id, world.deadline());
}
#endif

}  // namespace weft::nccl
