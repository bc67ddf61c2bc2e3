// The plan of a context-parallel step: footprint::measure (the step run on the Meta device) against
// the host allocator's counts of the same step on every rank (the attention's travelling blocks
// and accumulators included: they come from the layer's device), what falls with the context
// degree, and the bytes each attention type moves on the context axis against their closed forms.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "weft/comm/threads/run.hpp"
#include "weft/cost/measure.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/nn/describe.hpp"

using namespace weft;

namespace {

// 2 layers (pipe 2 takes one each), 4 heads over 2 key-value heads (tensor 2 holds one group each),
// a sequence of 32 (8 chunks of 4 at context 4).
const llama::Config kConfig{.vocab = 33,
                            .seq = 32,
                            .layers = 2,
                            .heads = 4,
                            .kv_heads = 2,
                            .width = 16,
                            .hidden = 24,
                            .rope = {.theta = 500},
                            .norm_eps = 1e-5,
                            .seed = 3,
                            .init_std = 0.2};

template <class Cx, bool SP = false>
struct Llama {
  template <class D>
  using on = llama::Model<float, SP, recompute::None, D, false, Cx>;
};

struct Gpt2Ring {
  template <class D>
  using on = gpt2::Model<float, false, recompute::None, D, context::Ring>;
};

std::string what_of(const footprint::Run& run) {
  return cat("data ", run.mesh.data, " pipe ", run.mesh.pipe, " context ", run.mesh.context, " tensor ",
             run.mesh.tensor);
}

// Every rank's measured plan against the same step's counts on Host thread ranks: each category's
// peak, what is left, what was allocated, the persistent state, and each axis's collectives.
template <class Cx, class Strategy, bool SP = false>
void check_exact(const footprint::Run& run) {
  using Model = Llama<Cx, SP>;
  const int ranks = run.mesh.ranks();
  std::vector<footprint::RankStep> host(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& w) {
    Host dev;
    host[static_cast<std::size_t>(w.rank())] =
        footprint::measure_rank<typename Model::template on<Host>, Strategy>(dev, w, kConfig, run);
  });
  const auto meta = footprint::measure<Model::template on, Strategy>(kConfig, run);
  REQUIRE(meta.size() == host.size());
  for (std::size_t r = 0; r < host.size(); ++r) {
    INFO(Cx::name, " ", Strategy::name(), " ", what_of(run), SP ? " SP" : "", " rank ", r);
    for (std::size_t k = 0; k < kCategories; ++k) {
      INFO(name(static_cast<Category>(k)));
      CHECK(meta[r].step.peak.bytes[k] == host[r].step.peak.bytes[k]);
      CHECK(meta[r].step.after.bytes[k] == host[r].step.after.bytes[k]);
      CHECK(meta[r].step.allocated.bytes[k] == host[r].step.allocated.bytes[k]);
      CHECK(meta[r].state.bytes[k] == host[r].state.bytes[k]);
    }
    CHECK(meta[r].step.total == host[r].step.total);
    CHECK(meta[r].step.allocations == host[r].step.allocations);
    CHECK(meta[r].coord.context == host[r].coord.context);
    for (Axis a : kAxes)
      for (std::size_t op = 0; op < threads::kOps; ++op) {
        const auto i = static_cast<std::size_t>(a);
        INFO("axis ", name(a), " ", threads::name(static_cast<threads::Op>(op)));
        CHECK(meta[r].collectives[i].calls[op] == host[r].collectives[i].calls[op]);
        CHECK(meta[r].collectives[i].bytes[op] == host[r].collectives[i].bytes[op]);
      }
    std::uint64_t context_bytes = 0;  // the attention's blocks and the loss's sum: never none here
    for (std::uint64_t b : meta[r].collectives[static_cast<std::size_t>(Axis::context)].bytes) context_bytes += b;
    CHECK(context_bytes > 0);
  }
  // One rank alone (its groups standing in for the others) equals the rank measured among all.
  for (const footprint::RankStep& r : meta) {
    const footprint::RankStep alone = footprint::measure_alone<Model::template on, Strategy>(kConfig, run, r.rank);
    INFO(Cx::name, " ", what_of(run), " rank ", r.rank, " alone");
    CHECK(alone.step.total == r.step.total);
    CHECK(alone.step.peak.bytes == r.step.peak.bytes);
    for (std::size_t a = 0; a < r.calls.size(); ++a) CHECK(alone.calls[a] == r.calls[a]);
  }
}

