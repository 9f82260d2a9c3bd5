// encode_2d (kernels/tma.h): the rules, then the driver's encoder or the emulation's fields.
#include "kernels/tma.h"

#include <cstring>
#include <string>

#include "kernels/common.cuh"
#include "kernels/tma.cuh"
#if defined(__CUDACC__)
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

namespace yolo::tma {

namespace {

void check_rules(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride_bytes, uint32_t box_cols,
                 uint32_t box_rows, int swizzle) {
  auto refuse = [](const std::string& why) { throw Error("tensor map: " + why); };
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) refuse("the global address must be 16-byte aligned");
  if (cols == 0 || rows == 0 || cols > (uint64_t(1) << 32) || rows > (uint64_t(1) << 32))
    refuse("each dimension must hold 1..2^32 elements (" + std::to_string(cols) + " x " + std::to_string(rows) + ")");
  if (row_stride_bytes % 16 != 0 || row_stride_bytes >= (uint64_t(1) << 40) || row_stride_bytes < cols * 2)
    refuse("the row stride (" + std::to_string(row_stride_bytes) +
           " bytes) must be a multiple of 16 below 2^40 and hold a row");
  if (box_cols == 0 || box_rows == 0 || box_cols > 256 || box_rows > 256)
    refuse("a box holds 1..256 elements per dimension (" + std::to_string(box_cols) + " x " +
           std::to_string(box_rows) + ")");
  if (box_cols * 2 % 16 != 0) refuse("a box row must be a multiple of 16 bytes (" + std::to_string(box_cols * 2) + ")");
  if (swizzle < 0 || swizzle > 3) refuse("swizzle code " + std::to_string(swizzle) + " is not 0..3");
  const uint32_t width = wgmma::swizzle_bytes(wgmma::Swizzle(swizzle));
  if (swizzle != 0 && box_cols * 2 > width)
    refuse("a box row of " + std::to_string(box_cols * 2) + " bytes is wider than its " + std::to_string(width) +
           "-byte swizzle");
}

}  // namespace

TensorMap encode_2d(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride_bytes, uint32_t box_cols,
                    uint32_t box_rows, int swizzle) {
  check_rules(base, cols, rows, row_stride_bytes, box_cols, box_rows, swizzle);
  TensorMap map{};
#if defined(__CUDACC__)
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "TensorMap must hold a CUtensorMap");
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CHECKED(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn)
      throw Error("tensor map: the driver has no cuTensorMapEncodeTiled (a driver for CUDA 12 or newer is needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows}, element_strides[2] = {1, 1};
  const CUtensorMapSwizzle swizzles[4] = {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_32B};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&map), CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                            const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzles[swizzle], CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("tensor map: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)));
#else
  const emulated::Map fields{emulated::kMagic, base, cols, rows, row_stride_bytes,
                             box_cols, box_rows, uint32_t(swizzle)};
  static_assert(sizeof fields <= sizeof map.bytes, "the emulated fields must fit the map");
  std::memcpy(map.bytes, &fields, sizeof fields);
#endif
  return map;
}

}  // namespace yolo::tma
