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
    CHECK(t[0] == 3 * base + 3);                     // base + base+1 + base+2
    CHECK(d[0] == 2 * mesh.coord().tensor + 3);      // t + (t + 3)
    CHECK(mesh.spread().tensor_degree == 3);
    CHECK(mesh.spread().data_index == mesh.coord().data);
  });
}
