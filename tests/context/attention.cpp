// Context parallelism's attention (weft/context/attention.hpp) against one rank's causal attention
// (host::attention_forward and attention_backward over the whole sequence), on 2 and 4 thread
// ranks, both attention types, multi-head and grouped heads; and the chunks' positions and balance
// (weft/context/chunks.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "support/gradcheck.hpp"
#include "support/ranks.hpp"
#include "weft/context/attention.hpp"
#include "weft/ops/all.hpp"

using namespace weft;
using Index = std::int64_t;

namespace {

template <class T>
std::vector<T> random(std::size_t n, std::uint64_t seed) {
  const std::vector<double> x = test::normals(n, seed);
  return std::vector<T>(x.begin(), x.end());
}

// The rows of `full` (B, T, width) at rank r's positions: its local (B, T/c, width).
template <class T>
std::vector<T> rows_of(const std::vector<T>& full, const context::Chunks& ch, int r, Index B, Index width) {
  std::vector<T> local(static_cast<std::size_t>(B * ch.local() * width));
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < ch.local(); ++t)
      std::copy_n(full.begin() + (b * ch.seq + ch.position(r, t)) * width, width,
                  local.begin() + (b * ch.local() + t) * width);
  return local;
}

// The largest difference between `got` and the rows of `want` at rank r's positions, relative to
// the largest element of want.
template <class T>
double rel_rows(const std::vector<T>& got, const std::vector<T>& want, const context::Chunks& ch, int r, Index B,
                Index width) {
  const std::vector<T> expected = rows_of(want, ch, r, B, width);
  double err = 0, scale = 0;
  for (const T& w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (std::size_t i = 0; i < got.size(); ++i)
    err = test::worse(err, std::abs(static_cast<double>(got[i]) - static_cast<double>(expected[i])));
  return err / scale;
}

// The mask m's lengths, where it has them, are B = 2 lengths in host memory.
template <class A, class T>
void check(int c, Index H, Index g, double tolerance, ops::Mask m = {}) {
  const Index B = 2, T_ = 8 * 4, hd = 8, G = H / g, row = G * (g + 2) * hd;
  const auto ch = context::Chunks::of(T_, c);
  const auto qkv = random<T>(static_cast<std::size_t>(B * T_ * row), 11);
  const auto dout = random<T>(static_cast<std::size_t>(B * T_ * H * hd), 12);
  // One rank over the whole sequence: the reference.
  std::vector<T> out(static_cast<std::size_t>(B * T_ * H * hd)), probs(static_cast<std::size_t>(B * H * T_ * T_)),
      dqkv(qkv.size());
  host::attention_forward(out.data(), probs.data(), qkv.data(), B, T_, H, hd, g, m);
  host::attention_backward(dqkv.data(), dout.data(), qkv.data(), probs.data(), B, T_, H, hd, g, m);

  std::vector<double> out_err(static_cast<std::size_t>(c)), grad_err(static_cast<std::size_t>(c));
  test::run_ranks(c, [&](test::World& world) {
    const int r = world.rank();
    const Index Tl = ch.local();
    const auto q = rows_of(qkv, ch, r, B, row), dy = rows_of(dout, ch, r, B, H * hd);
    std::vector<T> y(static_cast<std::size_t>(B * Tl * H * hd)), dq(q.size());
    std::vector<T> lse(static_cast<std::size_t>(B * H * Tl));
    A::forward(world, ch, y.data(), lse.data(), q.data(), B, Tl, H, hd, g, m);
    A::backward(world, ch, dq.data(), dy.data(), y.data(), lse.data(), q.data(), B, Tl, H, hd, g, m);
    out_err[static_cast<std::size_t>(r)] = rel_rows(y, out, ch, r, B, H * hd);
    grad_err[static_cast<std::size_t>(r)] = rel_rows(dq, dqkv, ch, r, B, row);
  });
  for (int r = 0; r < c; ++r) {
    INFO(std::string(A::name), ", context ", c, ", ", H, " heads in groups of ", g, ", rank ", r,
         (m.causal ? ", causal" : ", bidirectional"), (m.lengths ? ", padded" : ""));
    CHECK(out_err[static_cast<std::size_t>(r)] <= tolerance);
    CHECK(grad_err[static_cast<std::size_t>(r)] <= tolerance);
  }
  MESSAGE(std::string(A::name), " context ", c, " g ", g, ": output ",
          *std::max_element(out_err.begin(), out_err.end()), ", dqkv ",
          *std::max_element(grad_err.begin(), grad_err.end()));
}

// The context group with a count of the bytes this rank receives from the others: what a send
// delivers to its peer, and for a collective what its bandwidth-optimal (ring) algorithm brings
// in, (c - 1) / c of an all-gather's output and (c - 1) chunks of a reduce-scatter's.
struct Counting {
  test::World* group;
  std::int64_t received = 0;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
  std::string name() const { return group->name(); }
  template <class T>
  void all_reduce(std::span<T> buf, ReduceOp op) {
    received += 2 * static_cast<std::int64_t>(buf.size_bytes()) * (size() - 1) / size();
    group->all_reduce(buf, op);
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) {
    received += static_cast<std::int64_t>(out.size_bytes()) * (size() - 1);
    group->reduce_scatter(in, out, op);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    received += static_cast<std::int64_t>(out.size_bytes() - in.size_bytes());
    group->all_gather(in, out);
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    received += static_cast<std::int64_t>(out.size_bytes()) * (size() - 1) / size();
    group->all_to_all(in, out);
  }
  template <class T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t> send, std::span<T> out,
                    std::span<const std::int64_t> recv) {
    received += static_cast<std::int64_t>(out.size_bytes()) -
                recv[static_cast<std::size_t>(rank())] * static_cast<std::int64_t>(sizeof(T));
    group->all_to_all_v(in, send, out, recv);
  }
  template <class T>
  void broadcast(std::span<T> buf, int root) {
    if (rank() != root) received += static_cast<std::int64_t>(buf.size_bytes());
    group->broadcast(buf, root);
  }
  template <class T>
  void send(std::span<const T> buf, int peer) {
    group->send(buf, peer);
  }
  template <class T>
  void recv(std::span<T> buf, int peer) {
    received += static_cast<std::int64_t>(buf.size_bytes());
    group->recv(buf, peer);
  }
  void barrier() { group->barrier(); }
  Counting split(int, int) {
    throw Error("Counting::split", "a counted group is not split", "count the groups the split makes instead");
  }
};
static_assert(Communicator<Counting>);

}  // namespace

