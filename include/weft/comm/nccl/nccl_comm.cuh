// NcclComm: the Communicator concept (comm/communicator.hpp) over NCCL, one rank per process and GPU.
//
// Every call enqueues NCCL work on the rank's stream and then waits for it by polling, never by a
// blocking synchronize: the stream's completion, NCCL's asynchronous error (ncclCommGetAsyncError)
// and the deadline. A failed or expired call aborts the communicator (ncclCommAbort, which ends the
// kernels still waiting for a lost peer) and throws weft::Error naming the operation, its sequence
// number and the group, so a dead peer becomes an error rather than a hang.
//
// Buffers are device memory; a host span (a loss, a norm, a barrier's token) is staged through a
// device scratch. Reductions are NCCL's: sums of f32 and f64 in f32 and f64, of bf16 in bf16 (NCCL's
// own order, not fixed across topologies; the thread back end is the bitwise reference). The
// training step reduces gradients in f32 under every precision (core/precision.hpp), so only the
// bf16 activations of tensor parallelism are summed in bf16 here.
//
// split(color, key) makes per-axis communicators from the world (ncclCommSplit). The world is made
// from a unique id that rank 0 creates and every rank receives (the launch issue bootstraps it over
// MPI or a TCP store); a world of one rank needs no exchange.
//
// Include only from .cu translation units.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "weft/comm/communicator.hpp"
#include "weft/core/error.hpp"
#include "weft/device/cuda/device.hpp"

namespace weft::nccl {

inline void check(ncclResult_t r, const std::string& where) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(where, cat("NCCL error ", static_cast<int>(r), ": ", ncclGetErrorString(r)),
                "check that every rank runs the same collectives on the same group and that no rank has died");
}

template <Element T>
constexpr ncclDataType_t type_of() {
  if constexpr (std::same_as<T, float>) return ncclFloat32;
  else if constexpr (std::same_as<T, double>) return ncclFloat64;
  else if constexpr (std::same_as<T, bf16>) return ncclBfloat16;
  else if constexpr (std::same_as<T, std::int32_t>) return ncclInt32;
  else return ncclInt64;
}

inline ncclUniqueId unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "nccl::unique_id");
  return id;
}

class NcclComm {
  struct Handle {  // shared by copies of a communicator; destroyed once
    ncclComm_t comm = nullptr;
    bool aborted = false;
    ~Handle() {
      if (comm && !aborted) (void)ncclCommDestroy(comm);
    }
  };

 public:
  // Rank `rank` of a world of `size` ranks made from `id` (the same id on every rank), on `dev`.
  NcclComm(Cuda& dev, int size, int rank, const ncclUniqueId& id,
           std::chrono::milliseconds deadline = std::chrono::milliseconds(60'000), std::string name = "world")
      : dev_(&dev),
        handle_(std::make_shared<Handle>()),
        rank_(rank),
        size_(size),
        deadline_(deadline),
        name_(std::move(name)) {
    if (size < 1 || rank < 0 || rank >= size)
      throw Error("NcclComm", cat("rank ", rank, " of a world of ", size), "use 0 <= rank < size, size >= 1");
    check(ncclCommInitRank(&handle_->comm, size, id, rank), cat("NcclComm ", name_, ": ncclCommInitRank"));
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  Cuda& device() const { return *dev_; }  // the device whose stream orders this group's calls
  std::string name() const { return name_; }
  std::chrono::milliseconds deadline() const { return deadline_; }

  template <Element T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    run<T>("all_reduce", buf.data(), buf.size(), buf.data(), buf.size(), [&](const void* in, void* out) {
      return ncclAllReduce(in, out, buf.size(), type_of<T>(), op == ReduceOp::sum ? ncclSum : ncclMax, comm(),
                           dev_->stream());
    });
  }

  template <Element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    sizes("reduce_scatter", in.size() == out.size() * static_cast<std::size_t>(size_),
          "in.size() == size() * out.size()");
    run<T>("reduce_scatter", in.data(), in.size(), out.data(), out.size(), [&](const void* i, void* o) {
      return ncclReduceScatter(i, o, out.size(), type_of<T>(), op == ReduceOp::sum ? ncclSum : ncclMax, comm(),
                               dev_->stream());
    });
  }

  template <Element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    sizes("all_gather", out.size() == in.size() * static_cast<std::size_t>(size_), "out.size() == size() * in.size()");
    run<T>("all_gather", in.data(), in.size(), out.data(), out.size(), [&](const void* i, void* o) {
      return ncclAllGather(i, o, in.size(), type_of<T>(), comm(), dev_->stream());
    });
  }

