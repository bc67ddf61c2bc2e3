// The doctest entry point of the CUDA tests (compiled by nvcc, so it can link the kernels' TUs).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return context.run();
}
