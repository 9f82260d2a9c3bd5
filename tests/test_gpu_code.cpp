// Which of the build's GPU code each device runs (runtime/gpu_code.h), and what --devices and
// --list-devices make of a GPU that runs none of it (runtime/device.h).
#include <doctest/doctest.h>

#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/gpu_code.h"

namespace yolo {
namespace {

const BuildGpuCode kDefaultBuild{{75, 80, 90}, 80};  // `make` without a GPU: ARCH=75 80 90, PTX of 80

struct Expected {
  int cc;
  GpuCode code;
  int sass;
  const char* why;
};

}  // namespace

TEST_CASE("GPU code: the path each compute capability takes in the default build") {
  const Expected cases[] = {
      {75, GpuCode::Sm75, 75, "sm_75 code; mma.sync in FP16"},       // T4
      {80, GpuCode::Sm80, 80, "the build's sm_80 code"},            // A100
      {86, GpuCode::Sm80, 80, "which compute capability 8.6 runs"},  // RTX 30, A10
      {89, GpuCode::Sm80, 80, "which compute capability 8.9 runs"},  // L4, RTX 40
      {90, GpuCode::Sm90a, 90, "sm_90a code: wgmma"},               // H100, H200
      {100, GpuCode::PtxJit, 0, "compiles its compute_80 PTX"},     // B200
      {120, GpuCode::PtxJit, 0, "compiles its compute_80 PTX"},     // RTX 50
      {70, GpuCode::None, 0, "7.0 is older than CUDA 13 supports"},  // V100
  };
  for (const Expected& e : cases) {
    CAPTURE(e.cc);
    const GpuCodeChoice c = choose_gpu_code(e.cc, kDefaultBuild);
    CHECK(c.code == e.code);
    CHECK(c.sass == e.sass);
    CHECK(c.usable() == (e.code != GpuCode::None));
    CHECK_MESSAGE(c.why.find(e.why) != std::string::npos, c.why);
  }
  CHECK(describe_build_gpu_code(kDefaultBuild) == "sm_75 sm_80 sm_90a + compute_80 PTX");
}

TEST_CASE("GPU code: builds for fewer architectures say what to rebuild with") {
  const BuildGpuCode hopper_only{{90}, 0};  // make ARCH=90 (the GPU bundle)
  CHECK(choose_gpu_code(90, hopper_only).code == GpuCode::Sm90a);
  for (int cc : {75, 86, 100, 120}) {
    CAPTURE(cc);
    const GpuCodeChoice c = choose_gpu_code(cc, hopper_only);
    CHECK_FALSE(c.usable());
    CHECK(c.why.find("it holds sm_90a") != std::string::npos);
    CHECK(c.why.find("make ARCH=" + std::to_string(arch_for(cc))) != std::string::npos);
  }
  // sm_80 SASS never runs on 9.0 (another major version): its PTX does.
  const BuildGpuCode ampere{{80}, 80};
  CHECK(choose_gpu_code(90, ampere).code == GpuCode::PtxJit);
  CHECK(choose_gpu_code(89, ampere).code == GpuCode::Sm80);
  CHECK_FALSE(choose_gpu_code(75, ampere).usable());  // PTX runs only on its version or newer
  CHECK(arch_for(75) == 75);
  CHECK(arch_for(86) == 80);
  CHECK(arch_for(90) == 90);
  CHECK(arch_for(120) == 80);
}

TEST_CASE("GPU code: an old driver's line names the driver series the runtime needs") {
  const std::string line = old_driver_message(12040, 13000);
  CHECK(line.find("supports CUDA 12.4") != std::string::npos);
  CHECK(line.find("runtime is CUDA 13.0") != std::string::npos);
  CHECK(line.find("driver 580 or newer") != std::string::npos);
  CHECK(minimum_driver_series(13020) == 580);
}

TEST_CASE("--devices and --list-devices leave out a GPU that runs none of the build's code") {
  GpuInfo v100{0, "Tesla V100", 7, 0, 80, 16ull << 30, 6 << 20, choose_gpu_code(70, kDefaultBuild)};
  GpuInfo b200{1, "B200", 10, 0, 148, 180ull << 30, 126 << 20, choose_gpu_code(100, kDefaultBuild)};
  GpuDiscovery found;
  found.cuda_built = true;
  found.gpus = {b200};
  found.unusable = {v100};

  const DeviceChoice all = choose_devices("auto", found);
  CHECK(all.devices == std::vector<Device>{Device::cuda(1)});
  CHECK(all.reason.find("gpu:0 (Tesla V100) cannot run this build: compute capability 7.0") != std::string::npos);
  CHECK(choose_devices("gpu:1", found).devices == std::vector<Device>{Device::cuda(1)});
  CHECK_THROWS_WITH_AS(choose_devices("gpu:0", found), doctest::Contains("GPU 0 (Tesla V100) cannot run this build"), Error);
  CHECK_THROWS_WITH_AS(choose_devices("gpu:2", found), doctest::Contains("GPU 2 does not exist (found 2)"), Error);

  const std::string report = describe_devices(found);
  CHECK(report.find("GPUs: 2 (1 unusable)") != std::string::npos);
  CHECK(report.find("gpu:0  Tesla V100") < report.find("gpu:1  B200"));
  CHECK(report.find("runs none: compute capability 7.0") != std::string::npos);
  CHECK(report.find("runs PTX JIT: no SASS for compute capability 10.0") != std::string::npos);
}

}  // namespace yolo
