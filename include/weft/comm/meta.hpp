// MetaComm<C>: a communicator for the Meta device (device/meta/meta.hpp). Its groups are C's (rank,
// size, name, split are C's, so a Mesh and a pipeline's tie groups form as they do on C), and it
// moves no data: collectives, sends and receives return at once, and what they would have written
// is left as it is (the Meta device's buffers hold nothing). The plan (plan/measure.hpp) runs a
// step's code on Meta devices over MetaComm<ThreadComm>: the only calls that wait for the other ranks
// are the splits that build the groups.
//
// This header is plain C++20.
#pragma once

#include <span>
#include <string>
#include <utility>

#include "weft/comm/communicator.hpp"

namespace weft {

template <class C>
class MetaComm {
 public:
  struct SendHandle {};

  explicit MetaComm(C inner) : inner_(std::move(inner)) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  std::string name() const { return inner_.name(); }

  template <class T> void all_reduce(std::span<T>, ReduceOp = ReduceOp::sum) {}
  template <class T> void reduce_scatter(std::span<const T>, std::span<T>, ReduceOp = ReduceOp::sum) {}
  template <class T> void all_gather(std::span<const T>, std::span<T>) {}
  template <class T> void all_to_all(std::span<const T>, std::span<T>) {}
  template <class T> void broadcast(std::span<T>, int) {}
  template <class T> void send(std::span<const T>, int) {}
  template <class T> void recv(std::span<T>, int) {}
  template <class T> SendHandle isend(std::span<const T>, int) { return {}; }
  void wait(const SendHandle&) {}
  void cancel(const SendHandle&) noexcept {}
  void barrier() {}
  MetaComm split(int color, int key, const std::string& name = {}) { return MetaComm(inner_.split(color, key, name)); }

 private:
  C inner_;
};

}  // namespace weft
