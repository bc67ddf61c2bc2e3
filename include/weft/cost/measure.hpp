// weft::footprint::measure: the plan of a training step for any model (nn::StagedModel), measured by
// running the step's real code on the Meta device (device/meta/meta.hpp) over a communicator that
// moves no data (comm/meta.hpp). Every tensor the model's layers, the redistributions, the
// data-parallel protocol and the pipeline allocate is counted as the host allocator counts it, in
// the same order, so the result is exact for any model made of any layers: tests/cost/measure.cpp
// holds it to the allocator's counts of the custom decoder (examples/03_custom_model.hpp) and to
// GPT-2's constexpr replay (models/gpt2/replay.hpp) to the byte. Its cost is the code's control flow, not its
// arithmetic: every rank of the mesh is a thread that allocates nothing.
//
//   template <class D> using Mine = nn::StagedModel<MySpec<F32, false, D>>;
//   const auto ranks = footprint::measure<Mine, optim::Fsdp>(cfg, {.mesh = {.data = 8}, .micro_batch = 16});
//   ranks[r].step.total  // rank r's peak bytes during a step; .state its persistent bytes
//
// measure_rank runs the same step for one rank on any device and communicator: on Host, the
// allocator's own counts (what the test compares with). measure_alone runs it for one rank of a
// mesh of any size with no other rank there (MetaComm<StandIn>), and measure_bounding for the few
// ranks whose plans bound every rank's: what planning a cluster of thousands of GPUs needs.
//
// What a step is: zero_grad, the micro-batches' forward and backward (pipeline::forward_backward,
// or with mesh.pipe > 1 the schedule's table through pipeline::Pipeline on the even partition), then
// the optimizer step, as train::train runs it. The first step is measured: it is the one that
// allocates lazily made buffers, and tests/models/gpt2/replay.cpp shows later ones allocate the same.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/meta.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/cost/ledger.hpp"
#include "weft/cost/memory.hpp"
#include "weft/nn/staged_model.hpp"
#include "weft/ops/all.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/optim/optimizer.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/pipeline/pipelined.hpp"
#include "weft/pipeline/schedule.hpp"