// describe's rows: their steps on the context axis (the attention's passes or gathers, the loss's
// sum), forward and backward, counted as the communicators count them.
threads::Counters context_counts(const std::vector<nn::CommRow>& rows) {
  threads::Counters planned;
  const auto add = [&](threads::Op op, std::int64_t bytes) {
    planned.calls[static_cast<std::size_t>(op)] += 1;
    planned.bytes[static_cast<std::size_t>(op)] += static_cast<std::uint64_t>(bytes);
  };
  for (const nn::CommRow& row : rows)
    for (const auto* steps : {&row.forward, &row.backward})
      for (const CommStep& st : *steps) {
        if (st.axis != Axis::context) continue;
        switch (st.collective) {
          case Collective::send_recv:
            add(threads::Op::send, st.bytes_in);
            add(threads::Op::recv, st.bytes_in);
            break;
          case Collective::all_gather: add(threads::Op::all_gather, st.bytes_out); break;
          case Collective::reduce_scatter: add(threads::Op::reduce_scatter, st.bytes_in); break;
          case Collective::all_reduce: add(threads::Op::all_reduce, st.bytes_in); break;
          default: FAIL("a ", name(st.collective), " step on the context axis in ", row.layer);
        }
      }
  return planned;
}

// ... equal what one micro-batch's step measures there, on every rank.
void same_counts(const std::vector<footprint::RankStep>& measured, const threads::Counters& planned,
                 const std::string& what) {
  const auto c = static_cast<std::size_t>(Axis::context);
  for (const footprint::RankStep& r : measured)
    for (std::size_t op = 0; op < threads::kOps; ++op) {
      INFO(what, " rank ", r.rank, " ", threads::name(static_cast<threads::Op>(op)));
      CHECK(r.collectives[c].calls[op] == planned.calls[op]);
      CHECK(r.collectives[c].bytes[op] == planned.bytes[op]);
    }
}

// Llama's rows walked over its layers (nn/comm_walk.hpp), against the measured step.
template <class Cx, bool SP = false>
void check_walked(const footprint::Run& run) {
  using M = typename Llama<Cx, SP>::template on<Meta<Host>>;
  const Spread s{.data_degree = run.mesh.data, .tensor_degree = run.mesh.tensor, .context_degree = run.mesh.context};
  Meta<Host> dev;
  M model(dev, kConfig, s, run.micro_batch);
  const std::vector<nn::CommRow> rows = nn::walked_comm_rows(model, run.micro_batch, s);
  std::string table;
  for (const nn::CommRow& row : rows)
    if (row.layer.find("GroupedQueryAttention") != std::string::npos)
      table += cat(row.layer, ": ", nn::format_steps(row.forward), " | ", nn::format_steps(row.backward), "\n");
  const std::string what = cat(Cx::name, SP ? " SP, " : ", ", what_of(run));
  MESSAGE(cat(what, ": describe's attention rows\n", table));
  same_counts(footprint::measure<Llama<Cx, SP>::template on, optim::Ddp>(kConfig, run), context_counts(rows), what);
}

std::uint64_t axis_bytes(const footprint::RankStep& r, Axis a, threads::Op op) {
  return r.collectives[static_cast<std::size_t>(a)].bytes[static_cast<std::size_t>(op)];
}

}  // namespace

TEST_CASE("the measured plan of a context-parallel Llama step equals the host allocator's counts on every rank") {
  using pipeline::Kind;
  SUBCASE("ring, DDP") {
    check_exact<context::Ring, optim::Ddp>({.mesh = {.context = 2}, .micro_batch = 2, .micro_batches = 2});
    check_exact<context::Ring, optim::Ddp>({.mesh = {.context = 4}, .micro_batch = 1});
    check_exact<context::Ring, optim::Ddp>({.mesh = {.data = 2, .context = 2}, .micro_batch = 2});
    check_exact<context::Ring, optim::Ddp>({.mesh = {.context = 2, .tensor = 2}, .micro_batch = 1});
    check_exact<context::Ring, optim::Ddp>(
        {.mesh = {.pipe = 2, .context = 2}, .micro_batch = 1, .micro_batches = 4, .schedule = Kind::one_f_one_b});
  }
  SUBCASE("sequence parallelism inside context parallelism") {  // the rows split again over tensor
    check_exact<context::Ring, optim::Ddp, true>({.mesh = {.context = 2, .tensor = 2}, .micro_batch = 1});
    check_exact<context::AllGather, optim::Zero2, true>(
        {.mesh = {.data = 2, .context = 2, .tensor = 2}, .micro_batch = 2});
  }
  SUBCASE("all-gather, FSDP") {
    check_exact<context::AllGather, optim::Fsdp>({.mesh = {.data = 2, .context = 2}, .micro_batch = 2});
    check_exact<context::AllGather, optim::Fsdp>(
        {.mesh = {.context = 2, .tensor = 2}, .micro_batch = 1, .micro_batches = 2});
  }
}

