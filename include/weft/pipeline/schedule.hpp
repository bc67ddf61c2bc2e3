// Pipeline schedules as types that produce tables.
//
// The model's stages are cut into S = p V virtual stages over the p ranks of the pipe axis: virtual
// stage s lives on rank s % p as its chunk s / p (V = 1: stage s is rank s). A schedule's table
// lists, for every rank, the actions it runs for one optimizer step of m micro-batches, in order:
//
//   forward(s, i)     the forward of virtual stage s on micro-batch i
//   backward(s, i)    its backward: the input gradient, and with it the weight gradient unless the
//                     schedule splits them
//   weight(s, i)      the weight-gradient part alone (ZB-H1)
//   exchange          at most one send and one receive between two computes: the activation a
//                     forward just made (to the rank of s + 1) and/or the gradient a backward just made
//                     (to the rank of s - 1), and what the next compute needs. The send is posted and
//                     does not wait (isend: the executor keeps the buffer until it is delivered);
//                     the receive waits for its message. Messages between two ranks arrive in order.
//
//   schedule            order of computes per rank                         bubble (unit costs)
//   GPipe               all forwards, then all backwards                    (p-1)/(m+p-1)
//   OneFOneB            p-r-1 forwards, then forward/backward pairs, then   (p-1)/(m+p-1)
//                       the remaining backwards (PipeDream-flush)
//   Interleaved         1F1B over V chunks per rank, micro-batches in       (p-1)/(V m+p-1)
//                       groups of p (Narayanan et al., 2021); m % p == 0
//   ZeroBubbleH1        1F1B order with each backward split into B and W;   (p-1)/(3m+p-1) with
//                       rank r defers its W by r backwards (Qi et al., 2023) F = B = W = 1
//
// The bubble is idle time over the step's time per rank, with a forward costing 1 and a backward
// (input and weight gradient) 2, per chunk; for ZB-H1 the B and W parts cost 1 each. The same code
// builds a table at compile time (static_table<S, p, m, V>(), a constexpr array checked with
// static_assert) and at start-up (table<S>(p, m, V)); check() and simulate() run on either.
//
// This header is plain C++20 (constexpr std::vector).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::pipeline {

enum class Do : std::uint8_t { forward, backward, weight, exchange };

constexpr const char* name(Do d) {
  switch (d) {
    case Do::forward: return "forward";
    case Do::backward: return "backward";
    case Do::weight: return "weight";
    case Do::exchange: return "exchange";
  }
  return "?";
}

// A message between neighbouring virtual stages: the activation stage -> stage + 1, or the
// gradient stage -> stage - 1, of one micro-batch. stage < 0: no message.
struct Msg {
  bool grad = false;
  int stage = -1;  // the sending virtual stage
  int micro = 0;
  constexpr bool present() const { return stage >= 0; }
  constexpr bool operator==(const Msg&) const = default;
};

struct Action {
  constexpr Action() = default;
  constexpr explicit Action(Do w, int s = 0, int m = 0) : what(w), stage(s), micro(m) {}
  Do what = Do::forward;
  int stage = 0;  // compute: the virtual stage
  int micro = 0;
  Msg send, recv;                    // exchange
  int send_to = -1, recv_from = -1;  // exchange: pipe ranks
  constexpr bool operator==(const Action&) const = default;
};

struct Table {
  int p = 1, m = 1, v = 1;
  bool split_weight = false;  // backward is B alone and W is its own action
  std::vector<std::vector<Action>> ranks;
  constexpr int stages() const { return p * v; }
};

enum class Kind : std::uint8_t { gpipe, one_f_one_b, interleaved, zero_bubble_h1 };

// The schedule a trainer's --schedule names: gpipe, 1f1b, interleaved or zb (ZB-H1); 1F1B for any
// other name (the command line admits only these four).
inline Kind kind_named(const std::string& name) {
  if (name == "gpipe") return Kind::gpipe;
  if (name == "interleaved") return Kind::interleaved;
  if (name == "zb") return Kind::zero_bubble_h1;
  return Kind::one_f_one_b;
}

