// Pipeline schedules as tables, without a model: each table is checked (every forward before its
// backward, W after B, sends paired with receives in order), simulated with zero-latency messages
// (no deadlock for p = 2..8 and m = 1..32), bounded in micro-batches in flight, and its bubble with
// unit costs compared with the paper's closed form. A broken table is reported where it would block.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>

#include "weft/pipeline/schedule.hpp"

using namespace weft;
using namespace weft::pipeline;

// The same code at compile time: tables built and checked by the compiler.
static_assert(static_valid<GPipe, 4, 8>());
static_assert(static_valid<OneFOneB, 4, 8>());
static_assert(static_valid<Interleaved, 4, 8, 2>());
static_assert(static_valid<ZeroBubbleH1, 4, 8>());
// 1F1B on 2 ranks and 2 micro-batches, rank 0: F0, send a0, F1, send a1 + receive g0, B0, receive g1, B1.
constexpr auto k1f1b = static_rank<OneFOneB, 2, 2, 1, 0>();
static_assert(k1f1b.size() == 7 && k1f1b[0] == Action{Do::forward, 0, 0} && k1f1b[2] == Action{Do::forward, 0, 1});
static_assert(k1f1b[3].what == Do::exchange && k1f1b[3].send == Msg{false, 0, 1} && k1f1b[3].recv == Msg{true, 1, 0});
static_assert(k1f1b[4] == Action{Do::backward, 0, 0} && k1f1b[6] == Action{Do::backward, 0, 1});

namespace {

template <class S>
void sweep(int v) {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m) {
      if (S::kind == Kind::interleaved && m % p != 0) continue;
      const Table t = table<S>(p, m, v);
      const auto problem = check(t);
      REQUIRE_MESSAGE(!problem, S::name, " p ", p, " m ", m, ": rank ", problem->rank, " action ", problem->action,
                      ": ", problem->what);
      const Simulation sim = simulate(t, unit_costs(t));
      REQUIRE_MESSAGE(sim.completed, S::name, " p ", p, " m ", m, ": ", sim.blocked->what);
      for (int r = 0; r < p; ++r) {
        // Micro-batches in flight (forwards whose backward has not run), per rank.
        const int bound = S::kind == Kind::gpipe         ? m
                          : S::kind == Kind::interleaved ? std::min(m * v, (p - r - 1) * 2 + (v - 1) * p + 1)
                                                         : std::min(m, p - r);
        CHECK_MESSAGE(sim.max_in_flight[static_cast<std::size_t>(r)] <= bound, S::name, " p ", p, " m ", m, " rank ",
                      r);
        CHECK(sim.max_in_flight[static_cast<std::size_t>(r)] <= (S::kind == Kind::gpipe         ? m
                                                                 : S::kind == Kind::interleaved ? 3 * p * v
                                                                                                : p));
        // The bubble: exact for GPipe and 1F1B at every m; for interleaved and ZB-H1 from m >= p,
        // where the papers' steady state exists.
        if (S::kind == Kind::gpipe || S::kind == Kind::one_f_one_b || m >= p)
          CHECK_MESSAGE(std::abs(sim.bubble(r) - closed_form_bubble(S::kind, p, m, v)) < 1e-12, S::name, " p ", p,
                        " m ", m, " rank ", r, ": simulated ", sim.bubble(r), ", closed form ",
                        closed_form_bubble(S::kind, p, m, v));
      }
    }
}

}  // namespace

