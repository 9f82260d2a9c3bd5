// The op library, as the graph sees it: one include per op family. Each family header declares,
// for every op, the naive reference (`*_reference`, templated on float/double: the test
// oracle), the fast CPU version (`*_cpu`: what the CPU backend runs) and the CUDA launcher
// (`*_cuda`, taking a cudaStream_t; emulated in builds without CUDA). See kernels/README.md.
#pragma once

#include "kernels/tensor.h"
