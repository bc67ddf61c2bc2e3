// Reshard round trips: train 3 steps under configuration A and save (c1); load c1 under B and save
// (c2); load c2 under A and save (c3). Then:
//   - c3 equals c1 bit for bit: every parameter, master weight and optimizer-state element;
//   - where A and B compute in the same precision, c2 equals c1 bit for bit too (resharding moves
//     elements, it never changes one);
//   - one more step from c1 gives the same loss under A and under B (to 1e-5 relative in f32: the
//     tensor degree changes the order of the sums; 2e-2 where B computes in bf16), so B took every
//     element where its layout says it lies: a round trip alone could undo a consistent mistake.
#pragma once

#include <doctest/doctest.h>

#include "checkpoint/support.hpp"

namespace weft::test {

using Runner = std::vector<double> (*)(MeshDegrees, const RunPlan&);

struct Config {
  std::string name;
  MeshDegrees mesh;
  Runner run;
  bool bf16 = false;
  std::string precision = "f32";
};

template <class P, class S, bool SP = false, class Policy = checkpoint::Sharded, template <class, bool> class M = Gpt2>
Config config(const std::string& name, MeshDegrees m) {
  return {name, m, [](MeshDegrees mm, const RunPlan& p) { return ckpt_run<P, S, SP, Policy, M>(mm, p); },
          std::same_as<precision_t<P>, Bf16Mixed>, precision_t<P>::name()};
}

inline void round_trip(const Config& a, const Config& b) {
  const std::string tag = cat(a.name, "__", b.name);
  CAPTURE(tag);
  const std::string c1 = scratch(tag + "_1"), c2 = scratch(tag + "_2"), c3 = scratch(tag + "_3");
  a.run(a.mesh, RunPlan::fresh(c1, 3));
  b.run(b.mesh, RunPlan::resumed(c1, c2, 3));
  a.run(a.mesh, RunPlan::resumed(c2, c3, 3));
  CHECK(compare_checkpoints(c1, c3) == "");
  if (a.precision == b.precision) CHECK(compare_checkpoints(c1, c2) == "");
  const auto la = a.run(a.mesh, RunPlan::resumed(c1, "", 4));
  const auto lb = b.run(b.mesh, RunPlan::resumed(c1, "", 4));
  REQUIRE(la.size() == 1);
  REQUIRE(lb.size() == 1);
  const double tol = (a.bf16 || b.bf16) ? 2e-2 : 1e-5;
  CHECK(std::fabs(la[0] - lb[0]) <= tol * std::fabs(la[0]));
  MESSAGE(cat(tag, ": step 4 loss ", la[0], " under ", a.name, ", ", lb[0], " under ", b.name));
  if (!std::getenv("WEFT_KEEP_CHECKPOINTS"))
    for (const auto& d : {c1, c2, c3}) std::filesystem::remove_all(d);
}

}  // namespace weft::test
