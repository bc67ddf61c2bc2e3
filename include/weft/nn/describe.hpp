// describe(): the plan of a Gpt for given sizes and degrees, computed from its types without
// running it: each layer's input and output layouts and the collectives it runs forward and
// backward, with bytes per rank (the buffer each collective is called with, as the communicators
// count it: all_gather its output, the others their input).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "weft/nn/gpt.hpp"

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

template <class Layer>
PlanRow local_row(std::string name) {
  return {std::move(name), Layer::In::name(), Layer::Out::name(), {}, {}};
}

}  // namespace detail

// The rows of a Gpt<T, SP, Recompute>'s plan for `c`, a global batch and the degrees in `s`.
template <Floating T, bool SP, recompute::Policy Recompute = recompute::None>
std::vector<PlanRow> describe_rows(const GptConfig& c, std::int64_t batch, const Spread& s) {
  validate(c, s, SP, batch);
  using Enter = typename stream<SP>::enter;
  using Leave = typename stream<SP>::leave;
  using A = typename stream<SP>::layout;
  const std::int64_t e = sizeof(T), C = c.width;
  const Shape act{batch, c.seq, C};
  const std::int64_t rows = batch / s.data_degree * c.seq;  // local (B, T) positions
  std::vector<PlanRow> out;
  out.push_back(detail::pair_row<Leave>("embedding (vocab-parallel) -> stream", act, s, e));
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = cat("h", l, ".");
    for (const char* branch : {"attn", "mlp"}) {
      PlanRow ln{p + (branch[0] == 'a' ? "ln1" : "ln2"), A::name(), A::name(), {}, {}};
      out.push_back(ln);
      out.push_back(detail::pair_row<Enter>(p + branch + " enter", act, s, e));
      if (branch[0] == 'a') {
        out.push_back(detail::local_row<Linear<T, ColumnParallel>>(p + "attn.qkv (ColumnParallel)"));
        out.push_back({p + "attn.core (causal, local heads)", act::Features::name(), act::Features::name(), {}, {}});
        out.push_back(detail::local_row<Linear<T, RowParallel>>(p + "attn.proj (RowParallel)"));
      } else {
        out.push_back(detail::local_row<Linear<T, ColumnParallel, epilogue::Gelu>>(p + "mlp.fc (ColumnParallel, GELU)"));
        out.push_back(detail::local_row<Linear<T, RowParallel>>(p + "mlp.proj (RowParallel)"));
      }
      out.push_back(detail::pair_row<Leave>(p + branch + " leave", act, s, e));
      if constexpr (std::same_as<Recompute, recompute::Full>)  // backward re-runs the forward's collectives
        for (std::size_t i = out.size() - (branch[0] == 'a' ? 5 : 4); i < out.size(); ++i)
          out.back().backward.insert(out.back().backward.end(), out[i].forward.begin(), out[i].forward.end());
    }
  }
  out.push_back({"ln_f", A::name(), A::name(), {}, {}});
  out.push_back(detail::pair_row<Enter>("ln_f -> LM head", act, s, e));
  const std::int64_t Vl = padded_vocab(c.vocab, s.tensor_degree) / s.tensor_degree;
  out.push_back({cat("LM head (tied, vocab-parallel: ", Vl, " of ", c.vocab, " rows)"), act::Replicated::name(),
                 act::Features::name(), {}, {}});
  out.push_back({"cross-entropy (row max, then sum exp + target)", act::Features::name(), "loss",
                 {detail::reduction(Axis::tensor, s.tensor_degree, rows * e),
                  detail::reduction(Axis::tensor, s.tensor_degree, 2 * rows * e)},
                 {}});
  out.push_back({"loss (mean over the global batch)", "loss", "loss", {detail::reduction(Axis::data, s.data_degree, 8)},
                 {}});
  // Under SP the LayerNorm and position gradients are Partial on tensor: one all-reduce per step
  // for all of them (4 C per block, 2 C for ln_f, T C for wpe).
  if (SP)
    out.push_back({"gradients Partial on tensor (SP), per step", "-", "-", {}, {},
                   {detail::reduction(Axis::tensor, s.tensor_degree, (4 * c.layers * C + 2 * C + c.seq * C) * e)}});
  return out;
}

inline std::string format_steps(const std::vector<PlanStep>& steps) {
  if (steps.empty()) return "-";
  std::string r;
  for (const PlanStep& st : steps) {
    const std::int64_t b = st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in;
    r += cat(r.empty() ? "" : ", ", name(st.collective), "(", name(st.axis), ") ", b, " B");
  }
  return r;
}

// The plan as a table, one row per layer or boundary.
template <Floating T, bool SP, recompute::Policy Recompute = recompute::None>
std::string describe(const GptConfig& c, std::int64_t batch, const Spread& s) {
  std::ostringstream os;
  os << "Gpt: vocab " << c.vocab << ", seq " << c.seq << ", layers " << c.layers << ", heads " << c.heads << ", width "
     << c.width << "; batch " << batch << "; data " << s.data_degree << " x tensor " << s.tensor_degree
     << (SP ? ", sequence parallel" : "") << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-46s %-28s %-28s %-44s %s\n", "layer", "in", "out", "forward", "backward");
  os << line;
  for (const PlanRow& r : describe_rows<T, SP, Recompute>(c, batch, s)) {
    std::snprintf(line, sizeof line, "  %-46s %-28s %-28s %-44s %s\n", r.layer.c_str(), r.in.c_str(), r.out.c_str(),
                  format_steps(r.forward).c_str(), format_steps(r.step.empty() ? r.backward : r.step).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace weft::nn
