// Where kernel tests run: emulated on the CPU (build/tests_emu, under the sanitizers) or
// natively on gpu:0 (build/tests of a CUDA build). The same test source serves both.
#pragma once
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "runtime/memory.h"

namespace yolo::testing {

// The device kernel tests use, or nothing (with the reason) when this binary cannot run kernels.
std::optional<Device> kernel_device(std::string* why_not);
bool kernels_emulated();  // true in build/tests_emu

// Device memory holding `count` values of T, with host round trips for tests.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(Device device, size_t count) : memory_(device, count * sizeof(T)), count_(count) {}
  DeviceArray(Device device, const std::vector<T>& values) : DeviceArray(device, values.size()) { upload(values); }
  T* data() const { return static_cast<T*>(memory_.data()); }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& values) { copy_bytes(data(), values.data(), count_ * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    copy_bytes(values.data(), data(), count_ * sizeof(T));
    return values;
  }
  // All bytes 0xFF: NaN for floats, -1 for signed integers. Outputs are poisoned before a
  // kernel runs, so an element the kernel forgot to write fails the comparison.
  void poison() { fill_bytes(data(), 0xFF, count_ * sizeof(T), memory_.device()); }

 private:
  DeviceMemory memory_;
  size_t count_;
};

}  // namespace yolo::testing

// Starts a kernel test: binds `device` or skips the test with the reason.
#define KERNEL_TEST_DEVICE(device)                                     \
  std::string kernel_device_why_;                                      \
  auto kernel_device_opt_ = ::yolo::testing::kernel_device(&kernel_device_why_); \
  if (!kernel_device_opt_) SKIP_TEST(kernel_device_why_);              \
  const ::yolo::Device device = *kernel_device_opt_

namespace yolo::testing {

// Which implementations of an op a test compares: reference and CPU always, CUDA where
// kernels run (emulated in tests_emu, on a GPU natively).
enum class Impl { Reference, Cpu, Cuda };
inline const char* impl_name(Impl impl) {
  return impl == Impl::Reference ? "reference" : impl == Impl::Cpu ? "cpu" : "cuda";
}
inline std::vector<Impl> impls_here() {
  std::string why;
  if (kernel_device(&why)) return {Impl::Reference, Impl::Cpu, Impl::Cuda};
  return {Impl::Reference, Impl::Cpu};
}

}  // namespace yolo::testing
