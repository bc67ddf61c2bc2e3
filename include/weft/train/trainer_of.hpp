// defines: train::TrainerOf<F, D, P, SP, Strategy, World>, the one class template of the trainer:
// one rank's model of family F on device D in precision P (sequence parallelism SP), its
// data-parallel protocol (Strategy over the data axis, AdamW), its pipeline (with --pipe > 1), and
// its checkpoint savers, behind train::Trainer (train/trainer.hpp), which the loop drives.
//
// Member order is construction order and matters: the mesh refers to the world, the model to the
// device and the mesh, the protocol and the pipeline to the model. A TrainerOf is neither copied
// nor moved.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/describe.hpp"
#include "weft/nn/embedding.hpp"
#include "weft/nn/layer_walk.hpp"
#include "weft/optim/data_parallel.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/pipeline/pipelined.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/pipeline/trace.hpp"
#include "weft/train/devices.hpp"
#include "weft/train/family.hpp"
#include "weft/train/flops.hpp"
#include "weft/train/options.hpp"
#include "weft/train/signals.hpp"
#include "weft/train/stop.hpp"
#include "weft/train/trainer.hpp"

namespace weft::train {

template <Family F, class D, class P, bool SP, class Strategy, class World>
class TrainerOf final : public Trainer {
  using T = typename precision_t<P>::compute;
  using MeshT = Mesh<World>;
  using Model = model_t<F, P, SP, D>;
  using Protocol =
      decltype(optim::data_parallel<Strategy>(std::declval<Model&>(), optim::AdamW{}, std::declval<MeshT&>()));
  // The executor sends activations with isend, which the NCCL back end does not offer: its
  // processes refuse --pipe > 1 before training (train/checks.hpp), and never hold a pipeline.
  static constexpr bool pipelines = PostsSends<World>;
  using Pipe = std::conditional_t<pipelines, pipeline::Pipeline<Model, MeshT>, NoPipeline>;

 public:
  // Collective: builds this rank's part of the model (its pipe rank's stages), the protocol and the
  // pipeline. `trace`: the run's Chrome trace, or nullptr.
  TrainerOf(World& world, const Options& o, const config_t<F>& cfg, pipeline::Trace* trace)
      : o_(o),
        cfg_(cfg),
        micro_(o.optim.micro()),
        world_(world),
        dev_(DeviceSupport<D>::make(world)),
        mesh_(world, o.mesh.shape()),
        part_(pipeline::Partition::even(o.mesh.pipe, o.mesh.virtual_stages, cfg.layers)),
        model_(*dev_, cfg, mesh_.spread(), micro_, part_.placement(mesh_.coord().pipe)),
        dp_(optim::data_parallel<Strategy>(model_, optim::AdamW{.config = {.lr = o.optim.lr}}, mesh_)),
        trace_(trace) {
    if constexpr (OwnsData<F>) data_.emplace(o, cfg, micro_, o.mesh.data, mesh_.coord().data, o.optim.batch / micro_);
    if constexpr (pipelines)
      if (o.mesh.pipe > 1)
        pp_.emplace(model_,
                    pipeline::make_table(pipeline::kind_named(o.mesh.schedule), o.mesh.pipe,
                                         static_cast<int>(o.optim.batch / micro_), o.mesh.virtual_stages),
                    part_, mesh_);
    if (pp_ && trace_) pp_->set_trace(trace_, world.rank());
    if (o.checkpoint.save_dir.empty()) return;
    const checkpoint::SaveOptions save{.keep = o.checkpoint.keep};
    if (o.checkpoint.save_policy == "consolidated")
      consolidated_.emplace(o.checkpoint.save_dir, save, o.checkpoint.async_save);
    else sharded_.emplace(o.checkpoint.save_dir, save, o.checkpoint.async_save);
  }
  TrainerOf(const TrainerOf&) = delete;
  TrainerOf& operator=(const TrainerOf&) = delete;

  int rank() const override { return world_.rank(); }
  int data_rank() const override { return mesh_.coord().data; }

  void agree(Fingerprint& fp) override {
    // describe's table, walked over this rank's model.
    if constexpr (nn::Describable<Model>)
      if (o_.mesh.pipe == 1) fp.add("collectives of one micro-batch", nn::describe(model_, micro_, mesh_.spread()));
    fp.agree(world_);
  }
  void agree_max(std::span<std::int64_t> values) override { world_.all_reduce(values, ReduceOp::max); }
  double flops_per_token() override {
    if constexpr (requires { F::flops_per_token(cfg_); }) return F::flops_per_token(cfg_);
    else return declared_flops_per_token(model_, mesh_);  // a collective on the pipe axis
  }

