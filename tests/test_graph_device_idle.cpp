// The step split's device idle time (graph/device_idle.h): windows settled in batches with the
// newest left open, each settled once, steps counted by the windows that end them; spans that
// arrive after their window closed still count while it is open.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "graph/device_idle.h"
#include "runtime/stream.h"

using namespace yolo;
using namespace yolo::graph;

TEST_CASE("device idle: the CPU and --no-idle record nothing, and say why") {
  DeviceIdle cpu(Device::cpu(), true);
  CHECK_FALSE(cpu.available());
  CHECK(cpu.why_not().find("CPU backend") != std::string::npos);
  DeviceIdle off(Device::cpu(), false);
  CHECK(off.why_not() == "--no-idle");
  off.open_window();
  off.close_window(true);
  CHECK(off.settle(0).device_steps == 0);
}

#if YOLO_EMULATED_KERNELS
TEST_CASE("device idle (emu0): 3 windows, one left open then settled; a window's gap counts as idle") {
  Stream stream(Device::emu(0), StreamPriority::Normal, "idle");
  auto work = [] {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3);
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  DeviceIdle idle(Device::emu(0), true);
  REQUIRE(idle.available());
  // Window 1 (micro-batch 1 of step 1): one item. Window 2 (its last): two items 20 ms apart.
  // Window 3 (step 2): one item.
  idle.open_window();
  stream.enqueue(work);
  stream.synchronize();
  idle.close_window(false);
  idle.open_window();
  stream.enqueue(work);
  stream.synchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stream.enqueue(work);
  stream.synchronize();
  idle.close_window(true);
  idle.open_window();
  stream.enqueue(work);
  stream.synchronize();
  idle.close_window(true);
  // Work between windows (the data wait's) is in no window.
  stream.enqueue(work);
  stream.synchronize();

  StepSplit first = idle.settle(1);  // windows 1 and 2
  CHECK(first.device_steps == 1);
  CHECK(first.device_busy_ms >= 9);
  CHECK(first.device_idle_ms >= 20);
  StepSplit again = idle.settle(1);  // nothing new to settle
  CHECK(again.device_steps == 0);
  CHECK(again.device_busy_ms == 0);
  StepSplit last = idle.settle(0);  // window 3
  CHECK(last.device_steps == 1);
  CHECK(last.device_busy_ms >= 3);
  CHECK(last.device_busy_ms < 3 + 20);  // not the work after it
  CHECK(idle.take_notice().empty());    // emulated GPUs lose nothing
  CHECK(idle.settled_windows() == 3);
  CHECK(idle.empty_windows() == 0);
}
#endif
