// estimate::work_of: the time model's Work (cost/time.hpp) of any model, from a step measured on the
// Meta device (cost/measure.hpp) instead of GPT-2's closed forms: the GEMM shapes the layers asked
// for and how often, the causal attention core's FLOPs, the elements through GELU, LayerNorm, the
// cross-entropy and AdamW, the bytes the step allocated, and every collective call on the data,
// tensor and expert axes (and the expert-data groups) with its bytes. estimate::seconds prices it
// with the same rates as GPT-2's.
// tests/cost/measure.cpp holds it equal to estimate::work for GPT-2, shape by shape and call by
// call. What it cannot see: a user's own ops (the Meta device counts weft's), which it leaves out
// of the elementwise time.
#pragma once

#include <algorithm>
#include <cstdint>

#include "weft/cost/measure.hpp"
#include "weft/cost/time.hpp"

namespace weft::estimate {

inline Work work_of(const footprint::RankStep& r, const MeshShape& mesh) {
  Work w;
  w.memory = r.step;
  for (const MetaWork::Gemm& g : r.ops.gemms) w.gemms.push_back({g.m, g.n, g.k, g.count, g.ta, g.tb, g.fp8});
  w.attention_flops = r.ops.attention_flops;
  w.elementwise = {r.ops.gelu, r.ops.layernorm, r.ops.cross_entropy, r.ops.adamw, r.ops.fp8_cast};
  w.allocated_bytes = r.step.allocated.of(Category::activations) + r.step.allocated.of(Category::communication);
  const auto add = [&](const footprint::detail::CallLog& calls, Axis a, int degree) {
    for (const auto& [key, count] : calls) {
      const auto& [op, bytes] = key;
      Collective c = Collective::none;
      if (op == threads::Op::all_reduce) c = Collective::all_reduce;
      if (op == threads::Op::reduce_scatter) c = Collective::reduce_scatter;
      if (op == threads::Op::all_gather) c = Collective::all_gather;
      if (op == threads::Op::all_to_all) c = Collective::all_to_all;
      if (c != Collective::none) w.comms.push_back({c, a, degree, static_cast<std::int64_t>(bytes), count});
    }
  };
  add(r.calls[static_cast<std::size_t>(Axis::tensor)], Axis::tensor, mesh.tensor);
  add(r.calls[static_cast<std::size_t>(Axis::data)], Axis::data, mesh.data);
  // The expert group's dispatch and combine, and the experts' gradients over their expert-data
  // group (data ranks: on the data link, data x context / expert of them).
  add(r.calls[static_cast<std::size_t>(Axis::expert)], Axis::expert, mesh.expert);
  add(r.expert_data_calls, Axis::data, mesh.data * mesh.context / std::max(mesh.expert, 1));
  return w;
}

}  // namespace weft::estimate
