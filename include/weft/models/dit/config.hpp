// DiT's configuration (a class-conditional Diffusion Transformer over latent patches, Peebles and
// Xie 2023, as diffusers' DiTTransformer2DModel computes it): its sizes, the record a checkpoint
// keeps of them, the checks against a mesh, the named presets, and the FLOPs of a sample.
//
//   latents  (in_channels, sample, sample)   e.g. a VAE's 4 x 32 x 32 for 256 x 256 images
//   patches  N = (sample / patch)^2 positions of patch^2 in_channels features each
//   stream   (B, N, width), heads of width / heads
//
// defines: dit::Config, dit::record, dit::validate, dit::preset, dit::preset_names,
//   dit::forward_flops_per_sample
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/core/divisors.hpp"
#include "weft/core/error.hpp"
#include "weft/layout/layout.hpp"

namespace weft::dit {

struct Config {
  std::int64_t in_channels = 4;    // the latents' channels (out_channels: the same, no learned sigma)
  std::int64_t sample = 8;         // the latents' height and width (sample_size)
  std::int64_t patch = 2;          // patch_size
  std::int64_t seq = 16;           // N, the patches: (sample / patch)^2, which validate checks
  std::int64_t layers = 2;         // num_layers
  std::int64_t heads = 4;          // num_attention_heads
  std::int64_t width = 32;         // heads x attention_head_dim
  std::int64_t classes = 10;       // num_embeds_ada_norm; the label table has one more row, the null label
  std::int64_t frequencies = 256;  // the timestep's sinusoidal features (diffusers' 256)
  double norm_eps = 1e-5;          // the norm before the MLP (diffusers' norm_eps); the others 1e-6
  std::uint64_t seed = 1234;
  double init_std = 0.02;  // the projections normal(0, init_std)
  bool zero_init = true;   // adaLN-Zero: every modulation, gate and the output projection start at 0

