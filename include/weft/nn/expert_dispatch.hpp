// The token exchange of expert parallelism (docs/moe.md): a mixture of experts' rows, in the
// experts' order on each rank, sent to the ranks of the expert group that hold their experts, and
// the experts' outputs sent back. Each rank holds El = E / ep of the E experts (rank j experts
// [j El, (j + 1) El), the expert axis's Shard<0>).
//
//   sender order    (M, w)   a rank's rows in the order of their global experts (MoePlan's xp):
//                            the rows for rank j's experts are one contiguous run
//   receiver order  (Me, w)  the rows this rank's experts got, local expert by local expert, and
//                            within one expert by source rank, each source's rows in its order:
//                            each expert's block contiguous, for its GEMMs
//
//   expert_route(group, counts)  counts (E) the rows this rank sends to each expert -> ExpertRoute:
//                                what every pair of ranks exchanges, by one all-to-all of E int64
//                                (the counts first, as an all-to-all-v needs) and one all-reduce
//                                (max) of one int64
//   dispatch(dev, group, r, in, out, w)   sender order -> receiver order: one all-to-all
//   combine(dev, group, r, in, out, w)    receiver order -> sender order: one all-to-all, the exact
//                                         inverse of dispatch (so also its adjoint: backward sends
//                                         gradients the other way through the other one)
//
// Every back end's all-to-all moves equal chunks (Communicator), so each rank's chunk for each
// peer is padded to `chunk` rows, the most any rank sends any rank this time: ep x chunk x w
// elements each way per call, the bytes the run's counters show. The padding rows are zero and
// never read. Deterministic: the same routing gives the same bits in the same places on every run.
//
// defines: nn::ExpertRoute, nn::expert_route, nn::dispatch, nn::combine
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"
#include "weft/ops/all.hpp"

namespace weft::nn {

struct ExpertRoute {
  int ranks = 1;                   // ep, the expert group's size
  std::int64_t local = 0;          // El, the experts each rank holds
  std::vector<std::int64_t> send;  // (ep El): rows this rank sends to rank j's local expert e at [j El + e]
  std::vector<std::int64_t> recv;  // (ep El): rows this rank's local expert e gets from rank i at [i El + e]
  std::int64_t chunk = 0;          // rows of each padded chunk: the most any rank sends any rank

  std::int64_t sent() const { return sum(send); }      // M: rows in sender order
  std::int64_t received() const { return sum(recv); }  // Me: rows in receiver order
  // Where each local expert's block starts in receiver order (El + 1 entries, the last Me).
  std::vector<std::int64_t> offsets() const {
    std::vector<std::int64_t> o(static_cast<std::size_t>(local + 1), 0);
    for (std::int64_t e = 0; e < local; ++e) {
      o[static_cast<std::size_t>(e + 1)] = o[static_cast<std::size_t>(e)];
      for (int i = 0; i < ranks; ++i) o[static_cast<std::size_t>(e + 1)] += recv[at(i, e)];
    }
    return o;
  }
  std::size_t at(int rank, std::int64_t e) const { return static_cast<std::size_t>(rank * local + e); }

