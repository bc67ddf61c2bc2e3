// MetaComm<C>: a communicator for the Meta device (device/meta/meta.hpp). Its groups are C's (rank,
// size, name, split are C's, so a Mesh and a pipeline's tie groups form as they do on C), and it
// moves no data: collectives, sends and receives return at once, and what they would have written
// is left as it is (the Meta device's buffers hold nothing). The plan (plan/measure.hpp) runs a
// step's code on Meta devices over MetaComm<ThreadComm>: the only calls that wait for the other ranks
// are the splits that build the groups.
//
// It counts what it is asked as the thread communicator counts it (threads::Counters: calls and
// bytes per operation on each group; an all-gather by its output, the rest by their input, a send
// when it is posted), so a step measured on it reports its collectives per mesh axis, and
// tests/plan/measure.cpp holds the counts equal to the thread communicator's.
//
// This header is plain C++20.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>

#include "weft/comm/communicator.hpp"
#include "weft/comm/threads/world.hpp"

namespace weft {

template <class C>
class MetaComm {
 public:
  struct SendHandle {};

  explicit MetaComm(C inner) : inner_(std::move(inner)) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  std::string name() const { return inner_.name(); }

  template <class T> void all_reduce(std::span<T> b, ReduceOp = ReduceOp::sum) { count(Op::all_reduce, b.size_bytes()); }
  template <class T> void reduce_scatter(std::span<const T> in, std::span<T>, ReduceOp = ReduceOp::sum) {
    count(Op::reduce_scatter, in.size_bytes());
  }
  template <class T> void all_gather(std::span<const T>, std::span<T> out) { count(Op::all_gather, out.size_bytes()); }
  template <class T> void all_to_all(std::span<const T> in, std::span<T>) { count(Op::all_to_all, in.size_bytes()); }
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
