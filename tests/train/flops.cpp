// FLOPs per token from the layers' declarations (train/flops.hpp) against GPT-2's closed form
// (gpt2::flops_per_token, 6 (V C + T C + 12 L C^2) + 12 L C T), on one rank and on a mesh where
// the pipeline splits the model and the tied table lives on two ranks. The counts are integers
// below 2^53: equal exactly.
#include <doctest/doctest.h>

#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/gpt2/model.hpp"
#include "weft/pipeline/pipelined.hpp"
#include "weft/train/family.hpp"
#include "weft/train/flops.hpp"

using namespace weft;

TEST_CASE("FLOPs per token from the declared parameters equal GPT-2's closed form, on one rank and split") {
  // vocab 37 pads to 38 at tensor 2: the padding rows are not counted (logical shapes).
  const gpt2::Config c{.vocab = 37, .seq = 8, .layers = 4, .heads = 2, .width = 16, .seed = 1};
  const double want = gpt2::flops_per_token(c);
  CHECK(want == 84192.0);  // by hand: 6 (37 16 + 8 16 + 4 12 16^2) + 12 4 16 8 = 6 13008 + 6144
  for (const MeshShape m :
       {MeshShape{}, MeshShape{.data = 1, .pipe = 2, .tensor = 2}, MeshShape{.data = 2, .pipe = 2, .tensor = 1}}) {
    std::vector<double> got(static_cast<std::size_t>(m.data * m.pipe * m.tensor));
    run_threads(m.data * m.pipe * m.tensor, [&](ThreadComm& world) {
      Host h;
      Mesh mesh{world, m};
      const auto part = pipeline::Partition::even(m.pipe, 1, c.layers);
      gpt2::Model<double> model(h, c, mesh.spread(), 4, part.placement(mesh.coord().pipe));
      got[static_cast<std::size_t>(world.rank())] = train::declared_flops_per_token(model, mesh);
    });
    for (double g : got)
      CHECK_MESSAGE(g == want, "data ", m.data, " x pipe ", m.pipe, " x tensor ", m.tensor, ": ", g, " against ", want);
  }
}

// A family is planned on the Meta device unless it opts out (its ops have no Meta specializations).
namespace {
struct WithoutMetaOps {
  static constexpr bool measured_plan = false;
};
struct Plain {};
}  // namespace
static_assert(!train::measurable<WithoutMetaOps>, "measured_plan = false opts out of the measured plan");
static_assert(train::measurable<Plain>, "a family is planned on the Meta device by default");
