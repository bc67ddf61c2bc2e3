// The doctest entry point shared by every host test binary (support/doctest_main.hpp: a filter
// that selects no test fails the run).
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

int main(int argc, char** argv) { return weft::test::run_doctest(argc, argv); }
