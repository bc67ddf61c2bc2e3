// Attention with the sequence sharded over the context axis, two ways as types, on any device
// with ops::ContextBlock (ops/context_block.hpp: the host's; context_block.cuh: the Cuda device's),
// the device of the call's buffer source:
//
//   context::Ring       keys and values passed around the ring of c ranks (c - 1 steps); each step
//                       attends the local queries to the block it holds, and the partial results
//                       merge by their log-sum-exp. The backward passes the keys and values around
//                       again with their gradients, which end where they started (c steps).
//   context::AllGather  keys and values all-gathered once (Llama 3's choice: simpler, c times the
//                       key-value memory); the backward reduce-scatters their gradients.
//
// Each rank holds T / c rows of the sequence in the chunks of context::Chunks (rank r: chunks r and
// 2c - 1 - r), in the row layout of ops::Attention (H heads of size hd in groups of g sharing a key
// and a value):
//   qkv  (B, T/c, H/g, g + 2, hd)   this rank's rows
//   out  (B, T/c, H, hd)
//   lse  (B, H, T/c)                each query row's log-sum-exp of its scaled scores, in S: what
//                                   the backward needs instead of the (T/c, T) probabilities
// The mask (ops::Mask: causal unless told, padding lengths in the device's memory; on the host they
// are checked against T) is by position in the sequence (Chunks::position), so a block whose keys a
// query does not see (all after it, or all padding) contributes nothing to it. Sums run in S = accumulate_t<T>; in
// double both types equal one rank's ops::Attention to rounding (tests/context/attention.cpp: 1e-12); on the GPU in
// float, the host's in double to 1e-5 (tests/device/cuda/context.cu, where a GPU is).
//
// Communication per rank, a block being B (T/c) (H/g) 2 hd elements: Ring sends and receives c - 1
// blocks forward, and c - 1 blocks and c gradient blocks (in S) backward; AllGather gathers c - 1
// blocks forward, gathers them again backward (the forward keeps nothing) and reduce-scatters the c
// gradient blocks. Where the communicator posts sends (isend and wait: threads, MPI, the Meta
// device's), each step posts its key-value block to the next rank before it computes on it, and
// receives the previous rank's after: the transfer overlaps the step's compute, and no rank waits
// for a neighbour that is still computing before it can start its own. (Backward, the gradient
// block is sent after the step that adds to it.) Without isend (NCCL here) the send and receive
// block, ordered by rank parity so that they cannot deadlock.
// The buffers each call works in come from a Buffers source (below), so that the layers count them
// on their device's allocator: per rank, Ring holds 2 blocks forward and 2 blocks and 2 gradient
// blocks backward; AllGather c + 1 blocks forward and (c + 1) blocks and gradient blocks backward.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/context/chunks.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"
#include "weft/layout/transition.hpp"
#include "weft/ops/context_block.hpp"
#include "weft/ops/mask.hpp"

namespace weft::context {

namespace detail {

// Passes `mine` to the next rank of the ring and receives the previous rank's into `theirs`; even
// ranks send first, odd ranks receive first, so blocking sends always find their receiver.
template <Communicator C, class E>
void ring_shift(C& comm, std::span<const E> mine, std::span<E> theirs) {
  const int r = comm.rank(), c = comm.size(), next = (r + 1) % c, prev = (r + c - 1) % c;
  if (r % 2 == 0) {
    comm.send(mine, next);
    comm.recv(theirs, prev);
  } else {
    comm.recv(theirs, prev);
    comm.send(mine, next);
  }
}

// One step's passes around the ring, each send posted as soon as its block is final: post(mine)
// sends mine to the next rank (mine must stay unchanged until finish), finish(theirs...) receives
// the previous rank's blocks in the order they were posted, each the size of this rank's, and waits
// for this rank's sends. Where the communicator does not post sends, finish passes the blocks one
// by one with blocking calls (ring_shift). If the step unwinds before finish, the posted sends are
// withdrawn, so no neighbour reads a freed buffer.
template <Communicator C, std::size_t N>
class Shift {
 public:
  explicit Shift(C& comm) : comm_(comm) {}
  Shift(const Shift&) = delete;
  Shift& operator=(const Shift&) = delete;
  ~Shift() {
    if constexpr (posts)
      for (std::size_t i = 0; i < n_; ++i) comm_.cancel(sent_[i]);
  }

