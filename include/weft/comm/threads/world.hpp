// Shared state of the thread back end: one World per run_threads() call, shared by all ranks.
//
// Decisions that are not obvious:
// - One mutex and one condition variable for the whole world. Ranks only take it to post progress
//   and to check the others'; data moves outside it. With at most a few dozen thread ranks the
//   contention is negligible, and one lock makes failure propagation and deadlock detection simple:
//   whoever fails sets `abort_` and wakes everyone.
// - A rank's progress in a group is one counter, 4 * seq + phase (phase 1 arrived, 3 departed). A barrier at (seq,
// phase) waits until every member's counter reaches it, so a fast
//   rank never overwrites a descriptor a slow rank still reads.
// - Every wait has a deadline. It also ends early when (a) any rank has failed, (b) a rank it waits
//   for has returned from its function, or (c) the ranks form a wait-for cycle (each waits for the
//   next in a different op): a deadlock that no deadline would resolve.
// - Before sleeping on the condition variable, a waiter spins (yielding) for up to kSpin on a
//   generation counter that every notify bumps, then checks again under the lock: the partner of a
//   small collective usually arrives within microseconds, and a sleep and wake-up cost tens of
//   them. Only when every rank can have a core: oversubscribed, the spinning would only delay the
//   rank it waits for.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/core/error.hpp"

namespace weft::threads {

// An Error that only reports another rank's failure: an abort, or a message its sender withdrew
// while unwinding. run_threads reports the failure that caused it, whichever was recorded first.
struct FailedElsewhere : Error {
  using Error::Error;
};

using Clock = std::chrono::steady_clock;

struct Options {
  std::chrono::milliseconds deadline{60'000};  // every blocking call gives up after this long
};

enum class Op : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  broadcast,
  barrier,
  split,
  send,
  recv
};

constexpr const char* name(Op op) {
  constexpr const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                                   "barrier",    "split",          "send",       "recv"};
  return names[static_cast<int>(op)];
}

inline constexpr std::size_t kOps = 9;

// What one rank ran on one group: calls and bytes per op. Bytes are those of the buffer the op was
// called with, as nccl-tests counts them: all_reduce and broadcast the buffer, all_gather the
// gathered output, reduce_scatter the input, all_to_all the buffer, send and recv the message.
struct Counters {
  std::array<std::uint64_t, kOps> calls{}, bytes{};

  std::uint64_t calls_of(Op op) const { return calls[static_cast<std::size_t>(op)]; }
  std::uint64_t bytes_of(Op op) const { return bytes[static_cast<std::size_t>(op)]; }
  Counters operator-(const Counters& o) const {
    Counters d;
    for (std::size_t i = 0; i < kOps; ++i) {
      d.calls[i] = calls[i] - o.calls[i];
      d.bytes[i] = bytes[i] - o.bytes[i];
    }
    return d;
  }
  Counters operator+(const Counters& o) const {
    Counters d;
    for (std::size_t i = 0; i < kOps; ++i) {
      d.calls[i] = calls[i] + o.calls[i];
      d.bytes[i] = bytes[i] + o.bytes[i];
    }
    return d;
  }
};

// What a rank asked of a collective; every member must ask the same.
struct Desc {
  Op op = Op::barrier;
  DType dtype = DType::f32;
  std::int64_t in_count = 0, out_count = 0;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  const void* in = nullptr;
  void* out = nullptr;
  // all_to_all_v: the elements this rank sends each member and receives from each (size() each);
  // its in and out counts may differ between ranks, and each pair's counts must agree.
  const std::int64_t* send_counts = nullptr;
  const std::int64_t* recv_counts = nullptr;

  bool varying() const { return send_counts != nullptr; }
  bool same_call(const Desc& o) const {
    return op == o.op && dtype == o.dtype && varying() == o.varying() &&
           (varying() || (in_count == o.in_count && out_count == o.out_count)) && reduce == o.reduce && root == o.root;
  }
  std::string str() const {
    if (varying()) return cat(name(op), "_v(", dtype, ", in ", in_count, ", out ", out_count, ")");
    switch (op) {
      case Op::barrier:
      case Op::split: return cat(name(op), "()");
      case Op::all_reduce: return cat(name(op), "(", dtype, ", ", in_count, ", ", weft::name(reduce), ")");
      case Op::reduce_scatter:
        return cat(name(op), "(", dtype, ", in ", in_count, ", out ", out_count, ", ", weft::name(reduce), ")");
      case Op::broadcast: return cat(name(op), "(", dtype, ", ", in_count, ", root ", root, ")");
      default: return cat(name(op), "(", dtype, ", in ", in_count, ", out ", out_count, ")");
    }
  }
};