  StepResult step(std::span<const Tokens> micro_batches, double lr, double clip, StopPoints& points) override {
    if constexpr (OwnsData<F>) {
      (void)micro_batches, (void)lr, (void)clip, (void)points;
      throw Error(o_.where(), cat("the model family '", F::name(), "' reads its own data, not tokens"),
                  "train it through step_at");
    } else {
      const double scale = 1.0 / static_cast<double>(micro_batches.size());
      std::vector<typename Model::MicroBatch> mbs;
      for (const Tokens& t : micro_batches) mbs.push_back({{t.x, t.y}, micro_, scale});
      return run_step(mbs, lr, clip, points);
    }
  }

  bool owns_data() const override { return OwnsData<F>; }
  StepResult step_at(std::int64_t step, std::int64_t accumulation, double lr, double clip,
                     StopPoints& points) override {
    if constexpr (OwnsData<F>) {
      std::vector<typename Model::MicroBatch> mbs;
      for (std::int64_t a = 0; a < accumulation; ++a)
        mbs.push_back(data_->next(step, a, 1.0 / static_cast<double>(accumulation)));
      return run_step(mbs, lr, clip, points);
    } else {
      (void)step, (void)accumulation, (void)lr, (void)clip, (void)points;
      throw Error(o_.where(), cat("the model family '", F::name(), "' reads tokens"), "train it through step");
    }
  }
  std::vector<std::pair<std::string, double>> validate() override {
    std::vector<std::pair<std::string, double>> out;
    if constexpr (OwnsData<F>) {
      for (int k = 0; k < data_->validation_batches(); ++k) {
        auto [name, mb] = data_->validation(k);
        const double loss = evaluate_batch(mb);
        if (out.empty() || out.back().first != name) out.push_back({name, 0.0});
        out.back().second += loss;
      }
      for (auto& [name, sum] : out) sum /= data_->validation_batches() / static_cast<double>(out.size());
    }
    return out;
  }
  std::string describe_data() const override {
    if constexpr (OwnsData<F>) return data_->describe();
    else return {};
  }

 private:
  // Collective: forward and backward of the step's micro-batches (each weighted by its grad_scale),
  // then the optimizer step.
  StepResult run_step(std::vector<typename Model::MicroBatch>& mbs, double lr, double clip, StopPoints& points) {
    dp_.zero_grad();
    StepResult r;
    Polling hook(world_, stop_requested(), points);  // the executor's stop points, plain or pipelined
    try {
      if (pp_) {  // the schedule runs every micro-batch of the step
        r.loss = pp_->run(mbs, dp_, hook);
      } else {
        for (std::size_t a = 0; a < mbs.size(); ++a) {
          const pipeline::Trace::Scope traced(trace_, world_.rank(), "forward+backward", "compute", -1,
                                              static_cast<int>(a));
          auto ctx = model_.in_flight(mbs[a]);
          r.loss += pipeline::forward_backward(model_, ctx, mesh_, dp_, a + 1 == mbs.size(), hook) * mbs[a].grad_scale;
        }
      }
    } catch (const Abandoned& stop) {
      r.abandoned = stop.signal;  // every rank, at the same point: the optimizer step does not run
      return r;
    }
    const std::int64_t skipped_before = dp_.skipped();
    {
      const pipeline::Trace::Scope traced(trace_, world_.rank(), "optimizer step", "step");
      r.grad_norm = dp_.step(lr, clip);
    }
    r.skipped = dp_.skipped() > skipped_before;  // a non-finite norm: the same on every rank
    if constexpr (nn::contains_layer<typename Model::BlockT, nn::is_router>) r.routing = routing();
    return r;
  }

