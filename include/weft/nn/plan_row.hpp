// PlanRow: one row of a model's plan (describe.hpp): a layer or a boundary with its layouts and the
// collectives it runs, forward and backward per micro-batch and once per step. Each stage writes
// its own rows (plan_rows), so the plan comes from the same list of stages that runs.
#pragma once

#include <string>
#include <vector>

#include "weft/layout/plan.hpp"

namespace weft::nn {

struct PlanRow {
  std::string layer, in, out;
  std::vector<PlanStep> forward, backward;  // per micro-batch
  std::vector<PlanStep> step = {};          // once per optimizer step (the data-parallel step)
};

namespace detail {

inline PlanStep reduction(Axis axis, int degree, std::int64_t bytes) {
  PlanStep s;
  s.collective = Collective::all_reduce;
  s.axis = axis;
  s.degree = degree;
  s.bytes_in = s.bytes_out = bytes;
  s.wire_bytes = degree > 1 ? ring_wire_bytes(Collective::all_reduce, degree, bytes, bytes) : 0;
  return s;
}

template <class Pair>
PlanRow pair_row(std::string name, const Shape& g, const Spread& s, std::int64_t elem) {
  PlanRow r{std::move(name), Pair::In::name(), Pair::Out::name(), {}, {}};
  for (const PlanStep& st : plan<typename Pair::In, typename Pair::Out>(g, s, elem)) r.forward.push_back(st);
  for (const PlanStep& st : plan<typename Pair::GradOut, typename Pair::GradIn>(g, s, elem)) r.backward.push_back(st);
  return r;
}

// The global shape a layer that runs on a context rank's rows sees, (B, T/c, C), under context
// parallelism (CP); else act.
template <bool CP>
Shape context_rows(const Shape& act, const Spread& s) {
  if constexpr (CP) return {act[0], act[1] / s.context_degree, act[2]};
  else return act;
}

template <class Layer>
PlanRow local_row(std::string name) {
  return {std::move(name), Layer::In::name(), Layer::Out::name(), {}, {}};
}

}  // namespace detail

}  // namespace weft::nn
