// Stream capture and graph replay on CPU and emulated streams (stream.h's StreamGraph): a replay runs
// the captured work again, in order, with a stream forked from the capture and joined back; what
// CUDA refuses during a capture is refused with CUDA's reason; a kernel replayed (emulated, or a
// CUDA Graph on a GPU) reads its buffers at run time with the arguments of the capture.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/activation.h"
#include "runtime/check.h"
#include "runtime/memory.h"
#include "runtime/stream.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;


TEST_CASE("stream capture (CPU): a replay runs the captured work again, in order, across a fork and join") {
  const Device cpu = Device::cpu();
  Stream main(cpu, StreamPriority::Normal, "main"), side(cpu, StreamPriority::High, "side");
  Event fork(cpu), join(cpu);
  Log log;
  main.enqueue(log.note("before"));
  main.begin_capture();
  CHECK(main.capturing());
  main.enqueue(log.note("a1"));
  main.record(fork);
  side.wait(fork);  // side joins the capture
  CHECK(side.capturing());
  side.enqueue(log.note("b1"));
  side.record(join);
  main.wait(join);  // and is joined back
  main.enqueue(log.note("a2"));
  StreamGraph graph = main.end_capture();
  CHECK(!main.capturing());
  CHECK(!side.capturing());
  main.synchronize();
  CHECK(log.take() == std::vector<std::string>{"before"});  // the captured work did not run
  side.enqueue(log.note("side's own"));                     // side runs its own work again
  side.synchronize();
  CHECK(log.take() == std::vector<std::string>{"side's own"});
  for (int launch = 0; launch < 3; ++launch) {
    CAPTURE(launch);
    graph.launch(main);
    main.enqueue(log.note("after"));
    main.synchronize();
    CHECK(log.take() == std::vector<std::string>{"a1", "b1", "a2", "after"});
  }
  fork.synchronize();  // the events recorded in the capture completed when it ended
  join.synchronize();
}

TEST_CASE("stream capture (CPU): what CUDA refuses during a capture is refused, with CUDA's reason") {
  const Device cpu = Device::cpu();
  {
    Stream s(cpu, StreamPriority::Normal, "s");
    Event inside(cpu);
    s.begin_capture();
    CHECK_THROWS_WITH_AS(s.begin_capture(), doctest::Contains("is capturing already"), Error);
    CHECK_THROWS_WITH_AS(s.synchronize(), doctest::Contains("cudaErrorStreamCaptureUnsupported"), Error);
    std::vector<char> host(8), device(8);
    CHECK_THROWS_WITH_AS(copy_and_wait(host.data(), device.data(), 8, s),
                         doctest::Contains("cudaErrorStreamCaptureUnsupported"), Error);
    s.record(inside);
    CHECK_THROWS_WITH_AS(inside.synchronize(), doctest::Contains("cudaErrorCapturedEvent"), Error);
    CHECK_THROWS_WITH_AS(inside.query(), doctest::Contains("cudaErrorCapturedEvent"), Error);
    Stream other(cpu, StreamPriority::Normal, "other");
    Event outside(cpu);
    other.record(outside);
    CHECK_THROWS_WITH_AS(s.wait(outside), doctest::Contains("cudaErrorStreamCaptureIsolation"), Error);
    CHECK_THROWS_WITH_AS(other.end_capture(), doctest::Contains("did not begin a capture"), Error);
    StreamGraph graph = s.end_capture();
    CHECK(graph.valid());
    s.synchronize();  // allowed again
  }
  {  // A stream that joined and was not joined back: the capture ends, with CUDA's reason.
    Stream s(cpu, StreamPriority::Normal, "s"), forked(cpu, StreamPriority::Normal, "forked");
    Event fork(cpu);
    s.begin_capture();
    s.record(fork);
    forked.wait(fork);
    forked.enqueue([] {});
    CHECK_THROWS_WITH_AS(s.end_capture(), doctest::Contains("cudaErrorStreamCaptureUnjoined"), Error);
    CHECK(!s.capturing());
    CHECK(!forked.capturing());
    forked.synchronize();
  }
  StreamGraph empty;
  Stream s(cpu, StreamPriority::Normal, "s");
  CHECK_THROWS_WITH_AS(empty.launch(s), doctest::Contains("an empty graph"), Error);
}

// On the kernel device: emu:0 in build/tests_emu, gpu:0 (a CUDA Graph) on a GPU machine.
TEST_CASE(
    "stream capture (kernel device): a replayed kernel reads its buffers at launch time, with the capture's "
    "arguments") {
  KERNEL_TEST_DEVICE(gpu);
  set_current_device(gpu);
  Stream s(gpu, StreamPriority::Normal, "compute");
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 1, h = 3, w = 5, c = 7;
  const size_t count = size_t(n) * h * w * c;
  DeviceArray<float> x(gpu, rng.floats(count, -2.0f, 2.0f)), y(gpu, count);
  y.poison();
  s.begin_capture();
  activation_forward_cuda<float>(Activation::Leaky, nhwc<const float>(x.data(), n, h, w, c), nhwc(y.data(), n, h, w, c),
                                 s.native());
  StreamGraph graph = s.end_capture();
  s.synchronize();
  CHECK(std::isnan(y.download()[0]));  // captured, not run
  for (int launch = 0; launch < 3; ++launch) {
    CAPTURE(launch);
    const std::vector<float> input = rng.floats(count, -2.0f, 2.0f);
    x.upload(input);  // new data in the same buffer: the replay reads it
    graph.launch(s);
    s.synchronize();
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = activate<Activation::Leaky>(input[i]);
    CHECK(y.download() == want);
  }
}

TEST_CASE("stream capture (CPU): an event recorded with record_timing is recorded by every launch; record's is not") {
  Device cpu = Device::cpu();
  Stream s(cpu, StreamPriority::Normal, "compute");
  for (bool timing : {true, false}) {
    CAPTURE(timing);
    Event begin(cpu), end(cpu);
    std::atomic<int> runs{0};
    s.begin_capture();
    s.record_timing(begin);
    s.enqueue([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      ++runs;
    });
    if (timing)
      s.record_timing(end);
    else
      s.record(end);
    StreamGraph graph = s.end_capture();
    for (int launch = 1; launch <= 2; ++launch) {
      graph.launch(s);
      end.synchronize();  // with record_timing: waits for this launch's work
      if (timing) {
        CHECK(runs == launch);
        CHECK(end.elapsed_ms_since(begin) >= 25.0f);
      } else {
        CHECK(runs == launch - 1);  // the capture's record completed when the capture ended
      }
      s.synchronize();
    }
  }
}