  template <class B>
  void post(std::span<const B> mine) {
    static_assert(weft::PostsSends<C, B> == posts,
                  "context::detail::Shift: a communicator posts sends of every element type or none");
    if (n_ == N)
      throw Error("context::detail::Shift::post", cat("a block past the ", N, " this shift holds"),
                  "finish the shift first");
    if constexpr (posts) sent_[n_] = comm_.isend(mine, (comm_.rank() + 1) % comm_.size());
    else sent_[n_] = mine.data();
    ++n_;
  }

  template <class... B>
  void finish(std::span<B>... theirs) {
    if (sizeof...(B) != n_)
      throw Error("context::detail::Shift::finish", cat(sizeof...(B), " blocks to receive for ", n_, " posted"),
                  "receive one block for each posted");
    const int prev = (comm_.rank() + comm_.size() - 1) % comm_.size();
    std::size_t i = 0;
    if constexpr (posts) {
      (comm_.recv(theirs, prev), ...);
      for (; i < n_; ++i) comm_.wait(sent_[i]);
    } else {
      const auto pass = [&](auto into) {
        using B1 = typename decltype(into)::element_type;
        ring_shift(comm_, std::span<const B1>(static_cast<const B1*>(sent_[i++]), into.size()), into);
      };
      (pass(theirs), ...);
    }
    n_ = 0;
  }

 private:
  static constexpr bool posts = weft::PostsSends<C, float>;
  template <class D, bool>
  struct Handle {
    using type = const void*;  // without posted sends: this rank's block, passed in finish
  };
  template <class D>
  struct Handle<D, true> {
    using type = typename D::SendHandle;
  };
  C& comm_;
  std::size_t n_ = 0;
  std::array<typename Handle<C, posts>::type, N> sent_{};
};

inline void require(const Chunks& ch, int ranks, index Tl, index H, index g, const char* where) {
  if (ch.degree != ranks)
    throw Error(where, cat("chunks of a context degree ", ch.degree, " on a communicator of ", ranks, " ranks"),
                "build the Chunks with the context group's size");
  if (Tl != ch.local())
    throw Error(
        where,
        cat(Tl, " local rows where the chunks give each rank ", ch.local(), " (T ", ch.seq, " over ", ch.degree, ")"),
        "pass the rank's T / c rows");
  if (g < 1 || H % g != 0)
    throw Error(where, cat(H, " heads in groups of ", g), "use a group size that divides the heads");
}

// The mask's lengths, where they are in host memory (the Host device's buffers): each in [1, T].
template <class W>
void check_mask(const ops::Mask& m, index B, const Chunks& ch, const char* where) {
  if constexpr (std::same_as<typename W::device_type, Host>) ops::check_lengths(m, B, ch.seq, where);
}

// The sizes every call works with, after the checks: one key-value block (what travels), the
// output and the qkv rows in elements, and the log-sum-exp rows.
struct Sizes {
  int r, c;
  std::size_t block, out, rows, qkv;
  Sizes(const Chunks& ch, int rank, int size, index B, index Tl, index H, index hd, index g, const char* where)
      : r(rank), c(size) {
    require(ch, size, Tl, H, g, where);
    block = static_cast<std::size_t>(B * Tl * (H / g) * 2 * hd);
    out = static_cast<std::size_t>(B * Tl * H * hd);
    rows = static_cast<std::size_t>(B * H * Tl);
    qkv = static_cast<std::size_t>(B * Tl * (H / g) * (g + 2) * hd);
  }
};

}  // namespace detail

// Where a call's buffers come from (the travelling key-value blocks and their gradients:
// Category::communication; the S accumulators of the output and the gradients:
// Category::activations), and whether it computes. A call takes each buffer once and the source
// keeps them until it is destroyed, so the caller decides how long they live. HostBuffers keeps
// std::vectors of its own (the default); nn/context_attention.hpp takes them from the layer's device
// allocator, so the host allocator and the plan (the Meta device, where compute is false: the same
// buffers and collectives without the arithmetic) count them.
template <class W>
concept Buffers = requires(W& w, std::size_t n) {
  { w.template take<float>(n, Category::activations) } -> std::same_as<float*>;
  { W::compute } -> std::convertible_to<bool>;
  { w.device() } -> std::same_as<typename W::device_type&>;  // whose ops::ContextBlock computes
};

class HostBuffers {
 public:
  static constexpr bool compute = true;
  using device_type = Host;
  Host& device() { return dev_; }
  template <class E>
  E* take(std::size_t n, Category) {
    auto p = std::make_shared<E[]>(n);
    held_.push_back(p);
    return p.get();
  }

