// Sorting 64-bit keys within segments on the device: CUB's DeviceSegmentedSort under nvcc, and
// a plain serial twin (std::sort per segment) in the emulated and CPU-only builds.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/common.cuh"

#if defined(__CUDACC__)
#include <cub/device/device_segmented_sort.cuh>
#else
#include <algorithm>
#endif

namespace yolo {

// Device temporary storage segmented_sort_keys needs for num_items keys in num_segments segments.
inline size_t segmented_sort_temp_bytes(int num_items, int num_segments) {
#if defined(__CUDACC__)
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  CHECKED(cub::DeviceSegmentedSort::SortKeys(nullptr, bytes, keys, num_items, num_segments,
                                             static_cast<const int*>(nullptr), static_cast<const int*>(nullptr)));
  return bytes;
#else
  (void)num_items, (void)num_segments;
  return 0;
#endif
}

// Sorts keys[begin[s], end[s]) ascending for every segment s (begin and end: device arrays of
// num_segments offsets, read on the device, so counts need not reach the host). `keys` and
// `alternate` (num_items each) form a double buffer; returns the one holding the sorted keys.
// Keys outside every segment are neither read nor written.
inline uint64_t* segmented_sort_keys(uint64_t* keys, uint64_t* alternate, int num_items, int num_segments,
                                     const int* begin, const int* end, void* temp, size_t temp_bytes,
                                     cudaStream_t stream) {
#if defined(__CUDACC__)
  cub::DoubleBuffer<uint64_t> buffers(keys, alternate);
  CHECKED(cub::DeviceSegmentedSort::SortKeys(temp, temp_bytes, buffers, num_items, num_segments, begin, end, stream));
  return buffers.Current();
#else
  // In the stream's order, like the kernels before it that wrote the segments.
  (void)alternate, (void)num_items, (void)temp, (void)temp_bytes;
  emu::run_on_stream(stream, "segmented_sort_keys", [=] {
    for (int s = 0; s < num_segments; ++s)
      if (end[s] > begin[s]) std::sort(keys + begin[s], keys + end[s]);
  });
  return keys;
#endif
}

}  // namespace yolo
