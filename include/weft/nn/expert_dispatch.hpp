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
//                                (the counts first, as an all-to-all-v needs them)
//   dispatch(dev, group, r, in, out, w)   sender order -> receiver order: one all-to-all-v
//   combine(dev, group, r, in, out, w)    receiver order -> sender order: one all-to-all-v, the
//                                         exact inverse of dispatch (so also its adjoint: backward
//                                         sends gradients the other way through the other one)
//
// Each call moves exactly the rows routed (Communicator::all_to_all_v: MPI messages, NCCL grouped
// send/recv, thread copies), M w elements out of a rank on dispatch and Me w on combine, what the
// run's counters show; the receiver's runs, by source, are laid out by expert with one copy per
// (source, expert) block. Deterministic: the same routing gives the same bits in the same places
// on every run.
//
// defines: nn::AllToAllDispatch, nn::AllGatherDispatch, nn::ExpertDispatch, nn::ExpertRoute,
// nn::expert_route, nn::dispatch, nn::combine
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"
#include "weft/ops/all.hpp"

namespace weft::nn {

// How a mixture of experts' tokens reach experts on the other ranks of an expert group (nn/moe.hpp):
//   AllToAllDispatch   each rank sends each of its slots to the rank of its expert and gets the
//                      outputs back (dispatch and combine below): M k rows out and back
//   AllGatherDispatch  each rank gathers the group's rows and routing, runs its experts on the
//                      slots routed to them, and the weighted outputs are summed and scattered back
//                      (all-gather, then reduce-scatter): ep N rows each way, no counts to exchange,
//                      the choice where ep is small and k large (Megatron's allgather dispatcher)
struct AllToAllDispatch {
  static std::string name() { return "all-to-all"; }
};
struct AllGatherDispatch {
  static std::string name() { return "all-gather"; }
};
template <class P>
concept ExpertDispatch = std::same_as<P, AllToAllDispatch> || std::same_as<P, AllGatherDispatch>;

struct ExpertRoute {
  int ranks = 1;                   // ep, the expert group's size
  std::int64_t local = 0;          // El, the experts each rank holds
  std::vector<std::int64_t> send;  // (ep El): rows this rank sends to rank j's local expert e at [j El + e]
  std::vector<std::int64_t> recv;  // (ep El): rows this rank's local expert e gets from rank i at [i El + e]

  std::int64_t sent() const { return sum(send); }      // M: rows in sender order
  std::int64_t received() const { return sum(recv); }  // Me: rows in receiver order
  // Rows to each rank (sending), or from each (receiving): ep entries, times w for the elements.
  std::vector<std::int64_t> to_each(std::int64_t w) const { return per_rank(send, w); }
  std::vector<std::int64_t> from_each(std::int64_t w) const { return per_rank(recv, w); }
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
  std::vector<std::int64_t> per_rank(const std::vector<std::int64_t>& v, std::int64_t w) const {
    std::vector<std::int64_t> n(static_cast<std::size_t>(ranks), 0);
    for (int j = 0; j < ranks; ++j)
      for (std::int64_t e = 0; e < local; ++e) n[static_cast<std::size_t>(j)] += v[at(j, e)] * w;
    return n;
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
  return r;
}

namespace detail {
// Calls f(source rank, row in that source's run, row in receiver order, rows) for each (source
// rank, local expert) block of the receiver's side, in receiver order.
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
      f(i, before, at, n);
      at += n;
    }
  }
}
// Where each source's run starts among the received rows (by source).
inline std::vector<std::int64_t> run_starts(const ExpertRoute& r) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(r.ranks), 0);
  for (int i = 1; i < r.ranks; ++i) {
    s[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i - 1)];
    for (std::int64_t e = 0; e < r.local; ++e) s[static_cast<std::size_t>(i)] += r.recv[r.at(i - 1, e)];
  }
  return s;
}
template <class T, class D>
Allocation rows_buffer(D& dev, std::int64_t n) {
  return dev.allocate(std::max<std::int64_t>(n, 1) * static_cast<std::int64_t>(sizeof(T)), Category::communication);
}
}  // namespace detail

// in (M, w) in sender order -> out (Me, w) in receiver order.
template <class T, class D, Communicator C>
void dispatch(D& dev, C& group, const ExpertRoute& r, const T* in, T* out, std::int64_t w) {
  const std::int64_t M = r.sent(), Me = r.received();
  Allocation got = detail::rows_buffer<T>(dev, Me * w);  // by source
  T* g = static_cast<T*>(got.data());
  const std::vector<std::int64_t> to = r.to_each(w), from = r.from_each(w);
  group.all_to_all_v(std::span<const T>(in, static_cast<std::size_t>(M * w)), std::span<const std::int64_t>(to),
                     std::span<T>(g, static_cast<std::size_t>(Me * w)), std::span<const std::int64_t>(from));
  const std::vector<std::int64_t> start = detail::run_starts(r);
  detail::for_each_block(r, [&](int i, std::int64_t row, std::int64_t at, std::int64_t rows) {
    ops::Memory<D>::copy(dev, out + at * w, g + (start[static_cast<std::size_t>(i)] + row) * w, rows * w);
  });
}

// in (Me, w) in receiver order -> out (M, w) in sender order: dispatch's inverse.
template <class T, class D, Communicator C>
void combine(D& dev, C& group, const ExpertRoute& r, const T* in, T* out, std::int64_t w) {
  const std::int64_t M = r.sent(), Me = r.received();
  Allocation back = detail::rows_buffer<T>(dev, Me * w);  // by source
  T* b = static_cast<T*>(back.data());
  const std::vector<std::int64_t> start = detail::run_starts(r);
  detail::for_each_block(r, [&](int i, std::int64_t row, std::int64_t at, std::int64_t rows) {
    ops::Memory<D>::copy(dev, b + (start[static_cast<std::size_t>(i)] + row) * w, in + at * w, rows * w);
  });
  const std::vector<std::int64_t> to = r.from_each(w), from = r.to_each(w);
  group.all_to_all_v(std::span<const T>(b, static_cast<std::size_t>(Me * w)), std::span<const std::int64_t>(to),
                     std::span<T>(out, static_cast<std::size_t>(M * w)), std::span<const std::int64_t>(from));
}

}  // namespace weft::nn