TEST_CASE_TEMPLATE("context attention moves the bytes of its closed form", A, context::Ring, context::AllGather) {
  // A block: the keys and values of one rank, B (T/c) (H/g) 2 hd elements. Per rank, received:
  //   Ring       forward (c - 1) blocks;  backward (c - 1) blocks and c gradient blocks
  //   AllGather  forward (c - 1) blocks;  backward (c - 1) blocks and (c - 1) gradient blocks
  // (the gradient blocks in S = double here, as the blocks).
  const Index B = 2, T_ = 32, H = 4, g = 2, hd = 8, row = (H / g) * (g + 2) * hd;
  for (int c : {2, 4}) {
    const auto ch = context::Chunks::of(T_, c);
    const Index Tl = ch.local();
    const std::int64_t block = B * Tl * (H / g) * 2 * hd * static_cast<std::int64_t>(sizeof(double));
    std::vector<std::int64_t> forward(static_cast<std::size_t>(c)), backward(static_cast<std::size_t>(c));
    test::run_ranks(c, [&](test::World& world) {
      Counting counted{&world};
      const auto x =
          random<double>(static_cast<std::size_t>(B * Tl * row), 20 + static_cast<std::uint64_t>(world.rank()));
      const auto dy =
          random<double>(static_cast<std::size_t>(B * Tl * H * hd), 30 + static_cast<std::uint64_t>(world.rank()));
      std::vector<double> y(dy.size()), lse(static_cast<std::size_t>(B * H * Tl)), dx(x.size());
      A::forward(counted, ch, y.data(), lse.data(), x.data(), B, Tl, H, hd, g);
      forward[static_cast<std::size_t>(world.rank())] = counted.received;
      A::backward(counted, ch, dx.data(), dy.data(), y.data(), lse.data(), x.data(), B, Tl, H, hd, g);
      backward[static_cast<std::size_t>(world.rank())] =
          counted.received - forward[static_cast<std::size_t>(world.rank())];
    });
    const std::int64_t gradients = std::same_as<A, context::Ring> ? c : c - 1;
    for (int r = 0; r < c; ++r) {
      INFO(std::string(A::name), ", context ", c, ", rank ", r);
      CHECK(forward[static_cast<std::size_t>(r)] == (c - 1) * block);
      CHECK(backward[static_cast<std::size_t>(r)] == (c - 1) * block + gradients * block);
    }
  }
}

