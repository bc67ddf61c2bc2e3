// Parameters and their initialization.
//
// A Param holds this rank's shard of a value in the parameter's layout L (in the compute type T),
// and of its gradient in the gradient's layout GL (in master_t<T>: f32 under bf16 compute). GL is L except where the
// forward replicates a parameter but each rank sees only part of the data: under sequence parallelism a LayerNorm
// weight is Replicate on the tensor axis while its gradient is Partial there (each rank sums over its slice of the
// sequence), and the data-parallel step reduces it once, with the other gradients (optim/data_parallel.hpp). A model's
// units (unit.hpp) move every Param into flat buffers and leave views behind. Initialization does not depend on the
// mesh: element g of the global tensor is drawn from Philox keyed by (seed, parameter id, g), so the shards of any
// tensor degree gather to the same global weights, bit for bit.
#pragma once

#include <cstdint>
#include <optional>

#include "weft/core/precision.hpp"
#include "weft/ops/all.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::nn {

struct Init {
  enum Kind : std::uint8_t { normal, zeros, ones } kind = normal;
  double std = 0.02;
};

// Whether the optimizer's weight decay applies to a parameter, declared by the layer that owns it
// (GPT-2, nanoGPT and Megatron decay the matrices of Linear layers; not biases, norms or embedding
// tables). A model may override a declaration by name (Unit::set_decay). There is no default: a
// layer that adds a parameter says which group it is in.
enum class Decay : bool { no, yes };

// How the step moves a parameter. Every trained weight takes the optimizer's rule (AdamW, SGD). A
// routing bias of aux-loss-free balancing (DeepSeek-V3; nn::MoeMlp's router.bias) takes a fixed
// step against the sign of what its gradient buffer gathered over the step, p -= rate sign(g),
// outside the optimizer's rule, clipping and gradient norm (optim/data_parallel.hpp): its
// "gradient" is the experts' load over the mean, summed over micro-batches and ranks as gradients
// are, so that every layout moves it alike. Rate 0 holds it fixed.
struct SignStep {
  double rate = 0;
};

template <Element T, LayoutType L, LayoutType GL = L, class D = Host>
struct Param {
  static_assert(std::same_as<typename L::data, typename GL::data> &&
                    std::same_as<typename L::pipe, typename GL::pipe> &&
                    std::same_as<typename L::context, typename GL::context> &&
                    std::same_as<typename L::expert, typename GL::expert> &&
                    (std::same_as<typename L::tensor, typename GL::tensor> ||
                     (IsReplicate<typename L::tensor> && IsPartial<typename GL::tensor>)),
                "Param: a gradient layout differs from its value layout other than Partial for Replicate on the "
                "tensor axis; give the gradient the value's layout, or Partial where the value is Replicate");
  using layout = L;
  using grad_layout = GL;
  using value_type = T;
  using grad_type = master_t<T>;  // gradients accumulate in the master type (f32 under bf16)
  Tensor<T, L, D> value;
  Tensor<grad_type, GL, D> grad;
  std::uint64_t id = 0;
  Decay decay = Decay::no;
  std::optional<SignStep> sign_step;  // set: moved by SignStep, not by the optimizer's rule

  Param() = default;
  Param(D& dev, const Shape& global, const Spread& s, std::uint64_t param_id, Init init, std::uint64_t seed, Decay d)
      : value(Tensor<T, L, D>::empty(dev, global, s, Category::parameters)),
        grad(Tensor<grad_type, GL, D>::zeros(dev, global, s, Category::gradients)),
        id(param_id),
        decay(d) {
    switch (init.kind) {
      case Init::normal:
        ops::Init<D>::normal(dev, value.data(), global, value.local_shape(), local_box<L>(global, s).offset, seed,
                             param_id, init.std);
        break;
      case Init::zeros: ops::Memory<D>::fill(dev, value.data(), value.numel(), T(0)); break;
      case Init::ones: ops::Memory<D>::fill(dev, value.data(), value.numel(), T(1)); break;
    }
  }
};

}  // namespace weft::nn
