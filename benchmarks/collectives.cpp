// Bus bandwidth of the thread back end's all_reduce, all_gather and reduce_scatter on 2 and 4
// ranks, 4 KiB to 64 MiB, next to a plain memcpy bandwidth measured in the same run.
//
// One JSON object per line. Conventions of nccl-tests: `bytes` is the size of the full buffer
// (all_reduce: each rank's buffer; all_gather: the gathered output; reduce_scatter: the input),
// algbw = bytes / time, busbw = algbw * factor with factor 2 (n-1)/n for all_reduce and (n-1)/n
// for the others. Each point is the median of several timed iterations after a warm-up.
//
//   collectives [--max-mib N] [--iters N]
#include <weft/weft_host.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int iterations_for(std::size_t bytes, int iters) { return bytes >= (16u << 20) ? std::max(3, iters / 4) : iters; }

double memcpy_gbps(std::size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  std::memcpy(b.data(), a.data(), bytes);
  for (int i = 0; i < iterations_for(bytes, iters); ++i) {
    const auto s = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
  }
  // Read + write: count the bytes once, as busbw does for a copy.
  return static_cast<double>(bytes) / median(t) / 1e9;
}

// Times `op` on n ranks; returns the median over iterations of the slowest rank's time.
template <class Op>
double time_collective(int n, int iters, std::size_t bytes, Op op) {
  std::vector<double> times(static_cast<std::size_t>(iterations_for(bytes, iters)), 0.0);
  weft::run_threads(n, [&](weft::ThreadComm& c) {
    auto state = op.prepare(c, bytes);
    op.run(c, state);  // warm-up
    for (double& t : times) {
      c.barrier();
      const auto s = Clock::now();
      op.run(c, state);
      std::vector<double> dt{std::chrono::duration<double>(Clock::now() - s).count()};
      c.all_reduce(std::span<double>(dt), weft::ReduceOp::max);
      if (c.rank() == 0) t = dt[0];
    }
  });
  return median(times);
}

struct AllReduce {
  static constexpr const char* name = "all_reduce";
  static double factor(int n) { return 2.0 * (n - 1) / n; }
  std::vector<float> prepare(weft::ThreadComm&, std::size_t bytes) { return std::vector<float>(bytes / 4, 1.0f); }
  void run(weft::ThreadComm& c, std::vector<float>& v) { c.all_reduce(std::span<float>(v)); }
};
struct AllGather {
  static constexpr const char* name = "all_gather";
  static double factor(int n) { return 1.0 * (n - 1) / n; }
  std::pair<std::vector<float>, std::vector<float>> prepare(weft::ThreadComm& c, std::size_t bytes) {
    return {std::vector<float>(bytes / 4 / static_cast<std::size_t>(c.size()), 1.0f), std::vector<float>(bytes / 4)};
  }
  void run(weft::ThreadComm& c, std::pair<std::vector<float>, std::vector<float>>& s) {
    c.all_gather(std::span<const float>(s.first), std::span<float>(s.second));
  }
};
struct ReduceScatter {
  static constexpr const char* name = "reduce_scatter";
  static double factor(int n) { return 1.0 * (n - 1) / n; }
  std::pair<std::vector<float>, std::vector<float>> prepare(weft::ThreadComm& c, std::size_t bytes) {
    return {std::vector<float>(bytes / 4, 1.0f), std::vector<float>(bytes / 4 / static_cast<std::size_t>(c.size()))};
  }
  void run(weft::ThreadComm& c, std::pair<std::vector<float>, std::vector<float>>& s) {
    c.reduce_scatter(std::span<const float>(s.first), std::span<float>(s.second));
  }
};

template <class Op>
void sweep(int n, std::size_t bytes, int iters, double copy_gbps) {
  const double t = time_collective(n, iters, bytes, Op{});
  const double algbw = static_cast<double>(bytes) / t / 1e9;
  const nlohmann::json j = {{"bench", "collectives"},   {"backend", "threads"},
                            {"op", Op::name},           {"ranks", n},
                            {"bytes", bytes},           {"time_us", t * 1e6},
                            {"algbw_gbps", algbw},      {"busbw_gbps", algbw * Op::factor(n)},
                            {"memcpy_gbps", copy_gbps}, {"busbw_over_memcpy", algbw * Op::factor(n) / copy_gbps}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_bytes = 64u << 20;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max-mib") max_bytes = std::stoul(argv[i + 1]) << 20;
    else if (a == "--iters") iters = std::max(3, std::stoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "collectives: unknown option %s; use --max-mib N or --iters N\n", a.c_str());
      return 2;
    }
  }
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const double copy = memcpy_gbps(bytes, iters);
    for (int n : {2, 4}) {
      sweep<AllReduce>(n, bytes, iters, copy);
      sweep<AllGather>(n, bytes, iters, copy);
      sweep<ReduceScatter>(n, bytes, iters, copy);
    }
  }
  return 0;
}