namespace weft::footprint {

// The run a step is planned for.
struct Run {
  MeshShape mesh;
  std::int64_t micro_batch = 1;                           // sequences per micro-batch, global (over the data ranks)
  std::int64_t micro_batches = 1;                         // per optimizer step
  pipeline::Kind schedule = pipeline::Kind::one_f_one_b;  // with mesh.pipe > 1
  int virtual_stages = 1;
};

namespace detail {
// A communicator's call log: (operation, bytes) -> how many calls.
using CallLog = std::map<std::pair<threads::Op, std::uint64_t>, std::int64_t>;
}  // namespace detail

// One rank's plan: its coordinates, the bytes it holds once the model and the protocol are built,
// the first step's peaks (StepPeak: each category's, their sum's, what is left, what was
// allocated), and what the step asked of each axis group of the mesh, indexed by Axis (calls and
// bytes per operation, threads::Counters; zero on a communicator that does not count; the pipe
// axis with a pipeline's tie group, the tied table's gradient all-reduce; the data axis with the
// data x context group, which reduces the gradients under context parallelism).
struct RankStep {
  int rank = 0;
  MeshCoord coord;
  Memory state;
  StepPeak step;
  std::array<threads::Counters, kAxes.size()> collectives{};
  // On the Meta device, for the time model (cost/measure_time.hpp): what the step asked of weft's
  // ops, and of each axis call by call (operation, bytes) -> count.
  MetaWork ops;
  std::array<detail::CallLog, kAxes.size()> calls{};
  // Of the pipe axis's calls, those on the pipeline's tie group (the tied table's gradient).
  detail::CallLog tie_calls;
  // With an expert degree above 1: the expert-data group's calls (the experts' gradients, over the
  // data x context ranks of this rank's expert index), on no axis of `calls`.
  detail::CallLog expert_data_calls;
};

namespace detail {
inline Memory of_current(const MemoryStats& m) {
  Memory out;
  for (std::size_t k = 0; k < kCategories; ++k) out.bytes[k] = m.current[k];
  return out;
}

// The calls of `now` that were not in `before` (a communicator's call log, taken twice).
inline CallLog calls_since(const CallLog& now, const CallLog& before) {
  CallLog out;
  for (const auto& [key, n] : now) {
    const auto it = before.find(key);
    const std::int64_t d = n - (it == before.end() ? 0 : it->second);
    if (d > 0) out[key] = d;
  }
  return out;
}

// A group's counts before the step, for a group counted on an axis besides the axis's own (a
// pipeline's tie group on pipe; the data x context group on data).
struct GroupCounts {
  threads::Counters counters{};
  CallLog calls;
  template <class G>
  static GroupCounts of(G& g) {
    GroupCounts c;
    if constexpr (requires { g.counters(); }) c.counters = g.counters();
    if constexpr (requires { g.calls(); }) c.calls = g.calls();
    return c;
  }
  // Adds what g was asked since onto axis a of out; returns those calls.
  template <class G>
  CallLog add_since(G& g, Axis a, RankStep& out) const {
    const auto i = static_cast<std::size_t>(a);
    CallLog added;
    if constexpr (requires { g.counters(); }) out.collectives[i] = out.collectives[i] + (g.counters() - counters);
    if constexpr (requires { g.calls(); }) {
      added = calls_since(g.calls(), calls);
      for (const auto& [key, n] : added) out.calls[i][key] += n;
    }
    return added;
  }
};
}  // namespace detail

// One training step of a Model on this rank of `world` (device `dev`, the model's device), from a
// fresh model and protocol; returns what the device's allocator counted. Throws the model's own
// errors for sizes it refuses.
template <class Model, class Strategy, class Rule = optim::AdamW, class D, class C>
RankStep measure_rank(D& dev, C& world, const typename Model::config_type& c, const Run& run, Rule rule = {}) {
  Mesh mesh{world, run.mesh};
  const std::int64_t micro = run.micro_batch, m = run.micro_batches < 1 ? 1 : run.micro_batches;
  const auto part = pipeline::Partition::even(run.mesh.pipe, run.virtual_stages, c.layers);
  Model model(dev, c, mesh.spread(), micro, part.placement(mesh.coord().pipe));
  auto dp = optim::data_parallel<Strategy>(model, rule, mesh);
  std::optional<pipeline::Pipeline<Model, decltype(mesh)>> pp;
  if (run.mesh.pipe > 1)
    pp.emplace(model, pipeline::make_table(run.schedule, run.mesh.pipe, static_cast<int>(m), run.virtual_stages), part,
               mesh);
  // The model's inputs, zeros (token 0 is a valid id of any vocabulary): the counts do not depend on
  // the values. They are host memory, even on the Meta device: a micro-batch past 2^28 values a rank
  // is refused, not allocated.
  using In = typename Model::Inputs;
  double values = 0;
  for (std::int64_t v : In::per_sample(c))
    values += static_cast<double>(micro / run.mesh.data) * static_cast<double>(v);
  if (values > (1 << 28))
    throw Error("plan",
                cat("a micro-batch of ", micro, " samples (sequences of ", c.seq, ") over ", run.mesh.data,
                    " data ranks is ", values, " input values a rank, more than a plan feeds (2^28)"),
                "plan a smaller micro-batch (--micro-batch) or more data ranks");
  const nn::ZeroInputs<In> zeros(c, micro / run.mesh.data);
  RankStep out{world.rank(), mesh.coord(), detail::of_current(dev.memory()), {}, {}, {}, {}, {}, {}};
  constexpr bool counted = requires { mesh.comm(Axis::data).counters(); };
  std::array<threads::Counters, kAxes.size()> comm_before{};
  if constexpr (counted)
    for (Axis a : kAxes) comm_before[static_cast<std::size_t>(a)] = mesh.comm(a).counters();
  constexpr bool logged = requires { mesh.comm(Axis::data).calls(); };
  std::array<detail::CallLog, kAxes.size()> calls_before{};
  if constexpr (logged)
    for (Axis a : kAxes) calls_before[static_cast<std::size_t>(a)] = mesh.comm(a).calls();
  // The pipeline's tie group is part of the pipe axis; with context parallelism the gradients reduce
  // over the data x context group, counted on the data axis.
  std::optional<detail::GroupCounts> tie_before, folded_before, experts_before;
  if (pp && pp->tie_group()) tie_before = detail::GroupCounts::of(*pp->tie_group());
  if (run.mesh.context > 1) folded_before = detail::GroupCounts::of(mesh.data_context());
  if (run.mesh.expert > 1) experts_before = detail::GroupCounts::of(mesh.expert_data());
  if constexpr (is_meta<D>) dev.work = {};
  const MemoryStats before = dev.memory();
  dev.reset_peak();
  dp.zero_grad();
  if (pp) {
    const std::vector<typename Model::MicroBatch> mbs(
        static_cast<std::size_t>(m), typename Model::MicroBatch{zeros.inputs(), micro, 1.0 / static_cast<double>(m)});
    pp->run(mbs, dp);
  } else {
    for (std::int64_t k = 0; k < m; ++k) {
      auto ctx = model.in_flight({zeros.inputs(), micro, 1.0 / static_cast<double>(m)});
      pipeline::forward_backward(model, ctx, mesh, dp, k + 1 == m);
    }
  }
  dp.step(1e-3, 1.0);
  const MemoryStats& after = dev.memory();
  for (std::size_t k = 0; k < kCategories; ++k) {
    out.step.peak.bytes[k] = after.peak[k];
    out.step.after.bytes[k] = after.current[k];
    out.step.allocated.bytes[k] = after.allocated[k] - before.allocated[k];
  }
  out.step.total = after.total_peak;
  out.step.allocations = after.allocations - before.allocations;
  if constexpr (counted)
    for (Axis a : kAxes)
      out.collectives[static_cast<std::size_t>(a)] = mesh.comm(a).counters() - comm_before[static_cast<std::size_t>(a)];
  if constexpr (logged)
    for (Axis a : kAxes)
      out.calls[static_cast<std::size_t>(a)] =
          detail::calls_since(mesh.comm(a).calls(), calls_before[static_cast<std::size_t>(a)]);
  if (tie_before) out.tie_calls = tie_before->add_since(*pp->tie_group(), Axis::pipe, out);
  if (folded_before) folded_before->add_since(mesh.data_context(), Axis::data, out);
  if constexpr (logged)
    if (experts_before) out.expert_data_calls = detail::calls_since(mesh.expert_data().calls(), experts_before->calls);
  if constexpr (is_meta<D>) out.ops = dev.work;
  return out;
}

// Every rank's plan of one step of ModelOn<Meta<Host>> (ModelOn: the model over its device) under
// Strategy and Rule, by world rank: the host allocator's counts, without its memory. Up to 1024
// ranks (run_threads' limit).
template <template <class> class ModelOn, class Strategy, class Rule = optim::AdamW>
std::vector<RankStep> measure(const typename ModelOn<Meta<Host>>::config_type& c, const Run& run, Rule rule = {}) {
  using Model = ModelOn<Meta<Host>>;
  const int ranks = run.mesh.ranks();
  std::vector<RankStep> out(static_cast<std::size_t>(ranks > 0 ? ranks : 0));
  run_threads(ranks, [&](ThreadComm& w) {
    Meta<Host> dev;
    MetaComm<ThreadComm> world(w);
    out[static_cast<std::size_t>(w.rank())] = measure_rank<Model, Strategy>(dev, world, c, run, rule);
  });
  return out;
}

// One rank's plan of one step of ModelOn<Meta<Host>>, measured alone: the rank's groups stand in for
// the others (comm/meta.hpp), so any mesh is measured in the time of one rank's step. Equal to
// measure(c, run)[rank] (tests/cost/measure.cpp).
template <template <class> class ModelOn, class Strategy, class Rule = optim::AdamW>
RankStep measure_alone(const typename ModelOn<Meta<Host>>::config_type& c, const Run& run, int rank, Rule rule = {}) {
  validate(run.mesh, run.mesh.ranks());
  Meta<Host> dev;
  MetaComm<StandIn> world(StandIn(rank, run.mesh.ranks()));
  return measure_rank<ModelOn<Meta<Host>>, Strategy>(dev, world, c, run, rule);
}

// The ranks measure_bounding measures: on each pipe rank, the first and the last of its data x
// context x tensor ranks (world ranks, ascending). Ranks that differ only in their data, context and
// tensor indices hold shards of equal shapes (weft pads a shard to the group's equal share; context
// ranks hold T / c rows each), so their plans are equal; the last is measured besides the first to
// hold that to account, not to trust it.
inline std::vector<int> bounding_ranks(const MeshShape& s) {
  std::vector<int> out;
  for (int p = 0; p < s.pipe; ++p) {
    out.push_back(world_rank(s, {.pipe = p}));  // data, context and tensor index 0
    const int last = world_rank(s, {.data = s.data - 1, .pipe = p, .context = s.context - 1, .tensor = s.tensor - 1});
    if (last != out.back()) out.push_back(last);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The bounding ranks' plans, each measured alone: the largest of them per pipe rank is the mesh's
// (tests/cost/measure.cpp holds it to every rank's on the meshes it measures both ways).
template <template <class> class ModelOn, class Strategy, class Rule = optim::AdamW>
std::vector<RankStep> measure_bounding(const typename ModelOn<Meta<Host>>::config_type& c, const Run& run,
                                       Rule rule = {}) {
  std::vector<RankStep> out;
  for (int r : bounding_ranks(run.mesh)) out.push_back(measure_alone<ModelOn, Strategy>(c, run, r, rule));
  return out;
}

// One stage's collectives for one micro-batch, forward and backward, on each axis group (indexed
// by Axis): what describe's table gives GPT-2 from its comm_rows, for any model, as the thread
// communicator counts them.
struct StageCollectives {
  std::string stage;  // "embedding", Spec::block_name(l), "head"
  std::array<threads::Counters, kAxes.size()> forward{}, backward{};
};

// Every stage of ModelOn<Meta<Host>> on rank 0 of a data x tensor mesh (pipe 1), for one micro-batch
// of `micro_batch` sequences (global), its stages run one by one (pipeline::LocalGradients: the
// data-parallel protocol's collectives are not the model's).
template <template <class> class ModelOn>
std::vector<StageCollectives> stage_collectives(const typename ModelOn<Meta<Host>>::config_type& c, MeshShape shape,
                                                std::int64_t micro_batch) {
  using Model = ModelOn<Meta<Host>>;
  shape.pipe = 1;
  std::vector<StageCollectives> out;
  run_threads(shape.ranks(), [&](ThreadComm& w) {
    Meta<Host> dev;
    MetaComm<ThreadComm> world(w);
    Mesh mesh{world, shape};
    Model model(dev, c, mesh.spread(), micro_batch);
    const nn::ZeroInputs<typename Model::Inputs> zeros(c, micro_batch / shape.data);
    auto ctx = model.in_flight({zeros.inputs(), micro_batch});
    const std::size_t stages = model.stages();
    std::vector<StageCollectives> got(stages);
    const auto snapshot = [&] {
      std::array<threads::Counters, kAxes.size()> now{};
      for (Axis a : kAxes) now[static_cast<std::size_t>(a)] = mesh.comm(a).counters();
      return now;
    };
    const auto since = [&](const std::array<threads::Counters, kAxes.size()>& before) {
      std::array<threads::Counters, kAxes.size()> d = snapshot();
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = d[i] - before[i];
      return d;
    };
    for (std::size_t st = 0; st < stages; ++st) {
      got[st].stage = st == 0            ? std::string("embedding")
                      : st + 1 == stages ? std::string("head")
                                         : std::string(Model::spec::block_name(static_cast<std::int64_t>(st - 1)));
      const auto before = snapshot();
      model.forward(st, ctx, mesh, nn::Mode::train);
      got[st].forward = since(before);
    }
    for (std::size_t st = stages; st-- > 0;) {
      const auto before = snapshot();
      model.backward(st, ctx, mesh);
      got[st].backward = since(before);
    }
    if (w.rank() == 0) out = std::move(got);
  });
  return out;
}

}  // namespace weft::footprint
