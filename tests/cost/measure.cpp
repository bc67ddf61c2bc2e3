// footprint::measure (a step of any model run on the Meta device) against the two references it
// must equal to the byte: the host allocator's counts of the same step of the custom decoder
// (examples/03_custom_model.hpp, layers and ops weft does not ship), with the thread
// communicator's counts of each axis's collectives, and GPT-2's constexpr replay
// (models/gpt2/replay.hpp, itself held to the allocator by tests/models/gpt2/replay.cpp). Exact: the Meta device
// counts the blocks the code asks for, so any difference is a block counted wrong.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "03_custom_model.hpp"
#include "weft/core/float8_gemms.hpp"
#include "weft/cost/measure.hpp"
#include "weft/cost/measure_time.hpp"
#include "weft/models/gpt2/cluster_plan.hpp"
#include "weft/models/gpt2/estimate.hpp"
#include "weft/models/gpt2/replay.hpp"
#include "weft/plan/search.hpp"

using namespace weft;

namespace {

void same(const footprint::StepPeak& got, const footprint::StepPeak& want, const std::string& what) {
  INFO(what);
  for (std::size_t k = 0; k < kCategories; ++k) {
    INFO(name(static_cast<Category>(k)));
    CHECK(got.peak.bytes[k] == want.peak.bytes[k]);
    CHECK(got.after.bytes[k] == want.after.bytes[k]);
    CHECK(got.allocated.bytes[k] == want.allocated.bytes[k]);
  }
  CHECK(got.total == want.total);
  CHECK(got.allocations == want.allocations);
}

// Two measurements of one rank: equal in everything measured (peaks, state, each axis's calls
// call by call, the ops' work).
void same_rank(const footprint::RankStep& got, const footprint::RankStep& want, const std::string& what) {
  same(got.step, want.step, what);
  INFO(what);
  CHECK(got.rank == want.rank);
  CHECK(got.coord.data == want.coord.data);
  CHECK(got.coord.pipe == want.coord.pipe);
  CHECK(got.coord.tensor == want.coord.tensor);
  for (std::size_t k = 0; k < kCategories; ++k) CHECK(got.state.bytes[k] == want.state.bytes[k]);
  for (std::size_t a = 0; a < got.calls.size(); ++a) CHECK(got.calls[a] == want.calls[a]);
  CHECK(got.tie_calls == want.tie_calls);
  REQUIRE(got.ops.gemms.size() == want.ops.gemms.size());
  for (std::size_t g = 0; g < got.ops.gemms.size(); ++g) {
    const auto &x = got.ops.gemms[g], &y = want.ops.gemms[g];
    CHECK(std::tie(x.m, x.n, x.k, x.ta, x.tb, x.count) == std::tie(y.m, y.n, y.k, y.ta, y.tb, y.count));
  }
  CHECK(got.ops.attention_flops == want.ops.attention_flops);
  CHECK(got.ops.gelu == want.ops.gelu);
  CHECK(got.ops.layernorm == want.ops.layernorm);
  CHECK(got.ops.cross_entropy == want.ops.cross_entropy);
  CHECK(got.ops.adamw == want.ops.adamw);
}

// measure_alone on every rank equals the rank of measure (all ranks as threads), and the bounding
// ranks' largest peak per pipe rank equals the largest of all that pipe rank's ranks.
template <template <class> class M, class Strategy, class C>
void check_alone(const C& c, const footprint::Run& run, const std::vector<footprint::RankStep>& all) {
  const std::string what =
      cat(Strategy::name(), " data ", run.mesh.data, " pipe ", run.mesh.pipe, " tensor ", run.mesh.tensor);
  for (const footprint::RankStep& r : all)
    same_rank(footprint::measure_alone<M, Strategy>(c, run, r.rank), r, cat(what, " rank ", r.rank, " alone"));
  std::vector<std::int64_t> most(static_cast<std::size_t>(run.mesh.pipe), 0), bound(most);
  for (const footprint::RankStep& r : all)
    most[static_cast<std::size_t>(r.coord.pipe)] = std::max(most[static_cast<std::size_t>(r.coord.pipe)], r.step.total);
  for (const footprint::RankStep& r : footprint::measure_bounding<M, Strategy>(c, run))
    bound[static_cast<std::size_t>(r.coord.pipe)] =
        std::max(bound[static_cast<std::size_t>(r.coord.pipe)], r.step.total);
  CHECK_MESSAGE(bound == most, what);
}

template <class P, bool SP>
struct Custom {
  template <class D>
  using on = custom::Model<P, SP, D>;
};

// The custom decoder: every rank's measured plan against the same step on Host thread ranks.
template <class P, bool SP, class Strategy>
void check_custom(const footprint::Run& run) {
  const gpt2::Config c{.vocab = 33, .seq = 8, .layers = 4, .heads = 2, .width = 16, .seed = 3, .init_std = 0.1};
  const int ranks = run.mesh.data * run.mesh.pipe * run.mesh.tensor;
  std::vector<footprint::RankStep> host(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& w) {
    Host dev;
    host[static_cast<std::size_t>(w.rank())] =
        footprint::measure_rank<custom::Model<P, SP, Host>, Strategy>(dev, w, c, run);
  });
  const auto meta = footprint::measure<Custom<P, SP>::template on, Strategy>(c, run);
  REQUIRE(meta.size() == host.size());
  for (std::size_t r = 0; r < host.size(); ++r) {
    const std::string what =
        cat(Strategy::name(), SP ? "-sp " : " ", precision_t<P>::name(), " data ", run.mesh.data, " pipe ",
            run.mesh.pipe, " tensor ", run.mesh.tensor, " schedule ", static_cast<int>(run.schedule), " rank ", r);
    same(meta[r].step, host[r].step, what);
    for (std::size_t k = 0; k < kCategories; ++k) CHECK_MESSAGE(meta[r].state.bytes[k] == host[r].state.bytes[k], what);
    CHECK(meta[r].coord.pipe == host[r].coord.pipe);
    // What the step asked of each axis, as the thread communicator counted it.
    for (Axis a : kAxes)
      for (std::size_t op = 0; op < threads::kOps; ++op) {
        const auto i = static_cast<std::size_t>(a);
        INFO(what, " axis ", name(a), " ", threads::name(static_cast<threads::Op>(op)));
        CHECK(meta[r].collectives[i].calls[op] == host[r].collectives[i].calls[op]);
        CHECK(meta[r].collectives[i].bytes[op] == host[r].collectives[i].bytes[op]);
      }
    std::uint64_t calls = 0;
    for (const auto& c : host[r].collectives)
      for (std::uint64_t n : c.calls) calls += n;
    CHECK(calls > 0);  // every run here has collectives to count
  }
  check_alone<Custom<P, SP>::template on, Strategy>(c, run, meta);
}

}  // namespace

