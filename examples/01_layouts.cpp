// The layout algebra and the collectives at work on 4 ranks (data 2 x tensor 2): thread ranks, or
// under `mpirun -np 4` one rank per process (example_ranks.hpp).
//
// A (B, T, C) = (4, 8, 6) activation moves through the layouts a tensor-parallel transformer uses.
// For each redistribution the demo prints its plan (the collective on each axis, and the bytes per
// rank), runs it, and checks every rank's result against a serial computation of the global tensor.
#include <weft/weft_host.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "example_ranks.hpp"

using namespace weft;

namespace {

const Shape kGlobal{4, 8, 6};  // (B, T, C)

double value(std::int64_t g) { return static_cast<double>(g % 97) * 0.5 - 7.0; }  // the serial reference

template <class L>
void print_plan(const Spread& s) {
  const Redistribution p = redistribution<typename L::from, typename L::to>(kGlobal, s, sizeof(double));
  std::printf("%-36s -> %-32s", L::from::name().c_str(), L::to::name().c_str());
  if (p.count == 0) std::printf("  (no step)");
  std::printf("\n");
  for (const CommStep& st : p)
    std::printf("    %-14s on %-6s local %-12s -> %-12s %6lld -> %6lld bytes/rank, %6lld on the wire\n",
                name(st.collective), name(st.axis), cat(st.local_in).c_str(), cat(st.local_out).c_str(),
                static_cast<long long>(st.bytes_in), static_cast<long long>(st.bytes_out),
                static_cast<long long>(st.wire_bytes));
}

template <class From, class To>
struct Step {
  using from = From;
  using to = To;
};

// Checks a tensor without Partial axes against the serial values at its global positions.
template <class L>
bool matches(const Tensor<double, L, Host>& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (t[i] != value(t.global_index(i))) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_ranks(argc, argv, "auto", 4, [&](auto& world) {
    int failures = 0;
    Mesh mesh{world, {.data = 2, .tensor = 2}};
    Host host;
    const Spread s = mesh.spread();
    const bool print = world.rank() == 0;
    // What the last redistribution ran on each axis, from the communicators' counters.
    threads::Counters data0 = mesh.data().counters(), tensor0 = mesh.tensor().counters();
    auto ran = [&] {
      const threads::Counters d = mesh.data().counters() - data0, t = mesh.tensor().counters() - tensor0;
      data0 = mesh.data().counters();
      tensor0 = mesh.tensor().counters();
      if (!print) return;
      bool any = false;
      for (auto [axis, c] : {std::pair{"data", d}, std::pair{"tensor", t}})
        for (std::size_t op = 0; op < threads::kOps; ++op)
          if (c.calls[op] && (any = true))
            std::printf("    ran:   %-14s on %-6s x%llu, %llu bytes/rank\n",
                        threads::name(static_cast<threads::Op>(op)), axis, static_cast<unsigned long long>(c.calls[op]),
                        static_cast<unsigned long long>(c.bytes[op]));
      if (!any) std::printf("    ran:   no collective (a local step)\n");
    };
    auto report = [&](const char* what, bool ok) {
      ran();
      // Every rank's verdict counts (so every rank returns the same exit code); rank 0 prints.
      std::vector<std::int32_t> bad{ok ? 0 : 1};
      world.all_reduce(std::span<std::int32_t>(bad));
      failures += bad[0];
      if (print)
        std::printf("    check: %s on all 4 ranks: %s\n\n", what, bad[0] ? "WRONG" : "matches the serial result");
    };

    // Batch over data, replicated over tensor: what the embedding produces.
    auto x = Tensor<double, DataSharded<0>, Host>::empty(host, kGlobal, s);
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = value(x.global_index(i));

    using SeqParallel = Layout<Shard<0>, Shard<1>>;
    using Rows = Layout<Shard<0>, Shard<-1>>;
    if (print) print_plan<Step<DataSharded<0>, SeqParallel>>(s);
    auto sp = redistribute<SeqParallel>(x, mesh);  // Megatron-SP: sequence over tensor
    report("(B/2, T/2, C) sequence-parallel slice", matches(sp));

    if (print) print_plan<Step<SeqParallel, DataSharded<0>>>(s);
    auto gathered = redistribute<DataSharded<0>>(sp, mesh);  // all-gather before a column-parallel linear
    report("(B/2, T, C) all-gathered sequence", matches(gathered));

    if (print) print_plan<Step<SeqParallel, Rows>>(s);
    auto rows = redistribute<Rows>(sp, mesh);  // all-to-all: sequence shards become channel shards
    report("(B/2, T, C/2) all-to-all from sequence to channels", matches(rows));

    // A row-parallel linear leaves a Partial sum on tensor: each tensor rank holds half the value.
    auto partial = Tensor<double, Layout<Shard<0>, Partial>, Host>::empty(host, kGlobal, s);
    for (std::int64_t i = 0; i < partial.numel(); ++i) {
      const std::int64_t g = gathered.global_index(i);
      partial[i] = mesh.coord().tensor == 0 ? value(g) - 1.5 : 1.5;  // the addends sum to value(g)
    }
    if (print) print_plan<Step<Layout<Shard<0>, Partial>, SeqParallel>>(s);
    auto scattered = redistribute<SeqParallel>(partial, mesh);  // reduce-scatter after the row-parallel linear
    report("(B/2, T/2, C) reduce-scattered partial sums", matches(scattered));

    if (print) print_plan<Step<Layout<Shard<0>, Partial>, DataSharded<0>>>(s);
    auto reduced = redistribute<DataSharded<0>>(partial, mesh);  // all-reduce (no sequence parallelism)
    report("(B/2, T, C) all-reduced partial sums", matches(reduced));

    if (print) print_plan<Step<Rows, Replicated>>(s);
    auto full = redistribute<Replicated>(rows, mesh);  // gather on both axes
    report("(B, T, C) replicated everywhere", matches(full));
    if (print)
      std::printf("%s\n",
                  failures ? "demo: SOME CHECKS FAILED" : "demo: every redistribution matched the serial result");
    return failures ? 1 : 0;
  });
}
