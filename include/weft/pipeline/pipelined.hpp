// Pipeline parallelism: a staged model cut into virtual stages over the pipe axis, run by a
// schedule's table (schedule.hpp) for the micro-batches of one optimizer step.
//
//   Partition        which blocks each virtual stage holds: evenly by default, or as given; the
//                    embedding with virtual stage 0, the final LayerNorm, LM head and loss with the
//                    last; stage s on pipe rank s % p (chunk s / p)
//   Pipeline         runs one rank's table: forward and backward (and, for ZB-H1, the deferred
//                    weight gradients) of its stages per micro-batch; exchanges activations and
//                    gradients with its neighbours (sends posted without waiting, each buffer
//                    kept until a later receive proves it delivered (pipeline::delivered) or the
//                    run ends; receives in table order); tells the data-parallel protocol when
//                    each unit is first needed and last used; sums the tied embedding's gradients
//                    over the first and last pipe ranks; returns the step's mean loss on every rank.
//
// Composes with tensor and sequence parallelism (inside each stage) and with every data strategy
// (per rank's units). A failed rank makes every rank's next message or collective raise within the
// communicator's deadline.
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "weft/nn/staged_model.hpp"
#include "weft/pipeline/executor.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/pipeline/trace.hpp"

namespace weft::pipeline {

struct Partition {
  int p = 1, v = 1;
  std::int64_t layers = 0;
  std::vector<std::int64_t> first;  // per virtual stage: its first block; first[S] = layers

  int stages() const { return p * v; }
  int rank_of(int s) const { return s % p; }

  // Blocks split evenly: each of the p V virtual stages holds layers / (p V) blocks.
  static Partition even(int p, int v, std::int64_t layers) {
    if (p < 1 || v < 1)
      throw Error("pipeline::Partition", cat("pipe degree ", p, " and ", v, " virtual stages"), "use degrees >= 1");
    const std::int64_t S = static_cast<std::int64_t>(p) * v;
    if (layers % S != 0)
      throw Error(
          "pipeline::Partition",
          cat(layers, " layers do not split evenly over pipe ", p, " x ", v, " virtual stages = ", S, " stages"),
          cat("use a number of layers that is a multiple of ", S, ", or give each stage's blocks explicitly"));
    std::vector<std::int64_t> counts(static_cast<std::size_t>(S), layers / S);
    return given(p, v, counts);
  }
  // Stage s holds counts[s] blocks, in order.
  static Partition given(int p, int v, const std::vector<std::int64_t>& counts) {
    const std::int64_t S = static_cast<std::int64_t>(p) * v;
    if (static_cast<std::int64_t>(counts.size()) != S)
      throw Error("pipeline::Partition", cat(counts.size(), " stage sizes for pipe ", p, " x ", v, " virtual stages"),
                  cat("give ", S, " sizes"));
    Partition out{p, v, 0, {0}};
    for (std::size_t st = 0; st < counts.size(); ++st) {
      const std::int64_t c = counts[st];
      // A stage between the first (the embedding) and the last (the head) must hold a block.
      const bool ends = st == 0 || st + 1 == counts.size();
      if (c < 0 || (c == 0 && !ends))
        throw Error("pipeline::Partition", cat("virtual stage ", st, " of ", counts.size(), " is given ", c, " blocks"),
                    ends ? "use sizes >= 0" : "give every stage but the first and the last at least one block");
      out.first.push_back(out.first.back() + c);
    }
    out.layers = out.first.back();
    return out;
  }