TEST_CASE("the measured plan of the custom decoder equals the host allocator's counts on every rank") {
  using pipeline::Kind;
  check_custom<float, false, optim::Ddp>({.mesh = {.data = 2}, .micro_batch = 2, .micro_batches = 2});
  check_custom<float, true, optim::Zero1>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 4});
  check_custom<float, true, optim::Fsdp>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 2});
  check_custom<double, false, optim::Zero2>({.mesh = {.data = 2}, .micro_batch = 2});
  check_custom<float, false, optim::Ddp>(
      {.mesh = {.pipe = 2}, .micro_batch = 1, .micro_batches = 4, .schedule = Kind::one_f_one_b});
  check_custom<float, false, optim::Ddp>(
      {.mesh = {.pipe = 2}, .micro_batch = 1, .micro_batches = 4, .schedule = Kind::zero_bubble_h1});
  check_custom<float, true, optim::Fsdp>({.mesh = {.data = 2, .pipe = 2, .tensor = 2},
                                          .micro_batch = 2,
                                          .micro_batches = 4,
                                          .schedule = Kind::interleaved,
                                          .virtual_stages = 2});
}

namespace {

template <class D>
using Gpt = gpt2::Model<float, true, recompute::None, D>;
template <bool SP>
struct GptOn {
  template <class D>
  using on = gpt2::Model<float, SP, recompute::None, D>;
};
template <class D>
using GptBf16Full = gpt2::Model<Bf16Mixed, false, recompute::Full, D>;
template <class D>
using GptSelective = gpt2::Model<float, false, recompute::Selective, D>;
template <class D>
using GptFp8 = gpt2::Model<Fp8Rowwise, true, recompute::None, D>;

constexpr gpt2::Config kSmall{.vocab = 37, .seq = 8, .layers = 4, .heads = 2, .width = 8};

template <template <class> class M, class Strategy, class P, bool SP, class R>
void check_gpt2(const footprint::Run& run) {
  const auto meta = footprint::measure<M, Strategy>(kSmall, run);
  for (const footprint::RankStep& r : meta) {
    const Spread s{.data_degree = run.mesh.data,
                   .tensor_degree = run.mesh.tensor,
                   .data_index = r.coord.data,
                   .tensor_index = r.coord.tensor};
    const footprint::StepPeak want =
        run.mesh.pipe == 1 ? footprint::step<Strategy, P, SP, R>(kSmall, s, run.micro_batch, run.micro_batches)
                           : footprint::pipeline_step<Strategy, P, SP, R>(
                                 kSmall, s, run.micro_batch,
                                 pipeline::make_table(run.schedule, run.mesh.pipe, static_cast<int>(run.micro_batches),
                                                      run.virtual_stages),
                                 r.coord.pipe);
    same(r.step, want, cat("GPT-2 ", Strategy::name(), " rank ", r.rank));
  }
  check_alone<M, Strategy>(kSmall, run, meta);
}

}  // namespace