  // Collective: the routers' statistics over the step's micro-batches (nn::take_router_stats: the
  // losses and loads their means, the dropped slots their sum) over the mesh, in one all-reduce. Each router's are the
  // same on the data, context and tensor ranks of its stage (its forward all-reduces them): each pipe rank writes its
  // stage's into its own slot, and the world's sum is each stage's times its replicas. The dropped slots are each
  // rank's own rows' (a capacity runs without the sequence split: the tensor ranks of a stage hold the same rows).
  Routing routing() {
    nn::RouterStats st;
    for (auto& b : model_.blocks) nn::take_router_stats(st, b);
    const int pipes = mesh_.pipe().size(), me = mesh_.pipe().rank();
    std::vector<double> v(static_cast<std::size_t>(4 * pipes + 1), 0.0);  // (aux, z, routers, load) a stage, dropped
    const auto at = static_cast<std::size_t>(4 * me);
    v[at] = st.aux, v[at + 1] = st.z, v[at + 2] = static_cast<double>(st.routers), v[at + 3] = st.load;
    v.back() = static_cast<double>(st.dropped);  // exact: far below 2^53
    world_.all_reduce(std::span<double>(v), ReduceOp::sum);
    const double replicas = static_cast<double>(world_.size() / pipes);
    double aux = 0, z = 0, routers = 0, load = 0;
    for (std::size_t p = 0; p < static_cast<std::size_t>(pipes); ++p) {
      aux += v[4 * p], z += v[4 * p + 1], routers += v[4 * p + 2];
      load = std::max(load, v[4 * p + 3] / replicas);
    }
    const double n = std::max(routers / replicas, 1.0);
    return {.aux = aux / replicas / n,
            .z = z / replicas / n,
            .load = load,
            .dropped = static_cast<std::int64_t>(v.back()) / o_.mesh.tensor};
  }

  // Collective: one micro-batch's loss, forward only.
  double evaluate_batch(const typename Model::MicroBatch& mb) {
    if (pp_) return pp_->evaluate(mb);
    auto ctx = model_.in_flight(mb);
    pipeline::forward(model_, ctx, mesh_, dp_, nn::Mode::infer);
    return ctx.loss;
  }

 public:
  double evaluate(const Tokens& t) override {
    if constexpr (OwnsData<F>) {
      (void)t;
      throw Error(o_.where(), cat("the model family '", F::name(), "' reads its own data, not tokens"),
                  "evaluate it through validate");
    } else {
      return evaluate_batch({{t.x, t.y}, micro_});
    }
  }

  bool has_logits() const override {
    return requires(typename Model::Ctx& c) { c.head.ce.logits; };
  }
  std::vector<double> next_logits(const Tokens& t) override {
    if constexpr (requires(typename Model::Ctx& c) { c.head.ce.logits; }) {
      auto ctx = model_.in_flight({{t.x, t.y}, micro_});
      pipeline::forward(model_, ctx, mesh_, dp_, nn::Mode::infer);
      const auto logits = ctx.head.ce.logits.to_host();  // (B/dp, T, Vp/tp) Shard<-1> on tensor
      const std::int64_t Vl = nn::padded_vocab(cfg_.vocab, o_.mesh.tensor) / o_.mesh.tensor;
      std::vector<T> all(static_cast<std::size_t>(Vl * o_.mesh.tensor));  // (Vp) of the first sequence's last position
      mesh_.tensor().all_gather(std::span<const T>(logits.data() + logits.size() - Vl, static_cast<std::size_t>(Vl)),
                                std::span<T>(all));
      std::vector<double> out(static_cast<std::size_t>(cfg_.vocab));
      for (std::size_t v = 0; v < out.size(); ++v) out[v] = static_cast<double>(static_cast<accumulate_t<T>>(all[v]));
      return out;
    } else {
      (void)t;
      throw Error(o_.where("--sample"), cat("the model family '", F::name(), "' keeps no logits"),
                  "sample from a language model");
    }
  }

  checkpoint::RunState load(const std::string& path, checkpoint::LoadOptions opt) override {
    return checkpoint::load(path, model_, dp_, mesh_, opt);
  }
  void save(const checkpoint::RunState& state) override {
    if (sharded_) sharded_->save(model_, dp_, mesh_, state);
    if (consolidated_) consolidated_->save(model_, dp_, mesh_, state);
  }
  void poll_saves() override {
    if (sharded_) sharded_->poll(mesh_);
    if (consolidated_) consolidated_->poll(mesh_);
  }
  void wait_saves() override {
    if (sharded_) sharded_->wait(mesh_);
    if (consolidated_) consolidated_->wait(mesh_);
  }

  void synchronize() override { dev_->synchronize(); }
  void reset_peak() override { dev_->reset_peak(); }
  std::int64_t peak_bytes() const override { return dev_->memory().total_peak; }

 private:
  const Options& o_;
  const config_t<F>& cfg_;
  std::int64_t micro_;
  World& world_;
  std::shared_ptr<D> dev_;
  MeshT mesh_;
  pipeline::Partition part_;
  Model model_;
  Protocol dp_;
  pipeline::Trace* trace_;
  std::optional<Pipe> pp_;
  std::optional<checkpoint::Saver<checkpoint::Sharded>> sharded_;
  std::optional<checkpoint::Saver<checkpoint::Consolidated>> consolidated_;
  std::optional<family_data_t<F, T>> data_;  // a family's own data (OwnsData), this rank's
};

}  // namespace weft::train
