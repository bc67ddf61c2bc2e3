// defines: train::TrainerOf<F, D, P, SP, Strategy, World>, the one class template of the trainer:
// one rank's model of family F on device D in precision P (sequence parallelism SP), its
// data-parallel protocol (Strategy over the data axis, AdamW), its pipeline (with --pipe > 1), and
// its checkpoint savers, behind train::Trainer (train/trainer.hpp), which the loop drives.
//
// Member order is construction order and matters: the mesh refers to the world, the model to the
// device and the mesh, the protocol and the pipeline to the model. A TrainerOf is neither copied
// nor moved.
#pragma once

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
    dp_.zero_grad();
    StepResult r;
    const double scale = 1.0 / static_cast<double>(micro_batches.size());
    Polling hook(world_, stop_requested(), points);  // the executor's stop points, plain or pipelined
    try {
      if (pp_) {  // the schedule runs every micro-batch of the step
        std::vector<nn::MicroBatch> mbs;
        for (const Tokens& t : micro_batches) mbs.push_back({{t.x, t.y}, micro_, scale});
        r.loss = pp_->run(mbs, dp_, hook);
      } else {
        for (std::size_t a = 0; a < micro_batches.size(); ++a) {
          const pipeline::Trace::Scope traced(trace_, world_.rank(), "forward+backward", "compute", -1,
                                              static_cast<int>(a));
          auto ctx = model_.in_flight({{micro_batches[a].x, micro_batches[a].y}, micro_, scale});
          r.loss += pipeline::forward_backward(model_, ctx, mesh_, dp_, a + 1 == micro_batches.size(), hook) * scale;
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
    return r;
  }

  double evaluate(const Tokens& t) override {
    if (pp_) return pp_->evaluate({{t.x, t.y}, micro_});
    auto ctx = model_.in_flight({{t.x, t.y}, micro_});
    pipeline::forward(model_, ctx, mesh_, dp_, nn::Mode::infer);
    return ctx.loss;
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
};

}  // namespace weft::train