struct GPipe {
  static constexpr Kind kind = Kind::gpipe;
  static constexpr const char* name = "gpipe";
};
struct OneFOneB {
  static constexpr Kind kind = Kind::one_f_one_b;
  static constexpr const char* name = "1f1b";
};
struct Interleaved {
  static constexpr Kind kind = Kind::interleaved;
  static constexpr const char* name = "interleaved";
};
struct ZeroBubbleH1 {
  static constexpr Kind kind = Kind::zero_bubble_h1;
  static constexpr const char* name = "zb";
};

template <class S>
concept Schedule = requires {
  { S::kind } -> std::convertible_to<Kind>;
  { S::name } -> std::convertible_to<const char*>;
};

// A problem with a table: which rank, which of its actions, and what.
struct Problem {
  int rank = -1, action = -1;
  std::string what;
};

namespace detail {

struct Compute {
  Do what;
  int stage, micro;
};

// Why (p, m, v) cannot be scheduled by `kind`, or nothing.
constexpr const char* refusal(Kind kind, int p, int m, int v) {
  if (p < 1 || m < 1 || v < 1) return "the pipe degree, micro-batches and virtual stages must each be >= 1";
  if (kind == Kind::interleaved && v < 2) return "the interleaved schedule needs >= 2 virtual stages per rank";
  if (kind != Kind::interleaved && v != 1)
    return "only the interleaved schedule has more than 1 virtual stage per rank";
  if (kind == Kind::interleaved && m % p != 0)
    return "the interleaved schedule needs a number of micro-batches that is a multiple of the pipe degree";
  return nullptr;
}

// The order of computes on rank r.
constexpr std::vector<Compute> computes(Kind kind, int p, int m, int v, int r) {
  std::vector<Compute> out;
  const int total = m * v;
  auto fwd = [&](int k) {  // the k-th forward of this rank
    if (kind != Kind::interleaved) return Compute{Do::forward, r, k};
    const int chunk = (k % (p * v)) / p, micro = k / (p * v) * p + k % p;
    return Compute{Do::forward, chunk * p + r, micro};
  };
  auto bwd = [&](int k) {
    if (kind != Kind::interleaved) return Compute{Do::backward, r, k};
    const int chunk = v - 1 - (k % (p * v)) / p, micro = k / (p * v) * p + k % p;
    return Compute{Do::backward, chunk * p + r, micro};
  };
  if (kind == Kind::gpipe) {
    for (int i = 0; i < m; ++i) out.push_back(fwd(i));
    for (int i = 0; i < m; ++i) out.push_back(bwd(i));
    return out;
  }
  int warmup = kind == Kind::interleaved ? (p - r - 1) * 2 + (v - 1) * p : p - r - 1;
  warmup = std::min(warmup, total);
  const int steady = total - warmup;
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int k = 0; k < steady; ++k) {
    out.push_back(fwd(warmup + k));
    out.push_back(bwd(k));
  }
  for (int k = steady; k < total; ++k) out.push_back(bwd(k));
  if (kind != Kind::zero_bubble_h1) return out;
  // ZB-H1: after each backward, the W of the backward r places earlier (rank r keeps at most r
  // weight-gradient passes pending); the rest at the end.
  std::vector<Compute> zb;
  std::vector<int> done_b;
  std::size_t next_w = 0;
  for (const Compute& c : out) {
    zb.push_back(c);
    if (c.what != Do::backward) continue;
    done_b.push_back(c.micro);
    while (done_b.size() - next_w > static_cast<std::size_t>(r)) zb.push_back({Do::weight, r, done_b[next_w++]});
  }
  while (next_w < done_b.size()) zb.push_back({Do::weight, r, done_b[next_w++]});
  return zb;
}

}  // namespace detail

// The table of `kind` for p ranks, m micro-batches and v virtual stages per rank. Throws Error
// naming the values where the schedule cannot run them.
inline constexpr double kMaxComputes = 1 << 24;  // a table's computes (2 p m v) at most