// A call's bad argument, found before it runs: what is wrong and how to fix it. The host back ends
// (threads, MPI) raise it on the calling rank and fail the world with it.
struct Problem {
  std::string what, fix;
};

inline std::optional<Problem> size_problem(const Desc& d, int ranks, bool ok, const char* rule) {
  if (ok) return std::nullopt;
  return Problem{cat("sizes in ", d.in_count, ", out ", d.out_count, " on ", ranks, " ranks break ", rule),
                 "size the buffers as the rule says"};
}
inline std::optional<Problem> peer_problem(int peer, int ranks, const char* what) {
  if (peer >= 0 && peer < ranks) return std::nullopt;
  return Problem{cat(what, " ", peer, " is not a rank of a group of ", ranks),
                 cat("use a ", what, " in [0, ", ranks, ")")};
}
inline std::optional<Problem> overlap_problem(const void* a, std::size_t na, const void* b, std::size_t nb) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  if (!(na && nb && pa < pb + nb && pb < pa + na)) return std::nullopt;
  return Problem{"the input and output buffers overlap", "use separate buffers"};
}

// One group of ranks (the world, or a split of it).
struct Group {
  std::uint64_t id = 0;
  std::string name;
  std::vector<int> members;  // world ranks, in group-rank order

  struct Slot {
    std::uint64_t seq = 0;       // collectives this member has started
    std::uint64_t progress = 0;  // 4 * seq + phase
    Desc desc;
    // An all_to_all_v's counts, copied here when posted: the group's, so that a member that fails
    // the call and unwinds frees nothing another member still reads.
    std::vector<std::int64_t> send_counts, recv_counts;
    Counters counters;  // written only by the member itself
  };
  std::vector<Slot> slots;

  // Point-to-point: one mailbox per ordered (source, destination) pair of group ranks.
  // Messages are delivered in the order they were sent; a source may post several before the
  // destination takes the first (isend).
  struct Mailbox {
    std::uint64_t sent = 0, received = 0;  // messages posted by the source, consumed by the destination
    std::uint64_t claimed = 0;             // the destination started copying this message
    std::deque<Desc> queue;                // messages received + 1 .. sent, oldest first
    std::string error;                     // set by the destination when the message does not match its recv
  };
  std::vector<Mailbox> mail;                      // [src * size + dst]
  std::vector<std::uint64_t> send_seq, recv_seq;  // [src * size + dst]: calls started

  int size() const { return static_cast<int>(members.size()); }
  std::string label() const { return cat(name, "{", join(members, ","), "}"); }
};

// What a rank is blocked on, for deadlock detection and messages.
struct Wait {
  const Group* group = nullptr;
  std::uint64_t target = 0;  // progress target (collectives) or message number (send/recv)
  Op op = Op::barrier;
  std::size_t box = 0;  // mailbox index (src * size + dst) for send/recv
  std::uint64_t seq = 0;
};

class World {
 public:
  World(int size, Options opts)
      : size_(size),
        opts_(opts),
        waits_(static_cast<std::size_t>(size)),
        exited_(static_cast<std::size_t>(size), false),
        last_op_(static_cast<std::size_t>(size)),
        spin_(static_cast<unsigned>(size) <= std::thread::hardware_concurrency()) {}

  int size() const { return size_; }
  const Options& options() const { return opts_; }
  std::mutex& mutex() { return mu_; }

  std::shared_ptr<Group> make_group(std::string name, std::vector<int> members) {
    auto g = std::make_shared<Group>();
    g->id = next_group_id_++;
    g->name = std::move(name);
    g->members = std::move(members);
    const std::size_t n = g->members.size();
    g->slots.resize(n);
    g->mail.resize(n * n);
    g->send_seq.assign(n * n, 0);
    g->recv_seq.assign(n * n, 0);
    return g;
  }