TEST_CASE("GPipe tables: checked, no deadlock for p = 2..8 and m = 1..32, bubble (p-1)/(m+p-1), m in flight") {
  sweep<GPipe>(1);
}
TEST_CASE("1F1B tables: checked, no deadlock, bubble (p-1)/(m+p-1), at most p - r micro-batches in flight on rank r") {
  sweep<OneFOneB>(1);
}
TEST_CASE("interleaved 1F1B tables (V = 2, 3): checked, no deadlock, bubble (p-1)/(V m+p-1)") {
  sweep<Interleaved>(2);
  sweep<Interleaved>(3);
}
TEST_CASE("ZB-H1 tables: checked, no deadlock, W after its B, bubble (p-1)/(3m+p-1) with F = B = W = 1") {
  sweep<ZeroBubbleH1>(1);
  const Table t = table<ZeroBubbleH1>(4, 8);
  CHECK(t.split_weight);
  CHECK(closed_form_bubble(Kind::zero_bubble_h1, 4, 8) < closed_form_bubble(Kind::one_f_one_b, 4, 8) / 2);
}

TEST_CASE(
    "a table with two receives swapped is reported with the rank, the action and the micro-batch where it blocks") {
  // On rank 1 of 1F1B (p 3, m 4), the receive of micro-batch 0's activation and of its gradient trade
  // places: rank 1 now waits for the gradient before it has forwarded the activation that makes it.
  Table t = table<OneFOneB>(3, 4);
  auto& r1 = t.ranks[1];
  int act = -1, grad = -1;
  for (int k = 0; k < static_cast<int>(r1.size()); ++k) {
    const Action& x = r1[static_cast<std::size_t>(k)];
    if (x.what != Do::exchange || !x.recv.present() || x.recv.micro != 0) continue;
    (x.recv.grad ? grad : act) = k;
  }
  REQUIRE(act >= 0);
  REQUIRE(grad > act);
  std::swap(r1[static_cast<std::size_t>(act)].recv, r1[static_cast<std::size_t>(grad)].recv);
  std::swap(r1[static_cast<std::size_t>(act)].recv_from, r1[static_cast<std::size_t>(grad)].recv_from);
  const Simulation sim = simulate(t, unit_costs(t));
  REQUIRE(!sim.completed);
  REQUIRE(sim.blocked);
  CHECK(sim.blocked->rank == 1);
  CHECK(sim.blocked->action == act);
  CHECK(sim.blocked->what ==
        "blocks in an exchange receiving the gradient of stage 2 micro-batch 0 from rank 2, which is itself "
        "blocked before sending it");
  // check() also finds a table whose receives differ from the sends on one channel.
  Table u = table<GPipe>(2, 3);
  for (Action& x : u.ranks[1])
    if (x.what == Do::exchange && x.recv.present() && !x.recv.grad) x.recv.micro = (x.recv.micro + 1) % 3;
  const auto problem = check(u);
  REQUIRE(problem);
  CHECK(problem->rank == 1);
  CHECK(
      problem->what ==
      "receives the activation of stage 0 micro-batch 1 from rank 0 where rank 0 sends the activation of stage 0 micro-batch 0");
}

TEST_CASE("schedules refuse what they cannot run, naming the values") {
  CHECK_THROWS_WITH_AS(table<Interleaved>(4, 6, 2), doctest::Contains("a multiple of the pipe degree"), Error);
  CHECK_THROWS_WITH_AS(table<Interleaved>(4, 8, 1), doctest::Contains(">= 2 virtual stages"), Error);
  CHECK_THROWS_WITH_AS(table<OneFOneB>(4, 8, 2), doctest::Contains("only the interleaved schedule"), Error);
  CHECK_THROWS_WITH_AS(table<GPipe>(0, 8), doctest::Contains(">= 1"), Error);
}

TEST_CASE("docs/pipeline.md shows the pictures these tables draw") {
  std::ifstream f(WEFT_SOURCE_DIR "/docs/pipeline.md");
  REQUIRE(f);
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const Table& t :
       {table<GPipe>(4, 4), table<OneFOneB>(4, 8), table<Interleaved>(4, 8, 2), table<ZeroBubbleH1>(4, 8)})
    CHECK_MESSAGE(doc.find(chart(t)) != std::string::npos, "the doc lacks:\n", chart(t));
}

