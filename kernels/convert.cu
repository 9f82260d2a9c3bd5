// Storage-type conversion: reference and CUDA kernel (see convert.h).
#include <string>

#include "kernels/common.cuh"
#include "kernels/convert.h"

namespace yolo {
namespace {

void check_arrays(const char* op, const void* src, const void* dst, size_t count) {
  if (count > 0 && (src == nullptr || dst == nullptr))
    throw Error(std::string(op) + ": null array with " + std::to_string(count) + " elements");
}

// One element per thread and step of a grid-stride loop: the conversions are a few integer ops,
// so the loop is bound by memory either way.
template <typename From, typename To>
__global__ void convert_kernel(const From* src, To* dst, size_t count) {
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step)
    dst[i] = from_float<To>(to_float(src[i]));
}

}  // namespace

template <typename From, typename To>
void convert_reference(const From* src, To* dst, size_t count) {
  check_arrays("convert_reference", src, dst, count);
  for (size_t i = 0; i < count; ++i) dst[i] = from_float<To>(to_float(src[i]));
}

template <typename From, typename To>
void convert_cuda(const From* src, To* dst, size_t count, cudaStream_t stream) {
  check_arrays("convert_cuda", src, dst, count);
  if (count == 0) return;
  const unsigned blocks = ceil_div(count, 256) < 4096 ? ceil_div(count, 256) : 4096;
  LAUNCH((convert_kernel<From, To>), dim3(blocks), dim3(256), 0, stream, src, dst, count);
}

#define INSTANTIATE(From, To)                                          \
  template void convert_reference<From, To>(const From*, To*, size_t); \
  template void convert_cuda<From, To>(const From*, To*, size_t, cudaStream_t);
INSTANTIATE(float, Bf16)
INSTANTIATE(float, Fp16)
INSTANTIATE(Bf16, float)
INSTANTIATE(Fp16, float)
#undef INSTANTIATE

}  // namespace yolo