  // The model's stages (0 the embedding, 1 .. L the blocks, L + 1 the head) in virtual stage s.
  std::vector<std::size_t> fine(int s) const {
    std::vector<std::size_t> out;
    if (s == 0) out.push_back(0);
    for (std::int64_t l = first[static_cast<std::size_t>(s)]; l < first[static_cast<std::size_t>(s) + 1]; ++l)
      out.push_back(static_cast<std::size_t>(l) + 1);
    if (s == stages() - 1) out.push_back(static_cast<std::size_t>(layers) + 1);
    return out;
  }
  // What pipe rank r holds.
  nn::Parts placement(int r) const {
    nn::Parts pl{std::vector<bool>(static_cast<std::size_t>(layers), false), r == 0, r == rank_of(stages() - 1)};
    for (int s = r; s < stages(); s += p)
      for (std::int64_t l = first[static_cast<std::size_t>(s)]; l < first[static_cast<std::size_t>(s) + 1]; ++l)
        pl.blocks[static_cast<std::size_t>(l)] = true;
    return pl;
  }
};

// What a Pipeline reads of a model besides its stages (executor.hpp): its micro-batch type, the
// number of blocks, the stream's global shape for a micro-batch, and whether its head is tied to the embedding (then
// the first and last pipe ranks sum the table's gradients). nn::StagedModel satisfies it for any Spec;
// benchmarks/pipeline.cpp has a model of sleeps that does too.
template <class Model>
concept PipelinedModel = requires(Model& m, std::int64_t batch) {
  typename Model::Ctx;
  typename Model::MicroBatch;  // what in_flight takes (nn::Batch of the model's inputs)
  typename Model::value_type;
  typename Model::device;
  typename Model::A;
  { Model::tied } -> std::convertible_to<bool>;
  { m.layers() } -> std::convertible_to<std::int64_t>;
  { m.stream_shape(batch) } -> std::same_as<Shape>;
  m.defer_weight(true);
};

template <PipelinedModel Model, AxisComms M>
class Pipeline {
  using Comm = std::remove_cvref_t<decltype(std::declval<M&>().comm(Axis::pipe))>;
  using Ctx = typename Model::Ctx;
  using T = typename Model::value_type;
  using D = typename Model::device;
  using Act = Tensor<T, typename Model::A, D>;
  // A model with a side input (nn/side.hpp) passes it on with the stream, and its gradient back with
  // the stream's: a second message beside each activation and gradient, (B/dp, K) in act::Full.
  static constexpr bool sided = [] {
    if constexpr (requires { Model::sided; }) return Model::sided;
    else return false;
  }();
  using SideAct = Tensor<T, nn::act::Full, D>;

 public:
  // table: this schedule's table for the mesh's pipe degree; the model built with
  // part.placement(pipe rank). Collective over the pipe group (it makes the tied-table group).
  Pipeline(Model& model, Table table, Partition part, M& mesh)
      : model_(&model), table_(std::move(table)), part_(std::move(part)), mesh_(&mesh) {
    Comm& pipe = mesh.comm(Axis::pipe);
    if (table_.p != pipe.size() || part_.p != pipe.size() || table_.v != part_.v)
      throw Error("pipeline::Pipeline",
                  cat("a table for pipe ", table_.p, " x ", table_.v, ", a partition for pipe ", part_.p, " x ",
                      part_.v, ", on a pipe group of ", pipe.size()),
                  "build the table and the partition for the mesh's pipe degree and the same virtual stages");
    if (part_.layers != model.layers())
      throw Error("pipeline::Pipeline", cat("a partition of ", part_.layers, " layers for a model of ", model.layers()),
                  "partition the model's layers");
    rank_ = pipe.rank();
    lowest_stage_ = rank_;
    delivered_ = delivered(table_, rank_);
    cuts_ = cuts(table_);
    // The tied table's two holders (first and last pipe ranks) sum its gradients (a model whose
    // head has a table of its own has none).
    const int last = part_.rank_of(part_.stages() - 1);
    if (Model::tied && last != 0) {
      const bool holder = rank_ == 0 || rank_ == last;
      std::vector<int> members;  // this rank's group: the two holders, or every other pipe rank
      for (int r = 0; r < pipe.size(); ++r)
        if ((r == 0 || r == last) == holder) members.push_back(r);
      tie_.emplace(subgroup(pipe, holder ? 0 : 1, rank_, members, cat(pipe.name(), "/tied")));
    }
    model.defer_weight(table_.split_weight);
  }

  // The tied table's group of the first and last pipe ranks (every other pipe rank's group of the
  // rest), where the model ties its embedding and head across pipe ranks: what it was asked is the
  // plan's (cost/measure.hpp counts it on the pipe axis).
  const std::optional<Comm>& tie_group() const { return tie_; }