namespace {

// A host device whose context blocks note each step's compute in a log, as a user adds an op for
// their own device (ops::ContextBlock is open): the arithmetic is the host's.
struct Traced : Host {
  std::vector<std::string>* log = nullptr;
};

// The buffers of a call on a Traced device.
struct TracedBuffers {
  static constexpr bool compute = true;
  using device_type = Traced;
  Traced dev;
  context::HostBuffers held;
  Traced& device() { return dev; }
  template <class E>
  E* take(std::size_t n, Category c) {
    return held.take<E>(n, c);
  }
};

// The context group with a log of its point-to-point calls: "post" (isend), "recv", "wait".
struct Recording {
  using SendHandle = test::World::SendHandle;
  test::World* group;
  std::vector<std::string>* log;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
  std::string name() const { return group->name(); }
  template <class T>
  void all_reduce(std::span<T> buf, ReduceOp op) {
    group->all_reduce(buf, op);
  }
  template <class T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) {
    group->reduce_scatter(in, out, op);
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    group->all_gather(in, out);
  }
  template <class T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    group->all_to_all(in, out);
  }
  template <class T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t> send, std::span<T> out,
                    std::span<const std::int64_t> recv) {
    group->all_to_all_v(in, send, out, recv);
  }
  template <class T>
  void broadcast(std::span<T> buf, int root) {
    group->broadcast(buf, root);
  }
  template <class T>
  void send(std::span<const T> buf, int peer) {
    log->push_back("send");
    group->send(buf, peer);
  }
  template <class T>
  SendHandle isend(std::span<const T> buf, int peer) {
    log->push_back("post");
    return group->isend(buf, peer);
  }
  void wait(const SendHandle& h) {
    log->push_back("wait");
    group->wait(h);
  }
  void cancel(const SendHandle& h) noexcept { group->cancel(h); }
  template <class T>
  void recv(std::span<T> buf, int peer) {
    log->push_back("recv");
    group->recv(buf, peer);
  }
  void barrier() { group->barrier(); }
  Recording split(int, int) {
    throw Error("Recording::split", "a recorded group is not split", "record the groups the split makes instead");
  }
};
static_assert(Communicator<Recording>);
static_assert(PostsSends<Recording, double>);
static_assert(!PostsSends<Counting, double>);

std::string joined(const std::vector<std::string>& log) {
  std::string s;
  for (const auto& e : log) s += (s.empty() ? "" : " ") + e;
  return s;
}
std::string repeated(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (out.empty() ? "" : " ") + s;
  return out;
}

}  // namespace

template <>
struct weft::ops::ContextBlock<Traced> : ContextBlock<Host> {
  template <class T, class S>
  static void forward(Traced& d, S* o, S* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd, index g,
                      Positions qpos, Positions kpos, Mask m = {}) {
    d.log->push_back("compute");
    ContextBlock<Host>::forward(d, o, lse, qkv, kv, B, Tl, H, hd, g, qpos, kpos, m);
  }
  template <class T, class S>
  static void backward(Traced& d, S* dq, S* dkv, const T* qkv, const T* kv, const T* dout, const S* D, const S* lse,
                       index B, index Tl, index H, index hd, index g, Positions qpos, Positions kpos, Mask m = {}) {
    d.log->push_back("compute");
    ContextBlock<Host>::backward(d, dq, dkv, qkv, kv, dout, D, lse, B, Tl, H, hd, g, qpos, kpos, m);
  }
};

