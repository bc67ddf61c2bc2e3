// MetaComm<C>: a communicator for the Meta device (device/meta/meta.hpp). Its groups are C's (rank,
// size, name, split are C's, so a Mesh and a pipeline's tie groups form as they do on C), and it
// moves no data: collectives, sends and receives return at once, and what they would have written
// is left as it is (the Meta device's buffers hold nothing). The plan (cost/measure.hpp) runs a
// step's code on Meta devices over MetaComm<ThreadComm>: the only calls that wait for the other ranks
// are the splits that build the groups.
//
// It counts what it is asked as the thread communicator counts it (threads::Counters: calls and
// bytes per operation on each group; an all-gather by its output, the rest by their input, a send
// when it is posted), so a step measured on it reports its collectives per mesh axis, and
// tests/cost/measure.cpp holds the counts equal to the thread communicator's.
//
// StandIn: one rank of a world whose other ranks are not there, for MetaComm<StandIn>, so one
// rank's step is measured alone (footprint::measure_alone) on meshes of any size. Its groups form
// from the members their caller names (weft::subgroup: the Mesh's axis groups, a pipeline's tie
// group), since no other rank answers a split.
//
// This header is plain C++20.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/comm/threads/world.hpp"
#include "weft/core/error.hpp"

namespace weft {

class StandIn {
 public:
  StandIn(int rank, int size, std::string name = "world") : rank_(rank), size_(size), name_(std::move(name)) {
    if (size < 1 || rank < 0 || rank >= size)
      throw Error("StandIn", cat("rank ", rank, " of a world of ", size),
                  "give a rank from 0 to size - 1 of a size >= 1");
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const { return name_; }

  // This rank's group of `members` (ranks of this group, in the group's order).
  StandIn group(const std::vector<int>& members, const std::string& name) const {
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank_) return StandIn(static_cast<int>(i), static_cast<int>(members.size()), name);
    throw Error(cat("StandIn::group '", name, "'"),
                cat("rank ", rank_, " of '", name_, "' is not among the ", members.size(), " members"),
                "list this rank's own group");
  }
  [[noreturn]] StandIn split(int color, int, const std::string& name = {}) const {
    throw Error(cat("StandIn::split '", name, "'"),
                cat("a rank measured alone cannot split by color (", color, "): no other rank answers"),
                "form the group with weft::subgroup, naming its members");
  }

 private:
  int rank_, size_;
  std::string name_;
};

template <class C>
class MetaComm {
 public:
  struct SendHandle {};

  explicit MetaComm(C inner) : inner_(std::move(inner)) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  std::string name() const { return inner_.name(); }

  template <class T> void all_reduce(std::span<T> b, ReduceOp = ReduceOp::sum) {
    count(Op::all_reduce, b.size_bytes());
  }
  template <class T> void reduce_scatter(std::span<const T> in, std::span<T>, ReduceOp = ReduceOp::sum) {
    count(Op::reduce_scatter, in.size_bytes());
  }
  template <class T> void all_gather(std::span<const T>, std::span<T> out) { count(Op::all_gather, out.size_bytes()); }
  template <class T> void all_to_all(std::span<const T> in, std::span<T>) { count(Op::all_to_all, in.size_bytes()); }
  template <class T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t>, std::span<T>, std::span<const std::int64_t>) {
    count(Op::all_to_all, in.size_bytes());
  }
  template <class T> void broadcast(std::span<T> b, int) { count(Op::broadcast, b.size_bytes()); }
  template <class T> void send(std::span<const T> b, int) { count(Op::send, b.size_bytes()); }
  template <class T> void recv(std::span<T> b, int) { count(Op::recv, b.size_bytes()); }
  template <class T> SendHandle isend(std::span<const T> b, int) {
    count(Op::send, b.size_bytes());
    return {};
  }
  void wait(const SendHandle&) {}
  void cancel(const SendHandle&) noexcept {}
  void barrier() { count(Op::barrier, 0); }
  MetaComm split(int color, int key, const std::string& name = {}) { return MetaComm(inner_.split(color, key, name)); }
  MetaComm group(const std::vector<int>& members, const std::string& name)
    requires requires(C& c, const std::vector<int>& m, const std::string& n) { c.group(m, n); }
  {
    return MetaComm(inner_.group(members, name));
  }

  // What this rank has been asked on this group so far, call by call: how many of each
  // (operation, bytes), for the time model's alpha-beta costs, which are not linear in the bytes.
  const std::map<std::pair<threads::Op, std::uint64_t>, std::int64_t>& calls() const { return calls_; }
  // The same summed per operation (subtract two snapshots to count a region).
  threads::Counters counters() const {
    threads::Counters c;
    for (const auto& [key, n] : calls_) {
      c.calls[static_cast<std::size_t>(key.first)] += static_cast<std::uint64_t>(n);
      c.bytes[static_cast<std::size_t>(key.first)] += key.second * static_cast<std::uint64_t>(n);
    }
    return c;
  }

 private:
  using Op = threads::Op;
  void count(Op op, std::size_t bytes) { ++calls_[{op, static_cast<std::uint64_t>(bytes)}]; }
  C inner_;
  std::map<std::pair<threads::Op, std::uint64_t>, std::int64_t> calls_;
};

}  // namespace weft
