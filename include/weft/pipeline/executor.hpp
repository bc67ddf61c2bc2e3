// The executor: runs a model's stages for one micro-batch, forward in order and backward in
// reverse, and tells the data-parallel strategy when each unit is first needed and last used.
//
// A staged model provides
//   stages()                  the number of stages
//   units_of(s)               the units stage s reads and writes (its own, and any it shares, such as
//                             the tied embedding that the head uses)
//   forward(s, ctx, mesh, mode), backward(s, ctx, mesh)   on one micro-batch's Ctx
// and a data-parallel strategy provides
//   acquire(u, pass)          before a stage of this pass uses unit u (FSDP gathers its values, and
//                             for backward its gradient buffer, which alone the weight pass needs;
//                             DDP does nothing)
//   release(u, pass, last)    after the last stage of this pass that uses u (FSDP frees; ZeRO-2 and
//                             FSDP reduce-scatter the gradients; DDP all-reduces them when `last`,
//                             the last micro-batch before a step, is true)
//
// Today the schedule is one micro-batch after another on one pipe rank; the pipeline schedules run
// over the same stages, contexts and calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <vector>

#include "weft/nn/staged_model.hpp"

namespace weft::pipeline {

// weight: a split backward's weight-gradient pass (ZB-H1), which needs a unit's gradient buffer
// but not its values.
enum class Pass : std::uint8_t { forward, backward, weight };

template <class Model, class M>
concept Staged = requires(Model& m, typename Model::Ctx& ctx, M& mesh, std::size_t s) {
  { m.stages() } -> std::convertible_to<std::size_t>;
  { m.units_of(s) } -> std::same_as<std::vector<std::size_t>>;
  m.forward(s, ctx, mesh, nn::Mode::train);
  m.backward(s, ctx, mesh);
};

template <class P>
concept DataProtocol = requires(P& p, std::size_t u, Pass pass, bool last) {
  p.acquire(u, pass);
  p.release(u, pass, last);
};

// A step's stop hook: point() is called where every rank of the world is, in the same order, with
// no message between ranks pending across the point (the plain step: before each stage of each
// micro-batch's forward and backward; a pipelined step: at its table's cuts, pipeline::cuts). A
// point may throw a StepStopped to stop the step there, on every rank at once (train/stop.hpp polls
// for a stop request and throws train::Abandoned); Pipeline::run first receives what was sent
// across the cut. Any other exception is a failure, and goes on at once.
template <class H>
concept StopHook = requires(H& h) { h.point(); };

struct StepStopped : std::exception {
  const char* what() const noexcept override { return "pipeline: the step was stopped at a stop point"; }
};

// No stop within a step.
struct NoStop {
  void point() {}
};

// Gradients stay where the layers put them: no gathering, no reduction over data (tests, and one
// data rank).
struct LocalGradients {
  void acquire(std::size_t, Pass) {}
  void release(std::size_t, Pass, bool) {}
};

namespace detail {
// Which stages use which units, computed once per pass (units_of allocates).
struct Uses {
  std::vector<std::vector<std::size_t>> of;  // of[s]: the units stage s uses
  std::vector<std::size_t> first, last;      // per unit: its first and last stage

  template <class Model>
  explicit Uses(const Model& m) : of(m.stages()) {
    for (std::size_t s = 0; s < of.size(); ++s) {
      of[s] = m.units_of(s);
      for (std::size_t u : of[s]) {
        if (u >= first.size()) {
          first.resize(u + 1, of.size());
          last.resize(u + 1, 0);
        }
        first[u] = std::min(first[u], s);
        last[u] = std::max(last[u], s);
      }
    }
  }
};
}  // namespace detail

// The forward pass of one micro-batch (Mode::infer: evaluation, keeping nothing for backward).
// The units of the last stage stay acquired when its backward follows at once (Mode::train).
template <class Model, AxisComms M, DataProtocol P = LocalGradients, StopHook H = NoStop>
  requires Staged<Model, M>
void forward(Model& model, typename Model::Ctx& ctx, M& mesh, P&& dp = P{}, nn::Mode mode = nn::Mode::train,
             H&& hook = H{}) {
  const detail::Uses uses(model);
  const std::size_t n = uses.of.size();
  for (std::size_t s = 0; s < n; ++s) {
    hook.point();
    for (std::size_t u : uses.of[s]) dp.acquire(u, Pass::forward);
    model.forward(s, ctx, mesh, mode);
    const bool backward_next = mode == nn::Mode::train && s + 1 == n;  // the last stage's backward runs next
    for (std::size_t u : uses.of[s])
      if (uses.last[u] == s && !backward_next) dp.release(u, Pass::forward, false);
  }
}

// The backward pass of one micro-batch. last: no further micro-batch before the optimizer step.
template <class Model, AxisComms M, DataProtocol P = LocalGradients, StopHook H = NoStop>
  requires Staged<Model, M>
void backward(Model& model, typename Model::Ctx& ctx, M& mesh, P&& dp = P{}, bool last = true, H&& hook = H{}) {
  const detail::Uses uses(model);
  for (std::size_t s = uses.of.size(); s-- > 0;) {
    hook.point();
    for (std::size_t u : uses.of[s]) dp.acquire(u, Pass::backward);
    model.backward(s, ctx, mesh);
    for (std::size_t u : uses.of[s])
      if (uses.first[u] == s) dp.release(u, Pass::backward, last);
  }
}

// Forward then backward; returns the micro-batch's loss.
template <class Model, AxisComms M, DataProtocol P = LocalGradients, StopHook H = NoStop>
  requires Staged<Model, M>
double forward_backward(Model& model, typename Model::Ctx& ctx, M& mesh, P&& dp = P{}, bool last = true,
                        H&& hook = H{}) {
  forward(model, ctx, mesh, dp, nn::Mode::train, hook);
  backward(model, ctx, mesh, dp, last, hook);
  return ctx.loss;
}

}  // namespace weft::pipeline