TEST_CASE("simulate with stage costs: the slowest stage sets the steady state, and wrong sizes are refused") {
  // 1F1B, p 2, m 8, messages of time 0.5: stage 1 costs 3 per forward and backward pair (1 + 2),
  // stage 0 half that; rank 1 is busy 8 x 3 = 24 and waits only for its first activation
  // (stage 0's forward 0.5 plus the message 0.5), so it ends at 25; rank 0's last backward waits for
  // the last gradient (+ 0.5) and takes 1: it ends at 26.5.
  const Table t = table<OneFOneB>(2, 8);
  StageCosts c{{0.5, 1}, {1, 2}, {0, 0}, 0.5};
  const Simulation sim = simulate(t, c);
  CHECK(sim.completed);
  CHECK(sim.end[1] == doctest::Approx(25));
  CHECK(sim.end[0] == doctest::Approx(26.5));
  CHECK(sim.makespan == doctest::Approx(26.5));
  c.forward.pop_back();
  CHECK_THROWS_WITH_AS(simulate(t, c), doctest::Contains("costs for 1, 2 and 2 stages"), Error);
}

namespace {
// Where a message is posted and where it is received: (rank, action index) of its send and receive.
struct Where {
  int rank = -1, at = -1;
};
std::pair<Where, Where> find_message(const Table& t, const Msg& m) {
  Where sent, received;
  for (int r = 0; r < t.p; ++r)
    for (int k = 0; k < static_cast<int>(t.ranks[static_cast<std::size_t>(r)].size()); ++k) {
      const Action& x = t.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
      if (x.what != Do::exchange) continue;
      if (x.send == m) sent = {r, k};
      if (x.recv == m) received = {r, k};
    }
  return {sent, received};
}

// f(kind, p, m, v, table) for every schedule's table on 2 to 4 ranks with 4, 6 and 8 micro-batches
// (V = 2 for the interleaved one), leaving out what make_table refuses.
template <class F>
void for_each_table(F&& f) {
  for (const Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zero_bubble_h1})
    for (int p : {2, 3, 4})
      for (int m : {4, 6, 8})
        for (int v : {1, 2}) {
          if ((v == 2) != (kind == Kind::interleaved) || detail::refusal(kind, p, m, v)) continue;
          CAPTURE(static_cast<int>(kind));
          CAPTURE(p);
          CAPTURE(m);
          f(p, m, make_table(kind, p, m, v));
        }
}
}  // namespace

// The same rule by brute force, for every schedule: a send from r to q at action j is known
// delivered at the first action k >= j of r that receives from q a message q posted after the action
// in which it received the send (strictly after: within one exchange the send may go out before the
// receive completes); -1 where no such receive exists. The executor frees send buffers there and the
// memory plan counts them so, for every schedule, not only 1F1B.
TEST_CASE("delivered equals the brute-force rule for GPipe, 1F1B, interleaved and ZB-H1 on 2 to 4 ranks") {
  int sends = 0, proved = 0;
  for_each_table([&](int p, int, const Table& t) {
    for (int r = 0; r < p; ++r) {
      const auto& acts = t.ranks[static_cast<std::size_t>(r)];
      const std::vector<int> got = delivered(t, r);
      REQUIRE(got.size() == acts.size());
      for (int j = 0; j < static_cast<int>(acts.size()); ++j) {
        const Action& x = acts[static_cast<std::size_t>(j)];
        int want = -1;
        if (x.what == Do::exchange && x.send.present()) {
          ++sends;
          const int q = x.send_to;
          const int received = find_message(t, x.send).second.at;  // on q
          REQUIRE(received >= 0);
          for (int k = j; k < static_cast<int>(acts.size()) && want < 0; ++k) {
            const Action& y = acts[static_cast<std::size_t>(k)];
            if (y.what != Do::exchange || !y.recv.present() || y.recv_from != q) continue;
            const Where posted = find_message(t, y.recv).first;
            REQUIRE(posted.rank == q);
            if (posted.at > received) want = k;
          }
          if (want >= 0) ++proved;
        }
        CAPTURE(r);
        CAPTURE(j);
        CHECK(got[static_cast<std::size_t>(j)] == want);
      }
    }
  });
  // Both outcomes occur: sends proved by a later message, and sends only the run's end frees.
  CHECK(proved > 0);
  CHECK(sends > proved);
}