  template <Element T>
  void all_to_all(std::span<const T> in, std::span<T> out) {
    sizes("all_to_all", in.size() == out.size() && in.size() % static_cast<std::size_t>(size_) == 0,
          "in.size() == out.size(), a multiple of size()");
    const std::size_t k = in.size() / static_cast<std::size_t>(size_);
    run<T>("all_to_all", in.data(), in.size(), out.data(), out.size(), [&](const void* i, void* o) {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        r = ncclSend(static_cast<const T*>(i) + p * k, k, type_of<T>(), p, comm(), dev_->stream());
        if (r == ncclSuccess) r = ncclRecv(static_cast<T*>(o) + p * k, k, type_of<T>(), p, comm(), dev_->stream());
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  // send[j] elements to member j, recv[i] from member i, runs in member order: grouped sends and
  // receives (NCCL has no all-to-all). Each pair's counts are the caller's to make agree.
  template <Element T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t> send, std::span<T> out,
                    std::span<const std::int64_t> recv) {
    sizes("all_to_all_v", counts_fit(send, size_, in.size()) && counts_fit(recv, size_, out.size()),
          "one count >= 0 per member in send and recv, summing to in.size() and out.size()");
    run<T>("all_to_all_v", in.data(), in.size(), out.data(), out.size(), [&](const void* i, void* o) {
      ncclResult_t r = ncclGroupStart();
      std::size_t s = 0, g = 0;
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        const auto ns = static_cast<std::size_t>(send[static_cast<std::size_t>(p)]),
                   nr = static_cast<std::size_t>(recv[static_cast<std::size_t>(p)]);
        if (ns > 0) r = ncclSend(static_cast<const T*>(i) + s, ns, type_of<T>(), p, comm(), dev_->stream());
        if (r == ncclSuccess && nr > 0)
          r = ncclRecv(static_cast<T*>(o) + g, nr, type_of<T>(), p, comm(), dev_->stream());
        s += ns;
        g += nr;
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  template <Element T>
  void broadcast(std::span<T> buf, int root) {
    peer("broadcast", root);
    run<T>("broadcast", buf.data(), buf.size(), buf.data(), buf.size(), [&](const void* i, void* o) {
      return ncclBroadcast(i, o, buf.size(), type_of<T>(), root, comm(), dev_->stream());
    });
  }

  template <Element T>
  void send(std::span<const T> buf, int to) {
    peer("send", to);
    run<T>("send", buf.data(), buf.size(), nullptr, 0,
           [&](const void* i, void*) { return ncclSend(i, buf.size(), type_of<T>(), to, comm(), dev_->stream()); });
  }

  template <Element T>
  void recv(std::span<T> buf, int from) {
    peer("recv", from);
    run<T>("recv", nullptr, 0, buf.data(), buf.size(),
           [&](const void*, void* o) { return ncclRecv(o, buf.size(), type_of<T>(), from, comm(), dev_->stream()); });
  }

  void barrier() {
    std::int32_t token = 0;
    all_reduce(std::span<std::int32_t>(&token, 1));
  }

  // Ranks with the same color form a new group, ordered by key (ncclCommSplit; collective).
  NcclComm split(int color, int key, const std::string& name = {}) {
    if (color < 0) throw Error(where("split"), cat("color ", color, " is negative"), "use a color >= 0");
    NcclComm c(*this);
    c.handle_ = std::make_shared<Handle>();
    ++seq_;
    check(ncclCommSplit(comm(), color, key, &c.handle_->comm, nullptr), where("split"));
    int r = 0, n = 0;
    check(ncclCommUserRank(c.handle_->comm, &r), where("split (rank)"));
    check(ncclCommCount(c.handle_->comm, &n), where("split (size)"));
    c.rank_ = r;
    c.size_ = n;
    c.seq_ = 0;
    c.name_ = name.empty() ? cat(name_, "/", color) : name;
    return c;
  }

 private:
  NcclComm(const NcclComm&) = default;

 public:
  NcclComm(NcclComm&&) noexcept = default;
  NcclComm& operator=(NcclComm&&) noexcept = default;

 private:
  ncclComm_t comm() const {
    if (handle_->aborted)
      throw Error(cat("NcclComm ", name_), "the communicator was aborted after an earlier failure",
                  "the run cannot continue; restart it from a checkpoint");
    return handle_->comm;
  }
  std::string where(const char* op) const { return cat(op, " #", seq_, " on ", name_, " at rank ", rank_); }
  void sizes(const char* op, bool ok, const char* rule) const {
    if (!ok) throw Error(where(op), cat("buffer sizes break ", rule), "size the buffers as the rule says");
  }
  void peer(const char* op, int p) const {
    if (p < 0 || p >= size_)
      throw Error(where(op), cat("peer ", p, " of a group of ", size_), cat("use [0, ", size_, ")"));
  }

  static bool on_device(const void* p) {
    if (!p) return true;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  }

  // Stages host buffers through device scratch, enqueues `call(in, out)`, and waits for it.
  template <Element T, class Call>
  void run(const char* op, const T* in, std::size_t in_n, T* out, std::size_t out_n, Call&& call) {
    ++seq_;
    const bool in_host = in && !on_device(in), out_host = out && !on_device(out);
    Allocation in_scratch, out_scratch;
    const void* din = in;
    void* dout = out;
    if (in_host || out_host) {
      if (in && in == out) {  // in place on a host buffer
        out_scratch = dev_->allocate(static_cast<std::int64_t>(out_n * sizeof(T)), Category::communication);
        dev_->from_host(out_scratch.data(), in, in_n * sizeof(T));
        din = dout = out_scratch.data();
      } else {
        if (in_host) {
          in_scratch = dev_->allocate(static_cast<std::int64_t>(in_n * sizeof(T)), Category::communication);
          dev_->from_host(in_scratch.data(), in, in_n * sizeof(T));
          din = in_scratch.data();
        }
        if (out_host) {
          out_scratch = dev_->allocate(static_cast<std::int64_t>(out_n * sizeof(T)), Category::communication);
          dout = out_scratch.data();
        }
      }
    }
    const ncclResult_t r = call(din, dout);
    if (r != ncclSuccess && r != ncclInProgress) {
      abort();  // an error in a collective is fatal to the group, as on every back end
      check(r, where(op));
    }
    wait(op);
    if (out_host) dev_->to_host(out, dout, out_n * sizeof(T));
  }

  // Polls the stream, NCCL's asynchronous error and the deadline.
  void wait(const char* op) {
    const auto until = std::chrono::steady_clock::now() + deadline_;
    for (;;) {
      const cudaError_t s = cudaStreamQuery(dev_->stream());
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady) cuda::check(s, where(op).c_str());
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(handle_->comm, &async), where(op));
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        throw Error(where(op), cat("NCCL reported ", ncclGetErrorString(async)),
                    "a peer failed or the group's calls differ; see the other ranks' errors");
      }
      if (std::chrono::steady_clock::now() > until) {
        abort();
        throw Error(where(op), cat("did not complete within the deadline of ", deadline_.count(), " ms"),
                    "a peer has stalled or died, or the ranks issued different collectives");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort() {
    if (!handle_->aborted) {
      (void)ncclCommAbort(handle_->comm);
      handle_->aborted = true;
    }
  }

  Cuda* dev_;
  std::shared_ptr<Handle> handle_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds deadline_;
  std::string name_;
  std::uint64_t seq_ = 0;
};

static_assert(Communicator<NcclComm>);

}  // namespace weft::nccl
