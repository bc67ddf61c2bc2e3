// Llama's configuration (the family of Llama 2 and 3: RMSNorm, rotary positions, a SwiGLU MLP,
// grouped-query attention, no biases): its sizes, the record a checkpoint keeps of them, the checks
// against a mesh, the named presets, and the FLOPs of a step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/context/chunks.hpp"
#include "weft/core/divisors.hpp"
#include "weft/core/error.hpp"
#include "weft/layout/layout.hpp"
#include "weft/ops/rotary.hpp"

namespace weft::llama {

struct Config {
  std::int64_t vocab = 64;
  std::int64_t seq = 16;  // T, the sequence length trained on
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 2;  // key-value heads: heads for multi-head attention, fewer for GQA
  std::int64_t width = 32;    // C; the head size is C / heads
  std::int64_t hidden = 64;   // F, the SwiGLU MLP's hidden width (intermediate_size)
  ops::Rope rope{};           // rope_theta and the llama3 scaling
  double norm_eps = 1e-5;     // rms_norm_eps
  bool tied = false;          // the LM head reads the embedding table (tie_word_embeddings)
  std::uint64_t seed = 1234;
  double init_std = 0.02;  // every matrix normal(0, init_std) (initializer_range)

  std::int64_t head_dim() const { return width / heads; }
};

// The fields that shape the parameters, and those that change what the same parameters compute
// (the rotary base and scaling; a checkpoint of one does not continue as the other). A checkpoint
// records them and a load compares them, naming the field that differs. Real-valued fields are
// recorded scaled to integers, as the names say (rope_theta_x1e6 500000000000 for 500000,
// norm_eps_x1e12 10000000 for 1e-5).
inline std::int64_t scaled(double v, double by) { return static_cast<std::int64_t>(v * by + (v < 0 ? -0.5 : 0.5)); }
inline std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
  return {{"vocab", c.vocab},
          {"seq", c.seq},
          {"layers", c.layers},
          {"heads", c.heads},
          {"kv_heads", c.kv_heads},
          {"width", c.width},
          {"hidden", c.hidden},
          {"tied", c.tied ? 1 : 0},
          {"rope_theta_x1e6", scaled(c.rope.theta, 1e6)},
          {"rope_factor_x1e6", scaled(c.rope.factor, 1e6)},
          {"rope_low_freq_factor_x1e6", scaled(c.rope.low_freq_factor, 1e6)},
          {"rope_high_freq_factor_x1e6", scaled(c.rope.high_freq_factor, 1e6)},
          {"rope_original_max_positions", scaled(c.rope.original_max_positions, 1)},
          {"norm_eps_x1e12", scaled(c.norm_eps, 1e12)}};
}

