// The NCCL communicator on one GPU (a world of one rank; more ranks in the launch issue): the
// collectives on device and host buffers, split, argument errors, and a Mesh over it that trains
// the tiny GPT bitwise like one thread rank. Exits 77 (skipped) where there is no GPU.
#include <doctest/doctest.h>

#include "weft/comm/nccl/bootstrap.cuh"

#include "support/cuda_ranks.cuh"
#include "support/train_markov.hpp"

using namespace weft;

TEST_CASE(
    "NCCL communicator, world of one GPU: collectives on device and host buffers, split, and a mesh that trains") {
  Cuda& d = test::gpu();
  const ncclUniqueId id = nccl::unique_id();
  nccl::NcclComm world(d, 1, 0, id);
  CHECK(world.size() == 1);
  // Device buffer: a sum and a max over one rank are the buffer itself (bitwise).
  std::vector<float> h{1.5f, -2.25f, 3.0f};
  Allocation b = d.allocate(3 * sizeof(float));
  d.from_host(b.data(), h.data(), 3 * sizeof(float));
  world.all_reduce(std::span<float>(static_cast<float*>(b.data()), 3));
  world.all_reduce(std::span<float>(static_cast<float*>(b.data()), 3), ReduceOp::max);
  std::vector<float> back(3);
  d.to_host(back.data(), b.data(), 3 * sizeof(float));
  CHECK(back == h);
  // Host scalar (staged through the device), and a split.
  std::array<double, 1> loss{2.5};
  world.all_reduce(std::span<double>(loss));
  CHECK(loss[0] == 2.5);
  nccl::NcclComm sub = world.split(0, 0, "sub");
  CHECK(sub.size() == 1);
  CHECK(sub.name() == "sub");
  CHECK_THROWS_WITH_AS(world.send(std::span<const float>(h.data(), 1), 3), doctest::Contains("peer 3 of a group of 1"),
                       Error);

  // A Mesh over NCCL trains the tiny GPT exactly as one thread rank does (same kernels, no sums
  // across ranks): bitwise the same losses.
  const gpt2::Config c = test::markov_config();
  Mesh mesh{world, {}};
  gpt2::Model<F32, false, recompute::None, Cuda> gpt(d, c, mesh.spread(), 8);
  auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
  const data::MarkovSource corpus(c.vocab, 3);
  data::Loader<data::MarkovSource> loader(corpus, c.seq, 8, 1, 0);
  const auto schedule = optim::Schedule::warmup_cosine(3e-3, 0, 5, 3e-4);
  std::vector<std::int32_t> x, y;
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    loader.next(x, y);
    dp.zero_grad();
    auto ctx = gpt.in_flight({{x, y}, 8});
    losses.push_back(pipeline::forward_backward(gpt, ctx, mesh, dp));
    dp.step(schedule.lr(step), 1.0);
  }
  const auto threads = test::train_markov<F32, optim::Ddp, false, Cuda>(5, 1);
  CHECK(losses == threads);
}

TEST_CASE(
    "NCCL: an operation that cannot complete (a send with no receive) ends at the deadline with an Error, not a hang") {
  Cuda& d = test::gpu();
  nccl::NcclComm world(d, 1, 0, nccl::unique_id(), std::chrono::milliseconds(2000));
  std::vector<float> h{1.0f};
  Allocation b = d.allocate(sizeof(float));
  d.from_host(b.data(), h.data(), sizeof(float));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(world.send(std::span<const float>(static_cast<const float*>(b.data()), 1), 0), Error);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited < 10.0);  // the 2 s deadline, plus the abort
  // The aborted communicator refuses further work with an Error naming why.
  CHECK_THROWS_WITH_AS(world.barrier(), doctest::Contains("aborted"), Error);
}

TEST_CASE("NCCL bootstrap over the TCP store (env launcher, loopback): a world of one process sums on the GPU") {
  Cuda& d = test::gpu();
  CHECK(nccl::device_for(0) == 0);
  nccl::NcclComm world = nccl::world_from_env(
      d, {.rank = 0, .world = 1, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = 29617});
  REQUIRE(world.size() == 1);
  std::array<double, 2> v{1.25, -3.5};
  world.all_reduce(std::span<double>(v));
  CHECK(v[0] == 1.25);  // one rank: the sum is the buffer
  CHECK(v[1] == -3.5);
}
