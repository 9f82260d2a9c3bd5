// Checked calls: one macro, CHECKED(call), for every library whose calls return a status
// (CUDA runtime, NCCL). A failure throws yolo::Error naming file, line, the call's text and
// the library's own message. LAUNCH_CHECK(name) follows every kernel launch.
#pragma once
#include <stdexcept>
#include <string>

#if YOLO_CUDA
#include <cuda_runtime_api.h>
#endif

namespace yolo {

// Every error the trainer reports to the user; main() prints what() and exits non-zero.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail_call(const char* call, const char* file, int line, const std::string& why);

// Formats "file:line: message" and throws yolo::Error.
[[noreturn]] void fail_at(const char* file, int line, const std::string& message);

#if YOLO_CUDA
inline void check_result(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    fail_call(call, file, line,
              std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
}
#endif

// check_result for ncclResult_t lives in runtime/nccl_loader.h, beside the run-time loader.

}  // namespace yolo

#define CHECKED(call) ::yolo::check_result((call), #call, __FILE__, __LINE__)
#define FAIL_AT(message) ::yolo::fail_at(__FILE__, __LINE__, (message))

#if YOLO_CUDA
#define LAUNCH_CHECK(kernel_name) \
  ::yolo::check_result(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)
#endif