// Checks a configuration against the mesh's degrees before anything is allocated.
inline void validate(const Config& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  if (c.vocab < 1 || c.seq < 1 || c.layers < 1 || c.heads < 1 || c.kv_heads < 1 || c.width < 1 || c.hidden < 1)
    throw Error("Llama",
                cat("vocab ", c.vocab, ", seq ", c.seq, ", layers ", c.layers, ", heads ", c.heads, ", kv_heads ",
                    c.kv_heads, ", width ", c.width, ", hidden ", c.hidden, " include one below 1"),
                "use sizes >= 1");
  // A rank's elements of the parameters and of a micro-batch's activations, in double (it cannot
  // overflow): past 10^15 (petabytes) nothing fits a machine, and the 64-bit counts of shapes and
  // plans would overflow; refused before any of them is computed.
  {
    const double L = static_cast<double>(c.layers), C = static_cast<double>(c.width), F = static_cast<double>(c.hidden);
    const double V = static_cast<double>(c.vocab), H = static_cast<double>(c.heads), tp = s.tensor_degree;
    const double T = static_cast<double>(c.seq) / s.context_degree;
    const double B = static_cast<double>(std::max<std::int64_t>(batch, 1)) / s.data_degree;
    const double n = (L * (4 * C * C + 3 * C * F) + 2 * V * C) / tp + B * T * (L * (C + F / tp) + V / tp) +
                     L * B * (H / tp) * T * static_cast<double>(c.seq);
    if (n > 1e15)
      throw Error(
          "Llama",
          cat("layers ", c.layers, ", width ", c.width, ", hidden ", c.hidden, ", seq ", c.seq, ", vocab ", c.vocab,
              ", batch ", batch, ": about ", n, " elements (parameters, activations), more than any machine"),
          "use a smaller model, batch or micro-batch");
  }
  if (c.width % c.heads != 0 || (c.width / c.heads) % 2 != 0)
    throw Error(
        "Llama", cat("width ", c.width, " over ", c.heads, " heads is not an even head size"),
        cat("use a head count that divides the width into an even size, such as ", list_divisors(c.width, c.heads)));
  if (c.heads % c.kv_heads != 0)
    throw Error("Llama", cat(c.kv_heads, " key-value heads do not divide ", c.heads, " heads"),
                cat("use key-value heads that divide the heads, such as ", list_divisors(c.heads, c.kv_heads)));
  if (c.kv_heads % s.tensor_degree != 0)
    throw Error("Llama", cat("tensor degree ", s.tensor_degree, " does not divide ", c.kv_heads, " key-value heads"),
                cat("use a tensor degree that divides the key-value heads, such as ",
                    list_divisors(c.kv_heads, s.tensor_degree)));
  if (c.hidden % s.tensor_degree != 0)
    throw Error("Llama", cat("tensor degree ", s.tensor_degree, " does not divide the hidden width ", c.hidden),
                cat("use a tensor degree that divides it, such as ", list_divisors(c.hidden, s.tensor_degree)));
  if (!(c.rope.theta > 1) || c.rope.factor < 0 ||
      (c.rope.factor > 0 && !(c.rope.high_freq_factor > c.rope.low_freq_factor)))
    throw Error(
        "Llama",
        cat("rope theta ", c.rope.theta, ", factor ", c.rope.factor, ", low and high frequency factors ",
            c.rope.low_freq_factor, " and ", c.rope.high_freq_factor),
        "use a theta above 1, and a factor of 0 (no scaling) or one with a high frequency factor above the low");
  if (!(c.norm_eps > 0))
    throw Error("Llama", cat("norm eps ", c.norm_eps, " is not positive"), "use a small positive eps, such as 1e-5");
  if (sequence_parallel && c.seq % s.tensor_degree != 0)
    throw Error(
        "Llama",
        cat("sequence parallelism needs the tensor degree ", s.tensor_degree, " to divide the sequence length ", c.seq),
        cat("use a tensor degree that divides the sequence length, such as ", list_divisors(c.seq, s.tensor_degree)));
  if (sequence_parallel) context::require_tensor_split("Llama", c.seq, s.context_degree, s.tensor_degree);
  if (batch % s.data_degree != 0)
    throw Error("Llama", cat("data degree ", s.data_degree, " does not divide the batch of ", batch),
                cat("use a batch that is a multiple of ", s.data_degree));
}

// The named sizes: llama-tiny for tests and demos (trains on the built-in corpus on a CPU), and the
// sizes of Llama 3.2 1B, Llama 3.1 8B and 70B (their config.json: vocabulary 128256, rope theta
// 500000 with the llama3 scaling, 8 key-value heads) at a sequence of 8192 for --plan and weft-plan.
inline std::vector<std::string> preset_names() {
  return {"llama-tiny", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"};
}
inline Config preset(std::string_view name) {
  const ops::Rope llama3{
      .theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8192};
  if (name == "llama-tiny")
    return {.vocab = 64, .seq = 64, .layers = 2, .heads = 4, .kv_heads = 2, .width = 64, .hidden = 176};
  if (name == "llama-3.2-1b") {
    ops::Rope r = llama3;
    r.factor = 32;
    return {.vocab = 128256,
            .seq = 8192,
            .layers = 16,
            .heads = 32,
            .kv_heads = 8,
            .width = 2048,
            .hidden = 8192,
            .rope = r,
            .tied = true};
  }
  if (name == "llama-3.1-8b")
    return {.vocab = 128256,
            .seq = 8192,
            .layers = 32,
            .heads = 32,
            .kv_heads = 8,
            .width = 4096,
            .hidden = 14336,
            .rope = llama3};
  if (name == "llama-3.1-70b")
    return {.vocab = 128256,
            .seq = 8192,
            .layers = 80,
            .heads = 64,
            .kv_heads = 8,
            .width = 8192,
            .hidden = 28672,
            .rope = llama3};
  throw Error("llama::preset", cat("no preset named \"", name, "\""),
              "use llama-tiny, llama-3.2-1b, llama-3.1-8b or llama-3.1-70b");
}

// Model FLOPs per token of a training step (forward and backward), as in the PaLM paper's appendix
// and as weft counts any model (train/flops.hpp): 6 N + 12 L C T, with N the parameters in matrices
// and tables (a tied table once; norm weights left out) and the second term the attention scores
// and their use.
inline double flops_per_token(const Config& c) {
  const double C = static_cast<double>(c.width), L = static_cast<double>(c.layers);
  const double F = static_cast<double>(c.hidden), kv = static_cast<double>(c.kv_heads * c.head_dim());
  const double matrices =
      L * (2 * C * C + 2 * C * kv + 3 * C * F) + static_cast<double>(c.vocab) * C * (c.tied ? 1 : 2);
  return 6.0 * matrices + 12.0 * L * C * static_cast<double>(c.seq);
}

}  // namespace weft::llama
