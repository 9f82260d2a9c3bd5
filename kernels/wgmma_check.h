// Hopper's wgmma convolutions checked on the device itself before the planner trusts them. They
// were built against emulated twins that follow the PTX ISA as this project reads it; a fact the
// twins get wrong would otherwise train a network on wrong numbers without a word. Small shapes
// of every pass the planner may send to wgmma (bf16: forward, backward data at stride 1 and 2,
// weight gradient; tf32: forward, backward data) run against an FP64 reference of the operands as
// the tensor cores read them, within their precision's bound; one block walks all of a shape's
// tiles (persistent blocks), one shape having several.
#pragma once
#include <string>

namespace yolo {

// Runs the check on the current device now (it must run sm_90a code: current_device_runs_wgmma).
// Empty when every pass agrees; otherwise names the first that did not and by how much. CUDA:
// throws yolo::Error when the kernels have not finished within 20 s (a hang, which the process
// cannot recover from: YOLO_WGMMA=off avoids them).
std::string wgmma_self_check();

// Whether the planner may use wgmma on the current device. CUDA: the check runs at the first
// question per device (with the sm_90a probe: before any graph capture), its verdict cached; a
// failure prints one warning naming it, and every convolution there stays on mma.sync. Emulated
// devices answer true: their twins are the reading of the ISA the check would compare against,
// so it runs there only where a test asks for it (with a planted fault).
bool current_device_wgmma_verified();

// TMA's im2col mode (kernels/conv_wgmma.h: the forward's and backward data's A, the weight
// gradient's B), checked after the passes above (and only where they passed): 3x3 at strides 1
// and 2 over two images of unequal height and width, the forward in bf16 (also through a
// BatchNorm table, which the producers apply to what TMA landed) and tf32, backward data in bf16
// and tf32 (stride 2: its parity classes' maps), the weight gradient in bf16. The same
// cache and warning; a failure leaves both passes on their gathers.
// Emulated devices: true.
std::string tma_im2col_self_check();
bool current_device_tma_im2col_verified();

}  // namespace yolo
