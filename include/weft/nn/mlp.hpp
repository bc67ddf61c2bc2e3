// Mlp: the GELU MLP (GPT-2's, BERT's, ViT's), ColumnParallel C -> 4C with the GELU fused into its epilogue, then
// RowParallel 4C -> C (out Partial); Llama's gated one is nn/swiglu.hpp.
//
//   x  (B, T, C)      Replicate
//   h  (B, T, 4C/tp)  Shard<-1>   gelu(x W_fc^T + b_fc)
//   out (B, T, C)     Partial     h W_proj^T + b_proj, summed over the tensor ranks by the caller
//
// defines: nn::Mlp
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "weft/nn/comm_row.hpp"
#include "weft/nn/layer.hpp"
#include "weft/nn/linear.hpp"

namespace weft::nn {

// Mlp: ColumnParallel C -> 4C with fused GELU, RowParallel 4C -> C (out Partial).
// G: the precision's GEMMs (nn/linear.hpp).
template <Floating T, class D = Host, GemmPolicy G = ExactGemms>
class Mlp {
 public:
  using In = act::Full;
  using Out = act::Partial;
  using GradOut = act::Full;
  using GradIn = act::Partial;

  struct Ctx {
    typename Linear<T, ColumnParallel, epilogue::Gelu, D, G>::Ctx fc_ctx;
    typename Linear<T, RowParallel, epilogue::None, D, G>::Ctx proj_ctx;
  };

  Linear<T, ColumnParallel, epilogue::Gelu, D, G> fc;
  Linear<T, RowParallel, epilogue::None, D, G> proj;

  Mlp() = default;
  Mlp(D& dev, std::int64_t C, const Spread& s, std::uint64_t id, std::uint64_t seed, double std, double proj_std)
      : fc(dev, C, 4 * C, s, id, seed, std), proj(dev, 4 * C, C, s, id + 2, seed, proj_std) {}

  // mesh: the tensor group of FP8 casts (nn/linear.hpp), or NoMesh.
  template <class M = NoMesh>
  Tensor<T, act::Partial, D> forward(Ctx& ctx, const Tensor<T, act::Full, D>& x, M&& mesh = M{}) {
    auto h = within([] { return "fc"; }, [&] { return fc.forward(ctx.fc_ctx, x, mesh); });  // (B, T, 4C/tp) Shard<-1>
    return within([] { return "proj"; }, [&] { return proj.forward(ctx.proj_ctx, h, mesh); });
  }
  template <class M = NoMesh>
  Tensor<T, act::Partial, D> backward(Ctx& ctx, const Tensor<T, act::Full, D>& dy, M&& mesh = M{}) {
    auto dh = within([] { return "proj"; }, [&] { return proj.backward(ctx.proj_ctx, dy, mesh); });
    return within([] { return "fc"; }, [&] { return fc.backward(ctx.fc_ctx, dh, mesh); });
  }
  void backward_weight(Ctx& ctx) {
    fc.backward_weight(ctx.fc_ctx);
    proj.backward_weight(ctx.proj_ctx);
  }
  void defer_weight(bool on) {
    fc.defer_weight(on);
    proj.defer_weight(on);
  }
  // describe's rows (nn/comm_walk.hpp): its two Linear layers (collectives only in FP8 on tensor ranks).
  void comm_rows(std::vector<CommRow>& out, const std::string& row, const Shape& act, const Spread& s,
                 std::int64_t) const {
    out.push_back(detail::local_row<std::remove_cvref_t<decltype(fc)>>(row + ".fc (ColumnParallel, GELU)"));
    fc.add_amax_steps(out.back(), act, s);
    out.push_back(detail::local_row<std::remove_cvref_t<decltype(proj)>>(row + ".proj (RowParallel)"));
    proj.add_amax_steps(out.back(), act, s);
  }

  Shape out_shape(const Shape& s) const { return s; }
  static std::string name() { return "Mlp"; }

  template <class F>
  void for_each_param(const std::string& prefix, F&& f) {
    fc.for_each_param(prefix + ".fc", f);
    proj.for_each_param(prefix + ".proj", f);
  }
};

}  // namespace weft::nn
