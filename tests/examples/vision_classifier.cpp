// The vision transformer of examples/04_vision_classifier.hpp, a model of the user's own that is
// not token-in / cross-entropy-over-tokens: its head's gradients (the pooled cross-entropy written
// in the example) against finite differences in double; two AdamW steps on every layout equal to
// one rank within 1e-12 in double; and it learns the synthetic classes.
#include <doctest/doctest.h>

#include "04_vision_classifier.hpp"
#include "support/gradcheck.hpp"
#include "support/train_steps.hpp"

using namespace weft;

namespace {

template <bool SP, class Cx = context::None, class Sched = pipeline::OneFOneB, class Strategy = optim::Ddp>
test::StepsRun steps(int data, int pipe, int context, int tensor, int n = 2, int v = 1) {
  vit::Config c;
  c.layers = 4;  // interleaved: pipe 2 x 2 virtual stages
  return test::train_steps<vit::Model<SP, Cx>, Sched, Strategy, vit::Data>(c, 8, 2, pipe, v, tensor, data, n, context);
}

void same(const test::StepsRun& got, const test::StepsRun& ref, const std::string& what, bool grads = true) {
  INFO(what);
  REQUIRE(got.losses.size() == ref.losses.size());
  // f64: the same sums in other orders (the pooled rows' sums over tensor and context ranks, the
  // data reductions, the context blocks' merge).
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= 1e-12 * ref.losses[i]);
  std::string where;
  if (grads) CHECK_MESSAGE(test::worst_tensor(got.grads, ref.grads, where) <= 1e-12, "gradient ", where);
  // The keys' bias has no gradient but rounding (softmax ignores a shift common to every key),
  // which AdamW divides by its eps (1e-8): its values move by lr x rounding / eps, to 1e-10. The
  // other tensors to 1e-12.
  auto values = got.values, want = ref.values;
  std::map<std::string, std::vector<double>> kb, kb_ref;
  for (auto it = values.begin(); it != values.end();)
    if (it->first.ends_with("attn.qkv.bias"))
      kb[it->first] = it->second, kb_ref[it->first] = want[it->first], want.erase(it->first), it = values.erase(it);
    else ++it;
  CHECK_MESSAGE(test::worst_tensor(values, want, where) <= 1e-12, "value ", where);
  CHECK_MESSAGE(test::worst_tensor(kb, kb_ref, where) <= 1e-9, "value ", where);
}

}  // namespace

TEST_CASE("vision classifier: every gradient (its own head's among them) by finite differences") {
  Host h;
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    const vit::Config c;
    vit::Model<false> model(h, c, mesh.spread(), 4);
    vit::Data data(c, 4, 1, 0, 1);
    const auto mb = data.next(0, 0, 1.0);
    auto loss = [&] {
      auto ctx = model.in_flight(mb);
      pipeline::forward(model, ctx, mesh, pipeline::LocalGradients{}, nn::Mode::infer);
      return ctx.loss;
    };
    model.zero_grad();
    auto ctx = model.in_flight(mb);
    pipeline::forward_backward(model, ctx, mesh);
    int params = 0;
    model.for_each_param([&](const std::string& name, auto& p) {
      INFO(name);
      const auto r =
          test::gradcheck(std::span<double>(p.value.data(), static_cast<std::size_t>(p.value.numel())),
                          std::span<const double>(p.grad.data(), static_cast<std::size_t>(p.grad.numel())), loss, 20);
      CHECK(r.checked > 0);
      CHECK(r.worst <= 1e-6);  // support/gradcheck.hpp: central differences in double
      ++params;
    });
    CHECK(params == 2 + 2 * 12 + 2);  // in_proj; per block 2 norms, qkv, proj, fc, proj (2 each); the head
  });
}

TEST_CASE("vision classifier on every layout equals one rank in f64 (1e-12)") {
  const auto ref = steps<false>(1, 1, 1, 1);
  same(steps<false>(1, 1, 1, 2), ref, "tensor 2");
  same(steps<true>(1, 1, 1, 2), ref, "tensor 2 with sequence parallelism");
  same(steps<false>(2, 1, 1, 1), ref, "DDP over data 2");
  same(steps<false, context::None, pipeline::OneFOneB, optim::Fsdp>(2, 1, 1, 1), ref, "FSDP over data 2", false);
  same(steps<false>(1, 2, 1, 1), ref, "1F1B over pipe 2");
  same(steps<false, context::None, pipeline::ZeroBubbleH1>(1, 2, 1, 1), ref, "ZB-H1 over pipe 2");
  same(steps<false, context::None, pipeline::Interleaved>(1, 2, 1, 1, 2, 2), ref, "interleaved over pipe 2 x 2");
  same(steps<false, context::Ring>(1, 1, 2, 1), ref, "context 2 (ring)");
  same(steps<false, context::AllGather>(1, 1, 2, 1), ref, "context 2 (all-gather)");
  same(steps<true, context::Ring>(2, 2, 2, 2), ref, "data 2 x pipe 2 x context 2 x tensor 2 with SP");
}

TEST_CASE("vision classifier learns the synthetic classes: the loss falls from ln 4 to a tenth of it in 30 steps") {
  const auto run = steps<true>(2, 1, 1, 2, 30);
  MESSAGE("loss: first ", run.losses.front(), ", last ", run.losses.back());
  CHECK(std::abs(run.losses.front() - std::log(4.0)) <= 0.3);  // small weights: logits near zero
  CHECK(run.losses.back() <= 0.1 * std::log(4.0));
}
