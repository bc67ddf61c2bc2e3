// CommRow: one row of describe's table of a model (describe.hpp): a layer or a boundary with its layouts and the
// collectives it runs, forward and backward per micro-batch and once per step. Each stage writes
// its own rows (comm_rows), so the table comes from the same list of stages that runs.
#pragma once

#include <string>
#include <vector>

#include "weft/layout/transition.hpp"

namespace weft::nn {

struct CommRow {
  std::string layer, in, out;
  std::vector<CommStep> forward, backward;  // per micro-batch
  std::vector<CommStep> step = {};          // once per optimizer step (the data-parallel step)
};

namespace detail {

// A step of collective c over `degree` ranks of an axis, `in` and `out` bytes a rank.
inline CommStep collective_step(Collective c, Axis axis, int degree, std::int64_t in, std::int64_t out) {
  CommStep s;
  s.collective = c;
  s.axis = axis;
  s.degree = degree;
  s.bytes_in = in;
  s.bytes_out = out;
  s.wire_bytes = degree > 1 ? ring_wire_bytes(c, degree, in, out) : 0;
  return s;
}

inline CommStep reduction(Axis axis, int degree, std::int64_t bytes) {
  return collective_step(Collective::all_reduce, axis, degree, bytes, bytes);
}

template <class Pair>
CommRow pair_row(std::string name, const Shape& g, const Spread& s, std::int64_t elem) {
  CommRow r{std::move(name), Pair::In::name(), Pair::Out::name(), {}, {}};
  for (const CommStep& st : redistribution<typename Pair::In, typename Pair::Out>(g, s, elem)) r.forward.push_back(st);
  for (const CommStep& st : redistribution<typename Pair::GradOut, typename Pair::GradIn>(g, s, elem))
    r.backward.push_back(st);
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
CommRow local_row(std::string name) {
  return {std::move(name), Layer::In::name(), Layer::Out::name(), {}, {}};
}

}  // namespace detail

}  // namespace weft::nn