 private:
  Host dev_;
  std::vector<std::shared_ptr<void>> held_;
};

namespace detail {
// The calls without a buffer source, for an attention type A: A's, with a HostBuffers of their own.
template <class A>
struct HostCalls {
  template <Communicator C, class T, class S = accumulate_t<T>>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd,
                      index g = 1, ops::Mask m = {}) {
    HostBuffers w;
    A::forward(comm, ch, out, lse, qkv, B, Tl, H, hd, g, m, w);
  }
  template <Communicator C, class T, class S = accumulate_t<T>>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g = 1, ops::Mask m = {}) {
    HostBuffers w;
    A::backward(comm, ch, dqkv, dout, out, lse, qkv, B, Tl, H, hd, g, m, w);
  }
};

// One step of describe's rows (nn::CommRow) on the context axis of c ranks: in and out the local
// shapes, each of `bytes` bytes an element.
inline CommStep comm_step(Collective col, int c, const Shape& in, const Shape& out, std::int64_t bytes) {
  CommStep st;
  st.collective = col;
  st.axis = Axis::context;
  st.degree = c;
  st.local_in = in;
  st.local_out = out;
  st.bytes_in = in.numel() * bytes;
  st.bytes_out = out.numel() * bytes;
  st.wire_bytes = ring_wire_bytes(col, c, st.bytes_in, st.bytes_out);
  return st;
}
inline Shape gathered(const Shape& kv, int c) {  // c blocks (B, T/c, H/g, 2, hd) side by side
  return {c, kv[0], kv[1], kv[2], kv[3], kv[4]};
}
}  // namespace detail

// The attention types (one policy per type): how keys and values reach the local queries. Each
// call has a second form without `w` that takes its buffers from a HostBuffers of its own. Each
// also says what one call moves on the context axis, as steps of describe's rows (plan): kv the
// local key-value block (B, T/c, H/g, 2, hd), e and es the bytes of an element of T and of S
// (the gradient blocks' type); nothing on one rank.
struct Ring : detail::HostCalls<Ring> {
  static constexpr const char* name = "ring";
  using HostCalls::backward;
  using HostCalls::forward;

  // c - 1 blocks passed on forward; c - 1 blocks and c gradient blocks backward.
  static void comm_steps(std::vector<CommStep>& forward, std::vector<CommStep>& backward, const Shape& kv, int c,
                         std::int64_t e, std::int64_t es) {
    for (int i = 0; i + 1 < c; ++i) forward.push_back(detail::comm_step(Collective::send_recv, c, kv, kv, e));
    for (int i = 0; i + 1 < c; ++i) backward.push_back(detail::comm_step(Collective::send_recv, c, kv, kv, e));
    for (int i = 0; c > 1 && i < c; ++i) backward.push_back(detail::comm_step(Collective::send_recv, c, kv, kv, es));
  }