constexpr Table make_table(Kind kind, int p, int m, int v = 1) {
  if (const char* why = detail::refusal(kind, p, m, v))
    throw Error("pipeline schedule", why, "choose a pipe degree, micro-batch count and virtual stages that fit");
  // A table holds every rank's forward and backward of every micro-batch: past 2^24 computes it is
  // gigabytes, and its replay (the plan, a simulation) minutes.
  if (const double computes = 2.0 * p * m * v; computes > kMaxComputes)
    throw Error("pipeline schedule",
                cat(p, " pipe ranks x ", m, " micro-batches x ", v, " virtual stages: ", computes,
                    " computes, more than a table holds (2^24)"),
                "use fewer micro-batches per step (a larger micro-batch) or fewer pipe ranks");
  Table t{p, m, v, kind == Kind::zero_bubble_h1, {}};
  const int S = p * v;
  t.ranks.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& out = t.ranks[static_cast<std::size_t>(r)];
    Action pending{Do::exchange};  // the send of the last compute, waiting for the next recv
    bool has_pending = false;
    auto flush = [&] {
      if (has_pending) out.push_back(pending);
      pending = Action{Do::exchange};
      has_pending = false;
    };
    for (const detail::Compute& c : detail::computes(kind, p, m, v, r)) {
      Msg need;  // what this compute receives first
      int from = -1;
      if (c.what == Do::forward && c.stage > 0) {
        need = {false, c.stage - 1, c.micro};
        from = (c.stage - 1) % p;
      } else if (c.what == Do::backward && c.stage < S - 1) {
        need = {true, c.stage + 1, c.micro};
        from = (c.stage + 1) % p;
      }
      if (need.present()) {
        pending.recv = need;
        pending.recv_from = from;
        has_pending = true;
      }
      flush();
      out.push_back(Action{c.what, c.stage, c.micro});
      if (c.what == Do::forward && c.stage < S - 1) {
        pending.send = {false, c.stage, c.micro};
        pending.send_to = (c.stage + 1) % p;
        has_pending = true;
      } else if (c.what == Do::backward && c.stage > 0) {
        pending.send = {true, c.stage, c.micro};
        pending.send_to = (c.stage - 1) % p;
        has_pending = true;
      }
    }
    flush();
  }
  return t;
}

template <Schedule S>
Table table(int p, int m, int v = 1) {
  return make_table(S::kind, p, m, v);
}

