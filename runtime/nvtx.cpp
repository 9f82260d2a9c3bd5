// NVTX ranges (see nvtx.h): NVTX3 is header-only, in the CUDA toolkit.
#include "runtime/nvtx.h"

#if YOLO_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace yolo {

#if YOLO_CUDA
void nvtx_push(const std::string& name) { nvtxRangePushA(name.c_str()); }
void nvtx_pop() { nvtxRangePop(); }
#else
void nvtx_push(const std::string&) {}
void nvtx_pop() {}
#endif

}  // namespace yolo