  // The group for (parent, split number, color), created by the first rank that asks. Caller holds mu_.
  std::shared_ptr<Group> split_group(std::uint64_t parent, std::uint64_t seq, int color, const std::string& name,
                                     const std::vector<int>& members) {
    auto& g = splits_[{parent, seq, color}];
    if (!g) g = make_group(name, members);
    return g;
  }

  // Records the first failure and wakes every rank. Later failures are consequences and are ignored.
  void fail(int world_rank, const std::string& why, bool secondary = false) {
    std::lock_guard lock(mu_);
    fail_locked(world_rank, why, secondary);
  }
  // secondary: a failure that only follows from another rank's (a message its sender withdrew
  // while unwinding); the sender's own failure, recorded a moment later, replaces it as the one
  // reported, so that run_threads names the cause and not its echo.
  void fail_locked(int world_rank, const std::string& why, bool secondary = false) {
    if (!abort_ || (abort_->secondary && !secondary)) abort_ = Failure{world_rank, why, secondary};
    notify();
  }
  struct Failure {
    int rank;
    std::string why;
    bool secondary = false;
  };
  std::optional<Failure> failure() {
    std::lock_guard lock(mu_);
    return abort_;
  }

  void exited(int world_rank) {
    std::lock_guard lock(mu_);
    exited_[static_cast<std::size_t>(world_rank)] = true;
    notify();
  }
  // Wakes every waiter; the caller holds mutex() and has changed what they wait on.
  void notify() {
    generation_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
  }

  // Waits until pred() is true, with no deadline and no abort: only for the end of a data movement
  // that every rank has committed to (all arrived), which runs no user code and always finishes.
  // Returning earlier would free a buffer another rank is still reading.
  template <class Pred>
  void wait_committed(std::unique_lock<std::mutex>& lock, Pred pred) {
    bool spun = false;
    while (!pred()) {
      if (!spun && spin(lock)) {
        spun = true;
        continue;
      }
      cv_.wait(lock);
      spun = false;
    }
  }

  // Records the last op a rank completed (cheap: formatted only for a message). Caller holds mu_.
  void set_last_op(int world_rank, const Group* g, Op op, std::uint64_t seq) {
    last_op_[static_cast<std::size_t>(world_rank)] = LastOp{g, op, seq};
  }