namespace detail {

// The checks of check() below, written once for compile time and run time: on a problem it calls
// report(rank, action, describe) and stops; describe() builds the message (run time only).
template <class Report>
constexpr bool scan(const Table& t, Report&& report) {
  const int S = t.stages(), p = t.p;
  for (int r = 0; r < p; ++r) {
    const auto& acts = t.ranks[static_cast<std::size_t>(r)];
    std::vector<int> fpos(static_cast<std::size_t>(S * t.m), -1), bpos(fpos), wpos(fpos);
    for (int a = 0; a < static_cast<int>(acts.size()); ++a) {
      const Action& x = acts[static_cast<std::size_t>(a)];
      if (x.what == Do::exchange) {
        if (x.send.present() && x.send_to != (x.send.grad ? x.send.stage - 1 : x.send.stage + 1) % p)
          return report(r, a, [=] {
            return cat("sends ", x.send.grad ? "the gradient" : "the activation", " of stage ", x.send.stage,
                       " micro-batch ", x.send.micro, " to rank ", x.send_to, ", not its neighbour's rank");
          });
        continue;
      }
      if (x.stage < 0 || x.stage >= S || x.stage % p != r || x.micro < 0 || x.micro >= t.m)
        return report(r, a, [=] {
          return cat(name(x.what), " of stage ", x.stage, " micro-batch ", x.micro, " does not belong to rank ", r);
        });
      auto& pos = x.what == Do::forward ? fpos : x.what == Do::backward ? bpos : wpos;
      int& at = pos[static_cast<std::size_t>(x.stage * t.m + x.micro)];
      if (at >= 0)
        return report(
            r, a, [=] { return cat(name(x.what), " of stage ", x.stage, " micro-batch ", x.micro, " runs twice"); });
      at = a;
    }
    for (int s = r; s < S; s += p)
      for (int i = 0; i < t.m; ++i) {
        const auto k = static_cast<std::size_t>(s * t.m + i);
        const int f = fpos[k], b = bpos[k], w = wpos[k];
        if (f < 0 || b < 0 || (t.split_weight && w < 0))
          return report(r, -1, [=] {
            return cat("stage ", s, " micro-batch ", i, " lacks its ",
                       f < 0   ? "forward"
                       : b < 0 ? "backward"
                               : "weight gradient");
          });
        if (b < f)
          return report(
              r, b, [=] { return cat("the backward of stage ", s, " micro-batch ", i, " runs before its forward"); });
        if (t.split_weight && w < b)
          return report(r, w, [=] {
            return cat("the weight gradient of stage ", s, " micro-batch ", i, " runs before its backward");
          });
      }
  }
  // Pairing: for each (a -> b), the sends of a to b and the receives of b from a, in order.
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      std::vector<Msg> sent, received;
      std::vector<int> sent_at, received_at;
      for (int k = 0; k < static_cast<int>(t.ranks[static_cast<std::size_t>(a)].size()); ++k) {
        const Action& x = t.ranks[static_cast<std::size_t>(a)][static_cast<std::size_t>(k)];
        if (x.what == Do::exchange && x.send.present() && x.send_to == b) {
          sent.push_back(x.send);
          sent_at.push_back(k);
        }
      }
      for (int k = 0; k < static_cast<int>(t.ranks[static_cast<std::size_t>(b)].size()); ++k) {
        const Action& x = t.ranks[static_cast<std::size_t>(b)][static_cast<std::size_t>(k)];
        if (x.what == Do::exchange && x.recv.present() && x.recv_from == a) {
          received.push_back(x.recv);
          received_at.push_back(k);
        }
      }
      for (std::size_t i = 0; i < std::max(sent.size(), received.size()); ++i) {
        if (i >= received.size())
          return report(a, sent_at[i],
                        [=] { return cat("sends message ", i, " to rank ", b, " which never receives it"); });
        if (i >= sent.size())
          return report(b, received_at[i],
                        [=] { return cat("receives message ", i, " from rank ", a, " which never sends it"); });
        if (!(sent[i] == received[i])) {
          const Msg s = sent[i], q = received[i];
          return report(b, received_at[i], [=] {
            return cat("receives ", q.grad ? "the gradient" : "the activation", " of stage ", q.stage, " micro-batch ",
                       q.micro, " from rank ", a, " where rank ", a, " sends ",
                       s.grad ? "the gradient" : "the activation", " of stage ", s.stage, " micro-batch ", s.micro);
          });
        }
      }
    }
  return true;
}

}  // namespace detail

// Checks a table: every virtual stage's forward and backward (and weight) of every micro-batch
// runs once on its rank; forward before backward, weight after backward; every exchange sends to
// the neighbouring stage's rank; and between every ordered pair of ranks the messages one sends are
// the messages the other receives, in the same order. Returns the first problem, or nothing.
inline std::optional<Problem> check(const Table& t) {
  std::optional<Problem> out;
  detail::scan(t, [&](int r, int a, auto describe) {
    out = Problem{r, a, describe()};
    return false;
  });
  return out;
}

// The same checks at compile time (static_assert(pipeline::valid(...))).
constexpr bool valid(const Table& t) {
  return detail::scan(t, [](int, int, auto) { return false; });
}