  // One optimizer step's forwards and backwards over m micro-batches (the table's m), gradients
  // left for dp.step(); returns the mean loss of the micro-batches on every rank. hook.point() is
  // called at each of the table's cuts (pipeline::cuts; the same number on every rank): where it
  // throws StepStopped, this rank first receives every message sent to it before the cut (into
  // scratch) and waits for its own to be received, so that no rank is left with a message in
  // flight, then the exception goes on. The weights are untouched by a stopped step; the gradients
  // are partial.
  template <DataProtocol P, StopHook H = NoStop>
  double run(std::span<const typename Model::MicroBatch> micro, P& dp, H&& hook = H{}) {
    if (static_cast<int>(micro.size()) != table_.m)
      throw Error("pipeline::Pipeline::run", cat(micro.size(), " micro-batches for a table of ", table_.m),
                  "pass the number of micro-batches the schedule was built for");
    const auto& acts = table_.ranks[static_cast<std::size_t>(rank_)];
    // The last backward (or weight) action of each unit this rank holds: DDP reduces it there.
    std::vector<std::size_t> last_use(model_->units().size(), 0);
    for (std::size_t k = 0; k < acts.size(); ++k)
      if (acts[k].what == (table_.split_weight ? Do::weight : Do::backward))
        for (std::size_t fs : part_.fine(acts[k].stage))
          for (std::size_t u : model_->units_of(fs)) last_use[u] = k;
    std::vector<std::optional<Ctx>> ctx(static_cast<std::size_t>(table_.m));
    // a compute's output, until the next exchange sends it (and a sided model's side input or its
    // gradient)
    std::vector<Act> outgoing(static_cast<std::size_t>(table_.m));
    std::vector<SideAct> outgoing_side(sided ? static_cast<std::size_t>(table_.m) : 0);
    // Posted sends (their action index, handle and buffer), each freed once a later receive proves
    // it arrived (pipeline::delivered), the rest at the end.
    struct Sent {
      std::size_t action;
      typename Comm::SendHandle handle;
      Act buffer;
      SideAct side = {};
    };
    std::vector<Sent> sent;
    Comm& pipe = mesh_->comm(Axis::pipe);
    // If this rank fails mid-step, its posted sends are withdrawn before their buffers are freed
    // (a neighbour never reads freed memory; it gets an Error instead).
    struct Withdraw {
      Comm& pipe;
      std::vector<Sent>& sent;
      ~Withdraw() {
        for (auto& s : sent) pipe.cancel(s.handle);
      }
    } withdraw{pipe, sent};
    double loss = 0;
    // The cuts at this rank's point `at` (2 k: before action k, 2 k + 1: between the send and the
    // receive of exchange k): the hook's points; one that throws stops the step there.
    std::size_t cut = 0;
    const auto& points = cuts_.at[static_cast<std::size_t>(rank_)];
    const auto reach = [&](int at) {
      for (; cut < points.size() && points[cut] == at; ++cut) {
        try {
          hook.point();
        } catch (const StepStopped&) {
          drain(static_cast<int>(cut), micro, sent, pipe);
          throw;
        }
      }
    };
    for (std::size_t k = 0; k < acts.size(); ++k) {
      const Action& a = acts[k];
      reach(static_cast<int>(2 * k));
      if (a.what == Do::exchange) {
        if (a.send.present()) {
          Act out = std::move(outgoing[static_cast<std::size_t>(a.send.micro)]);
          auto h = pipe.isend(std::span<const T>(out.data(), static_cast<std::size_t>(out.numel())), a.send_to);
          sent.push_back({k, h, std::move(out)});
          if constexpr (sided) {
            SideAct side = std::move(outgoing_side[static_cast<std::size_t>(a.send.micro)]);
            auto hs = pipe.isend(std::span<const T>(side.data(), static_cast<std::size_t>(side.numel())), a.send_to);
            sent.push_back({k, hs, {}, std::move(side)});
          }
        }
        reach(static_cast<int>(2 * k + 1));
        if (a.recv.present()) {
          const Trace::Scope wait(trace_, lane_, "recv wait", "wait", a.recv.stage, a.recv.micro);
          Ctx& c = in_flight(ctx, micro, a.recv.micro);
          c.x = Act::empty(model_->dev(), shape(micro[static_cast<std::size_t>(a.recv.micro)]), mesh_->spread(),
                           Category::activations);
          pipe.recv(std::span<T>(c.x.data(), static_cast<std::size_t>(c.x.numel())), a.recv_from);
          if constexpr (sided) recv_side(c, micro[static_cast<std::size_t>(a.recv.micro)], a.recv.grad, a.recv_from);
          // The sends this message proves delivered: waiting returns at once; their buffers go.
          std::erase_if(sent, [&](Sent& x) {
            if (delivered_[x.action] != static_cast<int>(k)) return false;
            pipe.wait(x.handle);
            return true;
          });
        }
        continue;
      }
      Ctx& c = in_flight(ctx, micro, a.micro);
      const std::vector<std::size_t> fine = part_.fine(a.stage);
      std::optional<Trace::Scope> traced;
      if (trace_) traced.emplace(trace_, lane_, name(a.what), "compute", a.stage, a.micro);
      if (a.what == Do::forward) {
        for (std::size_t fs : fine) {
          for (std::size_t u : model_->units_of(fs)) dp.acquire(u, Pass::forward);
          model_->forward(fs, c, *mesh_);
          for (std::size_t u : model_->units_of(fs)) dp.release(u, Pass::forward, false);
        }
        if (a.stage == part_.stages() - 1) loss += c.loss;
      } else if (a.what == Do::backward) {
        for (auto it = fine.rbegin(); it != fine.rend(); ++it) {
          for (std::size_t u : model_->units_of(*it)) dp.acquire(u, Pass::backward);
          model_->backward(*it, c, *mesh_);
          if (!table_.split_weight)
            for (std::size_t u : model_->units_of(*it)) dp.release(u, Pass::backward, last_use[u] == k);
        }
      } else {  // the deferred weight gradients, then the units are done for this micro-batch
        for (auto it = fine.rbegin(); it != fine.rend(); ++it) {
          // An earlier weight pass may have reduced and freed the gradient buffer (ZeRO-2, FSDP).
          for (std::size_t u : model_->units_of(*it)) dp.acquire(u, Pass::weight);
          model_->backward_weight(*it, c);
          for (std::size_t u : model_->units_of(*it)) dp.release(u, Pass::weight, last_use[u] == k);
        }
      }
      // What the next exchange sends: a forward's output (but the last stage's), a backward's input
      // gradient (but the first stage's).
      if ((a.what == Do::forward && a.stage + 1 < part_.stages()) || (a.what == Do::backward && a.stage > 0)) {
        outgoing[static_cast<std::size_t>(a.micro)] = std::move(c.x);
        // The side input goes on as a copy (this rank's blocks read it in their backward too); its
        // gradient, the shares summed so far, goes back whole (this rank receives the sum again
        // before any earlier stage of its own runs).
        if constexpr (sided)
          outgoing_side[static_cast<std::size_t>(a.micro)] =
              a.what == Do::forward ? c.side.value.clone(Category::activations) : std::move(c.side.grad);
      }
      traced.reset();
      const bool done = table_.split_weight ? a.what == Do::weight : a.what == Do::backward;
      if (done && a.stage == lowest_stage_) ctx[static_cast<std::size_t>(a.micro)].reset();
    }
    reach(static_cast<int>(2 * acts.size()));
    {
      const Trace::Scope wait(trace_, lane_, "send wait", "wait");
      for (Sent& x : sent) pipe.wait(x.handle);
      sent.clear();  // delivered: nothing to withdraw
    }
    if (tie_) {
      const Trace::Scope reduce(trace_, lane_, "tied all-reduce", "collective");
      if constexpr (requires { dp.reduce_tied(*tie_); }) dp.reduce_tied(*tie_);
    }
    // The loss is known on the last stage's rank: every rank gets the mean.
    std::array<double, 1> l{loss / table_.m};
    const Trace::Scope reduce(trace_, lane_, "loss all-reduce", "collective");
    pipe.all_reduce(std::span<double>(l));
    return l[0];
  }

