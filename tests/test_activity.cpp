// Device activity (runtime/activity.h): the busy/idle split of a window against a count over
// every nanosecond, and the recorder of an emulated GPU, which sees a gap the host made.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/activity.h"
#include "runtime/stream.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// busy and idle by brute force: each nanosecond of [begin, end) covered or not.
IdleTime idle_by_count(const std::vector<ActivitySpan>& spans, int64_t begin, int64_t end) {
  std::vector<bool> covered(static_cast<size_t>(end - begin), false);
  for (const ActivitySpan& s : spans)
    for (int64_t t = std::max(s.start_ns, begin); t < std::min(s.end_ns, end); ++t) covered[t - begin] = true;
  auto first = std::find(covered.begin(), covered.end(), true);
  if (first == covered.end()) return {};
  auto last = std::find(covered.rbegin(), covered.rend(), true).base();
  double busy = static_cast<double>(std::count(first, last, true));
  return IdleTime{busy * 1e-6, static_cast<double>(last - first) * 1e-6 - busy * 1e-6};
}

}  // namespace

TEST_CASE("idle_time: busy and idle inside a window, spans overlapping, nested, clipped and outside") {
  // Window [100, 1000): 100-300 covered (two overlapping spans, one clipped), 400-500 (one nested
  // in another), 900-1000 (clipped); 300-400 and 500-900 idle; the last span lies outside.
  std::vector<ActivitySpan> spans = {{400, 500}, {50, 200}, {150, 300}, {450, 480}, {900, 1200}, {1100, 1300}};
  IdleTime t = idle_time(spans, 100, 1000);
  CHECK(t.busy_ms == doctest::Approx(400e-6));
  CHECK(t.idle_ms == doctest::Approx(500e-6));
  // Nothing inside: no device step.
  IdleTime none = idle_time(spans, 1300, 2000);
  CHECK(none.busy_ms == 0);
  CHECK(none.idle_ms == 0);

  Rng rng;
  CAPTURE(rng.seed());
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<ActivitySpan> random(rng.integer(0, 12));
    for (ActivitySpan& s : random) {
      s.start_ns = rng.integer(0, 300);
      s.end_ns = s.start_ns + rng.integer(0, 60);  // empty spans too
    }
    int64_t begin = rng.integer(0, 150), end = begin + rng.integer(1, 200);
    IdleTime expect = idle_by_count(random, begin, end), got = idle_time(random, begin, end);
    CAPTURE(trial);
    CHECK(got.busy_ms == doctest::Approx(expect.busy_ms).epsilon(1e-9));
    CHECK(got.idle_ms == doctest::Approx(expect.idle_ms).epsilon(1e-9));
  }
}

TEST_CASE("activity recorder: the CPU backend has none, with the reason") {
  ActivityRecorder cpu(Device::cpu());
  CHECK_FALSE(cpu.available());
  CHECK(cpu.why_not().find("CPU backend") != std::string::npos);
  CHECK(cpu.take().empty());
}

#if YOLO_EMULATED_KERNELS
TEST_CASE("activity recorder (emu0): two 5 ms items with a 40 ms host pause between them: busy >= 10 ms, idle >= 40") {
  Stream stream(Device::emu(0), StreamPriority::Normal, "activity");
  auto busy_wait = [] {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  ActivityRecorder recorder(Device::emu(0));
  REQUIRE(recorder.available());
  const int64_t begin = recorder.now_ns();
  stream.enqueue(busy_wait);
  stream.synchronize();
  // The second item cannot start before it is queued: the device idles at least this long.
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  stream.enqueue(busy_wait);
  stream.synchronize();
  const int64_t end = recorder.now_ns();
  std::vector<ActivitySpan> spans = recorder.take();
  REQUIRE(spans.size() == 2);
  IdleTime t = idle_time(spans, begin, end);
  CHECK(t.busy_ms >= 10);
  CHECK(t.idle_ms >= 40);
  CHECK(t.busy_ms + t.idle_ms <= (end - begin) * 1e-6);
  CHECK(recorder.take().empty());  // each span is handed over once
  // Another device's work is not this recorder's.
  Stream other(Device::emu(1), StreamPriority::Normal, "other");
  other.enqueue(busy_wait);
  other.synchronize();
  CHECK(recorder.take().empty());
}
#endif
