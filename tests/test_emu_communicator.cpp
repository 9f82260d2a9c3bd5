// The emulated GPUs' communicator (runtime/emu_communicator.h): the rank-ordered sum on every
// rank, bit for bit, broadcast and all-gather; collectives read their buffer when the stream
// gets there; an abort ends the pending collectives of every rank, naming the rank; a rank that
// never joins is given up on after the timeout; collectives out of step are refused.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/check.h"
#include "runtime/communicator.h"
#include "runtime/emu_communicator.h"
#include "runtime/memory.h"
#include "runtime/stream.h"
#include "tests/emu_fixtures.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

#if YOLO_EMULATED_KERNELS

namespace {

std::vector<float> download(const DeviceMemory& memory, size_t count) {
  std::vector<float> out(count);
  copy_bytes(out.data(), memory.data(), count * sizeof(float));
  return out;
}

// Runs body(rank, communicator) on `n` threads, emu:0 .. emu:n-1; returns each rank's error.
template <typename Body>
std::vector<std::string> on_ranks(int n, double timeout, Body body) {
  return on_replicas(DeviceKind::Emu, n, timeout, [&](int r, Device, Communicator& comm) { body(r, comm); });
}

}  // namespace

TEST_CASE("emulated GPUs' all-reduce: the rank-ordered sum on every rank, bit for bit; broadcast; all-gather") {
  Rng rng;
  CAPTURE(rng.seed());
  for (bool adversarial : {false, true}) {
    CAPTURE(adversarial);
    std::optional<AdversarialSchedule> schedule;
    if (adversarial) schedule.emplace(rng.seed());
    for (int n : {1, 2, 3}) {
      CAPTURE(n);
      const size_t count = 1001;
      std::vector<std::vector<float>> data(n);
      for (auto& d : data) d = rng.floats(count, -1e3f, 1e3f);
      std::vector<float> expect = testing::rank_ordered_sum(data);
      std::vector<std::vector<float>> reduced(n), broadcast(n);
      std::vector<std::vector<uint64_t>> gathered(n);
      std::vector<std::string> errors = on_ranks(n, 20, [&](int r, Communicator& comm) {
        Device gpu = Device::emu(r);
        Stream stream(gpu, StreamPriority::High, "comm");
        DeviceMemory buffer(gpu, count * sizeof(float)), other(gpu, 17 * sizeof(float));
        copy_bytes(buffer.data(), data[r].data(), buffer.size(), &stream);
        std::vector<float> mine(17, static_cast<float>(r + 1));
        copy_bytes(other.data(), mine.data(), other.size(), &stream);
        comm.all_reduce_sum(static_cast<float*>(buffer.data()), count, stream);
        comm.all_reduce_sum(static_cast<float*>(buffer.data()), 0, stream);  // empty: still in step
        comm.broadcast(static_cast<float*>(other.data()), 17, n - 1, stream);
        comm.wait(stream);
        stream.synchronize();
        reduced[r] = download(buffer, count);
        broadcast[r] = download(other, 17);
        gathered[r] = comm.all_gather(static_cast<uint64_t>(r * 7 + 1));
      });
      for (int r = 0; r < n; ++r) {
        CHECK(errors[r].empty());
        CHECK(reduced[r] == expect);
        CHECK(broadcast[r] == std::vector<float>(17, static_cast<float>(n)));
        REQUIRE(gathered[r].size() == size_t(n));
        CHECK(gathered[r].back() == static_cast<uint64_t>((n - 1) * 7 + 1));
      }
    }
  }
}

