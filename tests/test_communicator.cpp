// The in-process communicator: all-reduce gives every rank the same bits (the sum in rank
// order), broadcast and all-gather, and a failing rank makes the others throw, not hang.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "runtime/check.h"
#include "runtime/communicator.h"
#include "tests/test_support.h"

using namespace yolo;

TEST_CASE("in-process all-reduce: every rank gets the rank-ordered sum, bit for bit") {
  testing::Rng rng;
  CAPTURE(rng.seed());
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    const size_t count = 1001;
    std::vector<std::vector<float>> data(n);
    for (auto& d : data) d = rng.floats(count, -1e3f, 1e3f);
    std::vector<float> expect = testing::rank_ordered_sum(data);
    InProcessGroup group(n, 10);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        auto comm = group.communicator(r);
        Stream stream(Device::cpu());
        comm->all_reduce_sum(data[r].data(), count, stream);
        comm->all_reduce_sum(data[r].data(), 0, stream);  // empty: a no-op, still in step
        stream.synchronize();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) CHECK(data[r] == expect);
  }
}

TEST_CASE("in-process broadcast and all-gather") {
  const int n = 3;
  InProcessGroup group(n, 10);
  std::vector<std::vector<float>> data(n, std::vector<float>(17));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < 17; ++i) data[r][i] = static_cast<float>(r * 100 + i);
  std::vector<std::vector<uint64_t>> gathered(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.communicator(r);
      Stream stream(Device::cpu());
      comm->broadcast(data[r].data(), 17, 1, stream);
      stream.synchronize();
      gathered[r] = comm->all_gather(static_cast<uint64_t>(r * 7 + 1));
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    CHECK(data[r] == data[1]);
    CHECK(data[r][3] == 103.0f);
    CHECK(gathered[r] == std::vector<uint64_t>{1, 8, 15});
  }
}

TEST_CASE("a rank that fails makes the others throw instead of hanging; a missing rank times out") {
  InProcessGroup group(3, 10);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.communicator(r);
      if (r == 2) {
        comm->abort("out of memory");
        return;
      }
      try {
        comm->all_gather(1);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  CHECK(errors[0].find("rank 2 failed: out of memory") != std::string::npos);
  CHECK(errors[1].find("rank 2 failed: out of memory") != std::string::npos);

  InProcessGroup lonely(2, 0.2);
  auto comm = lonely.communicator(0);
  CHECK_THROWS_WITH_AS(comm->all_gather(1), doctest::Contains("never joined"), Error);
}
