// A downstream program: 2 thread ranks reduce a vector and gather a sharded tensor.
// Exits 0 only if the results are right, so the consumer tests check behaviour, not just linking.
#include <weft/weft_host.hpp>

#include <cstdio>

int main() {
  int bad = 0;
  weft::run_threads(2, [&](weft::ThreadComm& world) {
    weft::Mesh mesh{world, {.tensor = 2}};
    weft::Host host;
    auto x = weft::Tensor<float, weft::TensorSharded<0>, weft::Host>::empty(host, {4, 2}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(x.global_index(i));
    auto y = weft::redistribute<weft::Replicated>(x, mesh);
    for (std::int64_t i = 0; i < y.numel(); ++i)
      if (y[i] != static_cast<float>(i)) bad = 1;
  });
  std::printf("weft %s consumer: %s\n", weft::version, bad ? "WRONG" : "ok");
  return bad;
}