TEST_CASE("the measured plan of GPT-2 equals its constexpr replay: every strategy, SP, recompute, pipelines") {
  using pipeline::Kind;
  check_gpt2<Gpt, optim::Ddp, float, true, recompute::None>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 4});
  check_gpt2<Gpt, optim::Zero1, float, true, recompute::None>(
      {.mesh = {.data = 2, .tensor = 2}, .micro_batch = 2, .micro_batches = 2});
  check_gpt2<Gpt, optim::Zero2, float, true, recompute::None>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 4});
  check_gpt2<Gpt, optim::Fsdp, float, true, recompute::None>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 2});
  check_gpt2<GptBf16Full, optim::Fsdp, Bf16Mixed, false, recompute::Full>(
      {.mesh = {.data = 2}, .micro_batch = 2, .micro_batches = 2});
  check_gpt2<GptSelective, optim::Zero2, float, false, recompute::Selective>({.mesh = {.tensor = 2}, .micro_batch = 2});
  check_gpt2<Gpt, optim::Fsdp, float, true, recompute::None>(
      {.mesh = {.pipe = 2, .tensor = 2}, .micro_batch = 4, .micro_batches = 2, .schedule = Kind::one_f_one_b});
  check_gpt2<Gpt, optim::Zero2, float, true, recompute::None>(
      {.mesh = {.data = 2, .pipe = 2}, .micro_batch = 2, .micro_batches = 4, .schedule = Kind::zero_bubble_h1});
  check_gpt2<GptSelective, optim::Ddp, float, false, recompute::Selective>(
      {.mesh = {.pipe = 2}, .micro_batch = 1, .micro_batches = 4, .schedule = Kind::interleaved, .virtual_stages = 2});
}

