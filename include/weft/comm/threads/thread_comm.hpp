// ThreadComm: a Communicator whose ranks are threads of one process (see world.hpp for the shared
// state and the failure rules).
//
// Every collective runs the same protocol: post a descriptor, wait until all members have posted
// (arrival), check that they all asked for the same call, move data by reading the other ranks'
// buffers directly, and wait until all have finished reading (departure). Reductions add in rank
// order 0, 1, ..., n-1 for every element, whichever thread computes it, so results are bitwise
// identical across ranks and across runs; bf16 accumulates in float and rounds once.
//
// all_reduce is a reduce-scatter fused with an all-gather, in place: rank r owns elements
// [r*count/n, (r+1)*count/n), reduces them chunk by chunk into its own buffer and copies each chunk
// from there into every other rank's buffer while it is still in cache. No other rank touches that
// slice of any buffer, so no phase separates the two. Counts need not divide by the group size.
//
// A collective that fails (bad arguments, a mismatch, a deadline, a failed rank) throws weft::Error
// on every rank of the world: an error in a collective is fatal to the whole run. Failure can only
// happen before data moves: a rank that gives up withdraws its arrival, and once every rank has
// arrived the collective runs to completion (its remaining waits cover copies between ranks,
// which run no user code), so no rank ever reads a buffer that its owner has already freed.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/reduce.hpp"
#include "weft/comm/threads/memory.hpp"
#include "weft/comm/threads/world.hpp"

namespace weft::threads {

class ThreadComm {
 public:
  ThreadComm(std::shared_ptr<World> world, std::shared_ptr<Group> group, int group_rank,
             std::shared_ptr<Memory> memory = std::make_shared<Memory>())
      : world_(std::move(world)),
        group_(std::move(group)),
        me_(group_rank),
        world_rank_(group_->members[static_cast<std::size_t>(group_rank)]),
        mem_(std::move(memory)) {}

  // Where this rank's buffers live (memory.hpp); groups split from this communicator inherit it.
  // Set it on the world communicator before building a Mesh over device buffers.
  void set_memory(std::shared_ptr<Memory> m) { mem_ = std::move(m); }

  int rank() const { return me_; }
  int size() const { return group_->size(); }
  int world_rank() const { return world_rank_; }
  std::string name() const { return group_->label(); }
  const std::vector<int>& members() const { return group_->members; }

  template <Element T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    Desc d{Op::all_reduce, dtype_of<T>, size_of(buf), size_of(buf), op, 0, buf.data(), buf.data()};
    collective(d, [&](const std::vector<Desc>& all, std::uint64_t) {
      const int n = size();
      const std::int64_t count = d.in_count;
      auto lo = [&](int r) { return count * r / n; };
      // Only this rank reads or writes its slice of any rank's buffer: it reduces a chunk of the
      // slice into its own buffer and copies it from there, still in cache, into the others'.
      const std::vector<const T*> ins = inputs<T>(all);
      const std::int64_t chunk =
          std::max<std::int64_t>(1, static_cast<std::int64_t>(mem_->chunk_bytes(buf.data()) / sizeof(T)));
      for (std::int64_t c0 = lo(me_); c0 < lo(me_ + 1); c0 += std::min(chunk, lo(me_ + 1) - c0)) {
        const std::int64_t c1 = c0 + std::min(chunk, lo(me_ + 1) - c0);
        reduce_into(buf.data(), ins, c0, c1, op, 0);
        for (int r = 0; r < n; ++r)
          if (r != me_)
            mem_->copy(static_cast<T*>(all[static_cast<std::size_t>(r)].out) + c0, buf.data() + c0,
                       static_cast<std::size_t>(c1 - c0) * sizeof(T));
      }
    });
  }

