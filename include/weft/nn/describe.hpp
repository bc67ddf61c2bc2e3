// describe(): the collectives of a model (nn::StagedModel) for given sizes and degrees, computed without
// running it: each layer's input and output layouts and the collectives it runs forward and
// backward, with bytes per rank (the buffer each collective is called with, as the communicators
// count it: all_gather its output, the others their input). describe(model, batch, s) walks a built
// model's layers (comm_walk.hpp); describe<Model>(config, batch, s), for a model over the Meta
// device, builds it there first (no memory) and walks it, for any size.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "weft/device/meta/meta.hpp"
#include "weft/nn/comm_row.hpp"
#include "weft/nn/comm_walk.hpp"

namespace weft::nn {

// A model over the Meta device (device/meta/meta.hpp), whose layers can be walked: built for any
// size without allocating.
template <class Model>
concept MetaDescribable = Describable<Model> && is_meta<typename Model::device>;

// The rows of a Model's table for `c`, a global micro-batch and the degrees in `s`: the model built
// whole on the Meta device, its layers walked in stage order (walked_comm_rows).
template <MetaDescribable Model>
std::vector<CommRow> describe_rows(const typename Model::config_type& c, std::int64_t batch, const Spread& s) {
  typename Model::device dev;
  Model model(dev, c, s, batch);
  return walked_comm_rows(model, batch, s);
}

// "all_gather(tensor) 4096 B, send_recv(context) 2048 B x3": each step by the bytes its
// communicator call counts, a run of equal steps (a ring's passes) once with its count.
inline std::string format_steps(const std::vector<CommStep>& steps) {
  if (steps.empty()) return "-";
  const auto counted = [](const CommStep& st) {
    return st.collective == Collective::all_gather ? st.bytes_out : st.bytes_in;
  };
  std::string r;
  for (std::size_t i = 0; i < steps.size();) {
    const CommStep& st = steps[i];
    std::size_t n = 1;
    while (i + n < steps.size() && steps[i + n].collective == st.collective && steps[i + n].axis == st.axis &&
           counted(steps[i + n]) == counted(st))
      ++n;
    r += cat(r.empty() ? "" : ", ", name(st.collective), "(", name(st.axis), ") ", counted(st), " B",
             n > 1 ? cat(" x", n) : "");
    i += n;
  }
  return r;
}

namespace detail {
// The table, one row per layer or boundary, under a line naming the model and its record.
template <class Model>
std::string format_table(const typename Model::config_type& c, std::int64_t batch, const Spread& s,
                         const std::vector<CommRow>& rows) {
  std::ostringstream os;
  os << Model::spec::name() << ":";
  const char* sep = " ";
  for (const auto& [k, v] : Model::spec::record(c)) {
    os << sep << k << " " << v;
    sep = ", ";
  }
  os << "; batch " << batch << "; data " << s.data_degree;
  if (s.context_degree > 1) os << " x context " << s.context_degree;
  os << " x tensor " << s.tensor_degree << (Model::sequence_parallel ? ", sequence parallel" : "") << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-46s %-28s %-28s %-44s %s\n", "layer", "in", "out", "forward", "backward");
  os << line;
  for (const CommRow& r : rows) {
    std::snprintf(line, sizeof line, "  %-46s %-28s %-28s %-44s %s\n", r.layer.c_str(), r.in.c_str(), r.out.c_str(),
                  format_steps(r.forward).c_str(), format_steps(r.step.empty() ? r.backward : r.step).c_str());
    os << line;
  }
  return os.str();
}
}  // namespace detail

// The table, for a model over the Meta device (describe_rows).
template <MetaDescribable Model>
std::string describe(const typename Model::config_type& c, std::int64_t batch, const Spread& s) {
  return detail::format_table<Model>(c, batch, s, describe_rows<Model>(c, batch, s));
}

// The table of a built model: its layers' rows (walked_comm_rows). The model is built
// whole, for the degrees in s.
template <Describable Model>
std::string describe(Model& model, std::int64_t batch, const Spread& s) {
  return detail::format_table<Model>(model.config, batch, s, walked_comm_rows(model, batch, s));
}

}  // namespace weft::nn