  // Waits (holding `lock` on mutex()) until pred() is true. Throws Error on failure anywhere, on a
  // rank this one waits for having returned, on a deadlock cycle, or at the deadline. The caller
  // must withdraw what it posted before the wait when this throws (see ThreadComm). `where_fn`
  // builds the message's location, only when there is an error to report.
  template <class Where, class Pred>
  void wait(std::unique_lock<std::mutex>& lock, int me, const Wait& w, Where&& where_fn, Pred pred) {
    const auto deadline = Clock::now() + opts_.deadline;
    waits_[static_cast<std::size_t>(me)] = w;
    struct Clear {
      World* world;
      int me;
      ~Clear() { world->waits_[static_cast<std::size_t>(me)].reset(); }
    } clear{this, me};
    bool spun = false;
    for (;;) {
      if (pred()) return;  // a call that completed stays completed; the next one sees the failure
      if (abort_) throw aborted(where_fn());
      const std::vector<int> missing = waiting_for(w);
      for (int r : missing)
        if (exited_[static_cast<std::size_t>(r)]) {
          const std::string why = cat("world rank ", r, " returned from its function without calling ", name(w.op),
                                      " #", w.seq, " on ", w.group->label());
          fail_locked(r, why);
          throw Error(where_fn(), why, "every rank of a group must make the same sequence of collective calls");
        }
      if (auto cycle = find_cycle(me)) {
        fail_locked(me, *cycle);
        throw Error(where_fn(), *cycle, "every rank of a group must make the same sequence of collective calls");
      }
      if (!spun && spin(lock)) {  // then checked again under the lock, the checks above included
        spun = true;
        continue;
      }
      spun = false;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !pred() && !abort_) {
        const std::vector<int> late = waiting_for(w);
        std::string who;
        for (int r : late) who += cat(who.empty() ? "" : ", ", "world rank ", r, " (last op: ", last_op(r), ")");
        const std::string why = cat(who, " did not reach ", name(w.op), " #", w.seq, " on ", w.group->label(),
                                    " within the ", opts_.deadline.count(), " ms deadline");
        fail_locked(late.empty() ? me : late.front(), why);
        throw Error(where_fn(), why, "find why that rank is slow or stuck, or raise Options::deadline");
      }
    }
  }

 private:
  static constexpr std::chrono::microseconds kSpin{50};

  // Unlocks, yields until the generation moves or kSpin passes, and locks again. Returns whether
  // it spun at all (the caller then checks its predicate again before sleeping: a change made
  // while this rank held no lock is seen there, so no wake-up is lost).
  bool spin(std::unique_lock<std::mutex>& lock) {
    if (!spin_) return false;
    const std::uint64_t g = generation_.load(std::memory_order_acquire);
    lock.unlock();
    const auto until = Clock::now() + kSpin;
    while (generation_.load(std::memory_order_acquire) == g && Clock::now() < until) std::this_thread::yield();
    lock.lock();
    return true;
  }

  struct LastOp {
    const Group* group = nullptr;  // groups live as long as the world (splits_ and the ranks hold them)
    Op op = Op::barrier;
    std::uint64_t seq = 0;
  };
  std::string last_op(int r) const {
    const LastOp& l = last_op_[static_cast<std::size_t>(r)];
    return l.group ? cat(name(l.op), " #", l.seq, " on ", l.group->label()) : std::string("none");
  }

  FailedElsewhere aborted(const std::string& where) const {
    return FailedElsewhere(where, cat("aborted because world rank ", abort_->rank, " failed: ", abort_->why),
                           "the first failure is the cause; this rank stopped because of it");
  }

  // World ranks that wait `w` still needs. Caller holds mu_.
  std::vector<int> waiting_for(const Wait& w) const {
    std::vector<int> out;
    const Group& g = *w.group;
    if (w.op == Op::send) {
      const auto& box = g.mail[w.box];
      if (box.received < w.target) out.push_back(g.members[w.box % g.members.size()]);
    } else if (w.op == Op::recv) {
      const auto& box = g.mail[w.box];
      if (box.sent < w.target) out.push_back(g.members[w.box / g.members.size()]);
    } else {
      for (std::size_t i = 0; i < g.slots.size(); ++i)
        if (g.slots[i].progress < w.target) out.push_back(g.members[i]);
    }
    return out;
  }

  // A cycle of blocked ranks through `me`, described, or nothing. Caller holds mu_.
  std::optional<std::string> find_cycle(int me) const {
    std::vector<int> path{me};
    std::vector<bool> seen(static_cast<std::size_t>(size_), false);
    if (!dfs(me, me, path, seen)) return std::nullopt;
    std::string s = "deadlock: ";
    for (std::size_t i = 0; i + 1 < path.size(); ++i) {
      const Wait& w = *waits_[static_cast<std::size_t>(path[i])];
      s += cat(i ? ", " : "", "world rank ", path[i], " waits in ", name(w.op), " #", w.seq, " on ", w.group->label(),
               " for world rank ", path[i + 1]);
    }
    return s;
  }
  bool dfs(int at, int me, std::vector<int>& path, std::vector<bool>& seen) const {
    const auto& w = waits_[static_cast<std::size_t>(at)];
    if (!w) return false;
    for (int next : waiting_for(*w)) {
      if (next == me) {
        path.push_back(me);
        return true;
      }
      if (seen[static_cast<std::size_t>(next)]) continue;
      seen[static_cast<std::size_t>(next)] = true;
      path.push_back(next);
      if (dfs(next, me, path, seen)) return true;
      path.pop_back();
    }
    return false;
  }

  int size_;
  Options opts_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Failure> abort_;
  std::vector<std::optional<Wait>> waits_;
  std::vector<bool> exited_;
  std::vector<LastOp> last_op_;
  bool spin_ = false;                         // every rank can have a core
  std::atomic<std::uint64_t> generation_{0};  // bumped by every notify (spin)
  std::uint64_t next_group_id_ = 0;
  std::map<std::tuple<std::uint64_t, std::uint64_t, int>, std::shared_ptr<Group>> splits_;
};

}  // namespace weft::threads