TEST_CASE("the measured plan of a large model costs no memory, and refuses sizes the model refuses") {
  // GPT-2 1.5B's shapes at 8 sequences of 1024 on 8 data ranks: a step's control flow, no memory.
  // The process's peak of mapped memory (VmPeak) may grow by far less than one rank's plan: a Meta
  // device that really allocated would map several GiB (8 ranks of over a GiB each).
  const auto vm_peak = []() -> std::int64_t {  // bytes
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.starts_with("VmPeak:")) return std::stoll(line.substr(7)) * 1024;
    return -1;
  };
  const std::int64_t before = vm_peak();
  const gpt2::Config xl{.vocab = 50257, .seq = 1024, .layers = 48, .heads = 25, .width = 1600};
  const auto plan = footprint::measure<Gpt, optim::Fsdp>(xl, {.mesh = {.data = 8}, .micro_batch = 8});
  const std::int64_t grew = vm_peak() - before;
  const Spread s{.data_degree = 8};
  same(plan[0].step, footprint::step<optim::Fsdp, float, true>(xl, s, 8), "GPT-2 1.5B, FSDP-SP, data 8");
  CHECK(plan[0].step.total > (std::int64_t{1} << 30));  // more than a GiB per rank
  REQUIRE(before > 0);
  MESSAGE("the process's peak mapping grew by ", grew >> 20, " MiB while planning ", plan[0].step.total >> 20,
          " MiB per rank");
  CHECK(grew < plan[0].step.total / 4);  // 8 threads' stacks and the bookkeeping: well under a quarter of one rank's
  // 25 heads on tensor 4: GPT-2's own check refuses, naming the values, on every rank.
  const auto refused = [&] {
    return footprint::measure<Gpt, optim::Fsdp>(xl, {.mesh = {.tensor = 4}, .micro_batch = 8});
  };
  CHECK_THROWS_WITH_AS(refused(), doctest::Contains("tensor degree 4 does not divide 25 heads"), Error);
}

TEST_CASE("one rank measured alone plans a mesh of thousands of ranks: GPT-2 against its constexpr replay") {
  using pipeline::Kind;
  const gpt2::Config c{.vocab = 50257, .seq = 1024, .layers = 8, .heads = 16, .width = 1024};
  // 4096 ranks: data 256 x pipe 4 x tensor 4, ZeRO-2 with SP under ZB-H1, 8 micro-batches; the
  // bounding ranks of each pipe rank against the replay of that pipe rank.
  const footprint::Run run{.mesh = {.data = 256, .pipe = 4, .tensor = 4},
                           .micro_batch = 256,
                           .micro_batches = 8,
                           .schedule = Kind::zero_bubble_h1};
  const auto ranks = footprint::measure_bounding<Gpt, optim::Zero2>(c, run);
  CHECK(ranks.size() == 8);  // per pipe rank: data 0 tensor 0, and data 255 tensor 3
  const pipeline::Table table = pipeline::make_table(run.schedule, 4, 8);
  for (const footprint::RankStep& r : ranks) {
    const Spread s{.data_degree = 256, .tensor_degree = 4, .data_index = r.coord.data, .tensor_index = r.coord.tensor};
    same(r.step, footprint::pipeline_step<optim::Zero2, float, true>(c, s, 256, table, r.coord.pipe),
         cat("rank ", r.rank));
  }
  const std::vector<int> bounding{0, 4, 8, 12, 4083, 4087, 4091, 4095};
  CHECK(footprint::bounding_ranks({.data = 256, .pipe = 4, .tensor = 4}) == bounding);
  // A rank outside the mesh, and a rank's own split (no other rank answers), are refused.
  const auto outside = [&] { return footprint::measure_alone<Gpt, optim::Zero2>(c, run, 4096); };
  CHECK_THROWS_WITH_AS(outside(), doctest::Contains("rank 4096 of a world of 4096"), Error);
  StandIn alone(3, 8);
  CHECK_THROWS_WITH_AS(alone.split(0, 3), doctest::Contains("cannot split by color"), Error);
  const std::vector<int> others{0, 1, 2}, mine{1, 3, 5};
  CHECK_THROWS_WITH_AS(alone.group(others, "g"), doctest::Contains("rank 3 of 'world' is not among the 3 members"),
                       Error);
  CHECK(alone.group(mine, "g").rank() == 1);
  CHECK(alone.group(mine, "g").size() == 3);
}

