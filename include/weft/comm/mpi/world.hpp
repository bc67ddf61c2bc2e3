// The process-wide side of the MPI back end: who the other ranks are (pid and machine, to tell a
// dead peer from a slow one), the failure notices ranks send each other, the stop signal, and the
// one polling loop every blocking call waits in.
//
// Decisions that are not obvious:
// - Every wait polls (MPI_Testall plus a short sleep) instead of blocking in MPI, so it can give up:
//   at the deadline, when a notice says another rank failed, when a peer on this machine has exited,
//   or when the launcher asks this process to stop (mpirun sends SIGTERM to every rank once one has
//   died). The error names the rank waited for, the operation and its sequence number.
// - A failure is announced to every rank on a communicator of its own (a notice of at most 1 KiB,
//   sent without waiting), so a rank in another group, waiting on a rank that waits on the failed
//   one, reports the cause rather than its own timeout.
// - A deadline that expires starts a short round of "gave up" notices (which ranks each one was
//   waiting for, in which call), for at most one more second: the rank to blame is the one that was
//   waited for and did not give up itself (it is stalled, or busy outside communication). So every
//   rank names the stalled rank and the call it missed, not the neighbour it happened to wait on.
// - After a failure the world is dead: every later call throws at once. MPI requests still pending
//   are left to MPI_Finalize or the process's exit; nothing reads them again.
//
// Include only where <mpi.h> is available (the weft::mpi CMake target).
#pragma once

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "weft/comm/threads/world.hpp"  // FailedElsewhere, Op, Desc, Counters: shared with the thread back end
#include "weft/core/error.hpp"

namespace weft::mpi {

using threads::FailedElsewhere;
using Clock = std::chrono::steady_clock;

struct Options {
  std::chrono::milliseconds deadline{60'000};  // every blocking call gives up after this long
};

// Set by the handler Session installs for SIGTERM and SIGINT; every wait checks it.
inline std::atomic<int>& stop_signal() {
  static std::atomic<int> s{0};
  return s;
}
// How many waits are in progress (the handler acts at once when none is).
inline std::atomic<int>& waiting() {
  static std::atomic<int> n{0};
  return n;
}
// Set once this process has raised a communication error: it is on its way out with a message.
inline std::atomic<bool>& failing() {
  static std::atomic<bool> f{false};
  return f;
}

// Throws Error naming `what` when an MPI call fails (the communicators return errors, never abort).
inline void check(int rc, const char* call, const std::string& where) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(where, cat(call, " failed: ", std::string(text, static_cast<std::size_t>(len))),
              "check that every rank is alive and that the MPI installation works (mpirun -np 2 hostname)");
}

// This machine: its host name and boot id, so two containers that share a host name still differ.
inline std::uint64_t machine_id() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string b;
  if (boot >> b) id += "/" + b;
  return std::hash<std::string>{}(id);
}

