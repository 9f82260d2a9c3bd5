// Checked calls, device discovery and the --devices choice, and NCCL's run-time loading.
#include <doctest/doctest.h>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/nccl_loader.h"
#include "tests/test_support.h"

using namespace yolo;

TEST_CASE("FAIL_AT names the file and line") {
  std::string expected = "test_runtime.cpp:" + std::to_string(__LINE__ + 1) + ": bad thing";
  CHECK_THROWS_WITH_AS(FAIL_AT("bad thing"), doctest::Contains(expected.c_str()), Error);
}

#if YOLO_CUDA
TEST_CASE("CHECKED reports a CUDA failure with the call, file, line and CUDA's message") {
  int line = __LINE__ + 2;
  try {
    CHECKED(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK(what.find("test_runtime.cpp:" + std::to_string(line)) != std::string::npos);
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("failed") != std::string::npos);
  }
  CHECKED(cudaSuccess);  // no throw
}
#endif

#if YOLO_HAVE_NCCL
TEST_CASE("CHECKED reports an NCCL failure with NCCL's message") {
  if (!nccl_status().loaded) SKIP_TEST("NCCL not loaded: " + nccl_status().why_not);
  CHECK_THROWS_WITH_AS(CHECKED(ncclInvalidArgument), doctest::Contains("NCCL error 4"), Error);
  CHECKED(ncclSuccess);
}
#endif

TEST_CASE("device discovery never throws and explains a missing GPU") {
  const GpuDiscovery& found = discover_gpus();
  CHECK(found.cuda_built == bool(YOLO_CUDA));
  if (found.gpus.empty()) CHECK_FALSE(found.why_no_gpu.empty());
  std::string report = describe_devices(found);
  CHECK(report.find("CPU: ") != std::string::npos);
  CHECK(report.find("NCCL: ") != std::string::npos);
}

TEST_CASE("--devices: choices and clear errors") {
  GpuDiscovery none;
  none.why_no_gpu = "no CUDA driver on this machine";
  GpuDiscovery two;
  two.gpus = {GpuInfo{0, "A", 9, 0, 132, 1, 1, {}}, GpuInfo{1, "B", 9, 0, 132, 1, 1, {}}};

  DeviceChoice fallback = choose_devices("auto", none);
  REQUIRE(fallback.devices.size() == 1);
  CHECK(fallback.devices[0] == Device::cpu());
  CHECK(fallback.reason.find("no CUDA driver") != std::string::npos);

  CHECK(choose_devices("auto", two).devices.size() == 2);
  CHECK(choose_devices("gpu", two).devices.size() == 2);
  CHECK(choose_devices("cpu:3", two).devices == std::vector<Device>(3, Device::cpu()));
  DeviceChoice one = choose_devices("gpu:1", two);
  CHECK(one.devices == std::vector<Device>{Device::cuda(1)});

  CHECK_THROWS_WITH_AS(choose_devices("gpu:0", none), doctest::Contains("no GPU is available: no CUDA driver"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("gpu:2", two), doctest::Contains("GPU 2 does not exist"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("gpu:0,0", two), doctest::Contains("listed twice"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("gpu:x", two), doctest::Contains("'x' is not a non-negative integer"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("tpu:0", two), doctest::Contains("--devices tpu:0: unknown device kind"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("cpu:0", two), doctest::Contains("CPU replicas must be 1..64"), Error);
}

TEST_CASE("NCCL status is a clear answer either way") {
  const NcclStatusInfo& status = nccl_status();
  if (status.loaded) {
    CHECK(status.version >= 20000);
    CHECK_FALSE(status.path.empty());
  } else {
    CHECK_FALSE(status.why_not.empty());
  }
}