  template <Element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    Desc d{Op::reduce_scatter, dtype_of<T>, size_of(in), size_of(out), op, 0, in.data(), out.data()};
    check_sizes(d, d.in_count == d.out_count * size(), "in.size() == size() * out.size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](const std::vector<Desc>& all, std::uint64_t) {
      reduce_into(out.data(), inputs<T>(all), me_ * d.out_count, (me_ + 1) * d.out_count, op, me_ * d.out_count);
    });
  }

  template <Element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    Desc d{Op::all_gather, dtype_of<T>, size_of(in), size_of(out), ReduceOp::sum, 0, in.data(), out.data()};
    check_sizes(d, d.out_count == d.in_count * size(), "out.size() == size() * in.size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](const std::vector<Desc>& all, std::uint64_t) {
      for (int r = 0; r < size(); ++r)
        mem_->copy(out.data() + r * d.in_count, all[static_cast<std::size_t>(r)].in,
                   static_cast<std::size_t>(d.in_count) * sizeof(T));
    });
  }

  template <Element T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    Desc d{Op::all_to_all, dtype_of<T>, size_of(in), size_of(out), ReduceOp::sum, 0, in.data(), out.data()};
    check_sizes(d, d.in_count == d.out_count && d.in_count % size() == 0,
                "in.size() == out.size(), a multiple of size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](const std::vector<Desc>& all, std::uint64_t) {
      const std::int64_t k = d.in_count / size();
      for (int r = 0; r < size(); ++r)
        mem_->copy(out.data() + r * k, static_cast<const T*>(all[static_cast<std::size_t>(r)].in) + me_ * k,
                   static_cast<std::size_t>(k) * sizeof(T));
    });
  }

  // in holds send[j] elements for member j, one run after another in member order; out gets recv[i]
  // from member i the same way. Counted as an all_to_all of in's bytes. Each pair's counts must
  // agree (send[j] on rank i == recv[i] on rank j): checked on every rank before data moves.
  template <Element T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t> send, std::span<T> out,
                    std::span<const std::int64_t> recv) {
    Desc d{Op::all_to_all, dtype_of<T>, size_of(in), size_of(out), ReduceOp::sum, 0, in.data(), out.data()};
    d.send_counts = send.data();
    d.recv_counts = recv.data();
    check_sizes(d, counts_fit(send, size(), in.size()) && counts_fit(recv, size(), out.size()),
                "one count >= 0 per member in send and recv, summing to in.size() and out.size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](const std::vector<Desc>& all, std::uint64_t) {
      std::int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        const std::int64_t* theirs = group_->slots[static_cast<std::size_t>(r)].send_counts.data();
        const std::int64_t from = std::accumulate(theirs, theirs + me_, std::int64_t{0});
        mem_->copy(out.data() + at, static_cast<const T*>(all[static_cast<std::size_t>(r)].in) + from,
                   static_cast<std::size_t>(theirs[me_]) * sizeof(T));
        at += theirs[me_];
      }
    });
  }

  template <Element T>
  void broadcast(std::span<T> buf, int root) {
    Desc d{Op::broadcast, dtype_of<T>, size_of(buf), size_of(buf), ReduceOp::sum, root, buf.data(), buf.data()};
    check_peer(d, root, "root");
    collective(d, [&](const std::vector<Desc>& all, std::uint64_t) {
      if (me_ != root) mem_->copy(buf.data(), all[static_cast<std::size_t>(root)].in, buf.size_bytes());
    });
  }

  void barrier() {
    collective(Desc{Op::barrier}, [](const std::vector<Desc>&, std::uint64_t) {});
  }

  // Ranks with the same color form a new group, ordered by (key, rank). Requires: color >= 0.
  ThreadComm split(int color, int key, const std::string& name = {}) {
    if (color < 0) fail_local(Desc{Op::split}, cat("color ", color, " is negative"), "use a color >= 0");
    const int mine[2] = {color, key};
    std::shared_ptr<Group> made;
    int my_index = 0;
    collective(Desc{Op::split, DType::i32, 2, 2, ReduceOp::sum, 0, mine, nullptr}, [&](const std::vector<Desc>& all,
                                                                                       std::uint64_t seq) {
      std::vector<std::pair<int, int>> keyed;  // (key, group rank in parent)
      for (int r = 0; r < size(); ++r) {
        const int* cr = static_cast<const int*>(all[static_cast<std::size_t>(r)].in);
        if (cr[0] == color) keyed.emplace_back(cr[1], r);
      }
      std::sort(keyed.begin(), keyed.end());
      std::vector<int> members;
      for (std::size_t i = 0; i < keyed.size(); ++i) {
        if (keyed[i].second == me_) my_index = static_cast<int>(i);
        members.push_back(group_->members[static_cast<std::size_t>(keyed[i].second)]);
      }
      std::lock_guard lock(world_->mutex());
      made = world_->split_group(group_->id, seq, color, name.empty() ? cat(group_->name, "/", color) : name, members);
    });
    return ThreadComm(world_, made, my_index, mem_);
  }

  // A send that has been posted and may not have been received yet (isend); wait() completes it.
  struct SendHandle {
    std::size_t box = 0;
    std::uint64_t seq = 0;
    std::uint64_t in_count = 0;
    DType dtype = DType::f32;
  };

  // Posts buf for group rank `peer` and returns without waiting. buf must stay unchanged and alive
  // until wait(handle) returns. Messages to one peer arrive in the order they were posted.
  template <Element T>
  SendHandle isend(std::span<const T> buf, int peer) {
    Desc d{Op::send, dtype_of<T>, size_of(buf), size_of(buf), ReduceOp::sum, peer, buf.data(), nullptr};
    check_peer(d, peer, "peer");
    if (peer == me_) fail_local(d, "a rank cannot send to itself", "copy the buffer locally");
    const std::size_t box = static_cast<std::size_t>(me_ * size() + peer);
    mem_->publish();
    std::unique_lock lock(world_->mutex());
    const std::uint64_t seq = ++group_->send_seq[box];
    auto& mail = group_->mail[box];
    mail.queue.push_back(d);
    mail.sent = seq;
    world_->notify();
    return {box, seq, static_cast<std::uint64_t>(d.in_count), d.dtype};
  }

  // Waits until the message of h has been received.
  void wait(const SendHandle& h) {
    const int peer = static_cast<int>(h.box % static_cast<std::size_t>(size()));
    const auto where = [&] {
      return cat("send #", h.seq, " to group rank ", peer, " on ", name(), " at world rank ", world_rank_);
    };
    std::unique_lock lock(world_->mutex());
    auto& mail = group_->mail[h.box];
    try {
      world_->wait(lock, world_rank_, Wait{group_.get(), h.seq, Op::send, h.box, h.seq}, where,
                   [&] { return mail.received >= h.seq; });
    } catch (...) {
      // The receiver may be copying from this buffer: let it finish; otherwise withdraw the message.
      if (mail.claimed >= h.seq) {
        world_->wait_committed(lock, [&] { return mail.received >= h.seq; });
      } else {
        const std::uint64_t at = h.seq - mail.received - 1;
        if (at < mail.queue.size()) mail.queue[static_cast<std::size_t>(at)].in = nullptr;  // never read
      }
      throw;
    }
    if (!mail.error.empty()) throw Error(where(), mail.error, "post a recv of the same type and count");
    world_->set_last_op(world_rank_, group_.get(), Op::send, h.seq);
    count(Op::send, static_cast<std::int64_t>(h.in_count), h.dtype);
  }

  template <Element T>
  void send(std::span<const T> buf, int peer) {
    wait(isend(buf, peer));
  }

  // Withdraws a posted send that will not be waited for (its owner is failing): the message is
  // marked so no receiver reads it, or, where a receiver is already copying it, the copy is let
  // finish. Never waits for a receiver that has not started; never throws.
  void cancel(const SendHandle& h) noexcept {
    try {
      std::unique_lock lock(world_->mutex());
      auto& mail = group_->mail[h.box];
      if (mail.received >= h.seq) return;
      if (mail.claimed >= h.seq) {
        world_->wait_committed(lock, [&] { return mail.received >= h.seq; });
        return;
      }
      const std::uint64_t at = h.seq - mail.received - 1;
      if (at < mail.queue.size()) mail.queue[static_cast<std::size_t>(at)].in = nullptr;
    } catch (...) {  // the world is failing anyway
    }
  }

  template <Element T>
  void recv(std::span<T> buf, int peer) {
    Desc d{Op::recv, dtype_of<T>, size_of(buf), size_of(buf), ReduceOp::sum, peer, nullptr, buf.data()};
    check_peer(d, peer, "peer");
    if (peer == me_) fail_local(d, "a rank cannot receive from itself", "copy the buffer locally");
    const std::size_t box = static_cast<std::size_t>(peer * size() + me_);
    std::unique_lock lock(world_->mutex());
    const std::uint64_t seq = ++group_->recv_seq[box];
    const auto where = [&] {
      return cat("recv #", seq, " from group rank ", peer, " on ", name(), " at world rank ", world_rank_);
    };
    auto& mail = group_->mail[box];
    world_->wait(lock, world_rank_, Wait{group_.get(), seq, Op::recv, box, seq}, where,
                 [&] { return mail.sent >= seq; });
    const Desc& posted = mail.queue.front();  // message `seq`: every earlier one has been received
    if (posted.dtype != d.dtype || posted.in_count != d.in_count || !posted.in) {
      mail.error = !posted.in ? std::string("the sender withdrew the message after a failure")
                              : cat("group rank ", peer, " sent ", posted.in_count, " ", posted.dtype,
                                    " but group rank ", me_, " expected ", d.in_count, " ", d.dtype);
      mail.received = seq;
      mail.queue.pop_front();
      world_->fail_locked(world_rank_, cat(where(), ": ", mail.error), !posted.in);
      if (!posted.in) throw FailedElsewhere(where(), mail.error, "the sender's failure is the cause; fix it");
      throw Error(where(), mail.error, "post a send and recv of the same type and count");
    }
    const void* src = posted.in;
    mail.claimed = seq;
    lock.unlock();
    mem_->copy(buf.data(), src, buf.size_bytes());
    lock.lock();
    mail.queue.pop_front();
    mail.received = seq;
    world_->notify();
    world_->set_last_op(world_rank_, group_.get(), Op::recv, seq);
    count(Op::recv, d.in_count, d.dtype);
  }

  // What this rank has run on this group so far (subtract two snapshots to count a region).
  const Counters& counters() const { return group_->slots[static_cast<std::size_t>(me_)].counters; }

  // The deadline for this rank's blocking calls is the world's (Options::deadline).
  std::chrono::milliseconds deadline() const { return world_->options().deadline; }

 private:
  template <class T>
  static std::int64_t size_of(std::span<T> s) {
    return static_cast<std::int64_t>(s.size());
  }

  template <Element T>
  static std::vector<const T*> inputs(const std::vector<Desc>& all) {
    std::vector<const T*> v;
    for (const Desc& d : all) v.push_back(static_cast<const T*>(d.in));
    return v;
  }

  // out[i - offset] = reduce over ranks (in rank order) of ins[r][i], for i in [lo, hi): by the
  // Memory where the buffers are a device's, else here.
  template <Element T>
  void reduce_into(T* out, const std::vector<const T*>& ins, std::int64_t lo, std::int64_t hi, ReduceOp op,
                   std::int64_t offset) {
    if (lo >= hi) return;
    if (mem_->reduce(out, reinterpret_cast<const void* const*>(ins.data()), static_cast<int>(ins.size()), lo, hi, op,
                     dtype_of<T>, offset))
      return;
    reduce_in_rank_order(out, ins, lo, hi, op, offset);
  }

  std::string where(const Desc& d, std::uint64_t seq) const {
    return cat(threads::name(d.op), " #", seq, " on ", name(), " at world rank ", world_rank_);
  }

  // An error in this rank's own arguments: fatal to the world, like any collective failure.
  [[noreturn]] void fail_local(const Desc& d, const std::string& what, const std::string& fix) {
    const std::string w = where(d, group_->slots[static_cast<std::size_t>(me_)].seq + 1);
    world_->fail(world_rank_, cat(w, ": ", what));
    throw Error(w, what, fix);
  }
  void check_sizes(const Desc& d, bool ok, const char* rule) { raise(d, threads::size_problem(d, size(), ok, rule)); }
  void check_peer(const Desc& d, int peer, const char* what) { raise(d, threads::peer_problem(peer, size(), what)); }
  void check_disjoint(const Desc& d, const void* a, std::size_t na, const void* b, std::size_t nb) {
    raise(d, threads::overlap_problem(a, na, b, nb));
  }
  void raise(const Desc& d, const std::optional<threads::Problem>& p) {
    if (p) fail_local(d, p->what, p->fix);
  }

  // Posts this rank's progress at (seq, phase) and waits for every member to reach it. Holds the lock.
  // Arrival (phase 1) may fail: then this rank withdraws its arrival, so the others can never
  // complete it and start reading a buffer this rank is about to free. Once all have arrived the
  // collective is committed: later phases wait only for the others' copies, which always finish.
  void reach(std::unique_lock<std::mutex>& lock, std::uint64_t seq, int phase, Op op) {
    auto& slot = group_->slots[static_cast<std::size_t>(me_)];
    const std::uint64_t target = 4 * seq + static_cast<std::uint64_t>(phase);
    const std::uint64_t before = slot.progress;
    slot.progress = target;
    world_->notify();
    const auto& slots = group_->slots;
    auto all = [&] {
      return std::all_of(slots.begin(), slots.end(), [&](const Group::Slot& s) { return s.progress >= target; });
    };
    if (phase != 1) return world_->wait_committed(lock, all);
    try {
      world_->wait(
          lock, world_rank_, Wait{group_.get(), target, op, 0, seq}, [&] { return where(Desc{op}, seq); }, all);
    } catch (...) {
      slot.progress = before;
      throw;
    }
  }

  // The collective protocol: arrival, check, body(descriptors, seq), departure.
  template <class Body>
  void collective(const Desc& d, Body&& body) {
    mem_->publish();
    std::unique_lock lock(world_->mutex());
    auto& slot = group_->slots[static_cast<std::size_t>(me_)];
    const std::uint64_t seq = ++slot.seq;
    slot.desc = d;
    if (d.varying()) {
      slot.send_counts.assign(d.send_counts, d.send_counts + size());
      slot.recv_counts.assign(d.recv_counts, d.recv_counts + size());
    }
    reach(lock, seq, 1, d.op);
    std::vector<Desc> all;
    for (const auto& s : group_->slots) all.push_back(s.desc);
    if (!std::all_of(all.begin(), all.end(), [&](const Desc& o) { return o.same_call(all[0]); })) {
      std::string calls;
      for (std::size_t r = 0; r < all.size(); ++r)
        calls += cat(r ? ", " : "", "world rank ", group_->members[r], " called ", all[r].str());
      const std::string what = cat("mismatched collective #", seq, " on ", name(), ": ", calls);
      world_->fail_locked(world_rank_, what);
      throw Error(where(d, seq), what, "every rank of a group must make the same collective calls in the same order");
    }
    if (d.varying())  // every pair's counts agree, or no rank moves data
      for (std::size_t i = 0; i < all.size(); ++i)
        for (std::size_t j = 0; j < all.size(); ++j)
          if (const auto sent = group_->slots[i].send_counts[j], expected = group_->slots[j].recv_counts[i];
              sent != expected) {
            const std::string what =
                cat("mismatched all_to_all_v #", seq, " on ", name(), ": world rank ", group_->members[i], " sends ",
                    sent, " elements to world rank ", group_->members[j], ", which expects ", expected);
            world_->fail_locked(world_rank_, what);
            throw Error(where(d, seq), what, "give each rank the counts its peers send it (exchange them first)");
          }
    lock.unlock();
    body(all, seq);
    lock.lock();
    reach(lock, seq, 3, d.op);
    world_->set_last_op(world_rank_, group_.get(), d.op, seq);
    count(d.op, d.op == Op::all_gather ? d.out_count : d.in_count, d.dtype);
  }

  void count(Op op, std::int64_t elements, DType t) {
    auto& c = group_->slots[static_cast<std::size_t>(me_)].counters;
    c.calls[static_cast<std::size_t>(op)] += 1;
    c.bytes[static_cast<std::size_t>(op)] += static_cast<std::uint64_t>(elements) * weft::size_of(t);
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int me_;
  int world_rank_;
  std::shared_ptr<Memory> mem_;
};

static_assert(Communicator<ThreadComm>);

}  // namespace weft::threads