  // out (B, Tl, H, hd) and lse (B, H, Tl) of this rank's rows; comm is the context group, whose
  // rank r holds the chunks ch gives r.
  template <Communicator C, class T, class S, Buffers W>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd,
                      index g, ops::Mask m, W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::Ring::forward");
    detail::check_mask<W>(m, B, ch, "context::Ring::forward");
    const int r = z.r, c = z.c;
    [[maybe_unused]] auto& dev = w.device();
    using Ops [[maybe_unused]] = ops::ContextBlock<typename W::device_type>;
    T* cur = w.template take<T>(z.block, Category::communication);
    T* next = c > 1 ? w.template take<T>(z.block, Category::communication) : nullptr;
    S* o = w.template take<S>(z.out, Category::activations);
    if constexpr (W::compute) {
      Ops::pack_kv(dev, cur, qkv, B, Tl, H, hd, g);
      Ops::start(dev, o, lse, B, Tl, H, hd);
    }
    for (int step = 0; step < c; ++step) {
      const int src = (r - step + c) % c;  // whose keys and values this rank holds now
      detail::Shift<C, 1> shift(comm);
      if (step + 1 < c) shift.post(std::span<const T>(cur, z.block));  // on while this step computes
      if constexpr (W::compute)
        Ops::forward(dev, o, lse, qkv, cur, B, Tl, H, hd, g, ch.positions(r), ch.positions(src), m);
      if (step + 1 < c) {
        shift.finish(std::span<T>(next, z.block));
        std::swap(cur, next);
      }
    }
    if constexpr (W::compute) Ops::finish(dev, out, o, static_cast<index>(z.out));
  }

  // dqkv (B, Tl, H/g, g + 2, hd) of this rank's rows from dout and what forward returned.
  template <Communicator C, class T, class S, Buffers W>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g, ops::Mask m, W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::Ring::backward");
    detail::check_mask<W>(m, B, ch, "context::Ring::backward");
    const int r = z.r, c = z.c;
    [[maybe_unused]] auto& dev = w.device();
    using Ops [[maybe_unused]] = ops::ContextBlock<typename W::device_type>;
    T* cur = w.template take<T>(z.block, Category::communication);
    T* next = c > 1 ? w.template take<T>(z.block, Category::communication) : nullptr;
    S* dcur = w.template take<S>(z.block, Category::communication);
    S* dnext = c > 1 ? w.template take<S>(z.block, Category::communication) : nullptr;
    S* dq = w.template take<S>(z.qkv, Category::activations);
    S* D = w.template take<S>(z.rows, Category::activations);
    if constexpr (W::compute) {
      Ops::pack_kv(dev, cur, qkv, B, Tl, H, hd, g);
      dev.zero(dcur, z.block * sizeof(S));
      dev.zero(dq, z.qkv * sizeof(S));
      Ops::row_dots(dev, D, dout, out, B, Tl, H, hd);
    }
    for (int step = 0; step < c; ++step) {
      const int src = (r - step + c) % c;
      // The block and its gradient travel on together: the block is posted before the step computes,
      // the gradient once the step has added to it. After the last step (where rank r holds rank
      // r + 1's block) the gradient goes once more, home to the rank whose keys and values they are.
      detail::Shift<C, 2> shift(comm);
      if (step + 1 < c) shift.post(std::span<const T>(cur, z.block));
      if constexpr (W::compute)
        Ops::backward(dev, dq, dcur, qkv, cur, dout, D, lse, B, Tl, H, hd, g, ch.positions(r), ch.positions(src), m);
      if (c == 1) break;
      shift.post(std::span<const S>(dcur, z.block));
      if (step + 1 < c) {
        shift.finish(std::span<T>(next, z.block), std::span<S>(dnext, z.block));
        std::swap(cur, next);
      } else {
        shift.finish(std::span<S>(dnext, z.block));
      }
      std::swap(dcur, dnext);
    }
    if constexpr (W::compute) Ops::write_dqkv(dev, dqkv, dq, dcur, B, Tl, H, hd, g);
  }
};

struct AllGather : detail::HostCalls<AllGather> {
  static constexpr const char* name = "all-gather";
  using HostCalls::backward;
  using HostCalls::forward;

  // The blocks gathered forward and again backward; their gradients reduce-scattered.
  static void comm_steps(std::vector<CommStep>& forward, std::vector<CommStep>& backward, const Shape& kv, int c,
                         std::int64_t e, std::int64_t es) {
    if (c <= 1) return;
    const Shape all = detail::gathered(kv, c);
    forward.push_back(detail::comm_step(Collective::all_gather, c, kv, all, e));
    backward.push_back(detail::comm_step(Collective::all_gather, c, kv, all, e));
    backward.push_back(detail::comm_step(Collective::reduce_scatter, c, all, kv, es));
  }

