// MpiComm: the Communicator concept (comm/communicator.hpp) over MPI, one rank per process, host
// buffers. Results are bitwise those of the thread back end for the same group: the same
// algorithms, the same rank-order reduction (comm/reduce.hpp), the same sequence numbers and
// error texts.
//
// Every call is built from MPI point-to-point messages (MPI_Isend, MPI_Irecv) and waited for by
// polling (world.hpp), not from MPI's collectives, for two reasons:
// - order: MPI_Allreduce's summation order is the implementation's choice (Open MPI picks an
//   algorithm by message size and process count), so its float sums differ from the thread back
//   end's; here each rank gathers its chunk of every rank's input and adds them in rank order
//   0, 1, ..., n-1, as the threads do;
// - failure: a blocking MPI collective cannot be given a deadline, and a dead peer can hang it;
//   per-peer requests can be, and they name the peer that is missing.
//
// Each collective first exchanges a small header with every member (op, type, counts, root, sequence
// number); a difference is a mismatched collective, reported on every rank with every rank's call,
// before any data moves. Then:
//   all_reduce      reduce-scatter then all-gather: rank r reduces elements [r*c/n, (r+1)*c/n)
//   reduce_scatter  rank r receives chunk r of every input and reduces it
//   all_gather, all_to_all, broadcast: direct sends to every member
// That is O(n) messages per rank per call: right for the host ranks of one or a few machines that
// this back end serves (GPUs use NCCL), not for thousands of ranks.
//
// Include only where <mpi.h> is available (the weft::mpi CMake target).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/comm/mpi/world.hpp"
#include "weft/comm/reduce.hpp"

namespace weft::mpi {

using threads::Counters;
using threads::Desc;
using threads::Op;

class MpiComm {
  // One group's MPI communicator and counters, shared by copies of an MpiComm.
  //
  // The communicator is never freed. After a failure, messages to a rank that gave up may still be
  // queued at it, and Open MPI gives a freed communicator's context id to the next one created, which
  // would then receive them; and MPI_Comm_free is collective, which a failed group cannot be. A run
  // creates a handful (the world, three axis groups, the notices).
  struct Group {
    MPI_Comm comm = MPI_COMM_NULL;
    std::string name;
    std::vector<int> members;                       // world ranks, in group-rank order
    std::uint64_t seq = 0;                          // collectives started
    std::vector<std::uint64_t> send_seq, recv_seq;  // per peer
    Counters counters;
    std::string label() const { return cat(name, "{", join(members, ","), "}"); }
  };

  // What a rank asked of a call, as sent to the others.
  struct Header {
    std::uint64_t seq = 0;
    std::int64_t in_count = 0, out_count = 0;
    std::int32_t root = 0;
    std::uint8_t op = 0, dtype = 0, reduce = 0, varying = 0;

    static Header of(const Desc& d, std::uint64_t seq) {
      return {seq,
              d.in_count,
              d.out_count,
              d.root,
              static_cast<std::uint8_t>(d.op),
              static_cast<std::uint8_t>(d.dtype),
              static_cast<std::uint8_t>(d.reduce),
              static_cast<std::uint8_t>(d.varying())};
    }
    // The call as a rank described it (a varying all-to-all's counts stay with the rank: only that
    // it varies travels, and each pair's counts are the caller's to make agree).
    Desc desc() const {
      static constexpr std::int64_t some = 0;
      Desc d{static_cast<Op>(op),
             static_cast<DType>(dtype),
             in_count,
             out_count,
             static_cast<ReduceOp>(reduce),
             root,
             nullptr,
             nullptr};
      if (varying) d.send_counts = d.recv_counts = &some;
      return d;
    }
  };

  enum Tag : int { header = 1, data1 = 2, data2 = 3, p2p_header = 4, p2p_data = 5 };