 private:
  static std::int64_t sum(const std::vector<std::int64_t>& v) {
    std::int64_t s = 0;
    for (const std::int64_t x : v) s += x;
    return s;
  }
};

// counts (E): the rows this rank sends to each global expert. Collective over the expert group.
template <Communicator C>
ExpertRoute expert_route(C& group, std::span<const std::int64_t> counts) {
  ExpertRoute r;
  r.ranks = group.size();
  const auto E = static_cast<std::int64_t>(counts.size());
  if (E % r.ranks != 0)
    throw Error("nn::expert_route", cat(E, " experts over an expert group of ", r.ranks, " ranks"),
                "choose an expert degree that divides the number of experts");
  r.local = E / r.ranks;
  r.send.assign(counts.begin(), counts.end());
  r.recv.assign(counts.size(), 0);
  group.all_to_all(std::span<const std::int64_t>(r.send), std::span<std::int64_t>(r.recv));
  std::array<std::int64_t, 1> most{0};
  for (int j = 0; j < r.ranks; ++j) {
    std::int64_t rows = 0;
    for (std::int64_t e = 0; e < r.local; ++e) rows += r.send[r.at(j, e)];
    most[0] = std::max(most[0], rows);
  }
  group.all_reduce(std::span<std::int64_t>(most), ReduceOp::max);
  r.chunk = most[0];
  return r;
}

namespace detail {
// The padded chunks' buffer of one exchange: ep chunks of r.chunk rows of width w, zeroed.
template <class T, class D>
Allocation exchange_buffer(D& dev, const ExpertRoute& r, std::int64_t w) {
  const std::int64_t n = r.ranks * r.chunk * w;
  Allocation a =
      dev.allocate(std::max<std::int64_t>(n, 1) * static_cast<std::int64_t>(sizeof(T)), Category::communication);
  ops::Memory<D>::zero(dev, static_cast<T*>(a.data()), n);
  return a;
}

// Calls f(rank, local expert, row in that rank's padded chunk, row in receiver order, rows) for
// each (source rank, local expert) block of the receiver's side, in receiver order.
template <class F>
void for_each_block(const ExpertRoute& r, F&& f) {
  const std::vector<std::int64_t> off = r.offsets();
  for (std::int64_t e = 0; e < r.local; ++e) {
    std::int64_t at = off[static_cast<std::size_t>(e)];
    for (int i = 0; i < r.ranks; ++i) {
      // Source i's rows for expert e follow its rows for this rank's experts before e.
      std::int64_t before = 0;
      for (std::int64_t p = 0; p < e; ++p) before += r.recv[r.at(i, p)];
      const std::int64_t n = r.recv[r.at(i, e)];
      f(i, e, before, at, n);
      at += n;
    }
  }
}
}  // namespace detail

// in (M, w) in sender order -> out (Me, w) in receiver order.
template <class T, class D, Communicator C>
void dispatch(D& dev, C& group, const ExpertRoute& r, const T* in, T* out, std::int64_t w) {
  Allocation send = detail::exchange_buffer<T>(dev, r, w), recv = detail::exchange_buffer<T>(dev, r, w);
  T* s = static_cast<T*>(send.data());
  std::int64_t from = 0;
  for (int j = 0; j < r.ranks; ++j) {
    std::int64_t rows = 0;
    for (std::int64_t e = 0; e < r.local; ++e) rows += r.send[r.at(j, e)];
    ops::Memory<D>::copy(dev, s + j * r.chunk * w, in + from * w, rows * w);
    from += rows;
  }
  const auto n = static_cast<std::size_t>(r.ranks * r.chunk * w);
  group.all_to_all(std::span<const T>(s, n), std::span<T>(static_cast<T*>(recv.data()), n));
  const T* g = static_cast<const T*>(recv.data());
  detail::for_each_block(r, [&](int i, std::int64_t, std::int64_t row, std::int64_t at, std::int64_t rows) {
    ops::Memory<D>::copy(dev, out + at * w, g + (i * r.chunk + row) * w, rows * w);
  });
}

// in (Me, w) in receiver order -> out (M, w) in sender order: dispatch's inverse.
template <class T, class D, Communicator C>
void combine(D& dev, C& group, const ExpertRoute& r, const T* in, T* out, std::int64_t w) {
  Allocation send = detail::exchange_buffer<T>(dev, r, w), recv = detail::exchange_buffer<T>(dev, r, w);
  T* s = static_cast<T*>(send.data());
  detail::for_each_block(r, [&](int i, std::int64_t, std::int64_t row, std::int64_t at, std::int64_t rows) {
    ops::Memory<D>::copy(dev, s + (i * r.chunk + row) * w, in + at * w, rows * w);
  });
  const auto n = static_cast<std::size_t>(r.ranks * r.chunk * w);
  group.all_to_all(std::span<const T>(s, n), std::span<T>(static_cast<T*>(recv.data()), n));
  const T* g = static_cast<const T*>(recv.data());
  std::int64_t to = 0;
  for (int j = 0; j < r.ranks; ++j) {
    std::int64_t rows = 0;
    for (std::int64_t e = 0; e < r.local; ++e) rows += r.send[r.at(j, e)];
    ops::Memory<D>::copy(dev, out + to * w, g + j * r.chunk * w, rows * w);
    to += rows;
  }
}

}  // namespace weft::nn