// The time model's Work from the measured step against GPT-2's closed forms (estimate::work): each
// GEMM shape with its count, the attention core's FLOPs, each elementwise op's elements, the bytes
// allocated, each collective call (kind, axis, degree, bytes) with its count. Exact: integers, and
// halves of integers.
namespace {

template <template <class> class M, class Strategy, class P, bool SP, class R>
void check_work(const footprint::Run& run) {
  const auto meta = footprint::measure<M, Strategy>(kSmall, run);
  const footprint::RankStep& r = meta[0];
  const Spread s{.data_degree = run.mesh.data, .tensor_degree = run.mesh.tensor};
  const estimate::Work got = estimate::work_of(r, run.mesh);
  const estimate::Work want = estimate::work<Strategy, P, SP, R>(kSmall, s, run.micro_batch, run.micro_batches);
  INFO(cat(Strategy::name(), SP ? "-sp" : "", " data ", run.mesh.data, " tensor ", run.mesh.tensor, " micro ",
           run.micro_batch, " x ", run.micro_batches));
  using GemmKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool, bool, bool>;
  std::map<GemmKey, std::int64_t> g, wg;
  for (const auto& x : got.gemms) g[{x.m, x.n, x.k, x.ta, x.tb, x.fp8}] += x.count;
  for (const auto& x : want.gemms)
    if (x.count > 0) wg[{x.m, x.n, x.k, x.ta, x.tb, x.fp8}] += x.count;
  CHECK(g == wg);
  CHECK(got.attention_flops == want.attention_flops);
  CHECK(got.elementwise.gelu == want.elementwise.gelu);
  CHECK(got.elementwise.layernorm == want.elementwise.layernorm);
  CHECK(got.elementwise.cross_entropy == want.elementwise.cross_entropy);
  CHECK(got.elementwise.adamw == want.elementwise.adamw);
  CHECK(got.elementwise.fp8_cast == want.elementwise.fp8_cast);
  CHECK((want.elementwise.fp8_cast > 0) == precision_t<P>::gemms::fp8);
  CHECK(got.allocated_bytes == want.allocated_bytes);
  using CommKey = std::tuple<int, int, int, std::int64_t>;
  std::map<CommKey, std::int64_t> c, wc;
  for (const auto& x : got.comms)
    if (x.degree > 1) c[{static_cast<int>(x.collective), static_cast<int>(x.axis), x.degree, x.bytes}] += x.count;
  for (const auto& x : want.comms)
    if (x.degree > 1 && x.count > 0)
      wc[{static_cast<int>(x.collective), static_cast<int>(x.axis), x.degree, x.bytes}] += x.count;
  CHECK(c == wc);
  if (c != wc) {
    for (const auto& [k, n] : c)
      MESSAGE("measured ", std::get<0>(k), " axis ", std::get<1>(k), " bytes ", std::get<3>(k), " x ", n);
    for (const auto& [k, n] : wc)
      MESSAGE("closed form ", std::get<0>(k), " axis ", std::get<1>(k), " bytes ", std::get<3>(k), " x ", n);
  }
}

}  // namespace

TEST_CASE("the time model's work measured on the Meta device equals GPT-2's closed forms") {
  check_work<Gpt, optim::Ddp, float, true, recompute::None>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 4});
  check_work<Gpt, optim::Fsdp, float, true, recompute::None>(
      {.mesh = {.data = 2, .tensor = 2}, .micro_batch = 2, .micro_batches = 2});
  check_work<Gpt, optim::Zero1, float, true, recompute::None>({.mesh = {.data = 2, .tensor = 2}, .micro_batch = 2});
  check_work<GptBf16Full, optim::Zero2, Bf16Mixed, false, recompute::Full>(
      {.mesh = {.data = 2}, .micro_batch = 2, .micro_batches = 2});
  check_work<GptSelective, optim::Zero2, float, false, recompute::Selective>({.mesh = {.tensor = 2}, .micro_batch = 2});
  // FP8: the linear layers' GEMMs marked, their operands' elements cast, the amaxes' all-reduces
  // among the collectives
  check_work<GptFp8, optim::Ddp, Fp8Rowwise, true, recompute::None>(
      {.mesh = {.data = 2, .tensor = 2}, .micro_batch = 4});
}