// Whether process `pid` on this machine has exited (gone, or a zombie not yet reaped).
inline bool exited(int pid) {
  std::ifstream stat(cat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto close = line.rfind(')');  // "pid (comm) S ...": the state follows the command name
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z' || line[close + 2] == 'X';
}

class World {
 public:
  // Collective over MPI_COMM_WORLD. Requires: MPI initialized (Session).
  explicit World(Options opts) : opts_(opts) {
    if (opts_.deadline.count() <= 0)
      throw Error("mpi::World", cat("deadline of ", opts_.deadline.count(), " ms"), "use a positive deadline");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &notices_), "MPI_Comm_dup", "mpi::World");
    MPI_Comm_set_errhandler(notices_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(notices_, &rank_);
    MPI_Comm_size(notices_, &size_);
    struct Me {
      std::uint64_t machine;
      std::int64_t pid;
    } me{machine_id(), static_cast<std::int64_t>(::getpid())};
    std::vector<Me> all(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, notices_), "MPI_Allgather",
          "mpi::World (start-up)");
    for (const Me& m : all) peers_.push_back({static_cast<int>(m.pid), m.machine == me.machine});
    post_notice_recv();
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (notice_req_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&notice_req_);
      MPI_Request_free(&notice_req_);
    }
    // notices_ is not freed: see MpiComm's Group for why.
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return opts_; }

  // Records this rank's failure and tells every other rank (once; later failures are consequences).
  void fail(const std::string& why) {
    failing() = true;
    if (failure_) return;
    failure_ = cat("world rank ", rank_, " failed: ", why);
    send_notice('F', {}, why);
  }

  // Throws when the world has failed (here or elsewhere) or another rank gave up waiting. call():
  // the call being made, as "all_reduce #3 on tensor[d0,p0]{0,1}".
  void check_alive(const std::function<std::string()>& call) {
    poll_notices();
    std::string cause;
    if (!failure_ && !gave_up_.empty() && !waited_for_me()) {  // a stall elsewhere: join the blame round
      std::vector<MPI_Request> none;
      resolve_stall(none, {}, call);
    }
    if (failure_) cause = *failure_;
    else if (!gave_up_.empty())  // this rank is the one they waited for
      cause = cat("world rank ", gave_up_[0].from, " gave up waiting for ", ranks_text(gave_up_[0].waits_for), " in ",
                  gave_up_[0].text, " (deadline ", opts_.deadline.count(), " ms)");
    else if (const int sig = stop_signal().load(); sig && waiting().load() == 0)
      cause = cat("the launcher sent signal ", sig, " (it stops every rank when one fails)", dead_note());
    if (!cause.empty()) throw_failed_elsewhere(call, cause);
  }

  // Waits for `reqs` (their peers: the world ranks they exchange with) until all complete, polling
  // the stop signal, the peers' liveness, the deadline and, when `arrival`, the notices. Throws Error
  // naming the call and the peers still outstanding, after cancelling the requests left, so MPI
  // never writes into a buffer its owner frees while unwinding.
  //
  // arrival: waiting for the members to join a call (its headers). Once all have joined, the call is
  // committed: a notice of a failure elsewhere no longer stops it, since the members it waits for
  // have sent or will send everything (a member that dies is still caught by liveness or deadline).
  void wait(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::function<std::string()>& call,
            bool arrival = true) {
    try {
      poll(reqs, peers, call, arrival);
    } catch (...) {
      cancel(reqs);
      throw;
    }
  }

 private:
  void poll(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const std::function<std::string()>& call,
            bool arrival) {
    const auto where = [&] { return this->where(call); };
    struct Waiting {
      Waiting() { ++mpi::waiting(); }
      ~Waiting() { --mpi::waiting(); }
    } in_wait;
    const auto start = Clock::now(), until = start + opts_.deadline;
    std::vector<int> indices;
    auto next_liveness = start + std::chrono::milliseconds(100);
    for (std::uint64_t spins = 0;; ++spins) {
      // MPI_Testsome sets each completed request to MPI_REQUEST_NULL, so those left name the peers
      // still outstanding (MPI_Testall would leave every request untouched until all complete).
      int completed = 0;
      indices.resize(reqs.size());
      const int rc =
          MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &completed, indices.data(), MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        const std::string why = cat(where(), ": MPI reported an error (code ", rc, ")");
        fail(why);
        check(rc, "MPI_Testsome", where());
      }
      if (completed == MPI_UNDEFINED) return;  // no active request left
      if (arrival) {
        poll_notices();
        if (failure_) throw_failed_elsewhere(call);
        if (!gave_up_.empty()) resolve_stall(reqs, peers, call);  // another rank's deadline expired
      }
      const auto now = Clock::now();
      if (const int sig = stop_signal().load()) {
        const std::string why =
            cat("stopped by signal ", sig, " while waiting for ", ranks_text(outstanding(reqs, peers)), dead_note());
        fail(cat(where(), ": ", why));
        throw Error(where(), why, "the launcher stops every rank when one fails; look for the first rank's error");
      }
      if (now >= next_liveness) {
        next_liveness = now + std::chrono::milliseconds(100);
        for (std::size_t i = 0; i < reqs.size(); ++i)
          if (reqs[i] != MPI_REQUEST_NULL && peer_exited(peers[i])) {
            const std::string why = cat("world rank ", peers[i], " (pid ",
                                        peers_[static_cast<std::size_t>(peers[i])].pid, " on this machine) has exited");
            fail(cat(where(), ": ", why));
            throw Error(where(), why, "see that rank's output for its cause (a crash, a kill, running out of memory)");
          }
      }
      if (now >= until) {
        if (arrival) resolve_stall(reqs, peers, call);
        const std::string why = cat(ranks_text(outstanding(reqs, peers)), " did not complete ", call(), " within the ",
                                    opts_.deadline.count(), " ms deadline", dead_note());
        fail(cat(where(), ": ", why));
        throw Error(where(), why, "a rank has died or stalled mid-transfer; see the other ranks' errors");
      }
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(spins > 20'000 ? 500 : 20));
      else std::this_thread::yield();
    }
  }

  // Cancels the requests still active and gives them 100 ms to finish (a receive already matched
  // completes with its data); any left then are released to complete in the background.
  static void cancel(std::vector<MPI_Request>& reqs) {
    for (MPI_Request& r : reqs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    std::vector<int> indices(reqs.size());
    int completed = 0;
    while (Clock::now() < until) {
      MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &completed, indices.data(), MPI_STATUSES_IGNORE);
      if (completed == MPI_UNDEFINED) return;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (MPI_Request& r : reqs)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

  static constexpr int kNotice = 1024, kNoticeTag = 7;
  struct Peer {
    int pid;
    bool local;  // on this machine, so its liveness can be read
  };

  std::string where(const std::function<std::string()>& call) const { return cat(call(), " at world rank ", rank_); }

  [[noreturn]] void throw_failed_elsewhere(const std::function<std::string()>& call, const std::string& cause = {}) {
    failing() = true;
    throw FailedElsewhere(where(call), cat("aborted because ", cause.empty() ? *failure_ : cause),
                          "fix the first failure; this rank stopped because of it");
  }

  bool peer_exited(int world_rank) const {
    const Peer& p = peers_[static_cast<std::size_t>(world_rank)];
    return p.local && world_rank != rank_ && exited(p.pid);
  }
  bool waited_for_me() const {
    return std::any_of(gave_up_.begin(), gave_up_.end(), [&](const Notice& n) {
      return std::find(n.waits_for.begin(), n.waits_for.end(), rank_) != n.waits_for.end();
    });
  }

  static std::vector<int> outstanding(std::vector<MPI_Request>& reqs, const std::vector<int>& peers) {
    std::vector<int> waiting;
    for (std::size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i] != MPI_REQUEST_NULL && std::find(waiting.begin(), waiting.end(), peers[i]) == waiting.end())
        waiting.push_back(peers[i]);
    std::sort(waiting.begin(), waiting.end());
    return waiting;
  }
  static std::string ranks_text(const std::vector<int>& ranks) {
    return cat(ranks.size() == 1 ? "world rank " : "world ranks ", join(ranks));
  }

  // This rank's deadline expired in `call`, or another rank's did: tell the others which ranks this
  // one waits for, collect their notices for up to a second, and throw Error naming the rank that
  // was waited for and did not give up itself, and the call in which it was missed.
  [[noreturn]] void resolve_stall(std::vector<MPI_Request>& reqs, const std::vector<int>& peers,
                                  const std::function<std::string()>& call) {
    failing() = true;
    const std::vector<int> mine = outstanding(reqs, peers);
    send_notice('T', mine, call());
    const auto grace = Clock::now() + std::min<std::chrono::milliseconds>(opts_.deadline, std::chrono::seconds(1));
    std::vector<int> blamed;
    for (;;) {
      poll_notices();
      std::vector<bool> reported(static_cast<std::size_t>(size_), false), waited(reported);
      reported[static_cast<std::size_t>(rank_)] = true;
      for (int r : mine) waited[static_cast<std::size_t>(r)] = true;
      for (const Notice& n : gave_up_) {
        reported[static_cast<std::size_t>(n.from)] = true;
        for (int r : n.waits_for) waited[static_cast<std::size_t>(r)] = true;
      }
      blamed.clear();
      int silent = 0;
      for (int r = 0; r < size_; ++r) {
        if (waited[static_cast<std::size_t>(r)] && !reported[static_cast<std::size_t>(r)]) blamed.push_back(r);
        silent += !reported[static_cast<std::size_t>(r)];
      }
      // Done when a failure notice names a cause, when every rank has reported (a cycle), or at the
      // end of the grace: a rank slow to report cannot be told from a stalled one any sooner.
      if (failure_ || silent == 0 || Clock::now() >= grace) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (failure_) throw_failed_elsewhere(call);
    const std::string fix =
        "a rank has stalled or died, or the ranks issued different collectives; raise the deadline if a step "
        "legitimately takes longer";
    if (blamed.empty()) {  // every rank waits for another: a cycle
      const std::string why = cat(ranks_text(mine), " did not reach ", call(), " within the ", opts_.deadline.count(),
                                  " ms deadline, and every rank was waiting for another: a deadlock");
      failure_ = cat("world rank ", rank_, " failed: ", why);
      throw Error(where(call), why, "every rank of a group must make the same collective calls in the same order");
    }
    // The call in which the first blamed rank was missed: this rank's, or a reporting rank's.
    std::string missed = call(), by = cat("this rank");
    if (std::find(mine.begin(), mine.end(), blamed[0]) == mine.end())
      for (const Notice& n : gave_up_)
        if (std::find(n.waits_for.begin(), n.waits_for.end(), blamed[0]) != n.waits_for.end()) {
          missed = n.text;
          by = cat("world rank ", n.from);
          break;
        }
    const std::string why = cat(ranks_text(blamed), " did not reach ", missed, " within the ", opts_.deadline.count(),
                                " ms deadline", by == "this rank" ? "" : cat(" (", by, " waited for it there)"));
    failure_ = cat("world rank ", rank_, " failed: ", why);
    throw Error(where(call), why, fix);
  }

  struct Notice {
    int from = 0;
    std::vector<int> waits_for;
    std::string text;  // a failure's cause, or the call a rank gave up waiting in
  };

  // kind 'F' (failure: text is the cause) or 'T' (gave up waiting for `waits_for` in the call `text`).
  void send_notice(char kind, const std::vector<int>& waits_for, const std::string& text) {
    std::string msg = cat(kind, join(waits_for, ","), "|", text).substr(0, kNotice - 1);
    auto& buf = sent_.emplace_back(msg.begin(), msg.end());
    buf.push_back('\0');
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request req;
      if (MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_CHAR, r, kNoticeTag, notices_, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);  // never waited for: the receiver may be dead
    }
  }

  // " (world rank K has exited)" for the first rank of the world on this machine that has exited.
  std::string dead_note() const {
    for (int r = 0; r < size_; ++r)
      if (peer_exited(r))
        return cat(" (world rank ", r, ", pid ", peers_[static_cast<std::size_t>(r)].pid, ", has exited)");
    return {};
  }

  void post_notice_recv() {
    MPI_Irecv(notice_.data(), kNotice, MPI_CHAR, MPI_ANY_SOURCE, kNoticeTag, notices_, &notice_req_);
  }
  void poll_notices() {
    for (;;) {
      if (notice_req_ == MPI_REQUEST_NULL) return;
      int got = 0;
      MPI_Status st;
      if (MPI_Test(&notice_req_, &got, &st) != MPI_SUCCESS || !got) return;
      notice_.back() = '\0';
      const std::string msg = notice_.data();
      post_notice_recv();
      const auto bar = msg.find('|');
      if (msg.empty() || bar == std::string::npos) continue;
      if (msg[0] == 'F') {
        if (!failure_) failure_ = cat("world rank ", st.MPI_SOURCE, " failed: ", msg.substr(bar + 1));
        continue;
      }
      Notice n{st.MPI_SOURCE, {}, msg.substr(bar + 1)};
      std::size_t at = 1;
      while (at < bar) {
        const auto comma = std::min(msg.find(',', at), bar);
        n.waits_for.push_back(std::atoi(msg.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
      if (std::all_of(n.waits_for.begin(), n.waits_for.end(), [&](int r) { return r >= 0 && r < size_; }))
        gave_up_.push_back(std::move(n));
    }
  }

  Options opts_;
  MPI_Comm notices_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<Peer> peers_;
  std::optional<std::string> failure_;  // the first failure's cause, from here or a notice
  std::vector<Notice> gave_up_;         // ranks that gave up waiting, in the order their notices came
  std::array<char, kNotice> notice_{};
  MPI_Request notice_req_ = MPI_REQUEST_NULL;
  std::vector<std::vector<char>> sent_;  // notices in flight: alive until the process ends
};

}  // namespace weft::mpi
