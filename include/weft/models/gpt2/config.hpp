// GPT-2's configuration: its sizes, the record a checkpoint keeps of them, the checks against a
// mesh, and the named presets the trainer and weft-plan offer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/context/chunks.hpp"
#include "weft/core/divisors.hpp"
#include "weft/core/error.hpp"
#include "weft/layout/layout.hpp"

namespace weft::gpt2 {

struct Config {
  std::int64_t vocab = 64;
  std::int64_t seq = 16;  // T, the sequence length (and the number of positions)
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t width = 32;  // C
  std::uint64_t seed = 1234;
  double init_std = 0.02;  // GPT-2: normal(0, 0.02); residual projections scaled by 1/sqrt(2 layers)
};

// The fields that shape a GPT's parameters, as a checkpoint records them and a load compares them
// (the seed and init_std choose the initial values only).
inline std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
  return {{"vocab", c.vocab}, {"seq", c.seq}, {"layers", c.layers}, {"heads", c.heads}, {"width", c.width}};
}

// Checks a configuration against the mesh's degrees before anything is allocated.
inline void validate(const Config& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  if (c.vocab < 1 || c.seq < 1 || c.layers < 1 || c.heads < 1 || c.width < 1)
    throw Error("GPT-2",
                cat("vocab ", c.vocab, ", seq ", c.seq, ", layers ", c.layers, ", heads ", c.heads, ", width ", c.width,
                    " include one below 1"),
                "use sizes >= 1");
  if (c.width % c.heads != 0)
    throw Error("GPT-2", cat("width ", c.width, " is not divisible by ", c.heads, " heads"),
                cat("use a head count that divides the width, such as ", list_divisors(c.width, c.heads)));
  if (c.heads % s.tensor_degree != 0)
    throw Error("GPT-2", cat("tensor degree ", s.tensor_degree, " does not divide ", c.heads, " heads"),
                cat("use a tensor degree that divides the heads, such as ", list_divisors(c.heads, s.tensor_degree)));
  if (sequence_parallel && c.seq % s.tensor_degree != 0)
    throw Error(
        "GPT-2",
        cat("sequence parallelism needs the tensor degree ", s.tensor_degree, " to divide the sequence length ", c.seq),
        cat("use a tensor degree that divides the sequence length, such as ", list_divisors(c.seq, s.tensor_degree),
            ", or a sequence length that it divides"));
  if (sequence_parallel) context::require_tensor_split("GPT-2", c.seq, s.context_degree, s.tensor_degree);
  if (batch % s.data_degree != 0)
    throw Error("GPT-2", cat("data degree ", s.data_degree, " does not divide the batch of ", batch),
                cat("use a batch that is a multiple of ", s.data_degree));
}

// The named sizes: "tiny" and "small" for tests and demos, and GPT-2's 124M and 1.5B (vocabulary
// 50257, 1024 positions).
inline std::vector<std::string> preset_names() { return {"tiny", "small", "gpt2-124m", "gpt2-1.5b"}; }
inline Config preset(std::string_view name) {
  if (name == "tiny") return {.vocab = 64, .seq = 64, .layers = 2, .heads = 4, .width = 64};
  if (name == "small") return {.vocab = 256, .seq = 128, .layers = 4, .heads = 4, .width = 128};
  if (name == "gpt2-124m") return {.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .width = 768};
  if (name == "gpt2-1.5b") return {.vocab = 50257, .seq = 1024, .layers = 48, .heads = 25, .width = 1600};
  throw Error("gpt2::preset", cat("no preset named \"", name, "\""), "use tiny, small, gpt2-124m or gpt2-1.5b");
}

// Model FLOPs per token of a training step (forward and backward), as in the PaLM paper's appendix:
//   6 N + 12 L C T
// with N the parameters in matrices and embeddings (wte, wpe, 12 C^2 per block), L layers, C width,
// T sequence length (the second term is the attention scores and their use).
inline double flops_per_token(const Config& c) {
  const double C = static_cast<double>(c.width), L = static_cast<double>(c.layers);
  const double params = static_cast<double>(c.vocab) * C + static_cast<double>(c.seq) * C + L * 12.0 * C * C;
  return 6.0 * params + 12.0 * L * C * static_cast<double>(c.seq);
}

}  // namespace weft::gpt2
