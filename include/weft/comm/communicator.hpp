// The Communicator concept: what every back end (threads now; MPI and NCCL later) provides to a
// group of ranks.
//
// All calls are collective over the group except send/recv. Buffers are contiguous spans of one
// Element type (f64, f32, bf16, i32, i64). Every blocking call has a deadline and every call carries
// a per-group sequence number, so a failure is reported as "<op> #<seq> on <group>" on every rank.
//
//   all_reduce(buf, op)            in place; sum or max
//   reduce_scatter(in, out, op)    in.size() == size() * out.size(); rank r gets chunk r of the sum
//   all_gather(in, out)            out.size() == size() * in.size(); chunk r of out is rank r's in
//   all_to_all(in, out)            in.size() == out.size() == size() * k; in chunk j goes to rank j,
//                                  out chunk j came from rank j
//   all_to_all_v(in, send, out, recv)
//                                  in holds send[j] elements for rank j, one run after another in rank
//                                  order; out gets recv[i] from rank i the same way (send[j] on rank i
//                                  must equal recv[i] on rank j: exchange the counts first)
//   broadcast(buf, root)           in place
//   send(buf, peer) / recv(buf, peer)
//   barrier()
//   isend(buf, peer) -> SendHandle, wait(h), cancel(h)
//                                  optional (PostsSends): a send posted and later waited for or
//                                  withdrawn; the pipeline executor and the context ring need it
//   split(color, key)              collective: ranks with the same color form a new group, ordered
//                                  by key (MPI_Comm_split)
//
// weft::subgroup forms the groups of a mesh and a pipeline: split on a communicator whose ranks are
// all there, group(members) on one that stands in for a single rank (comm/meta.hpp, StandIn).
//
// This header is plain C++20.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weft/core/dtype.hpp"

namespace weft {

enum class ReduceOp : std::uint8_t { sum, max };

// Whether all_to_all_v's counts fit a buffer of `total` elements on a group of `members`: one count
// >= 0 a member, summing to the total.
inline bool counts_fit(std::span<const std::int64_t> counts, int members, std::size_t total) {
  if (counts.size() != static_cast<std::size_t>(members)) return false;
  std::int64_t sum = 0;
  for (const std::int64_t n : counts) {
    if (n < 0) return false;
    sum += n;
  }
  return sum == static_cast<std::int64_t>(total);
}

constexpr const char* name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

template <class C>
concept Communicator = requires(C& c, const C& cc, std::span<float> f, std::span<const float> cf, std::span<double> d,
                                std::span<bf16> h, std::span<std::int32_t> i, std::span<std::int64_t> l,
                                std::span<const std::int64_t> n, ReduceOp op, int r) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.name() } -> std::convertible_to<std::string>;
  c.all_reduce(f, op);
  c.all_reduce(d, op);
  c.all_reduce(h, op);
  c.all_reduce(i, op);
  c.all_reduce(l, op);
  c.reduce_scatter(cf, f, op);
  c.all_gather(cf, f);
  c.all_to_all(cf, f);
  c.all_to_all_v(cf, n, f, n);
  c.broadcast(f, r);
  c.send(cf, r);
  c.recv(f, r);
  c.barrier();
  { c.split(r, r) } -> std::same_as<C>;
};

// Whether C posts a send of E and lets it be waited for or withdrawn (ThreadComm, MpiComm, MetaComm;
// not NcclComm). The pipeline executor needs it; the context ring overlaps its shifts with it.
template <class C, class E = float>
concept PostsSends = requires(C& c, std::span<const E> b, int peer, const typename C::SendHandle& h) {
  { c.isend(b, peer) } -> std::same_as<typename C::SendHandle>;
  c.wait(h);
  c.cancel(h);
};

// A group of c's ranks, collective over c as split is: split(color, key, name), or where C forms a
// group from its members without the other ranks (StandIn), group(members, name). `members` are
// the group's ranks in c, in the order of their keys: what split would form for this rank.
template <class C>
C subgroup(C& c, int color, int key, const std::vector<int>& members, const std::string& name) {
  if constexpr (requires {
                  { c.group(members, name) } -> std::same_as<C>;
                })
    return c.group(members, name);
  else return c.split(color, key, name);
}

}  // namespace weft
