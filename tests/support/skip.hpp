// defines: WEFT_SKIP(why), a test case that cannot run here, shown as skipped.
//
// CTest runs each discovered test case alone (`binary --test-case=<name>`); a case that calls
// WEFT_SKIP says why and returns, and the entry point (support/doctest_main.hpp) then exits 77,
// which every test binary's CTest properties name as SKIP_RETURN_CODE: the summary lists it as
// "Skipped", never as a pass. In a run of several cases the skip is a message only.
#pragma once

#include <doctest/doctest.h>

namespace weft::test {

inline int& skipped_cases() {
  static int n = 0;
  return n;
}

}  // namespace weft::test

#define WEFT_SKIP(why)               \
  do {                               \
    MESSAGE("SKIPPED: " << why);     \
    ++::weft::test::skipped_cases(); \
    return;                          \
  } while (0)