  // The forward alone of one micro-batch through every stage (evaluation: Mode::infer, nothing kept
  // for a backward); returns its loss on every rank.
  double evaluate(const typename Model::MicroBatch& mb) {
    Comm& pipe = mesh_->comm(Axis::pipe);
    Ctx c = model_->in_flight(mb);
    for (int s = rank_; s < part_.stages(); s += part_.p) {
      if (s > 0) {
        c.x = Act::empty(model_->dev(), shape(mb), mesh_->spread(), Category::activations);
        pipe.recv(std::span<T>(c.x.data(), static_cast<std::size_t>(c.x.numel())), part_.rank_of(s - 1));
        if constexpr (sided) recv_side(c, mb, false, part_.rank_of(s - 1));
      }
      for (std::size_t fs : part_.fine(s)) model_->forward(fs, c, *mesh_, nn::Mode::infer);
      if (s + 1 < part_.stages()) {
        pipe.send(std::span<const T>(c.x.data(), static_cast<std::size_t>(c.x.numel())), part_.rank_of(s + 1));
        if constexpr (sided)
          pipe.send(std::span<const T>(c.side.value.data(), static_cast<std::size_t>(c.side.value.numel())),
                    part_.rank_of(s + 1));
      }
    }
    std::array<double, 1> l{rank_ == part_.rank_of(part_.stages() - 1) ? c.loss : 0.0};
    pipe.all_reduce(std::span<double>(l));
    return l[0];
  }

  const Table& table() const { return table_; }