// When each send of rank r is known to be delivered: for every action index of r, the index of the
// exchange after whose receive the send posted there has arrived (-1: no later message tells; the
// run's end waits for it). A message from q posted after q received our send proves the send
// arrived; messages between two ranks arrive in order, so each receive from q frees a prefix of the
// sends to q still held. The executor frees send buffers there, and the memory plan counts them so.
constexpr std::vector<int> delivered(const Table& t, int r) {
  const int S = t.stages();
  const auto key = [&](const Msg& x) {
    return static_cast<std::size_t>(((x.grad ? 1 : 0) * S + x.stage) * t.m + x.micro);
  };
  const std::size_t keys = static_cast<std::size_t>(2 * S * t.m);
  std::vector<int> sent_at(keys, -1), received_at(keys, -1);  // action index on the sending / receiving rank
  for (const auto& acts : t.ranks)
    for (int k = 0; k < static_cast<int>(acts.size()); ++k) {
      const Action& x = acts[static_cast<std::size_t>(k)];
      if (x.what != Do::exchange) continue;
      if (x.send.present()) sent_at[key(x.send)] = k;
      if (x.recv.present()) received_at[key(x.recv)] = k;
    }
  const auto& acts = t.ranks[static_cast<std::size_t>(r)];
  std::vector<int> out(acts.size(), -1);
  std::vector<std::vector<int>> held(static_cast<std::size_t>(t.p));  // per peer: our sends, in order
  std::vector<std::size_t> head(static_cast<std::size_t>(t.p), 0);
  for (int k = 0; k < static_cast<int>(acts.size()); ++k) {
    const Action& x = acts[static_cast<std::size_t>(k)];
    if (x.what != Do::exchange) continue;
    if (x.send.present()) held[static_cast<std::size_t>(x.send_to)].push_back(k);
    if (!x.recv.present()) continue;
    const auto q = static_cast<std::size_t>(x.recv_from);
    const int posted = sent_at[key(x.recv)];  // on q
    while (head[q] < held[q].size()) {
      const int j = held[q][head[q]];
      if (received_at[key(acts[static_cast<std::size_t>(j)].send)] >= posted) break;
      out[static_cast<std::size_t>(j)] = k;
      ++head[q];
    }
  }
  return out;
}

// Costs of one chunk's passes for the simulation.
struct Costs {
  double forward = 1, backward = 2, weight = 0;  // backward: B + W where the schedule does not split
};

// Costs per virtual stage (the stages differ: the first holds the embedding, the last the head),
// and a message's time from its send to its arrival.
struct StageCosts {
  std::vector<double> forward, backward, weight;  // per virtual stage
  double message = 0;
};

struct Simulation {
  bool completed = false;
  double makespan = 0;
  std::vector<double> busy;                // per rank
  std::vector<int> max_in_flight;          // per rank: forwards done whose backward has not run
  std::vector<std::vector<double>> start;  // per rank and action: when it started (-1: never)
  std::vector<double> end;                 // per rank: when its last action ended
  std::optional<Problem> blocked;          // where the lowest blocked rank stopped, when not completed
  double bubble(int r) const { return makespan > 0 ? 1.0 - busy[static_cast<std::size_t>(r)] / makespan : 0.0; }
};