TEST_CASE("cuts: every rank reaches its point of a cut without waiting on a rank already at its own, on 2 to 4 ranks") {
  // The rule checked by brute force over every message: a receive before the receiver's point of a
  // cut has its send before the sender's point (sends never wait: messages the other way are what a
  // stop drains). Every rank has the same number of cuts, its points never go back, and every rank
  // has a cut strictly inside its step, so a stop can land part-way on each.
  int crossing = 0, inside = 0;
  for_each_table([&](int p, int m, const Table& t) {
    const Cuts c = cuts(t);
    REQUIRE(static_cast<int>(c.at.size()) == p);
    REQUIRE(c.count() >= m);
    for (int r = 0; r < p; ++r) {
      const auto& at = c.at[static_cast<std::size_t>(r)];
      const int end = static_cast<int>(2 * t.ranks[static_cast<std::size_t>(r)].size());
      REQUIRE(static_cast<int>(at.size()) == c.count());
      CHECK(std::is_sorted(at.begin(), at.end()));
      CHECK(std::any_of(at.begin(), at.end(), [&](int x) { return x > 0 && x < end; }));
    }
    for (int cut = 0; cut < c.count(); ++cut)
      for (int r = 0; r < p; ++r) {
        const auto& acts = t.ranks[static_cast<std::size_t>(r)];
        const int mine = c.at[static_cast<std::size_t>(r)][static_cast<std::size_t>(cut)];
        if (mine > 0 && mine < static_cast<int>(2 * acts.size())) ++inside;
        for (int k = 0; k < static_cast<int>(acts.size()); ++k) {
          const Action& x = acts[static_cast<std::size_t>(k)];
          if (x.what != Do::exchange || !x.recv.present()) continue;
          const Where sent = find_message(t, x.recv).first;
          const bool sent_before =
              2 * sent.at + 1 <= c.at[static_cast<std::size_t>(sent.rank)][static_cast<std::size_t>(cut)];
          if (2 * k + 2 <= mine) {
            CAPTURE(cut);
            CAPTURE(r);
            CAPTURE(k);
            CHECK(sent_before);  // received before the cut: sent before it
          } else if (sent_before) {
            ++crossing;  // a stop there receives it
          }
        }
      }
  });
  CHECK(crossing > 0);
  CHECK(inside > 0);
}

TEST_CASE("delivered: a send is freed where a later message from its receiver proves it arrived") {
  // 1F1B, p 2, m 4. Rank 0's activation i is proved delivered by gradient i (rank 1 ran F(i) before
  // B(i)); rank 1's gradient i by activation i + 2 (rank 0 posts it after B(i), which needed the
  // gradient); rank 1's last two gradients only by the run's end.
  const Table t = table<OneFOneB>(2, 4);
  for (int r : {0, 1}) {
    const auto& acts = t.ranks[static_cast<std::size_t>(r)];
    const std::vector<int> at = delivered(t, r);
    REQUIRE(at.size() == acts.size());
    for (std::size_t k = 0; k < acts.size(); ++k) {
      const Action& x = acts[k];
      if (x.what != Do::exchange || !x.send.present()) {
        CHECK(at[k] == -1);
        continue;
      }
      CAPTURE(r);
      CAPTURE(x.send.micro);
      const int i = x.send.micro;
      const Msg proof = r == 0 ? Msg{true, 1, i} : Msg{false, 0, i + 2};
      if (r == 1 && i + 2 >= 4) {
        CHECK(at[k] == -1);
        continue;
      }
      REQUIRE(at[k] >= 0);
      CHECK(acts[static_cast<std::size_t>(at[k])].recv == proof);
    }
  }
}