TEST_CASE("emulated GPUs' collectives read their buffer when the stream reaches them, not when they are called") {
  std::vector<std::vector<float>> result(2);
  std::vector<std::string> errors = on_ranks(2, 20, [&](int r, Communicator& comm) {
    Device gpu = Device::emu(r);
    Stream stream(gpu, StreamPriority::High, "comm");
    DeviceMemory buffer(gpu, 4 * sizeof(float));
    std::vector<float> first(4, 1.0f), later(4, 10.0f);
    copy_bytes(buffer.data(), first.data(), buffer.size());
    Latch hold;
    stream.enqueue([&] { hold.wait(); });
    comm.all_reduce_sum(static_cast<float*>(buffer.data()), 4, stream);
    copy_bytes(buffer.data(), later.data(), buffer.size());  // before the stream gets there
    hold.release();
    comm.wait(stream);
    stream.synchronize();
    result[r] = download(buffer, 4);
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(errors[r].empty());
    CHECK(result[r] == std::vector<float>(4, 20.0f));
  }
}

TEST_CASE(
    "emulated GPUs' collectives in a stream capture: every launch of the graph all-reduces afresh, in step with the "
    "other ranks' launches and with eager collectives between them") {
  Rng rng;
  CAPTURE(rng.seed());
  for (bool adversarial : {false, true}) {
    CAPTURE(adversarial);
    std::optional<AdversarialSchedule> schedule;
    if (adversarial) schedule.emplace(rng.seed());
    const int n = 2;
    const size_t count = 37;
    const int launches = 3;
    // Per launch and rank: fresh data; an eager all-reduce of another buffer between launches.
    std::vector<std::vector<std::vector<float>>> data(launches, std::vector<std::vector<float>>(n));
    for (auto& per_rank : data)
      for (auto& d : per_rank) d = rng.floats(count, -1e3f, 1e3f);
    std::vector<std::vector<std::vector<float>>> reduced(launches, std::vector<std::vector<float>>(n));
    std::vector<std::vector<float>> eager(n);
    std::vector<std::string> errors = on_ranks(n, 20, [&](int r, Communicator& comm) {
      Device gpu = Device::emu(r);
      DeviceMemory buffer(gpu, count * sizeof(float)), other(gpu, sizeof(float));
      Stream compute(gpu, StreamPriority::Normal, "compute");
      Stream comm_stream(gpu, StreamPriority::High, "comm");
      Event fork(gpu), join(gpu);
      compute.begin_capture();
      compute.record(fork);
      comm_stream.wait(fork);  // the comm stream joins the capture
      comm.all_reduce_sum(static_cast<float*>(buffer.data()), count, comm_stream);
      comm_stream.record(join);
      compute.wait(join);
      StreamGraph graph = compute.end_capture();
      const float one = static_cast<float>(r + 1);
      for (int launch = 0; launch < launches; ++launch) {
        copy_bytes(buffer.data(), data[launch][r].data(), buffer.size(), &compute);
        graph.launch(compute);
        comm.wait(compute);  // the deadline wait, on the stream the graph ran on
        reduced[launch][r] = download(buffer, count);
        copy_bytes(other.data(), &one, sizeof one, &comm_stream);
        comm.all_reduce_sum(static_cast<float*>(other.data()), 1, comm_stream);  // numbered between launches
        comm.wait(comm_stream);
        comm_stream.synchronize();
        eager[r].push_back(download(other, 1)[0]);
      }
    });
    for (int r = 0; r < n; ++r) {
      CHECK(errors[r].empty());
      CHECK(eager[r] == std::vector<float>(launches, 3.0f));
      for (int launch = 0; launch < launches; ++launch) {
        CAPTURE(launch);
        CHECK(reduced[launch][r] == testing::rank_ordered_sum(data[launch]));
      }
    }
  }
}

TEST_CASE("emulated GPUs: an abort ends every rank's pending collectives, naming the rank") {
  auto start = std::chrono::steady_clock::now();
  std::string stream_error;
  Latch enqueued;
  std::vector<std::string> errors = on_ranks(2, 60, [&](int r, Communicator& comm) {
    if (r == 1) {
      if (!enqueued.wait()) throw Error("rank 0 never queued its all-reduce");
      comm.abort("out of memory");
      return;
    }
    // The buffer outlives the stream, whose destructor runs what is still queued (cudaFree would
    // synchronise the device first; the emulation's free does not).
    DeviceMemory buffer(Device::emu(0), 8 * sizeof(float));
    Stream stream(Device::emu(0), StreamPriority::High, "comm");
    comm.all_reduce_sum(static_cast<float*>(buffer.data()), 8, stream);
    enqueued.release();
    try {
      comm.wait(stream);
    } catch (const Error&) {
      try {
        stream.synchronize();  // the collective ended with the abort: its stream says so
      } catch (const Error& e) {
        stream_error = e.what();
      }
      throw;
    }
  });
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(errors[0].find("rank 1 failed: out of memory") != std::string::npos);
  CHECK(stream_error.find("rank 1 failed: out of memory") != std::string::npos);
  CHECK(seconds < 30);  // not the 60 s timeout
  // Later calls refuse at once.
  std::vector<std::string> later = on_ranks(1, 5, [&](int, Communicator& comm) {
    comm.abort("first");
    Stream stream(Device::emu(0), StreamPriority::High, "comm");
    DeviceMemory buffer(Device::emu(0), sizeof(float));
    comm.all_reduce_sum(static_cast<float*>(buffer.data()), 1, stream);
  });
  CHECK(later[0].find("was aborted: rank 0 failed: first") != std::string::npos);
}

TEST_CASE("emulated GPUs: a rank that never joins is given up on after the timeout; collectives out of step are refused") {
  std::string stream_error;
  std::vector<std::string> errors = on_ranks(2, 0.5, [&](int r, Communicator& comm) {
    if (r == 1) return;  // never takes part
    // The buffer outlives the stream, whose destructor runs what is still queued (cudaFree would
    // synchronise the device first; the emulation's free does not).
    DeviceMemory buffer(Device::emu(0), 8 * sizeof(float));
    Stream stream(Device::emu(0), StreamPriority::High, "comm");
    comm.all_reduce_sum(static_cast<float*>(buffer.data()), 8, stream);
    try {
      comm.wait(stream);
    } catch (const Error&) {
      try {
        stream.synchronize();
      } catch (const Error& e) {
        stream_error = e.what();
      }
      throw;
    }
  });
  CHECK(errors[0].find("rank 0 waited 0 s in a collective that the other ranks never joined (--comm-timeout)") !=
        std::string::npos);
  CHECK(stream_error.find("never joined") != std::string::npos);
  CHECK(errors[1].empty());

  // A timeout in the host all-gather ends the collectives already queued: no stream waits forever.
  std::string queued_error;
  std::vector<std::string> gather = on_ranks(2, 0.5, [&](int r, Communicator& comm) {
    if (r == 1) return;  // joins nothing
    // The buffer outlives the stream, whose destructor runs what is still queued (cudaFree would
    // synchronise the device first; the emulation's free does not).
    DeviceMemory buffer(Device::emu(0), 8 * sizeof(float));
    Stream stream(Device::emu(0), StreamPriority::High, "comm");
    comm.all_reduce_sum(static_cast<float*>(buffer.data()), 8, stream);
    try {
      comm.all_gather(1);
    } catch (const Error&) {
      try {
        stream.synchronize();
      } catch (const Error& e) {
        queued_error = e.what();
      }
      throw;
    }
  });
  CHECK(gather[0].find("never joined") != std::string::npos);
  CHECK(queued_error.find("never joined") != std::string::npos);

  std::vector<std::string> step = on_ranks(2, 20, [&](int r, Communicator& comm) {
    DeviceMemory buffer(Device::emu(r), 16 * sizeof(float));  // outlives the stream (see above)
    Stream stream(Device::emu(r), StreamPriority::High, "comm");
    comm.all_reduce_sum(static_cast<float*>(buffer.data()), r == 0 ? 10 : 11, stream);
    comm.wait(stream);
    stream.synchronize();
  });
  bool named = false;
  for (const std::string& e : step) named |= e.find("out of step") != std::string::npos;
  CHECK(named);
  for (const std::string& e : step) CHECK_FALSE(e.empty());
}

#endif