 public:
  // The world: every process of MPI_COMM_WORLD. Collective. Requires: MPI initialized (Session).
  static MpiComm world(Options opts = {}) {
    auto w = std::make_shared<World>(opts);
    auto g = std::make_shared<Group>();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &g->comm), "MPI_Comm_dup", "MpiComm::world");
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    g->name = "world";
    for (int r = 0; r < w->size(); ++r) g->members.push_back(r);
    const int me = w->rank();
    return MpiComm(std::move(w), std::move(g), me);
  }

  int rank() const { return me_; }
  int size() const { return static_cast<int>(g_->members.size()); }
  int world_rank() const { return g_->members[static_cast<std::size_t>(me_)]; }
  std::string name() const { return g_->label(); }
  const std::vector<int>& members() const { return g_->members; }
  const Counters& counters() const { return g_->counters; }
  std::chrono::milliseconds deadline() const { return world_->options().deadline; }

  // Ends the world after a failure outside communication (an exception in user code): every rank's
  // current or next call throws an Error naming this rank and `why`.
  void abort(const std::string& why) { world_->fail(why); }

  template <Element T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    const Desc d{Op::all_reduce, dtype_of<T>, size_of(buf), size_of(buf), op, 0, buf.data(), buf.data()};
    collective(d, [&](Exchange& x) {
      const int n = size();
      const std::int64_t count = d.in_count;
      auto lo = [&](int r) { return count * r / n; };
      const std::int64_t mine = lo(me_ + 1) - lo(me_);
      std::vector<std::vector<T>> from(static_cast<std::size_t>(n));
      for (int p = 0; p < n; ++p) {
        if (p == me_) continue;
        x.send(buf.data() + lo(p), lo(p + 1) - lo(p), p, data1);
        from[static_cast<std::size_t>(p)].resize(static_cast<std::size_t>(mine));
        x.recv(from[static_cast<std::size_t>(p)].data(), mine, p, data1);
      }
      x.wait();
      std::vector<const T*> ins;
      for (int p = 0; p < n; ++p)
        ins.push_back(p == me_ ? buf.data() + lo(me_) : from[static_cast<std::size_t>(p)].data());
      reduce_in_rank_order(buf.data() + lo(me_), ins, 0, mine, op, 0);
      for (int p = 0; p < n; ++p) {
        if (p == me_) continue;
        x.send(buf.data() + lo(me_), mine, p, data2);
        x.recv(buf.data() + lo(p), lo(p + 1) - lo(p), p, data2);
      }
      x.wait();
    });
  }

  template <Element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    const Desc d{Op::reduce_scatter, dtype_of<T>, size_of(in), size_of(out), op, 0, in.data(), out.data()};
    check_sizes(d, d.in_count == d.out_count * size(), "in.size() == size() * out.size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](Exchange& x) {
      const std::int64_t k = d.out_count;
      std::vector<std::vector<T>> from(static_cast<std::size_t>(size()));
      for (int p = 0; p < size(); ++p) {
        if (p == me_) continue;
        x.send(in.data() + p * k, k, p, data1);
        from[static_cast<std::size_t>(p)].resize(static_cast<std::size_t>(k));
        x.recv(from[static_cast<std::size_t>(p)].data(), k, p, data1);
      }
      x.wait();
      std::vector<const T*> ins;
      for (int p = 0; p < size(); ++p)
        ins.push_back(p == me_ ? in.data() + me_ * k : from[static_cast<std::size_t>(p)].data());
      reduce_in_rank_order(out.data(), ins, 0, k, op, 0);
    });
  }

  template <Element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    const Desc d{Op::all_gather, dtype_of<T>, size_of(in), size_of(out), ReduceOp::sum, 0, in.data(), out.data()};
    check_sizes(d, d.out_count == d.in_count * size(), "out.size() == size() * in.size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](Exchange& x) {
      const std::int64_t k = d.in_count;
      for (int p = 0; p < size(); ++p) {
        if (p == me_) continue;
        x.send(in.data(), k, p, data1);
        x.recv(out.data() + p * k, k, p, data1);
      }
      std::copy(in.begin(), in.end(), out.begin() + me_ * k);
      x.wait();
    });
  }

  template <Element T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    const Desc d{Op::all_to_all, dtype_of<T>, size_of(in), size_of(out), ReduceOp::sum, 0, in.data(), out.data()};
    check_sizes(d, d.in_count == d.out_count && d.in_count % size() == 0,
                "in.size() == out.size(), a multiple of size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](Exchange& x) {
      const std::int64_t k = d.in_count / size();
      for (int p = 0; p < size(); ++p) {
        if (p == me_) continue;
        x.send(in.data() + p * k, k, p, data1);
        x.recv(out.data() + p * k, k, p, data1);
      }
      std::copy(in.begin() + me_ * k, in.begin() + (me_ + 1) * k, out.begin() + me_ * k);
      x.wait();
    });
  }

  // As ThreadComm's: send[j] elements to member j, recv[i] from member i, runs in member order.
  template <Element T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t> send, std::span<T> out,
                    std::span<const std::int64_t> recv) {
    Desc d{Op::all_to_all, dtype_of<T>, size_of(in), size_of(out), ReduceOp::sum, 0, in.data(), out.data()};
    d.send_counts = send.data();
    d.recv_counts = recv.data();
    check_sizes(d, counts_fit(send, size(), in.size()) && counts_fit(recv, size(), out.size()),
                "one count >= 0 per member in send and recv, summing to in.size() and out.size()");
    check_disjoint(d, in.data(), in.size_bytes(), out.data(), out.size_bytes());
    collective(d, [&](Exchange& x) {
      std::int64_t s = 0, r = 0;
      for (int p = 0; p < size(); ++p) {
        const std::int64_t ns = send[static_cast<std::size_t>(p)], nr = recv[static_cast<std::size_t>(p)];
        if (p == me_) {
          std::copy(in.begin() + s, in.begin() + s + ns, out.begin() + r);
        } else {
          x.send(in.data() + s, ns, p, data1);
          x.recv(out.data() + r, nr, p, data1);
        }
        s += ns;
        r += nr;
      }
      x.wait();
    });
  }

  template <Element T>
  void broadcast(std::span<T> buf, int root) {
    const Desc d{Op::broadcast, dtype_of<T>, size_of(buf), size_of(buf), ReduceOp::sum, root, buf.data(), buf.data()};
    check_peer(d, root, "root");
    collective(d, [&](Exchange& x) {
      if (me_ == root) {
        for (int p = 0; p < size(); ++p)
          if (p != me_) x.send(buf.data(), d.in_count, p, data1);
      } else {
        x.recv(buf.data(), d.in_count, root, data1);
      }
      x.wait();
    });
  }

  void barrier() {
    collective(Desc{Op::barrier}, [](Exchange&) {});
  }

  // Ranks with the same color form a new group, ordered by (key, rank). Requires: color >= 0.
  MpiComm split(int color, int key, const std::string& name = {}) {
    if (color < 0) fail_local(Desc{Op::split}, cat("color ", color, " is negative"), "use a color >= 0");
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size()));
    auto made = std::make_shared<Group>();
    int my_index = 0;
    collective(Desc{Op::split, DType::i32, 2, 2, ReduceOp::sum, 0, nullptr, nullptr}, [&](Exchange& x) {
      const std::int32_t mine[2] = {color, key};
      for (int p = 0; p < size(); ++p) {
        if (p == me_) continue;
        x.send(mine, 2, p, data1);
        x.recv(all.data() + 2 * p, 2, p, data1);
      }
      all[2 * static_cast<std::size_t>(me_)] = color;
      all[2 * static_cast<std::size_t>(me_) + 1] = key;
      x.wait();
      std::vector<std::pair<int, int>> keyed;  // (key, group rank in parent)
      for (int r = 0; r < size(); ++r)
        if (all[2 * static_cast<std::size_t>(r)] == color)
          keyed.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
      std::sort(keyed.begin(), keyed.end());
      for (std::size_t i = 0; i < keyed.size(); ++i) {
        if (keyed[i].second == me_) my_index = static_cast<int>(i);
        made->members.push_back(g_->members[static_cast<std::size_t>(keyed[i].second)]);
      }
      // Every member has joined this call (the headers matched), so MPI_Comm_split cannot wait on a
      // missing rank; it orders by (key, parent rank) as above.
      check(MPI_Comm_split(g_->comm, color, key, &made->comm), "MPI_Comm_split", where(Desc{Op::split}, g_->seq));
      MPI_Comm_set_errhandler(made->comm, MPI_ERRORS_RETURN);
    });
    made->name = name.empty() ? cat(g_->name, "/", color) : name;
    return MpiComm(world_, std::move(made), my_index);
  }

  // A send that has been posted and may not have been received yet (isend); wait() completes it.
  struct SendHandle {
    struct Posted {
      Header header;  // sent ahead of the data: alive until the send completes
      std::vector<MPI_Request> reqs;
    };
    std::shared_ptr<Posted> posted;
    int peer = 0;
    std::uint64_t seq = 0;
  };

  // Posts buf for group rank `peer` and returns without waiting. buf must stay unchanged and alive
  // until wait(handle) returns. Messages to one peer arrive in the order they were posted.
  template <Element T>
  SendHandle isend(std::span<const T> buf, int peer) {
    const Desc d{Op::send, dtype_of<T>, size_of(buf), size_of(buf), ReduceOp::sum, peer, buf.data(), nullptr};
    check_peer(d, peer, "peer");
    if (peer == me_) fail_local(d, "a rank cannot send to itself", "copy the buffer locally");
    const std::uint64_t seq = ++g_->send_seq[static_cast<std::size_t>(peer)];
    const std::string w = p2p_where(Op::send, seq, peer);
    world_->check_alive([&] { return p2p_call(Op::send, seq, peer); });
    SendHandle h{std::make_shared<SendHandle::Posted>(), peer, seq};
    h.posted->header = Header::of(d, seq);
    post(h.posted->reqs, &h.posted->header, sizeof(Header), peer, p2p_header, true, w);
    // Synchronous: the send completes once the receiver has checked the header and posted its
    // receive, so a receiver that refuses the message (another type or count) is never left behind.
    post(h.posted->reqs, buf.data(), buf.size_bytes(), peer, p2p_data, true, w, true);
    return h;
  }

  // Waits until the message of h has been received.
  void wait(const SendHandle& h) {
    const std::vector<int> peers(h.posted->reqs.size(), g_->members[static_cast<std::size_t>(h.peer)]);
    world_->wait(h.posted->reqs, peers, [&] { return p2p_call(Op::send, h.seq, h.peer); });
    const Header& sent = h.posted->header;
    count(Op::send, sent.in_count, static_cast<DType>(sent.dtype));
  }

  template <Element T>
  void send(std::span<const T> buf, int peer) {
    wait(isend(buf, peer));
  }

  // Gives up a posted send that will not be waited for (its owner is failing): its header stays
  // alive with the world, since MPI may still read it. Never throws.
  void cancel(const SendHandle& h) noexcept {
    try {
      abandoned_.push_back(h.posted);
    } catch (...) {  // out of memory while failing: the process is ending anyway
    }
  }

  template <Element T>
  void recv(std::span<T> buf, int peer) {
    const Desc d{Op::recv, dtype_of<T>, size_of(buf), size_of(buf), ReduceOp::sum, peer, nullptr, buf.data()};
    check_peer(d, peer, "peer");
    if (peer == me_) fail_local(d, "a rank cannot receive from itself", "copy the buffer locally");
    const std::uint64_t seq = ++g_->recv_seq[static_cast<std::size_t>(peer)];
    const auto call = [&] { return p2p_call(Op::recv, seq, peer); };
    const auto where = [&] { return p2p_where(Op::recv, seq, peer); };
    world_->check_alive(call);
    const int wr = g_->members[static_cast<std::size_t>(peer)];
    Header got;
    std::vector<MPI_Request> reqs;
    post(reqs, &got, sizeof got, peer, p2p_header, false, where());
    world_->wait(reqs, {wr}, call);
    if (static_cast<DType>(got.dtype) != d.dtype || got.in_count != d.in_count) {
      const std::string what = cat("group rank ", peer, " sent ", got.in_count, " ", static_cast<DType>(got.dtype),
                                   " but group rank ", me_, " expected ", d.in_count, " ", d.dtype);
      world_->fail(cat(where(), ": ", what));
      throw Error(where(), what, "post a send and recv of the same type and count");
    }
    reqs.clear();
    post(reqs, buf.data(), buf.size_bytes(), peer, p2p_data, false, where());
    world_->wait(reqs, std::vector<int>(reqs.size(), wr), call, false);
    count(Op::recv, d.in_count, d.dtype);
  }

 private:
  MpiComm(std::shared_ptr<World> w, std::shared_ptr<Group> g, int me)
      : world_(std::move(w)), g_(std::move(g)), me_(me) {
    g_->send_seq.assign(g_->members.size(), 0);
    g_->recv_seq.assign(g_->members.size(), 0);
  }

  // The messages of one collective's body: posted, then waited for together.
  class Exchange {
   public:
    // arrival: the members are joining the call (headers); otherwise the call is committed (world.hpp).
    Exchange(MpiComm& c, std::function<std::string()> call, bool arrival)
        : c_(c), call_(std::move(call)), arrival_(arrival) {}
    template <class T>
    void send(const T* p, std::int64_t n, int peer, int tag) {
      add(const_cast<T*>(p), n * static_cast<std::int64_t>(sizeof(T)), peer, tag, true);
    }
    template <class T>
    void recv(T* p, std::int64_t n, int peer, int tag) {
      add(p, n * static_cast<std::int64_t>(sizeof(T)), peer, tag, false);
    }
    void wait() {
      c_.world_->wait(reqs_, peers_, call_, arrival_);
      reqs_.clear();
      peers_.clear();
    }

   private:
    void add(void* p, std::int64_t bytes, int peer, int tag, bool out) {
      if (bytes <= 0) return;
      c_.post(reqs_, p, static_cast<std::size_t>(bytes), peer, tag, out, c_.world_where(call_()));
      peers_.resize(reqs_.size(), c_.g_->members[static_cast<std::size_t>(peer)]);
    }
    MpiComm& c_;
    std::function<std::string()> call_;
    bool arrival_;
    std::vector<MPI_Request> reqs_;
    std::vector<int> peers_;
  };

  // Posts one message as pieces of at most 1 GiB (MPI counts are int); synchronous: MPI_Issend.
  void post(std::vector<MPI_Request>& reqs, const void* p, std::size_t bytes, int peer, int tag, bool out,
            const std::string& where, bool synchronous = false) {
    constexpr std::size_t piece = std::size_t{1} << 30;
    auto* at = static_cast<char*>(const_cast<void*>(p));
    do {
      const int n = static_cast<int>(std::min(bytes, piece));
      MPI_Request r;
      const int rc = !out          ? MPI_Irecv(at, n, MPI_BYTE, peer, tag, g_->comm, &r)
                     : synchronous ? MPI_Issend(at, n, MPI_BYTE, peer, tag, g_->comm, &r)
                                   : MPI_Isend(at, n, MPI_BYTE, peer, tag, g_->comm, &r);
      if (rc != MPI_SUCCESS) {
        world_->fail(cat(where, ": ", out ? "MPI_Isend" : "MPI_Irecv", " failed"));
        check(rc, out ? "MPI_Isend" : "MPI_Irecv", where);
      }
      reqs.push_back(r);
      at += n;
      bytes -= static_cast<std::size_t>(n);
    } while (bytes > 0);
  }

  std::string world_where(const std::string& call) const { return cat(call, " at world rank ", world_rank()); }

  template <class T>
  static std::int64_t size_of(std::span<T> s) {
    return static_cast<std::int64_t>(s.size());
  }

  // The call, as errors name it: "all_reduce #3 on tensor[d0,p0]{0,1}"; where() adds the rank.
  std::string call(const Desc& d, std::uint64_t seq) const {
    return cat(threads::name(d.op), " #", seq, " on ", name());
  }
  std::string where(const Desc& d, std::uint64_t seq) const { return world_where(call(d, seq)); }
  std::string p2p_call(Op op, std::uint64_t seq, int peer) const {
    return cat(threads::name(op), " #", seq, op == Op::send ? " to" : " from", " group rank ", peer, " on ", name());
  }
  std::string p2p_where(Op op, std::uint64_t seq, int peer) const { return world_where(p2p_call(op, seq, peer)); }

  [[noreturn]] void fail_local(const Desc& d, const std::string& what, const std::string& fix) {
    const std::string w = where(d, g_->seq + 1);
    world_->fail(cat(w, ": ", what));
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

  // The collective protocol: headers with every member, the check, then body(exchange).
  template <class Body>
  void collective(const Desc& d, Body&& body) {
    const std::uint64_t seq = ++g_->seq;
    const auto c = [&] { return call(d, seq); };
    const auto w = [&] { return where(d, seq); };
    world_->check_alive(c);
    const int n = size();
    const Header mine = Header::of(d, seq);
    std::vector<Header> all(static_cast<std::size_t>(n));
    all[static_cast<std::size_t>(me_)] = mine;
    {
      Exchange x(*this, c, true);
      for (int p = 0; p < n; ++p) {
        if (p == me_) continue;
        x.send(&mine, 1, p, header);
        x.recv(&all[static_cast<std::size_t>(p)], 1, p, header);
      }
      x.wait();
    }
    const bool same =
        std::all_of(all.begin(), all.end(), [&](const Header& h) { return h.seq == seq && h.desc().same_call(d); });
    if (!same) {
      std::string calls;
      for (std::size_t r = 0; r < all.size(); ++r)
        calls += cat(r ? ", " : "", "world rank ", g_->members[r], " called ", all[r].desc().str(),
                     all[r].seq != seq ? cat(" as #", all[r].seq) : std::string());
      const std::string what = cat("mismatched collective #", seq, " on ", name(), ": ", calls);
      world_->fail(what);
      throw Error(w(), what, "every rank of a group must make the same collective calls in the same order");
    }
    Exchange x(*this, c, false);
    body(x);
    count(d.op, d.op == Op::all_gather ? d.out_count : d.in_count, d.dtype);
  }

  void count(Op op, std::int64_t elements, DType t) {
    g_->counters.calls[static_cast<std::size_t>(op)] += 1;
    g_->counters.bytes[static_cast<std::size_t>(op)] += static_cast<std::uint64_t>(elements) * weft::size_of(t);
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<Group> g_;
  int me_ = 0;
  std::vector<std::shared_ptr<SendHandle::Posted>> abandoned_;
};

static_assert(Communicator<MpiComm>);

// Runs fn(world) on this process's rank; an exception from fn ends the world for every rank (each
// one's current or next call throws an Error naming this rank and the exception's message), then
// propagates. Errors that only report another rank's failure propagate as they are.
template <class Fn>
  requires std::invocable<Fn&, MpiComm&>
void run(MpiComm& world, Fn&& fn) {
  try {
    fn(world);
  } catch (const FailedElsewhere&) { throw; } catch (const std::exception& e) {
    world.abort(e.what());
    throw;
  }
}

}  // namespace weft::mpi