  std::int64_t grid() const { return sample / patch; }
  std::int64_t patch_features() const { return patch * patch * in_channels; }  // p^2 Cin
  std::int64_t head_dim() const { return width / heads; }
};

// The fields that shape the parameters or change what they compute; a checkpoint records them and
// a load compares them, naming the field that differs (norm_eps scaled: norm_eps_x1e12).
inline std::vector<std::pair<std::string, std::int64_t>> record(const Config& c) {
  return {{"in_channels", c.in_channels},
          {"sample", c.sample},
          {"patch", c.patch},
          {"layers", c.layers},
          {"heads", c.heads},
          {"width", c.width},
          {"classes", c.classes},
          {"frequencies", c.frequencies},
          {"norm_eps_x1e12", static_cast<std::int64_t>(c.norm_eps * 1e12 + 0.5)}};
}

// The sizes against each other and the mesh: the tensor degree divides the heads; the positions
// split over context (two chunks a rank) and, under sequence parallelism, over tensor.
inline void validate(const Config& c, const Spread& s, bool sequence_parallel, std::int64_t batch) {
  auto positive = [&](const char* what, std::int64_t v) {
    if (v < 1) throw Error("dit::Config", cat(what, " is ", v), cat("set ", what, " to 1 or more"));
  };
  positive("in_channels", c.in_channels);
  positive("sample", c.sample);
  positive("patch", c.patch);
  positive("layers", c.layers);
  positive("heads", c.heads);
  positive("classes", c.classes);
  if (c.sample % c.patch != 0)
    throw Error("dit::Config", cat("latents of ", c.sample, " x ", c.sample, " in patches of ", c.patch),
                "use a patch size that divides the sample size");
  if (c.seq != c.grid() * c.grid())
    throw Error("dit::Config", cat("seq ", c.seq, " for ", c.grid(), " x ", c.grid(), " patches"),
                cat("set seq to (sample / patch)^2 = ", c.grid() * c.grid()));
  if (c.width < 4 || c.width % c.heads != 0 || c.width % 4 != 0)
    throw Error("dit::Config", cat("width ", c.width, " over ", c.heads, " heads"),
                "use a width that the heads and 4 divide (the 2D positions take a quarter each way)");
  if (c.frequencies < 4 || c.frequencies % 2 != 0)
    throw Error("dit::Config", cat("frequencies is ", c.frequencies), "use an even count of 4 or more (DiT's 256)");
  if (!(c.norm_eps > 0)) throw Error("dit::Config", cat("norm_eps is ", c.norm_eps), "use a positive epsilon");
  if (c.heads % s.tensor_degree != 0)
    throw Error("dit::Config", cat(c.heads, " heads over a tensor degree of ", s.tensor_degree),
                cat("use a tensor degree among ", list_divisors(c.heads, s.tensor_degree)));
  const std::int64_t per_context = c.seq % (2 * s.context_degree) == 0 ? c.seq / s.context_degree : 0;
  if (s.context_degree > 1 && per_context == 0)
    throw Error("dit::Config", cat(c.seq, " patches over a context degree of ", s.context_degree),
                "use a context degree c with 2c dividing the patches (two chunks a rank)");
  const std::int64_t rows = s.context_degree > 1 ? per_context : c.seq;
  if (sequence_parallel && rows % s.tensor_degree != 0)
    throw Error("dit::Config", cat(rows, " patches a rank over a tensor degree of ", s.tensor_degree),
                "use a tensor degree that divides them, or no sequence parallelism");
  if (batch < 1 || batch % s.data_degree != 0)
    throw Error("dit::Config", cat("a batch of ", batch, " over a data degree of ", s.data_degree),
                "use a batch that the data degree divides");
}

// The DiT paper's sizes (latents of 4 x 32 x 32: 256 x 256 images through SD's VAE; 1000 ImageNet
// classes) and "tiny", the tests' size.
inline std::vector<std::string> preset_names() {
  return {"tiny", "DiT-S/2", "DiT-B/2", "DiT-L/2", "DiT-XL/2", "DiT-XL/4", "DiT-XL/8"};
}
inline Config preset(std::string_view name) {
  Config c;
  if (name == "tiny") return c;
  c.in_channels = 4;
  c.sample = 32;
  c.classes = 1000;
  auto sized = [&](std::int64_t layers, std::int64_t width, std::int64_t heads, std::int64_t patch) {
    c.layers = layers, c.width = width, c.heads = heads, c.patch = patch;
    c.seq = (c.sample / patch) * (c.sample / patch);
    return c;
  };
  if (name == "DiT-S/2") return sized(12, 384, 6, 2);
  if (name == "DiT-B/2") return sized(12, 768, 12, 2);
  if (name == "DiT-L/2") return sized(24, 1024, 16, 2);
  if (name == "DiT-XL/2") return sized(28, 1152, 16, 2);
  if (name == "DiT-XL/4") return sized(28, 1152, 16, 4);
  if (name == "DiT-XL/8") return sized(28, 1152, 16, 8);
  throw Error("dit::preset", cat("no preset named '", name, "'"), cat("use one of ", join(preset_names(), ", ")));
}

// The forward pass's FLOPs for one sample (2 per multiply-add; the backward is twice this): the
// patch projection, the conditioning MLP, per block the adaLN projections (6 C^2), QKV and output
// (4 C^2 a position), attention scores and values (4 N^2 C, every pair: no mask), the MLP (16 C^2
// a position), the final adaLN and projection.
inline double forward_flops_per_sample(const Config& c) {
  const double N = static_cast<double>(c.seq), C = static_cast<double>(c.width),
               F = static_cast<double>(c.patch_features()), L = static_cast<double>(c.layers);
  const double embed = 2 * N * F * C + 2 * (static_cast<double>(c.frequencies) * C + C * C);
  const double block = 2 * 6 * C * C + N * 2 * (4 * C * C + 8 * C * C) + 4 * N * N * C;
  const double final_layer = 2 * 2 * C * C + 2 * N * C * F;
  return embed + L * block + final_layer;
}

}  // namespace weft::dit