  // Records every action of run() on lane `lane` of `t` (nullptr: no trace).
  void set_trace(Trace* t, int lane) {
    trace_ = t;
    lane_ = lane;
  }

 private:
  Shape shape(const typename Model::MicroBatch& mb) const { return model_->stream_shape(mb.batch); }

  // A step stopped at cut c: receives (into scratch) every message this rank has still to receive
  // whose sender posted it before its own point of cut c, in this rank's table order, then waits for
  // the sends it posted itself (their receivers drain them the same way). Every rank stops at the
  // same cut, so this waits for nothing that is not already posted.
  template <class SentList>
  void drain(int c, std::span<const typename Model::MicroBatch> micro, SentList& sent, Comm& pipe) {
    const auto S = table_.stages();
    const auto key = [&](const Msg& x) { return ((x.grad ? 1 : 0) * S + x.stage) * table_.m + x.micro; };
    std::vector<int> sent_at(static_cast<std::size_t>(2 * S * table_.m), -1);  // the point after a message's send
    for (int r = 0; r < table_.p; ++r)
      for (std::size_t k = 0; k < table_.ranks[static_cast<std::size_t>(r)].size(); ++k) {
        const Action& x = table_.ranks[static_cast<std::size_t>(r)][k];
        if (x.what == Do::exchange && x.send.present())
          sent_at[static_cast<std::size_t>(key(x.send))] = static_cast<int>(2 * k + 1);
      }
    const auto& acts = table_.ranks[static_cast<std::size_t>(rank_)];
    const int mine = cuts_.at[static_cast<std::size_t>(rank_)][static_cast<std::size_t>(c)];
    for (std::size_t k = 0; k < acts.size(); ++k) {
      const Action& a = acts[k];
      // received already
      if (a.what != Do::exchange || !a.recv.present() || static_cast<int>(2 * k + 2) <= mine) continue;
      const int theirs = cuts_.at[static_cast<std::size_t>(a.recv_from)][static_cast<std::size_t>(c)];
      if (sent_at[static_cast<std::size_t>(key(a.recv))] > theirs) continue;  // never sent: the sender stopped first
      Act scratch = Act::empty(model_->dev(), shape(micro[static_cast<std::size_t>(a.recv.micro)]), mesh_->spread(),
                               Category::activations);
      pipe.recv(std::span<T>(scratch.data(), static_cast<std::size_t>(scratch.numel())), a.recv_from);
      if constexpr (sided) {
        SideAct side =
            SideAct::empty(model_->dev(), model_->side_shape(micro[static_cast<std::size_t>(a.recv.micro)].batch),
                           mesh_->spread(), Category::activations);
        pipe.recv(std::span<T>(side.data(), static_cast<std::size_t>(side.numel())), a.recv_from);
      }
    }
    for (auto& x : sent) pipe.wait(x.handle);
    sent.clear();  // delivered: nothing to withdraw
  }
  // A sided model's second message: the side input (forward; its gradient starts at zero here) or
  // the gradient's shares summed over the later stages (grad), in place of this rank's.
  void recv_side(Ctx& c, const typename Model::MicroBatch& mb, bool grad, int from) {
    Comm& pipe = mesh_->comm(Axis::pipe);
    const Shape ss = model_->side_shape(mb.batch);
    SideAct& into = grad ? c.side.grad : c.side.value;
    into = SideAct::empty(model_->dev(), ss, mesh_->spread(), Category::activations);
    pipe.recv(std::span<T>(into.data(), static_cast<std::size_t>(into.numel())), from);
    if (!grad) c.side.grad = SideAct::zeros(model_->dev(), ss, mesh_->spread(), Category::activations);
  }

  Ctx& in_flight(std::vector<std::optional<Ctx>>& ctx, std::span<const typename Model::MicroBatch> micro, int i) {
    auto& c = ctx[static_cast<std::size_t>(i)];
    if (!c) c.emplace(model_->in_flight(micro[static_cast<std::size_t>(i)]));
    return *c;
  }

  Model* model_;
  Table table_;
  Partition part_;
  M* mesh_;
  int rank_ = 0;
  int lowest_stage_ = 0;        // this rank's first virtual stage: a micro-batch's last backward here
  std::vector<int> delivered_;  // per action: where its send is known delivered (pipeline::delivered)
  Cuts cuts_;                   // where a step may stop on every rank at once (pipeline::cuts)
  std::optional<Comm> tie_;
  Trace* trace_ = nullptr;
  int lane_ = 0;
};

}  // namespace weft::pipeline
