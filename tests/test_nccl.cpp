// The NCCL communicator. Without a GPU (or without NCCL) it must refuse with a clear error; on
// a GPU machine: world size 1 (the all-reduce leaves the data, the all-gather returns the one
// value), and, where NCCL lets two ranks share a GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >=
// 2.30), two ranks as threads all-reduce random odd-sized buffers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/nccl_communicator.h"
#include "runtime/nccl_loader.h"
#include "runtime/stream.h"
#include "tests/test_support.h"

using namespace yolo;

namespace {

bool nccl_ready() { return discover_gpus().cuda_built && !discover_gpus().gpus.empty() && nccl_status().loaded; }

std::string why_not_ready() {
  if (discover_gpus().gpus.empty()) return "no GPU: " + discover_gpus().why_no_gpu;
  return "NCCL not loaded: " + nccl_status().why_not;
}

}  // namespace

TEST_CASE("NCCL communicator: refused with a reason where it cannot run") {
  if (nccl_ready()) SKIP_TEST("this machine can run NCCL (the GPU tests below cover it)");
  try {
    std::vector<uint8_t> id(128, 0);
    auto comm = nccl_communicator(Device::cuda(0), 0, 1, id, 2);
    FAIL("an NCCL communicator was made without a GPU or NCCL");
  } catch (const Error& e) {
    std::string what = e.what();
    CAPTURE(what);
    CHECK(!what.empty());
    bool explains = what.find("NCCL") != std::string::npos || what.find("cuda") != std::string::npos ||
                    what.find("CUDA") != std::string::npos || what.find("GPU") != std::string::npos;
    CHECK(explains);
  }
  // Bad arguments are refused before anything is created.
  CHECK_THROWS_AS(nccl_communicator(Device::cpu(), 0, 1, std::vector<uint8_t>(128), 2), Error);
}

TEST_CASE("NCCL communicator, world size 1: all-reduce keeps the data, all-gather returns the value") {
  if (!nccl_ready()) SKIP_TEST(why_not_ready());
  testing::Rng rng;
  CAPTURE(rng.seed());
  const Device gpu = Device::cuda(0);
  auto comm = nccl_communicator(gpu, 0, 1, nccl_unique_id(), 60);
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  const size_t count = 100003;
  std::vector<float> host = rng.floats(count, -5, 5);
  DeviceMemory buffer(gpu, count * sizeof(float));
  Stream stream(gpu, StreamPriority::High, "comm");
  copy_bytes(buffer.data(), host.data(), count * sizeof(float), &stream);
  comm->all_reduce_sum(static_cast<float*>(buffer.data()), count, stream);
  comm->broadcast(static_cast<float*>(buffer.data()), count, 0, stream);
  comm->wait(stream);
  std::vector<float> back(count, -1e30f);
  copy_bytes(back.data(), buffer.data(), count * sizeof(float), &stream);
  stream.synchronize();
  CHECK(back == host);
  CHECK(comm->all_gather(0x1234567890ABCDEFull) == std::vector<uint64_t>{0x1234567890ABCDEFull});
}

TEST_CASE("NCCL communicator, 2 ranks sharing one GPU: all-reduce sums, all-gather in rank order") {
  if (!nccl_ready()) SKIP_TEST(why_not_ready());
  const char* shared = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  if (!shared || std::string(shared) != "1" || nccl_status().version < 23000)
    SKIP_TEST("two ranks on one GPU need NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1");
  testing::Rng rng;
  CAPTURE(rng.seed());
  const Device gpu = Device::cuda(0);
  const size_t count = 77777;
  std::vector<std::vector<float>> inputs = {rng.floats(count, -3, 3), rng.floats(count, -3, 3)};
  std::vector<std::vector<float>> outputs(2);
  std::vector<std::vector<uint64_t>> gathered(2);
  std::vector<std::string> errors(2);
  std::vector<uint8_t> id = nccl_unique_id();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = nccl_communicator(gpu, r, 2, id, 60);
        DeviceMemory buffer(gpu, count * sizeof(float));
        Stream stream(gpu, StreamPriority::High, "comm");
        copy_bytes(buffer.data(), inputs[r].data(), count * sizeof(float), &stream);
        comm->all_reduce_sum(static_cast<float*>(buffer.data()), count, stream);
        comm->wait(stream);
        outputs[r].assign(count, -1e30f);
        copy_bytes(outputs[r].data(), buffer.data(), count * sizeof(float), &stream);
        stream.synchronize();
        gathered[r] = comm->all_gather(100 + r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(errors[r].empty());
    for (size_t i = 0; i < count; ++i) REQUIRE(std::fabs(outputs[r][i] - (inputs[0][i] + inputs[1][i])) <= 1e-6f);
    CHECK(gathered[r] == std::vector<uint64_t>{100, 101});
  }
  CHECK(outputs[0] == outputs[1]);  // the ranks agree bit for bit
}
