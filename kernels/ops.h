// The op library, as the graph sees it: one include per op family. Each family header declares,
// for every op, the naive reference (`*_reference`, templated on float/double: the test
// oracle), the fast CPU version (`*_cpu`: what the CPU backend runs) and the CUDA launcher
// (`*_cuda`, taking a cudaStream_t; emulated in builds without CUDA). See kernels/README.md.
#pragma once

#include "kernels/tensor.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/detect.h"
#include "kernels/gemm.h"
#include "kernels/maxpool.h"
#include "kernels/route.h"
#include "kernels/sgd.h"
#include "kernels/shortcut.h"
#include "kernels/softmax.h"
#include "kernels/upsample.h"
#include "kernels/yolo_loss.h"