// Each stage's collectives for one micro-batch on the tensor axis, measured, against the rows
// describe walks over GPT-2's stages and layers: per stage, forward and backward, the calls and bytes of each
// operation (an all-gather counted by its output, the rest by their input, as the communicators
// count them). With and without SP, on tensor 2 and on data 2 x tensor 2.
namespace {

threads::Op op_of(Collective c) {
  switch (c) {
    case Collective::all_reduce: return threads::Op::all_reduce;
    case Collective::reduce_scatter: return threads::Op::reduce_scatter;
    case Collective::all_gather: return threads::Op::all_gather;
    default: return threads::Op::all_to_all;
  }
}

threads::Counters tensor_counts(const std::vector<nn::CommRow>& rows, bool forward) {
  threads::Counters c;
  for (const nn::CommRow& row : rows)
    for (const CommStep& st : forward ? row.forward : row.backward) {
      if (st.axis != Axis::tensor || st.degree < 2) continue;
      if (st.collective != Collective::all_reduce && st.collective != Collective::reduce_scatter &&
          st.collective != Collective::all_gather && st.collective != Collective::all_to_all)
        continue;
      const auto op = static_cast<std::size_t>(op_of(st.collective));
      c.calls[op] += 1;
      c.bytes[op] += static_cast<std::uint64_t>(st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in);
    }
  return c;
}

// One stage's measured tensor-axis collectives against its rows; adds the calls to `total`.
void same_stage(const footprint::StageCollectives& t, const std::vector<nn::CommRow>& rows, const std::string& what,
                std::uint64_t& total) {
  INFO(what);
  const auto i = static_cast<std::size_t>(Axis::tensor);
  const threads::Counters fw = tensor_counts(rows, true), bw = tensor_counts(rows, false);
  for (std::size_t op = 0; op < threads::kOps; ++op) {
    INFO(threads::name(static_cast<threads::Op>(op)));
    CHECK(t.forward[i].calls[op] == fw.calls[op]);
    CHECK(t.forward[i].bytes[op] == fw.bytes[op]);
    CHECK(t.backward[i].calls[op] == bw.calls[op]);
    CHECK(t.backward[i].bytes[op] == bw.bytes[op]);
    total += t.forward[i].calls[op] + t.backward[i].calls[op];
  }
}

// Every stage's measured collectives against its rows: the embedding's and the head's comm_rows,
// block l's from block_rows(rows, l, act, s, e).
template <class M, class C, class BlockRows>
void same_stages(const std::vector<footprint::StageCollectives>& got, const C& c, MeshShape shape, std::int64_t micro,
                 const std::string& what, BlockRows&& block_rows) {
  const Spread s{.data_degree = shape.data, .tensor_degree = shape.tensor};
  const Shape act{micro, c.seq, c.width};
  const std::int64_t e = sizeof(float);
  REQUIRE(got.size() == static_cast<std::size_t>(c.layers + 2));
  std::uint64_t total = 0;
  for (std::size_t st = 0; st < got.size(); ++st) {
    std::vector<nn::CommRow> rows;
    if (st == 0) M::Embedding::comm_rows(rows, act, s, e);
    else if (st + 1 == got.size()) M::Head::comm_rows(rows, c, act, s, e);
    else block_rows(rows, static_cast<std::int64_t>(st) - 1, act, s, e);
    same_stage(got[st], rows, cat(what, "data ", shape.data, " tensor ", shape.tensor, " stage ", got[st].stage),
               total);
  }
  CHECK(total > 0);
}

template <bool SP>
void check_stages(MeshShape shape, std::int64_t micro) {
  using M = gpt2::Model<float, SP, recompute::None, Meta<Host>>;
  const auto got = footprint::stage_collectives<GptOn<SP>::template on>(kSmall, shape, micro);
  Meta<Host> dev;
  M model(dev, kSmall, {.data_degree = shape.data, .tensor_degree = shape.tensor}, micro);
  same_stages<M>(got, kSmall, shape, micro, SP ? "SP " : "", [&](auto& rows, std::int64_t l, auto&... rest) {
    nn::layer_comm_rows(rows, M::spec::block_name(l), model.blocks[static_cast<std::size_t>(l)], rest...);
  });
  CHECK(got[1].stage == "h0");
}

// The custom decoder: describe walks its layers as it does GPT-2's (nn/comm_walk.hpp: Named, Sequential,
// Residual, the redistributions in its Sequentials), each block's rows against the block's
// measured collectives; and the whole step's tensor-axis calls (measure: one optimizer step of
// DDP) against all its rows, forward, backward and the step's, plus the gradient norm's all-reduce
// of one double.
constexpr gpt2::Config kCustomSmall{
    .vocab = 33, .seq = 8, .layers = 3, .heads = 2, .width = 16, .seed = 3, .init_std = 0.1};

template <bool SP>
void check_walked(MeshShape shape, std::int64_t micro) {
  using M = custom::Model<float, SP, Meta<Host>>;
  const auto& c = kCustomSmall;
  const auto got = footprint::stage_collectives<Custom<float, SP>::template on>(c, shape, micro);
  const Spread s{.data_degree = shape.data, .tensor_degree = shape.tensor};
  Meta<Host> dev;
  M model(dev, c, s, micro);
  same_stages<M>(got, c, shape, micro, SP ? "custom SP " : "custom ", [&](auto& rows, std::int64_t l, auto&... rest) {
    nn::layer_comm_rows(rows, M::spec::block_name(l), model.blocks[static_cast<std::size_t>(l)], rest...);
  });

  const std::vector<nn::CommRow> rows = nn::walked_comm_rows(model, micro, s);
  threads::Counters planned = tensor_counts(rows, true) + tensor_counts(rows, false);
  for (const nn::CommRow& row : rows)
    for (const CommStep& st : row.step) {
      REQUIRE(st.collective == Collective::all_reduce);
      planned.calls[static_cast<std::size_t>(threads::Op::all_reduce)] += 1;
      planned.bytes[static_cast<std::size_t>(threads::Op::all_reduce)] += static_cast<std::uint64_t>(st.bytes_in);
    }
  const auto ar = static_cast<std::size_t>(threads::Op::all_reduce);
  planned.calls[ar] += 1;  // the gradient norm
  planned.bytes[ar] += 8;
  const auto step = footprint::measure<Custom<float, SP>::template on, optim::Ddp>(
      c, {.mesh = shape, .micro_batch = micro, .micro_batches = 1});
  const auto t = static_cast<std::size_t>(Axis::tensor);
  for (std::size_t op = 0; op < threads::kOps; ++op) {
    INFO("custom step ", SP ? "SP " : "", "data ", shape.data, " tensor ", shape.tensor, " ",
         threads::name(static_cast<threads::Op>(op)));
    CHECK(step[0].collectives[t].calls[op] == planned.calls[op]);
    CHECK(step[0].collectives[t].bytes[op] == planned.bytes[op]);
  }
  // Under SP the norms' weights and the learned positions are Partial on tensor: 2 C per block, C for
  // the head's norm, T C for the positions.
  std::int64_t step_bytes = 0;
  for (const nn::CommRow& row : rows)
    for (const CommStep& st : row.step) step_bytes += st.bytes_in;
  CHECK(step_bytes == (SP && shape.tensor > 1 ? ((2 * c.layers + 1) * c.width + c.seq * c.width) * 4 : 0));
}

}  // namespace