// Runs a table with the exchange's semantics: a send is posted when its rank reaches the exchange
// and never waits; a receive completes `c.message` after its message was posted. A deadlock leaves
// ranks blocked: `blocked` names the one that blocked first (the others wait for it, directly or
// not), the action and the message it waits for.
inline Simulation simulate(const Table& t, const StageCosts& c) {
  const auto S = static_cast<std::size_t>(t.stages());
  if (c.forward.size() != S || c.backward.size() != S || c.weight.size() != S)
    throw Error("pipeline::simulate",
                cat("costs for ", c.forward.size(), ", ", c.backward.size(), " and ", c.weight.size(),
                    " stages (forward, backward, weight) for a table of ", S, " virtual stages"),
                "give one cost per virtual stage");
  const int p = t.p;
  Simulation sim;
  sim.busy.assign(static_cast<std::size_t>(p), 0.0);
  sim.max_in_flight.assign(static_cast<std::size_t>(p), 0);
  // Where each message is sent and received: (rank, action index).
  auto key = [&](const Msg& x) {
    return static_cast<std::size_t>(((x.grad ? 1 : 0) * t.stages() + x.stage) * t.m + x.micro);
  };
  const std::size_t keys = static_cast<std::size_t>(2 * t.stages() * t.m);
  std::vector<std::pair<int, int>> sender(keys, {-1, -1});
  for (int r = 0; r < p; ++r)
    for (int k = 0; k < static_cast<int>(t.ranks[static_cast<std::size_t>(r)].size()); ++k) {
      const Action& x = t.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
      if (x.what != Do::exchange) continue;
      if (x.send.present()) sender[key(x.send)] = {r, k};
    }
  std::vector<std::size_t> pc(static_cast<std::size_t>(p), 0);
  std::vector<double> now(static_cast<std::size_t>(p), 0.0);
  std::vector<std::vector<double>> posted(static_cast<std::size_t>(p));
  std::vector<int> in_flight(static_cast<std::size_t>(p), 0);
  for (int r = 0; r < p; ++r)
    posted[static_cast<std::size_t>(r)].assign(t.ranks[static_cast<std::size_t>(r)].size(), -1.0);
  sim.start = posted;
  auto posted_at = [&](std::pair<int, int> where) {
    return where.first < 0 ? -1.0
                           : posted[static_cast<std::size_t>(where.first)][static_cast<std::size_t>(where.second)];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto& acts = t.ranks[ur];
      while (pc[ur] < acts.size()) {
        const Action& x = acts[pc[ur]];
        if (x.what != Do::exchange) {
          const auto st = static_cast<std::size_t>(x.stage);
          const double cost = x.what == Do::forward    ? c.forward[st]
                              : x.what == Do::backward ? c.backward[st]
                                                       : c.weight[st];
          sim.start[ur][pc[ur]] = now[ur];
          now[ur] += cost;
          sim.busy[ur] += cost;
          if (x.what == Do::forward) sim.max_in_flight[ur] = std::max(sim.max_in_flight[ur], ++in_flight[ur]);
          if (x.what == Do::backward) --in_flight[ur];
          ++pc[ur];
          progress = true;
          continue;
        }
        double& mine = posted[ur][pc[ur]];
        if (mine < 0) {
          mine = now[ur];
          progress = true;
        }
        const double from = x.recv.present() ? posted_at(sender[key(x.recv)]) : 0.0;
        if (from < 0) break;  // the message has not been sent yet
        now[ur] = std::max(now[ur], x.recv.present() ? from + c.message : from);
        ++pc[ur];
        progress = true;
      }
    }
  }
  sim.completed = true;
  sim.end = now;
  double first_block = 0;
  for (int r = 0; r < p; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    sim.makespan = std::max(sim.makespan, now[ur]);
    // Of the blocked ranks, the one that blocked first (the others wait, directly or not, for it).
    if (pc[ur] < t.ranks[ur].size() && (sim.completed || now[ur] < first_block)) {
      sim.completed = false;
      first_block = now[ur];
      const Action& x = t.ranks[ur][pc[ur]];
      sim.blocked = Problem{r, static_cast<int>(pc[ur]),
                            cat("blocks in an exchange receiving the ", x.recv.grad ? "gradient" : "activation",
                                " of stage ", x.recv.stage, " micro-batch ", x.recv.micro, " from rank ", x.recv_from,
                                ", which is itself blocked before sending it")};
    }
  }
  return sim;
}

// The same costs on every stage, and messages that take no time.
inline Simulation simulate(const Table& t, Costs c) {
  const auto S = static_cast<std::size_t>(t.stages());
  return simulate(t, StageCosts{std::vector<double>(S, c.forward), std::vector<double>(S, c.backward),
                                std::vector<double>(S, c.weight), 0});
}

inline Costs unit_costs(const Table& t) { return t.split_weight ? Costs{1, 1, 1} : Costs{1, 2, 0}; }

// Where a pipelined step can stop on every rank at once: points of each rank's actions such that
// no rank waits, before its point, for a message that another rank sends only after its own. A
// point is a position in a rank's actions: 2 k is before action k, 2 k + 1 between the send and the
// receive of exchange k (the executor posts the send, then receives), 2 n after the last action.
//
// Cut c is the same on every rank: with the table run on unit costs (simulate), each rank's point
// is after every part of its actions that ends by the time T_c, T_c the c-th end of a compute on
// any rank (the last end, where every rank has finished, is not one). A receive that completes by
// T_c has its message posted by T_c, so its send lies before the sender's point: every rank reaches
// its point of cut c without waiting for a rank that is already at its own. Messages posted before
// a cut and received after it are the ones a stop must still receive (Pipeline::run drains them).
struct Cuts {
  std::vector<std::vector<int>> at;  // [rank][cut]: the rank's point of each cut, in order
  int count() const { return at.empty() ? 0 : static_cast<int>(at[0].size()); }
};

