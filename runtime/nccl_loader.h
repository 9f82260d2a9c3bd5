// Our run-time loader for NCCL (dlopen), so that the binary starts on machines without it.
// NCCL's own types come from the installed <nccl.h> (the CUDA toolkit's, or the libnccl-dev
// package; NCCL_HOME= points elsewhere); without it, NCCL support is left out of the build.
// Calls go through the table returned by nccl().
// Search order: $YOLO_NCCL_LIB (a file or a folder), then the loader's default paths.
#pragma once
#include <string>

#include "runtime/check.h"

#if YOLO_CUDA && YOLO_NCCL_HEADER
#include <nccl.h>
#define YOLO_HAVE_NCCL 1
#else
#define YOLO_HAVE_NCCL 0
#endif

namespace yolo {

struct NcclStatusInfo {
  bool loaded = false;
  std::string path;     // the library that was loaded
  int version = 0;      // e.g. 22703 for 2.27.3
  std::string why_not;  // when not loaded: what was tried and what failed
};

// Tries to load NCCL once; later calls return the same answer.
const NcclStatusInfo& nccl_status();

#if YOLO_HAVE_NCCL
struct NcclApi {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommInitAll)(ncclComm_t*, int, const int*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  const char* (*GetErrorString)(ncclResult_t);
};

// The loaded API; throws yolo::Error (with nccl_status().why_not) when NCCL is unavailable.
const NcclApi& nccl();

inline void check_result(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclSuccess) {
    const char* text = nccl_status().loaded ? nccl().GetErrorString(status) : "NCCL not loaded";
    fail_call(call, file, line, std::string("NCCL error ") + std::to_string(int(status)) + ": " + text);
  }
}
#endif

}  // namespace yolo
