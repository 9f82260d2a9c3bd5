// Emulated GPUs (runtime/emu/device.h, runtime/stream_queue.h): --devices emu:..., properties and
// memory budgets, device memory the host cannot touch, fresh memory full of NaN, kernels and
// copies in stream order (pageable copies staged, pinned ones asynchronous, stream-less ones
// unordered), the adversarial schedule, injected kernel failures. Concurrency is shown with
// latches; in the adversarial mode "never ran" is certain, so a latch that times out proves it.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/conv.h"
#include "kernels/shortcut.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/stream.h"
#include "runtime/stream_queue.h"
#include "tests/child_process.h"
#include "tests/emu_fixtures.h"
#include "tests/test_support.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

using namespace yolo;
using namespace yolo::testing;

#if !YOLO_EMULATED_KERNELS

TEST_CASE("emulated GPUs: a build with real CUDA kernels refuses them clearly") {
  GpuDiscovery none;
  CHECK_THROWS_WITH_AS(choose_devices("emu:0", none), doctest::Contains("emulated GPUs exist only in builds"), Error);
  CHECK_THROWS_WITH_AS(Stream(Device::emu(0)), doctest::Contains("emulated GPUs exist only in builds"), Error);
}

#else

namespace {

std::vector<float> download(const DeviceMemory& memory) {
  std::vector<float> out(memory.size() / sizeof(float));
  copy_bytes(out.data(), memory.data(), memory.size());
  return out;
}

Act flat_view(void* data, int count) { return Act{static_cast<float*>(data), 1, 1, count, 1, 1}; }

// In a forked child, with the emulation's fault handler above doctest's per-test crash handler.
template <typename Body>
std::string in_child(Body body, int* status) {
  return output_of_forked(
      [&] {
        emu::install_fault_handler();
        body();
      },
      status);
}

}  // namespace