TEST_CASE("each stage's measured collectives equal the rows GPT-2 gives describe") {
  check_stages<false>({.tensor = 2}, 2);
  check_stages<true>({.tensor = 2}, 2);
  check_stages<true>({.data = 2, .tensor = 2}, 4);
}

TEST_CASE(
    "describe's rows walked over the custom decoder's layers equal each stage's measured collectives and the step's") {
  check_walked<false>({.tensor = 2}, 2);
  check_walked<true>({.tensor = 2}, 2);
  check_walked<true>({.data = 2, .tensor = 2}, 4);

  // Full recompute (recompute::Checkpointed) re-runs each row's forward collectives in its backward.
  using M = custom::Model<float, true, Meta<Host>>;
  Meta<Host> dev;
  const Spread s{.tensor_degree = 2};
  M model(dev, kCustomSmall, s, 2);
  const Shape act{2, kCustomSmall.seq, kCustomSmall.width};
  std::vector<nn::CommRow> plain, full;
  nn::layer_comm_rows(plain, "b", model.blocks[0], act, s, 4);
  nn::layer_comm_rows(
      full, "b", recompute::Checkpointed<typename M::BlockT, float, Meta<Host>>(std::move(model.blocks[0])), act, s, 4);
  REQUIRE(full.size() == plain.size());
  std::size_t moved = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    INFO(full[i].layer);
    CHECK(full[i].forward.size() == plain[i].forward.size());
    CHECK(full[i].backward.size() == plain[i].forward.size() + plain[i].backward.size());
    moved += plain[i].forward.size();
  }
  CHECK(moved == 4);  // SP: each branch's gather in and scatter out
}