inline Cuts cuts(const Table& t) {
  const Costs c = unit_costs(t);
  const Simulation sim = simulate(t, c);
  Cuts out;
  out.at.resize(static_cast<std::size_t>(t.p));
  if (!sim.completed) return out;  // a table that deadlocks has no such points (check() refuses it)
  // Each rank's parts in order, as (time the part is done, the point after it).
  std::vector<std::vector<std::pair<double, int>>> parts(static_cast<std::size_t>(t.p));
  std::vector<double> ends;
  for (int r = 0; r < t.p; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const auto& acts = t.ranks[ur];
    for (std::size_t k = 0; k < acts.size(); ++k) {
      const Action& x = acts[k];
      const double start = sim.start[ur][k];
      const double next = k + 1 < acts.size() ? sim.start[ur][k + 1] : sim.end[ur];  // when the rank moves on
      const int after = static_cast<int>(2 * (k + 1));
      if (x.what == Do::exchange) {
        parts[ur].push_back({start, static_cast<int>(2 * k + 1)});  // the send, posted on arrival
        parts[ur].push_back({next, after});                         // the receive, complete when it moves on
      } else {
        const double end = start + (x.what == Do::forward ? c.forward : x.what == Do::backward ? c.backward : c.weight);
        parts[ur].push_back({end, after});
        ends.push_back(end);
      }
    }
  }
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  if (!ends.empty()) ends.pop_back();  // every rank is done by the last
  for (int r = 0; r < t.p; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    std::size_t done = 0;
    for (double T : ends) {
      while (done < parts[ur].size() && parts[ur][done].first <= T) ++done;
      out.at[ur].push_back(done == 0 ? 0 : parts[ur][done - 1].second);
    }
  }
  return out;
}

// A text picture of a table on a time line of unit costs (one column per unit), one row per rank:
// forward of micro-batch i as the digit i, its backward as the letter a + i (one per column of its
// cost: two for a backward with its weight gradient), its split weight gradient as A + i, idle as
// "." (micro-batches 0 .. 9). Interleaved chunks are not told apart.
inline std::string chart(const Table& t) {
  const Costs c = unit_costs(t);
  const Simulation sim = simulate(t, c);
  const int width = static_cast<int>(sim.makespan);
  std::string out;
  for (int r = 0; r < t.p; ++r) {
    std::string row(static_cast<std::size_t>(width), '.');
    const auto& acts = t.ranks[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < acts.size(); ++k) {
      const Action& x = acts[k];
      const double at = sim.start[static_cast<std::size_t>(r)][k];
      if (x.what == Do::exchange || at < 0) continue;
      const int i = x.micro % 10;
      const char g = static_cast<char>(x.what == Do::forward ? '0' + i : x.what == Do::backward ? 'a' + i : 'A' + i);
      const double len = x.what == Do::forward ? c.forward : x.what == Do::backward ? c.backward : c.weight;
      for (int col = static_cast<int>(at); col < static_cast<int>(at + len) && col < width; ++col)
        row[static_cast<std::size_t>(col)] = g;
    }
    out += cat("rank ", r, " |", row, "|\n");
  }
  return out;
}

// The bubble fraction of a schedule in the model above (unit forward cost, backward 2, ZB's B and
// W 1 each), from the papers' formulas.
constexpr double closed_form_bubble(Kind kind, int p, int m, int v = 1) {
  const double P = p - 1;
  switch (kind) {
    case Kind::gpipe:
    case Kind::one_f_one_b: return P / (m + P);
    case Kind::interleaved: return P / (static_cast<double>(v) * m + P);
    case Kind::zero_bubble_h1: return P / (3.0 * m + P);
  }
  return 0;
}

// A table at compile time, for p, m and V known to the compiler: rank R's actions as a constexpr
// array, and whether the whole table passes check().
template <Schedule S, int P, int M, int V = 1>
consteval bool static_valid() {
  return valid(make_table(S::kind, P, M, V));
}
template <Schedule S, int P, int M, int V, int R>
consteval std::size_t static_length() {
  return make_table(S::kind, P, M, V).ranks[static_cast<std::size_t>(R)].size();
}
template <Schedule S, int P, int M, int V, int R>
consteval std::array<Action, static_length<S, P, M, V, R>()> static_rank() {
  std::array<Action, static_length<S, P, M, V, R>()> out{};
  const Table t = make_table(S::kind, P, M, V);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = t.ranks[static_cast<std::size_t>(R)][i];
  return out;
}

}  // namespace weft::pipeline
