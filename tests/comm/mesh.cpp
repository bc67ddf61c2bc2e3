// Mesh: validation of degrees, coordinates, and the members of each axis group.
#include <doctest/doctest.h>

#include <mutex>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"

using namespace weft;

TEST_CASE("Mesh rejects degrees whose product is not the world size naming the values") {
  CHECK_THROWS_WITH_AS(validate({.data = 2, .pipe = 1, .tensor = 3}, 4),
                       "Mesh: data 2 x pipe 1 x tensor 3 = 6 ranks, but the world has 4; choose degrees whose product "
                       "is 4 (each one of 1, 2, 4)",
                       Error);
  CHECK_THROWS_WITH_AS(validate({.data = 0}, 1), doctest::Contains("include one below 1"), Error);
  // A product beyond 64 bits is refused, not wrapped (65536^3 fits; 2^31 - 1 cubed does not).
  CHECK_THROWS_WITH_AS(validate({.data = 65536, .pipe = 65536, .tensor = 65536}, 4),
                       doctest::Contains("= 281474976710656 ranks, but the world has 4"), Error);
  CHECK_THROWS_WITH_AS(validate({.data = 2147483647, .pipe = 2147483647, .tensor = 2147483647}, 4),
                       doctest::Contains("ranks, but the world has 4"), Error);
  CHECK_NOTHROW(validate({.data = 2, .pipe = 2, .tensor = 2}, 8));
  // Through the constructor, on every rank.
  CHECK_THROWS_WITH_AS(run_threads(4, [](ThreadComm& w) { Mesh m{w, {.data = 3}}; }),
                       doctest::Contains("data 3 x pipe 1 x tensor 1 = 3 ranks, but the world has 4"), Error);
}

TEST_CASE("Mesh: tensor is the fastest-varying axis groups are the ranks that differ on one axis") {
  std::mutex mu;
  std::vector<std::vector<int>> tensor(8), data(8), pipe(8);
  std::vector<MeshCoord> coords(8);
  run_threads(8, [&](ThreadComm& w) {
    Mesh mesh{w, {.data = 2, .pipe = 2, .tensor = 2}};
    std::lock_guard lock(mu);
    const auto r = static_cast<std::size_t>(w.rank());
    tensor[r] = mesh.tensor().members();
    data[r] = mesh.data().members();
    pipe[r] = mesh.pipe().members();
    coords[r] = mesh.coord();
    CHECK(mesh.tensor().rank() == mesh.coord().tensor);
    CHECK(mesh.data().rank() == mesh.coord().data);
    CHECK(mesh.pipe().rank() == mesh.coord().pipe);
  });
  // Rank 5 = (data 1, pipe 0, tensor 1).
  CHECK(coords[5].data == 1);
  CHECK(coords[5].pipe == 0);
  CHECK(coords[5].tensor == 1);
  CHECK(tensor[5] == std::vector<int>{4, 5});
  CHECK(data[5] == std::vector<int>{1, 5});
  CHECK(pipe[5] == std::vector<int>{5, 7});
  CHECK(tensor[2] == std::vector<int>{2, 3});
  CHECK(data[2] == std::vector<int>{2, 6});
  CHECK(pipe[2] == std::vector<int>{0, 2});
}

TEST_CASE("axis groups reduce independently") {
  run_threads(6, [](ThreadComm& w) {
    Mesh mesh{w, {.data = 2, .tensor = 3}};
    std::vector<std::int64_t> t{w.rank()}, d{w.rank()};
    mesh.tensor().all_reduce(std::span<std::int64_t>(t));
    mesh.data().all_reduce(std::span<std::int64_t>(d));
    const int base = mesh.coord().data * 3;
    CHECK(t[0] == 3 * base + 3);                 // base + base+1 + base+2
    CHECK(d[0] == 2 * mesh.coord().tensor + 3);  // t + (t + 3)
    CHECK(mesh.spread().tensor_degree == 3);
    CHECK(mesh.spread().data_index == mesh.coord().data);
  });
}