TEST_CASE(
    "describe's rows of a context-parallel Llama carry the attention's collectives on the context axis, as a step "
    "counts them") {
  check_walked<context::Ring>({.mesh = {.context = 2}, .micro_batch = 2});
  check_walked<context::Ring>({.mesh = {.context = 4, .tensor = 2}, .micro_batch = 1});
  check_walked<context::AllGather>({.mesh = {.data = 2, .context = 2}, .micro_batch = 2});
  check_walked<context::AllGather, true>({.mesh = {.context = 2, .tensor = 2}, .micro_batch = 1});
  // GPT-2's rows, walked the same way over its layers on the Meta device.
  const gpt2::Config g{.vocab = 33, .seq = 32, .layers = 2, .heads = 4, .width = 16, .seed = 5, .init_std = 0.2};
  const footprint::Run run{.mesh = {.context = 4, .tensor = 2}, .micro_batch = 1};
  const Spread s{.tensor_degree = 2, .context_degree = 4};
  same_counts(footprint::measure<Gpt2Ring::template on, optim::Ddp>(g, run),
              context_counts(nn::describe_rows<Gpt2Ring::on<Meta<Host>>>(g, 1, s)), "GPT-2 ring, context 4 x tensor 2");
}

TEST_CASE(
    "a context rank's activations fall by the context degree, and the attention's bytes on the context axis equal their "
    "closed forms") {
  // One micro-batch of 2 sequences of 32 on context 1, 2 and 4: every activation of a rank is
  // (B, T/c, ...), and so are the attention's buffers, except all-gather's gathered keys and values.
  const std::int64_t B = 2, L = kConfig.layers, hd = kConfig.width / kConfig.heads, KV = kConfig.kv_heads;
  const auto activations = [](const footprint::RankStep& r) { return r.step.peak.of(Category::activations); };
  const auto ring = [&](int c) {
    return footprint::measure<Llama<context::Ring>::template on, optim::Ddp>(
        kConfig, {.mesh = {.context = c}, .micro_batch = B});
  };
  const auto gather = [&](int c) {
    return footprint::measure<Llama<context::AllGather>::template on, optim::Ddp>(
        kConfig, {.mesh = {.context = c}, .micro_batch = B});
  };
  const auto r1 = ring(1);
  const std::int64_t a1 = activations(r1[0]);
  for (int c : {2, 4}) {
    const auto rc = ring(c), gc = gather(c);
    // one rank's keys and values
    const std::int64_t block = B * (kConfig.seq / c) * KV * 2 * hd * static_cast<std::int64_t>(sizeof(float));
    for (std::size_t r = 0; r < rc.size(); ++r) {
      INFO("context ", c, " rank ", r);
      const auto communication = [](const footprint::RankStep& x) { return x.step.peak.of(Category::communication); };
      MESSAGE("context ", c, " rank ", r, ": activations ", activations(rc[r]), " bytes (ring), ", activations(gc[r]),
              " (all-gather), one rank ", a1, "; communication buffers ", communication(rc[r]), " (ring), ",
              communication(gc[r]), " (all-gather)");
      CHECK(activations(rc[r]) * c == a1);  // exact: every activation is (B, T/c, ...)
      CHECK(activations(gc[r]) == activations(rc[r]));
      // The blocks in flight: the ring's two (and two gradient blocks) against all-gather's c + 1.
      CHECK(communication(rc[r]) < communication(gc[r]));
      // Ring: c - 1 blocks forward, c - 1 blocks and c gradient blocks backward, per layer; received as sent.
      CHECK(axis_bytes(rc[r], Axis::context, threads::Op::send) == static_cast<std::uint64_t>(L * (3 * c - 2) * block));
      CHECK(axis_bytes(rc[r], Axis::context, threads::Op::recv) == axis_bytes(rc[r], Axis::context, threads::Op::send));
      CHECK(axis_bytes(rc[r], Axis::context, threads::Op::all_gather) == 0);
      // All-gather: the c blocks gathered forward and again backward, their gradients reduce-scattered.
      CHECK(axis_bytes(gc[r], Axis::context, threads::Op::all_gather) == static_cast<std::uint64_t>(L * 2 * c * block));
      CHECK(axis_bytes(gc[r], Axis::context, threads::Op::reduce_scatter) == static_cast<std::uint64_t>(L * c * block));
      CHECK(axis_bytes(gc[r], Axis::context, threads::Op::send) == 0);
      // The loss's sum over the context group is the rest: the same for both types.
      CHECK(axis_bytes(gc[r], Axis::context, threads::Op::all_reduce) ==
            axis_bytes(rc[r], Axis::context, threads::Op::all_reduce));
    }
  }
}