TEST_CASE(
    "the ring posts each key-value block before the step computes on it, and passes the same bits with blocking calls") {
  // Forward, each of the c - 1 steps that pass a block: post it, compute on it, receive the
  // neighbour's, wait for the post; then the last block. Backward, the gradient block is posted once
  // the step has added to it, and goes home after the last step.
  const Index B = 2, T_ = 32, H = 4, g = 2, hd = 8, row = (H / g) * (g + 2) * hd;
  for (int c : {2, 4}) {
    const auto ch = context::Chunks::of(T_, c);
    const Index Tl = ch.local();
    std::vector<std::string> forward_log(static_cast<std::size_t>(c)), backward_log(static_cast<std::size_t>(c));
    std::vector<int> same(static_cast<std::size_t>(c), 0);
    test::run_ranks(c, [&](test::World& world) {
      const auto r = static_cast<std::size_t>(world.rank());
      const auto x = random<double>(static_cast<std::size_t>(B * Tl * row), 40 + r);
      const auto dy = random<double>(static_cast<std::size_t>(B * Tl * H * hd), 50 + r);
      std::vector<double> y(dy.size()), lse(static_cast<std::size_t>(B * H * Tl)), dx(x.size());
      std::vector<std::string> log;
      Recording recorded{&world, &log};
      TracedBuffers fw;
      fw.dev.log = &log;
      context::Ring::forward(recorded, ch, y.data(), lse.data(), x.data(), B, Tl, H, hd, g, {}, fw);
      forward_log[r] = joined(log);
      log.clear();
      TracedBuffers bw;
      bw.dev.log = &log;
      context::Ring::backward(recorded, ch, dx.data(), dy.data(), y.data(), lse.data(), x.data(), B, Tl, H, hd, g, {},
                              bw);
      backward_log[r] = joined(log);
      // The same call on a group without isend: blocking sends ordered by rank parity.
      Counting blocking{&world};
      std::vector<double> y2(y.size()), lse2(lse.size()), dx2(dx.size());
      context::Ring::forward(blocking, ch, y2.data(), lse2.data(), x.data(), B, Tl, H, hd, g);
      context::Ring::backward(blocking, ch, dx2.data(), dy.data(), y2.data(), lse2.data(), x.data(), B, Tl, H, hd, g);
      same[r] = y == y2 && lse == lse2 && dx == dx2;
    });
    const std::string fw = repeated("post compute recv wait", c - 1) + " compute";
    const std::string bw = repeated("post compute post recv recv wait wait", c - 1) + " compute post recv wait";
    for (int r = 0; r < c; ++r) {
      INFO("context ", c, ", rank ", r);
      CHECK(forward_log[static_cast<std::size_t>(r)] == fw);
      CHECK(backward_log[static_cast<std::size_t>(r)] == bw);
      CHECK(same[static_cast<std::size_t>(r)] == 1);  // bitwise: the same arithmetic in the same order
    }
  }
}

TEST_CASE("context chunks: a permutation of the sequence, the same causal work on every rank, bad sizes refused") {
  for (int c : {1, 2, 3, 4}) {
    const auto ch = context::Chunks::of(48, c);
    std::vector<Index> seen;
    for (int r = 0; r < c; ++r) {
      Index work = 0;
      for (Index t = 0; t < ch.local(); ++t) {
        seen.push_back(ch.position(r, t));
        work += ch.position(r, t) + 1;  // a query at position p sees p + 1 keys
      }
      const Index h = ch.chunk();
      CHECK(work == 2 * c * h * h + h);  // the closed form of chunks.hpp, the same for every rank
    }
    std::sort(seen.begin(), seen.end());
    std::vector<Index> all(48);
    std::iota(all.begin(), all.end(), 0);
    CHECK(seen == all);
    // Any window of a rank's rows (sequence parallelism's slice of them, which can straddle the two
    // chunks) has the positions of those rows.
    for (int r = 0; r < c; ++r)
      for (Index first = 0; first < ch.local(); ++first) {
        const ops::Positions p = ch.positions(r).from(first);
        for (Index t = 0; first + t < ch.local(); ++t) CHECK(p.at(t) == ch.position(r, first + t));
      }
  }
  const auto ch = context::Chunks::of(16, 2);  // chunks of 4: rank 0 holds 0-3 and 12-15, rank 1 4-11
  CHECK(ch.position(0, 4) == 12);
  CHECK(ch.position(1, 0) == 4);
  CHECK(ch.position(1, 7) == 11);
  CHECK_THROWS_WITH_AS(context::Chunks::of(30, 4),
                       doctest::Contains("a sequence of 30 tokens does not split into 2 x 4 = 8 equal chunks"), Error);
  CHECK_THROWS_WITH_AS(context::Chunks::of(16, 0), doctest::Contains("a context degree of 0"), Error);
  // Sequence parallelism inside: the tensor degree must divide a context rank's rows.
  CHECK_NOTHROW(context::require_tensor_split("GPT-2", 16, 2, 4));
  CHECK_NOTHROW(context::require_tensor_split("GPT-2", 12, 1, 5));  // no context axis: not this check's
  CHECK_THROWS_WITH_AS(
      context::require_tensor_split("GPT-2", 12, 2, 4),
      "GPT-2: sequence parallelism inside context parallelism needs the tensor degree 4 to divide each context "
      "rank's 6 rows (a sequence of 12 over 2 context ranks); use a tensor degree that divides 6, such as 1, 2, 3, 6, "
      "or a longer sequence",
      Error);
}