TEST_CASE("Mesh: context sits between pipe and tensor in the rank order, its group the ranks that differ on it") {
  // Closed forms first: rank = ((data * pipe + p) * context + c) * tensor + t.
  const MeshShape s{.data = 2, .pipe = 2, .context = 2, .tensor = 2};
  for (int r = 0; r < 16; ++r) CHECK(world_rank(s, mesh_coord(s, r)) == r);
  CHECK(world_rank(s, {.data = 1, .pipe = 0, .context = 1, .tensor = 0}) == 10);
  CHECK(mesh_coord(s, 13).data == 1);
  CHECK(mesh_coord(s, 13).pipe == 1);
  CHECK(mesh_coord(s, 13).context == 0);
  CHECK(mesh_coord(s, 13).tensor == 1);
  CHECK_THROWS_WITH_AS(validate({.data = 2, .context = 3, .tensor = 2}, 8),
                       doctest::Contains("data 2 x pipe 1 x context 3 x tensor 2 = 12 ranks, but the world has 8"),
                       Error);
  CHECK_THROWS_WITH_AS(validate({.context = 0}, 1),
                       doctest::Contains("degrees data 1 x pipe 1 x context 0 x tensor 1 include one below 1"), Error);

  std::mutex mu;
  std::vector<std::vector<int>> tensor(8), context(8), data(8), data_context(8);
  std::vector<std::string> names(8);
  run_threads(8, [&](ThreadComm& w) {
    Mesh mesh{w, {.data = 2, .context = 2, .tensor = 2}};
    CHECK(mesh.context().rank() == mesh.coord().context);
    CHECK(&mesh.comm(Axis::context) == &mesh.context());
    CHECK(mesh.spread().context_degree == 2);
    CHECK(mesh.spread().context_index == mesh.coord().context);
    CHECK(mesh.spread().degree(Axis::context) == 2);
    // The context group sums its ranks' values and nothing else's.
    std::vector<std::int64_t> v{w.rank()};
    mesh.context().all_reduce(std::span<std::int64_t>(v));
    const int t = mesh.coord().tensor, d = mesh.coord().data;
    CHECK(v[0] == (d * 2 + 0) * 2 + t + (d * 2 + 1) * 2 + t);
    std::lock_guard lock(mu);
    const auto r = static_cast<std::size_t>(w.rank());
    tensor[r] = mesh.tensor().members();
    context[r] = mesh.context().members();
    data[r] = mesh.data().members();
    names[r] = cat(mesh.tensor().name(), " ", mesh.context().name(), " ", mesh.data().name(), " ", mesh.pipe().name());
    data_context[r] = mesh.data_context().members();
    CHECK(mesh.data_context().rank() == mesh.coord().data * 2 + mesh.coord().context);
  });
  // Rank 5's data x context group: the ranks with tensor index 1, data-major.
  CHECK(data_context[5] == std::vector<int>{1, 3, 5, 7});
  CHECK(data_context[2] == std::vector<int>{0, 2, 4, 6});
  // Rank 5 = (data 1, context 0, tensor 1).
  CHECK(tensor[5] == std::vector<int>{4, 5});
  CHECK(context[5] == std::vector<int>{5, 7});
  CHECK(data[5] == std::vector<int>{1, 5});
  CHECK(context[2] == std::vector<int>{0, 2});
  CHECK(names[5] == "tensor[d1,p0,c0]{4,5} context[d1,p0,t1]{5,7} data[p0,c0,t1]{1,5} pipe[d1,c0,t1]{5}");

  // Without context parallelism the groups keep their names, and each rank's context group is itself.
  run_threads(4, [&](ThreadComm& w) {
    Mesh mesh{w, {.data = 2, .tensor = 2}};
    CHECK(mesh.context().size() == 1);
    CHECK(mesh.context().members() == std::vector<int>{w.rank()});
    CHECK(&mesh.data_context() == &mesh.data());
    if (w.rank() == 3)
      CHECK(cat(mesh.tensor().name(), " ", mesh.data().name()) == "tensor[d1,p0]{2,3} data[p0,t1]{1,3}");
  });
}
