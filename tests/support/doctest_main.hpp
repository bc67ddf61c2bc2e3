// The doctest entry point's body, shared by the host and CUDA test binaries (tests/main.cpp,
// tests/device/cuda/main.cu): doctest's run, refused when a --test-case filter selects no test.
// CTest runs each discovered test as `binary --test-case=<name>`; a name CMake cannot carry whole
// (a ';' splits it, a list separator) would select nothing, and doctest reports an empty run as a
// success, so the test would pass without running. A test case run alone that calls WEFT_SKIP
// (support/skip.hpp) exits 77, which CTest lists as skipped. Include from exactly one file per binary.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

#include "support/skip.hpp"

namespace weft::test {

// How many test cases the run's filters selected (doctest's own count, at the end of the run).
struct FilterCount : doctest::IReporter {
  static inline unsigned selected = 0;
  explicit FilterCount(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override { selected = s.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

inline int run_doctest(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases and the like
  bool filtered = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    filtered = filtered || a.starts_with("--test-case=") || a.starts_with("-tc=");
  }
  if (filtered && FilterCount::selected == 0) {
    std::printf(
        "FAILED: the --test-case filter selects no test case (a name with a ';' that CMake split?); "
        "rename the test so that its name reaches the filter whole\n");
    return 1;
  }
  if (rc == 0 && FilterCount::selected == 1 && skipped_cases() > 0) {
    std::printf("SKIPPED: the test case cannot run here (its message says why)\n");
    return 77;  // CTest's SKIP_RETURN_CODE for every test binary
  }
  return rc;
}

}  // namespace weft::test

DOCTEST_REGISTER_LISTENER("filter_count", 1, weft::test::FilterCount);
