// encode_2d (kernels/tma.h): the rules, then the driver's encoder or the emulation's fields.
#include "kernels/tma.h"

#include <atomic>
#include <cstring>
#include <string>

#include "kernels/common.cuh"
#include "kernels/tma.cuh"
#include "runtime/fault.h"
#if defined(__CUDACC__)
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

namespace yolo::tma {

namespace {
std::atomic<unsigned long long> g_im2col_loads{0};
thread_local bool g_driver_base_rule = false;  // DriverBaseRule's
}
#if !defined(__CUDACC__)
void emulated::count_im2col_load() { ++g_im2col_loads; }
#endif
unsigned long long emulated_im2col_loads() { return g_im2col_loads.load(); }

bool swizzled_base_fits(const void* base) {
  return reinterpret_cast<uintptr_t>(base) % (g_driver_base_rule ? 16 : 128) == 0;
}
DriverBaseRule::DriverBaseRule() : previous_(g_driver_base_rule) { g_driver_base_rule = true; }
DriverBaseRule::~DriverBaseRule() { g_driver_base_rule = previous_; }

namespace {

constexpr const char* kSwizzledBaseRule =
    "a swizzled map's global address must be 128-byte aligned (the CUDA Programming Guide's TMA swizzle rule)";

void check_rules(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride_bytes, uint32_t box_cols,
                 uint32_t box_rows, int swizzle) {
  auto refuse = [](const std::string& why) { throw Error("tensor map: " + why); };
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) refuse("the global address must be 16-byte aligned");
  if (swizzle != 0 && !swizzled_base_fits(base)) refuse(kSwizzledBaseRule);
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

void check_im2col_rules(const Im2colNhwc& t) {
  auto refuse = [](const std::string& why) { throw Error("im2col tensor map: " + why); };
  auto text = [](auto v) { return std::to_string(v); };
  if (reinterpret_cast<uintptr_t>(t.base) % 16 != 0) refuse("the global address must be 16-byte aligned");
  if (t.swizzle != 0 && !swizzled_base_fits(t.base)) refuse(kSwizzledBaseRule);
  if (t.element_bytes != 2 && t.element_bytes != 4)
    refuse("elements of " + text(t.element_bytes) + " bytes (2 or 4 are supported)");
  for (uint64_t d : {t.n, t.h, t.w, t.c})
    if (d == 0 || d > (uint64_t(1) << 32))
      refuse("each dimension must hold 1..2^32 elements (n " + text(t.n) + ", h " + text(t.h) + ", w " + text(t.w) +
             ", c " + text(t.c) + ")");
  const uint64_t image_bytes = t.pixel_stride_bytes * t.w * t.h;
  if (t.pixel_stride_bytes % 16 != 0 || t.pixel_stride_bytes < t.c * t.element_bytes || image_bytes >= (uint64_t(1) << 40))
    refuse("the pixel stride (" + text(t.pixel_stride_bytes) +
           " bytes) must be a multiple of 16 that holds a pixel, and an image below 2^40 bytes");
  for (int corner : {t.lower_h, t.lower_w, t.upper_h, t.upper_w})
    if (corner < -128 || corner > 127)
      refuse("the bounding box's corners must lie in -128..127 (lower " + text(t.lower_h) + ", " + text(t.lower_w) +
             "; upper " + text(t.upper_h) + ", " + text(t.upper_w) + ")");
  if (int64_t(t.h) + t.upper_h <= t.lower_h || int64_t(t.w) + t.upper_w <= t.lower_w)
    refuse("the bounding box holds no pixel");
  const uint64_t row_bytes = uint64_t(t.channels_per_pixel) * t.element_bytes;
  if (t.channels_per_pixel == 0 || t.channels_per_pixel > 256 || row_bytes % 16 != 0)
    refuse("a pixel's channels (" + text(t.channels_per_pixel) + ") must be 1..256 and fill a multiple of 16 bytes");
  if (t.pixels_per_column == 0 || t.pixels_per_column > 1024)
    refuse("a load moves 1..1024 pixels (" + text(t.pixels_per_column) + ")");
  if (t.stride == 0 || t.stride > 8) refuse("the traversal stride (" + text(t.stride) + ") must be 1..8");
  if (t.swizzle < 0 || t.swizzle > 3) refuse("swizzle code " + text(t.swizzle) + " is not 0..3");
  const uint32_t width = wgmma::swizzle_bytes(wgmma::Swizzle(t.swizzle));
  if (t.swizzle != 0 && row_bytes > width)
    refuse("a pixel's " + text(row_bytes) + " bytes are wider than its " + text(width) + "-byte swizzle");
}

#if defined(__CUDACC__)
// The driver's entry point `name` of the CUDA 12.0 ABI.
void* driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECKED(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || !fn)
    throw Error(std::string("tensor map: the driver has no ") + name + " (a driver for CUDA 12 or newer is needed)");
  return fn;
}

constexpr CUtensorMapSwizzle kSwizzles[4] = {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                             CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_32B};
#endif

}  // namespace

TensorMap encode_2d(const void* base, uint64_t cols, uint64_t rows, uint64_t row_stride_bytes, uint32_t box_cols,
                    uint32_t box_rows, int swizzle) {
  check_rules(base, cols, rows, row_stride_bytes, box_cols, box_rows, swizzle);
  TensorMap map{};
#if defined(__CUDACC__)
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap), "TensorMap must hold a CUtensorMap");
  static const auto encode =
      reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(driver_entry_point("cuTensorMapEncodeTiled"));
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows}, element_strides[2] = {1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&map), CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                            const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            kSwizzles[swizzle], CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
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

TensorMap encode_im2col(const Im2colNhwc& t) {
  check_im2col_rules(t);
  TensorMap map{};
#if defined(__CUDACC__)
  static const auto encode =
      reinterpret_cast<PFN_cuTensorMapEncodeIm2col_v12000>(driver_entry_point("cuTensorMapEncodeIm2col"));
  // Innermost first: C, W, H, N; the corners W before H, as the dimensions are ordered. The
  // elements' bits are moved as they are (UINT16, UINT32: no conversion, zeros outside).
  const cuuint64_t dims[4] = {t.c, t.w, t.h, t.n};
  const cuuint64_t strides[3] = {t.pixel_stride_bytes, t.pixel_stride_bytes * t.w, t.pixel_stride_bytes * t.w * t.h};
  const int lower[2] = {t.lower_w, t.lower_h}, upper[2] = {t.upper_w, t.upper_h};
  const cuuint32_t element_strides[4] = {1, t.stride, t.stride, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&map),
                            t.element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT32, 4,
                            const_cast<void*>(t.base), dims, strides, lower, upper, t.channels_per_pixel,
                            t.pixels_per_column, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, kSwizzles[t.swizzle],
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("im2col tensor map: cuTensorMapEncodeIm2col failed with CUresult " + std::to_string(int(r)));
#else
  if (fault_injected(Fault::TmaEncoderRefuses))  // planted: what only a driver would refuse
    throw Error("im2col tensor map: cuTensorMapEncodeIm2col failed with CUresult 1 (planted)");
  emulated::Im2colMap fields{};
  fields.magic = emulated::kIm2colMagic;
  fields.tensor = t;
  static_assert(sizeof fields <= sizeof map.bytes, "the emulated fields must fit the map");
  std::memcpy(map.bytes, &fields, sizeof fields);
#endif
  return map;
}

}  // namespace yolo::tma
