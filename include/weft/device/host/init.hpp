// defines: host::init_normal, parameter initialization by counter-based draws.
//
// out, this rank's shard (local shape `local`, row-major) of a tensor of `global` shape starting at
// `offset` (its local_box), gets std * normal(seed, id, g) for each element's global flat index g,
// so every mesh draws the same global weights, and every device (the Cuda device uploads these
// draws) the same bits.
//
// A draw is a Philox-4x32-10 block and a Box-Muller transform, about 45 ns on one core: Llama 3.2
// 1B's 1.24B parameters took a minute on one thread. Each element depends on its index alone, so
// large tensors are drawn on every core, in contiguous ranges of rows, with the same bits as on one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/core/philox.hpp"
#include "weft/core/shape.hpp"

namespace weft::host {

namespace detail {

// Elements [begin, end) of the shard, in row-major order.
template <class T>
void init_normal_range(T* out, const Shape& global, const Shape& local, const Shape& offset, std::uint64_t seed,
                       std::uint64_t id, double std, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) {
    std::int64_t g = 0, stride = 1;
    for (int d = global.rank() - 1; d >= 0; --d) {
      g += ((i / local.inner(d)) % local[d] + offset[d]) * stride;
      stride *= global[d];
    }
    out[i] = narrow<T>(static_cast<accumulate_t<T>>(std * weft::normal(seed, id, static_cast<std::uint64_t>(g))));
  }
}

}  // namespace detail

template <class T>
void init_normal(T* out, const Shape& global, const Shape& local, const Shape& offset, std::uint64_t seed,
                 std::uint64_t id, double std) {
  const std::int64_t n = local.numel();
  constexpr std::int64_t kPerThread = std::int64_t{1} << 20;  // below this, a thread costs more than it saves
  const auto cores = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t threads = std::clamp(n / kPerThread, std::int64_t{1}, std::min<std::int64_t>(cores, 64));
  if (threads == 1) {
    detail::init_normal_range(out, global, local, offset, seed, id, std, 0, n);
    return;
  }
  std::vector<std::jthread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (std::int64_t t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      detail::init_normal_range(out, global, local, offset, seed, id, std, n * t / threads, n * (t + 1) / threads);
    });
}

}  // namespace weft::host