// weft-plan's measured cost of a layout (train::measured_cost: the bounding ranks measured alone,
// their work at the cluster's rates, a pipeline from four pipe-1 steps) against GPT-2's closed-form
// cost (models/gpt2/cluster_plan.hpp) of the same layout: the peak and state to the byte (the closed
// form adds its CUDA workspace estimate, which the measurement leaves out), each part of the time to
// 1e-12 relative (the same terms summed in another order).
namespace {

template <class Strategy>
void check_cluster_cost(const train::Setup& x) {
  train::Cluster k;
  k.gpus = x.tensor * x.data * x.pipe;
  k.gpus_per_node = 2;  // data and pipe links leave the node on the larger meshes
  const train::Candidate closed = gpt2::detail::cluster_cost<Strategy, float, true, recompute::None>(kSmall, x, k);
  const train::Candidate measured = train::measured_cost<Gpt, Strategy, float>(kSmall, x, k);
  INFO(x.name(), " ", x.describe(), " schedule ", x.schedule_name());
  CHECK(measured.peak_bytes == closed.peak_bytes - closed.workspace_bytes);
  CHECK(measured.state_bytes == closed.state_bytes);
  const auto near = [&](double a, double b) { return std::abs(a - b) <= 1e-12 * closed.step_seconds(); };
  CHECK(near(measured.time.gemm, closed.time.gemm));
  CHECK(near(measured.time.attention, closed.time.attention));
  CHECK(near(measured.time.elementwise, closed.time.elementwise));
  CHECK(near(measured.time.memory, closed.time.memory));
  CHECK(near(measured.time.tensor_comm, closed.time.tensor_comm));
  CHECK(near(measured.time.data_comm, closed.time.data_comm));
  CHECK(near(measured.pipeline_s, closed.pipeline_s));
  CHECK(closed.step_seconds() > 0);
  if (x.pipe > 1) CHECK(closed.pipeline_s > 0);  // a bubble, messages and the tied all-reduce
}

}  // namespace

TEST_CASE("weft-plan's measured cost of a layout equals GPT-2's closed forms") {
  using pipeline::Kind;
  check_cluster_cost<optim::Fsdp>({.strategy = "fsdp-sp", .tensor = 2, .data = 2, .micro = 4, .accumulation = 2});
  check_cluster_cost<optim::Zero2>({.strategy = "zero2-sp",
                                    .tensor = 1,
                                    .data = 2,
                                    .pipe = 2,
                                    .schedule = Kind::zero_bubble_h1,
                                    .micro = 2,
                                    .accumulation = 4});
  check_cluster_cost<optim::Fsdp>({.strategy = "fsdp-sp",
                                   .tensor = 2,
                                   .data = 1,
                                   .pipe = 2,
                                   .schedule = Kind::one_f_one_b,
                                   .micro = 2,
                                   .accumulation = 2});
  check_cluster_cost<optim::Ddp>({.strategy = "ddp-sp",
                                  .tensor = 1,
                                  .data = 1,
                                  .pipe = 2,
                                  .schedule = Kind::interleaved,
                                  .virtual_stages = 2,
                                  .micro = 1,
                                  .accumulation = 4});
}