TEST_CASE_TEMPLATE(
    "context attention equals one rank's in double (1e-12): ring and all-gather, context 2 and 4, grouped heads", A,
    context::Ring, context::AllGather) {
  // Double: the blocks' log-sum-exp merge and the one-rank softmax differ by rounding alone
  // (about 1e-16 per operation over 32 keys).
  for (int c : {2, 4})
    for (Index g : {1, 2}) check<A, double>(c, 4, g, 1e-12);
}

TEST_CASE_TEMPLATE(
    "context attention equals one rank's in double (1e-12) without a mask and with padding, on 2 and 4 ranks", A,
    context::Ring, context::AllGather) {
  // The mask is by position in the whole sequence, so every rank's two chunks see the keys one
  // rank's attention lets them see. Lengths 32 (no padding) and 11: on 4 ranks (chunks of 4) the
  // second sample's keys 11.. are padding, a chunk partly and five chunks wholly (blocks that add
  // nothing to a query, as the future does when causal). Tolerance as above.
  const std::vector<std::int32_t> lengths{32, 11};
  for (int c : {2, 4})
    for (Index g : {1, 2}) {
      check<A, double>(c, 4, g, 1e-12, {.causal = false});
      check<A, double>(c, 4, g, 1e-12, {.causal = false, .lengths = lengths.data()});
      check<A, double>(c, 4, g, 1e-12, {.causal = true, .lengths = lengths.data()});
    }
}

TEST_CASE_TEMPLATE("context attention refuses padding lengths outside 1..T, naming the sample", A, context::Ring,
                   context::AllGather) {
  const auto ch = context::Chunks::of(16, 2);
  for (std::int32_t bad : {0, 17}) {
    const std::vector<std::int32_t> lengths{16, bad};
    std::vector<std::string> what(2);
    test::run_ranks(2, [&](test::World& world) {
      std::vector<double> qkv(2 * 8 * 3 * 8), out(2 * 8 * 8), lse(2 * 8);
      try {
        A::forward(world, ch, out.data(), lse.data(), qkv.data(), 2, 8, 1, 8, 1, {.lengths = lengths.data()});
      } catch (const Error& e) { what[static_cast<std::size_t>(world.rank())] = e.what(); }
    });
    for (const std::string& w : what)
      CHECK(w == cat("context::", A::name == std::string("ring") ? "Ring" : "AllGather", "::forward: sample 1 has ",
                     bad,
                     " valid positions of 16; give each sample a length from 1 to the sequence length (padding at "
                     "the end)"));
  }
}

TEST_CASE_TEMPLATE("context attention equals one rank's in f32 (1e-5)", A, context::Ring, context::AllGather) {
  // f32: sums of 32 keys and 8 dimensions in other orders and exp/log of the merge, each about 1e-7
  // relative; 1e-5 of the largest element leaves a margin of 10 and is far below a wrong mask or
  // merge (order 1e-1).
  check<A, float>(4, 4, 2, 1e-5);
}

TEST_CASE("context attention refuses chunks that do not match the group or the rows") {
  std::vector<std::string> wrong_degree(2), wrong_rows(2);
  test::run_ranks(2, [&](test::World& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    std::vector<double> qkv(16 * 3 * 8), out(16 * 8), lse(16);
    try {  // chunks made for 4 ranks, used on 2
      context::Ring::forward(world, context::Chunks::of(16, 4), out.data(), lse.data(), qkv.data(), 1, 4, 1, 8);
    } catch (const Error& e) { wrong_degree[r] = e.what(); }
    try {  // 4 rows where T 16 over 2 ranks gives 8
      context::AllGather::forward(world, context::Chunks::of(16, 2), out.data(), lse.data(), qkv.data(), 1, 4, 1, 8);
    } catch (const Error& e) { wrong_rows[r] = e.what(); }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(wrong_degree[r].find("context::Ring::forward: chunks of a context degree 4 on a communicator of 2 ranks") !=
          std::string::npos);
    CHECK(wrong_rows[r].find("4 local rows where the chunks give each rank 8") != std::string::npos);
  }
}
