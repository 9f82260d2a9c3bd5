// The test runner: doctest, plus a listener that counts test cases as passed, failed or
// skipped (a case calls SKIP_TEST(reason) when what it needs is absent) and prints one line
// `tests: N passed, M failed, K skipped` for tools/run_tests.sh to add up, after a line
// `failed test case: NAME` for each failed case (tools/run_tests.sh repeats them last, and
// tools/sharded_tests.sh runs them again alone). Started with
// YOLO_TEST_ROLE set, it is a multi-process test's child instead (tests/child_process.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/child_process.h"
#include "tests/test_support.h"

namespace {

std::string g_skip_reason, g_current;
std::vector<std::string> g_failed_names;
int g_passed = 0, g_failed = 0, g_skipped = 0;

struct CountingListener : doctest::IReporter {
  explicit CountingListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    g_skip_reason.clear();
    g_current = data.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (!stats.testCaseSuccess) {
      ++g_failed;
      g_failed_names.push_back(g_current);
    } else if (!g_skip_reason.empty()) {
      ++g_skipped;
    } else {
      ++g_passed;
    }
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("counting", 1, CountingListener);

}  // namespace

namespace yolo::testing {
void mark_skipped(const char* test_name, const std::string& reason) {
  g_skip_reason = reason;
  std::printf("SKIPPED %s: %s\n", test_name, reason.c_str());
}
}  // namespace yolo::testing

int main(int argc, char** argv) {
  // A child process of a multi-process test (tests/child_process.h).
  if (const char* role = std::getenv("YOLO_TEST_ROLE")) return yolo::testing::run_role(role);
  doctest::Context context(argc, argv);
  int status = context.run();
  if (context.shouldExit()) return status;
  for (const std::string& name : g_failed_names) std::printf("failed test case: %s\n", name.c_str());
  std::printf("tests: %d passed, %d failed, %d skipped\n", g_passed, g_failed, g_skipped);
  std::fflush(stdout);
  return status;
}