TEST_CASE("--devices emu:...: indices, architectures, SM counts and memory sizes") {
  EmulatedDevicesReset reset;
  GpuDiscovery none;
  none.why_no_gpu = "no CUDA driver on this machine";
  DeviceChoice two = choose_devices("emu:0@sm75@mem=512M,1", none);
  REQUIRE(two.devices == std::vector<Device>{Device::emu(0), Device::emu(1)});
  CHECK(two.devices[0].name() == "emu:0");
  CHECK(two.reason.find("emulated") != std::string::npos);
  emu::DeviceProps t4 = emu::device_props(0), h200 = emu::device_props(1);
  CHECK(t4.cc_major == 7);
  CHECK(t4.cc_minor == 5);
  CHECK(t4.multiprocessors == 40);
  CHECK(t4.memory_bytes == size_t(512) << 20);
  CHECK(h200.cc_major == 9);
  CHECK(h200.multiprocessors == 132);
  CHECK(choose_devices("emu", none).devices == std::vector<Device>{Device::emu(0)});
  CHECK(choose_devices("emu:2@sms=7", none).devices == std::vector<Device>{Device::emu(2)});
  CHECK(emu::device_props(2).multiprocessors == 7);
  CHECK_THROWS_WITH_AS(choose_devices("emu:0,0", none), doctest::Contains("listed twice"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("emu:8", none), doctest::Contains("emu:8 does not exist"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("emu:0@sm61", none), doctest::Contains("no emulated GPU preset for sm_61"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("emu:0@mem=12Q", none), doctest::Contains("'12Q' is not a memory size"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("emu:0@fast", none), doctest::Contains("unknown emulated GPU property 'fast'"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("emu:0@sms=0", none), doctest::Contains("sms must be 1..1024"), Error);
  CHECK(describe_devices(none).find("Emulated GPUs: emu:0") != std::string::npos);
}

TEST_CASE("emulated GPU memory: a budget per device, fresh memory full of NaN, the SM count for tile planning") {
  EmulatedDevicesReset reset;
  emu::DeviceProps small = emu::preset_for(75);
  small.memory_bytes = size_t(1) << 20;
  emu::configure_device(3, small);
  std::optional<MemoryInfo> info = device_memory_info(Device::emu(3));
  REQUIRE(info);
  CHECK(info->total_bytes == size_t(1) << 20);
  CHECK(info->free_bytes == size_t(1) << 20);
  {
    DeviceMemory a(Device::emu(3), 600 << 10);
    CHECK(device_memory_info(Device::emu(3))->free_bytes == (size_t(1) << 20) - (600 << 10));
    CHECK_THROWS_WITH_AS(DeviceMemory(Device::emu(3), 600 << 10),
                         doctest::Contains("out of memory on emu:3: asked for 0.6 MiB, 0.4 MiB free of 1.0 MiB"), Error);
    for (float v : download(a)) REQUIRE(std::isnan(v));  // as uninitialised device memory may hold
  }
  CHECK(device_memory_info(Device::emu(3))->free_bytes == size_t(1) << 20);  // freed
  CHECK_FALSE(device_memory_info(Device::cpu()));
  set_current_device(Device::emu(3));
  CHECK(emu::current_multiprocessors() == 40);
  emu::set_current_device(-1);
  CHECK(emu::current_multiprocessors() == 4);
}

TEST_CASE("emulated GPUs: the current device's SM count reaches the kernels' tile planning") {
  EmulatedDevicesReset reset;
  emu::DeviceProps few = emu::preset_for(90), many = emu::preset_for(90);
  few.multiprocessors = 4;
  emu::configure_device(0, few);
  emu::configure_device(1, many);
  // The weight gradient of a 3x3 conv over many pixels splits its pixel sum to fill the GPU.
  Conv2dShape shape{8, 52, 52, 64, 64, 3, 1};
  set_current_device(Device::emu(0));
  size_t on_few = conv2d_backward_weights_workspace_bytes(shape);
  set_current_device(Device::emu(1));
  size_t on_many = conv2d_backward_weights_workspace_bytes(shape);
  MESSAGE("split-K workspace: " << on_few << " bytes on 4 SMs, " << on_many << " on 132");
  CHECK(on_many > on_few);
}

TEST_CASE("emulated GPU memory: a host read of a device pointer faults, naming the device and allocation") {
  int status = 0;
  std::string report = in_child(
      [] {
        DeviceMemory memory(Device::emu(1), 64);
        volatile const char* p = static_cast<const char*>(memory.data()) + 5;
        char c = *p;  // the classic bug: device memory read by host code
        std::fprintf(stderr, "read %d: not caught\n", int(c));
      },
      &status);
  INFO(report);
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(report.find("host code touched the device memory of emu:1") != std::string::npos);
  CHECK(report.find("byte 5 of a 64-byte allocation") != std::string::npos);
  CHECK(report.find("not caught") == std::string::npos);
  // The same memory through a copy and a kernel is fine.
  DeviceMemory a(Device::emu(1), 4 * sizeof(float)), b(Device::emu(1), 4 * sizeof(float));
  std::vector<float> values{1, 2, 3, 4};
  copy_bytes(a.data(), values.data(), a.size());
  shortcut_forward_cuda(as_const(flat_view(a.data(), 4)), as_const(flat_view(a.data(), 4)), flat_view(b.data(), 4), nullptr);
  CHECK(download(b) == std::vector<float>{2, 4, 6, 8});
}

TEST_CASE("emulated GPU streams: kernels run in the stream's order, not at the launch") {
  Device gpu = Device::emu(0);
  Stream stream(gpu, StreamPriority::Normal, "compute");
  DeviceMemory a(gpu, 64 * sizeof(float)), out(gpu, 64 * sizeof(float));
  std::vector<float> ones(64, 1.0f);
  copy_bytes(a.data(), ones.data(), a.size(), &stream);
  Latch hold;
  stream.enqueue([&] { hold.wait(); });
  shortcut_forward_cuda(as_const(flat_view(a.data(), 64)), as_const(flat_view(a.data(), 64)), flat_view(out.data(), 64),
                        stream.native());
  Event done(gpu);
  stream.record(done);
  CHECK_FALSE(done.query());
  for (float v : download(out)) REQUIRE(std::isnan(v));  // queued behind the held host function
  hold.release();
  stream.synchronize();
  CHECK(download(out) == std::vector<float>(64, 2.0f));
}

TEST_CASE("emulated GPU copies: pageable sources are staged, pinned ones read when the stream gets there") {
  Device gpu = Device::emu(0);
  Stream stream(gpu, StreamPriority::Normal, "copy");
  DeviceMemory from_pageable(gpu, 8 * sizeof(float)), from_pinned(gpu, 8 * sizeof(float));
  std::vector<float> pageable(8, 1.0f);
  PinnedHostBuffer pinned(8 * sizeof(float));
  CHECK(pinned.pinned());
  auto* p = static_cast<float*>(pinned.data());
  std::fill(p, p + 8, 1.0f);
  Latch hold;
  stream.enqueue([&] { hold.wait(); });
  copy_bytes(from_pageable.data(), pageable.data(), from_pageable.size(), &stream);
  copy_bytes(from_pinned.data(), p, from_pinned.size(), &stream);
  std::fill(pageable.begin(), pageable.end(), 5.0f);  // allowed: the source was staged
  std::fill(p, p + 8, 5.0f);                          // the copy from pinned memory has not run yet
  hold.release();
  stream.synchronize();
  CHECK(download(from_pageable) == std::vector<float>(8, 1.0f));
  CHECK(download(from_pinned) == std::vector<float>(8, 5.0f));
}

TEST_CASE("emulated GPU copies: to pageable memory the call returns once the copy is done") {
  Device gpu = Device::emu(0);
  Stream stream(gpu, StreamPriority::Normal, "copy");
  DeviceMemory d(gpu, 4 * sizeof(float));
  std::vector<float> values{1, 2, 3, 4};
  copy_bytes(d.data(), values.data(), d.size());
  Latch hold, returned;
  stream.enqueue([&] { hold.wait(); });
  std::vector<float> back(4, 0.0f), seen;
  std::thread reader([&] {
    copy_bytes(back.data(), d.data(), d.size(), &stream);
    seen = back;  // read at once: the copy must be done
    returned.release();
  });
  CHECK_FALSE(returned.wait(std::chrono::milliseconds(200)));  // still held behind the stream's work
  hold.release();
  CHECK(returned.wait());
  reader.join();
  CHECK(seen == values);
}

TEST_CASE("emulated GPU copies: a copy without a stream is not ordered after the stream's work") {
  Device gpu = Device::emu(0);
  Stream stream(gpu, StreamPriority::Normal, "compute");
  DeviceMemory d(gpu, 4 * sizeof(float));
  Latch hold;
  stream.enqueue([&] { hold.wait(); });
  fill_bytes(d.data(), 0, d.size(), stream);  // queued behind the held function
  std::vector<float> early(4, 7.0f);
  copy_bytes(early.data(), d.data(), d.size());  // as cudaMemcpy with non-blocking streams
  for (float v : early) CHECK(std::isnan(v));    // what the device held before the fill
  hold.release();
  stream.synchronize();
  CHECK(download(d) == std::vector<float>(4, 0.0f));
}

TEST_CASE("emulated GPU streams: a host function may not touch device memory (it faults)") {
  int status = 0;
  std::string report = in_child(
      [] {
        DeviceMemory memory(Device::emu(0), 16);
        Stream stream(Device::emu(0), StreamPriority::Normal, "host");
        stream.enqueue([&] { static_cast<volatile char*>(memory.data())[0] = 1; });
        stream.synchronize();
        std::fprintf(stderr, "not caught\n");
      },
      &status);
  INFO(report);
  CHECK(report.find("host code touched the device memory of emu:0") != std::string::npos);
  CHECK(report.find("not caught") == std::string::npos);
}

TEST_CASE("adversarial schedule: a normal stream runs only what something waits for") {
  AdversarialSchedule adversarial(7);
  Device gpu = Device::emu(0);
  Stream a(gpu, StreamPriority::Normal, "a");
  Latch ran;
  a.enqueue([&] { ran.release(); });
  CHECK_FALSE(ran.wait(std::chrono::milliseconds(100)));  // nobody waits for it: it never runs
  a.synchronize();
  CHECK(ran.is_open());
}

TEST_CASE("adversarial schedule: a high-priority stream runs at once, asking its producer for no more than it waits for") {
  AdversarialSchedule adversarial(11);
  Device gpu = Device::emu(0);
  Stream compute(gpu, StreamPriority::Normal, "compute");
  Stream comm(gpu, StreamPriority::High, "comm");
  std::mutex mutex;
  std::vector<std::string> log;
  auto note = [&](const char* what) {
    std::lock_guard lock(mutex);
    log.push_back(what);
  };
  Event ready(gpu);
  Latch comm_done;
  compute.enqueue([&] { note("produce"); });
  compute.record(ready);
  compute.enqueue([&] { note("after the event"); });
  comm.wait(ready);
  comm.enqueue([&] {
    note("consume");
    comm_done.release();
  });
  REQUIRE(comm_done.wait());  // nobody synchronised: the comm stream got there by itself
  {
    std::lock_guard lock(mutex);
    CHECK(log == std::vector<std::string>{"produce", "consume"});
  }
  compute.synchronize();
  CHECK(log == std::vector<std::string>{"produce", "consume", "after the event"});
}

TEST_CASE("adversarial schedule: one item at a time in the whole process, and a missing wait reads stale data") {
  AdversarialSchedule adversarial(3);
  Device gpu = Device::emu(0);
  Stream s1(gpu, StreamPriority::Normal, "s1"), s2(gpu, StreamPriority::Normal, "s2");
  std::atomic<int> active{0}, most{0};
  auto item = [&] {
    int now = ++active;
    most = std::max(most.load(), now);
    std::this_thread::yield();
    --active;
  };
  for (int k = 0; k < 20; ++k) {
    s1.enqueue(item);
    s2.enqueue(item);
  }
  std::thread other([&] { s2.synchronize(); });
  s1.synchronize();
  other.join();
  CHECK(most.load() == 1);
  // A consumer on the comm stream that forgot to wait for the producer's kernel: always stale.
  Stream comm(gpu, StreamPriority::High, "comm");
  DeviceMemory x(gpu, 4 * sizeof(float)), y(gpu, 4 * sizeof(float));
  std::vector<float> ones(4, 1.0f);
  copy_bytes(x.data(), ones.data(), x.size());
  shortcut_forward_cuda(as_const(flat_view(x.data(), 4)), as_const(flat_view(x.data(), 4)), flat_view(x.data(), 4),
                        s1.native());  // x = 2 on s1
  copy_bytes(y.data(), x.data(), y.size(), &comm);  // no wait on s1
  comm.synchronize();
  s1.synchronize();
  CHECK(download(y) == std::vector<float>(4, 1.0f));
  CHECK(download(x) == std::vector<float>(4, 2.0f));
  CHECK_THROWS_WITH_AS(set_adversarial_schedule(std::nullopt), doctest::Contains("emulated GPU stream(s) exist"), Error);
}

TEST_CASE("adversarial schedule: a host wait asked for a record not yet queued is still served") {
  // The generation is handed out before the record reaches its queue: a wait in between must
  // not lose its demand (it did, once: the waiter slept forever).
  AdversarialSchedule adversarial(5);
  Device gpu = Device::emu(0);
  Stream s(gpu, StreamPriority::Normal, "recorder");
  Event e(gpu);
  std::atomic<bool> stop{false};
  std::thread recorder([&] {
    while (!stop) s.record(e);
  });
  Latch waited;
  std::thread waiter([&] {
    for (int k = 0; k < 2000; ++k) e.synchronize();
    waited.release();
  });
  bool served = waited.wait(std::chrono::seconds(30));
  stop = true;
  recorder.join();
  s.synchronize();  // asks for everything: frees a waiter that lost its demand, so the test ends
  waiter.join();
  CHECK(served);
}

TEST_CASE("streams: work that waits for a stream throws instead of deadlocking (adversarial: for any stream)") {
  Device gpu = Device::emu(0);
  {
    Stream own(gpu, StreamPriority::Normal, "own");
    own.enqueue([&] { own.synchronize(); });
    CHECK_THROWS_WITH_AS(own.synchronize(), doctest::Contains("would deadlock"), Error);
  }
  AdversarialSchedule adversarial(9);
  Stream a(gpu, StreamPriority::Normal, "a"), b(gpu, StreamPriority::Normal, "b");
  b.enqueue([] {});
  a.enqueue([&] { b.synchronize(); });
  CHECK_THROWS_WITH_AS(a.synchronize(), doctest::Contains("from work running on stream 'a' would deadlock"), Error);
  b.synchronize();
}

TEST_CASE("emulated GPUs: an injected kernel failure surfaces at the stream's next synchronisation") {
  Device gpu = Device::emu(1);
  Stream stream(gpu, StreamPriority::Normal, "compute");
  DeviceMemory x(gpu, 4 * sizeof(float));
  fill_bytes(x.data(), 0, x.size(), gpu);
  emu::fail_kernel_launch(1, 2);
  Act v = flat_view(x.data(), 4);
  shortcut_forward_cuda(as_const(v), as_const(v), v, stream.native());
  shortcut_forward_cuda(as_const(v), as_const(v), v, stream.native());  // this one fails
  shortcut_forward_cuda(as_const(v), as_const(v), v, stream.native());
  CHECK_THROWS_WITH_AS(stream.synchronize(), doctest::Contains("an illegal memory access in"), Error);
  stream.synchronize();  // reported once
  // As on a GPU, the fault lost the device's context: a kernel launched after it fails too.
  CHECK(emu::device_failure(1).find("an illegal memory access in") == 0);
  shortcut_forward_cuda(as_const(v), as_const(v), v, stream.native());
  CHECK_THROWS_WITH_AS(stream.synchronize(), doctest::Contains("did not run"), Error);
  // A copy to pageable memory is a synchronisation too: it reports the error, as CUDA's would.
  emu::fail_kernel_launch(1, 1);
  shortcut_forward_cuda(as_const(v), as_const(v), v, stream.native());
  std::vector<float> back(4);
  CHECK_THROWS_WITH_AS(copy_bytes(back.data(), x.data(), x.size(), &stream), doctest::Contains("an illegal memory access"),
                       Error);
  stream.synchronize();
  emu::fail_kernel_launch(1, 0);
  CHECK(emu::device_failure(1).empty());  // disarming gives the context back
}

#endif
