// Streams and events: in-order execution, cross-stream dependencies through events, real
// concurrency between streams (proved with latches, never with timing), and errors.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/stream.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

TEST_CASE("cpu stream: work runs in enqueue order") {
  Stream s(Device::cpu(), StreamPriority::Normal, "order");
  std::vector<int> seen;
  for (int i = 0; i < 100; ++i) s.enqueue([&seen, i] { seen.push_back(i); });
  s.synchronize();
  std::vector<int> expected(100);
  for (int i = 0; i < 100; ++i) expected[size_t(i)] = i;
  CHECK(seen == expected);
}

TEST_CASE("cpu streams: an event orders work across streams") {
  Log log;
  Latch hold_producer;
  Stream producer(Device::cpu(), StreamPriority::Normal, "producer");
  Stream consumer(Device::cpu(), StreamPriority::High, "consumer");
  Event ready(Device::cpu());

  producer.enqueue([&] {
    hold_producer.wait();  // keeps the producer busy until the consumer's wait is queued
    log.add("produce");
  });
  producer.record(ready);
  consumer.wait(ready);
  consumer.enqueue([&] { log.add("consume"); });
  CHECK_FALSE(ready.query());
  hold_producer.release();
  consumer.synchronize();
  producer.synchronize();
  CHECK(log.get() == std::vector<std::string>{"produce", "consume"});
  CHECK(ready.query());
}

TEST_CASE("cpu streams: without the event the consumer does not wait (the control)") {
  Log log;
  Latch hold_producer;
  Stream producer(Device::cpu(), StreamPriority::Normal, "producer");
  Stream consumer(Device::cpu(), StreamPriority::Normal, "consumer");
  producer.enqueue([&] {
    hold_producer.wait();
    log.add("produce");
  });
  consumer.enqueue([&] { log.add("consume"); });
  consumer.synchronize();  // completes while the producer is still held
  CHECK(log.get() == std::vector<std::string>{"consume"});
  hold_producer.release();
  producer.synchronize();
  CHECK(log.get() == std::vector<std::string>{"consume", "produce"});
}

TEST_CASE("cpu streams: independent streams really run at the same time") {
  // Each side waits for the other to have started: this completes only if both run at once.
  Latch a_started, b_started;
  std::atomic<bool> a_saw_b{false}, b_saw_a{false};
  Stream a(Device::cpu(), StreamPriority::Normal, "a");
  Stream b(Device::cpu(), StreamPriority::Normal, "b");
  a.enqueue([&] {
    a_started.release();
    a_saw_b = b_started.wait();
  });
  b.enqueue([&] {
    b_started.release();
    b_saw_a = a_started.wait();
  });
  a.synchronize();
  b.synchronize();
  CHECK(a_saw_b.load());
  CHECK(b_saw_a.load());
}

TEST_CASE("cpu streams: wait uses the record made before it; an unrecorded event is no dependency") {
  Stream s1(Device::cpu(), StreamPriority::Normal, "s1");
  Stream s2(Device::cpu(), StreamPriority::Normal, "s2");
  Event never(Device::cpu());
  s2.wait(never);  // must not block
  std::atomic<int> ran{0};
  s2.enqueue([&] { ran = 1; });
  s2.synchronize();
  CHECK(ran == 1);

  Event e(Device::cpu());
  Latch first_point, hold_after;
  s1.enqueue([&] { first_point.wait(); });
  s1.record(e);          // point 1
  s2.wait(e);            // waits for point 1 only
  s1.enqueue([&] { hold_after.wait(); });
  s1.record(e);          // point 2, after the wait was queued
  std::atomic<bool> s2_done{false};
  s2.enqueue([&] { s2_done = true; });
  first_point.release();
  s2.synchronize();      // must complete although point 2 is still held
  CHECK(s2_done.load());
  CHECK_FALSE(e.query());
  hold_after.release();
  e.synchronize();
  CHECK(e.query());
}

TEST_CASE("cpu events: elapsed time between two points of a stream") {
  Stream s(Device::cpu(), StreamPriority::Normal, "timed");
  Event start(Device::cpu()), stop(Device::cpu());
  s.record(start);
  s.enqueue([] {
    volatile double x = 0;
    for (int i = 0; i < 100000; ++i) x = x + 1.0;
  });
  s.record(stop);
  CHECK(stop.elapsed_ms_since(start) >= 0.0f);
  Event unrecorded(Device::cpu());
  CHECK_THROWS_AS((void)unrecorded.elapsed_ms_since(start), Error);
}

TEST_CASE("cpu stream: an exception in queued work surfaces at synchronize") {
  Stream s(Device::cpu(), StreamPriority::Normal, "throws");
  std::atomic<bool> later_ran{false};
  s.enqueue([] { throw Error("boom in stream work"); });
  s.enqueue([&] { later_ran = true; });
  CHECK_THROWS_WITH_AS(s.synchronize(), "boom in stream work", Error);
  CHECK(later_ran.load());
  s.synchronize();  // the error is reported once
}

TEST_CASE("gpu streams: an event orders kernels and host work across streams") {
  const GpuDiscovery& found = discover_gpus();
  if (found.gpus.empty()) SKIP_TEST("needs a GPU: " + found.why_no_gpu);
  Device gpu = Device::cuda(0);
  Log log;
  Latch hold;
  Stream producer(gpu, StreamPriority::Normal, "producer");
  Stream comm(gpu, StreamPriority::High, "comm");
  Event ready(gpu);
  producer.enqueue([&] {
    hold.wait();
    log.add("produce");
  });
  producer.record(ready);
  comm.wait(ready);
  comm.enqueue([&] { log.add("consume"); });
  hold.release();
  comm.synchronize();
  producer.synchronize();
  CHECK(log.get() == std::vector<std::string>{"produce", "consume"});
  CHECK(ready.query());
  Event start(gpu), stop(gpu);
  producer.record(start);
  producer.record(stop);
  CHECK(stop.elapsed_ms_since(start) >= 0.0f);
}

TEST_CASE("cpu events: a wait is not released by a later record completing first") {
  // A records point 1, C waits for point 1, B records point 2 and completes at once: C must
  // still wait for A.
  Stream a(Device::cpu(), StreamPriority::Normal, "a");
  Stream b(Device::cpu(), StreamPriority::Normal, "b");
  Stream c(Device::cpu(), StreamPriority::Normal, "c");
  Event e(Device::cpu());
  Latch hold_a;
  std::atomic<bool> a_done{false}, c_saw_a{false};
  a.enqueue([&] {
    hold_a.wait();
    a_done = true;
  });
  a.record(e);
  c.wait(e);
  c.enqueue([&] { c_saw_a = a_done.load(); });
  b.record(e);
  b.synchronize();  // point 2 is complete now
  hold_a.release();
  c.synchronize();
  CHECK(c_saw_a.load());
  a.synchronize();
  CHECK(e.query());
}

TEST_CASE("streams and events: moved-from objects refuse to be used") {
  Stream s(Device::cpu(), StreamPriority::Normal, "moved");
  Stream t = std::move(s);
  CHECK_FALSE(s.valid());
  CHECK_THROWS_WITH_AS(s.enqueue([] {}), doctest::Contains("moved-from stream"), Error);
  Event e(Device::cpu());
  Event f = std::move(e);
  CHECK_THROWS_WITH_AS(t.record(e), doctest::Contains("moved-from event"), Error);
  t.record(f);
  t.synchronize();
  CHECK(f.elapsed_ms_since(f) == 0.0f);  // the same event twice: no self-deadlock
}