  template <Communicator C, class T, class S, Buffers W>
  static void forward(C& comm, const Chunks& ch, T* out, S* lse, const T* qkv, index B, index Tl, index H, index hd,
                      index g, ops::Mask m, W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::AllGather::forward");
    detail::check_mask<W>(m, B, ch, "context::AllGather::forward");
    const int r = z.r, c = z.c;
    [[maybe_unused]] auto& dev = w.device();
    using Ops [[maybe_unused]] = ops::ContextBlock<typename W::device_type>;
    const std::size_t all_n = z.block * static_cast<std::size_t>(c);
    T* mine = w.template take<T>(z.block, Category::communication);
    T* all = w.template take<T>(all_n, Category::communication);
    S* o = w.template take<S>(z.out, Category::activations);
    if constexpr (W::compute) Ops::pack_kv(dev, mine, qkv, B, Tl, H, hd, g);
    comm.all_gather(std::span<const T>(mine, z.block), std::span<T>(all, all_n));  // rank k's block at k * block
    if constexpr (W::compute) {
      Ops::start(dev, o, lse, B, Tl, H, hd);
      for (int src = 0; src < c; ++src)
        Ops::forward(dev, o, lse, qkv, all + static_cast<std::size_t>(src) * z.block, B, Tl, H, hd, g, ch.positions(r),
                     ch.positions(src), m);
      Ops::finish(dev, out, o, static_cast<index>(z.out));
    }
  }

  template <Communicator C, class T, class S, Buffers W>
  static void backward(C& comm, const Chunks& ch, T* dqkv, const T* dout, const T* out, const S* lse, const T* qkv,
                       index B, index Tl, index H, index hd, index g, ops::Mask m, W& w) {
    const detail::Sizes z(ch, comm.rank(), comm.size(), B, Tl, H, hd, g, "context::AllGather::backward");
    detail::check_mask<W>(m, B, ch, "context::AllGather::backward");
    const int r = z.r, c = z.c;
    [[maybe_unused]] auto& dev = w.device();
    using Ops [[maybe_unused]] = ops::ContextBlock<typename W::device_type>;
    const std::size_t all_n = z.block * static_cast<std::size_t>(c);
    T* mine = w.template take<T>(z.block, Category::communication);
    T* all = w.template take<T>(all_n, Category::communication);
    S* dall = w.template take<S>(all_n, Category::communication);
    S* dmine = w.template take<S>(z.block, Category::communication);
    S* dq = w.template take<S>(z.qkv, Category::activations);
    S* D = w.template take<S>(z.rows, Category::activations);
    if constexpr (W::compute) Ops::pack_kv(dev, mine, qkv, B, Tl, H, hd, g);
    comm.all_gather(std::span<const T>(mine, z.block), std::span<T>(all, all_n));  // again: the forward kept none
    if constexpr (W::compute) {
      dev.zero(dall, all_n * sizeof(S));
      dev.zero(dq, z.qkv * sizeof(S));
      Ops::row_dots(dev, D, dout, out, B, Tl, H, hd);
      for (int src = 0; src < c; ++src)
        Ops::backward(dev, dq, dall + static_cast<std::size_t>(src) * z.block, qkv,
                      all + static_cast<std::size_t>(src) * z.block, dout, D, lse, B, Tl, H, hd, g, ch.positions(r),
                      ch.positions(src), m);
    }
    comm.reduce_scatter(std::span<const S>(dall, all_n), std::span<S>(dmine, z.block), ReduceOp::sum);
    if constexpr (W::compute) Ops::write_dqkv(dev, dqkv, dq, dmine, B, Tl, H, hd, g);
  }
};

// The attention FLOPs of rank r's queries over the whole sequence (QK^T and PV over the pairs its
// rows see: 4 B H hd pairs forward, twice that backward, as ops::Attention's count; every pair when
// not causal, padding not known), for the time model on the Meta device.
inline double forward_flops(const Chunks& ch, int r, index B, index H, index hd, bool causal = true) {
  double pairs = 0;
  for (index t = 0; t < ch.local(); ++t) pairs += static_cast<double>(causal ? ch.position(r, t) + 1 : ch.seq);
  return 4.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(hd) * pairs;
}

template <class A>
concept Kind = std::same_as<A, Ring> || std::same_as<A, AllGather>;

// No context parallelism: a layer's choice (nn::GroupedQueryAttention's Cx) where the sequence is
// whole on every rank.
struct None {
  static constexpr const char* name = "none";
};
template <class A>
concept Choice = std::same_as<A, None> || Kind<A>;

}  // namespace weft::context
