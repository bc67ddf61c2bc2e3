// describe(): the plan of a Gpt for given sizes and degrees, computed from its types without
// running it: each layer's input and output layouts and the collectives it runs forward and
// backward, with bytes per rank (the buffer each collective is called with, as the communicators
// count it: all_gather its output, the others their input).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "weft/nn/gpt.hpp"
#include "weft/nn/plan_row.hpp"

namespace weft::nn {

// The rows of a Gpt<T, SP, Recompute>'s plan for `c`, a global batch and the degrees in `s`: each
// stage's rows, in stage order (Gpt::plan_rows).
template <Floating T, bool SP, recompute::Policy Recompute = recompute::None>
std::vector<PlanRow> describe_rows(const GptConfig& c, std::int64_t batch, const Spread& s) {
  return Gpt<T, SP, Recompute>::plan_rows(c, batch, s);
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
