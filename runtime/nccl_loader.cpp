// Run-time loading of NCCL (see nccl_loader.h).
#include "runtime/nccl_loader.h"

#include "runtime/dynamic_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace yolo {

#if YOLO_HAVE_NCCL
namespace {

NcclApi g_api{};

void* open_library(std::string* path, std::string* why) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("YOLO_NCCL_LIB"); env && *env) {
    std::filesystem::path p(env);
    candidates.push_back(std::filesystem::is_directory(p) ? (p / "libnccl.so.2").string() : p.string());
  }
  candidates.push_back("libnccl.so.2");
  candidates.push_back("libnccl.so");
  for (const std::string& name : candidates)
    if (void* handle = try_dlopen(name, path, why)) return handle;
  *why += " (set YOLO_NCCL_LIB to the library or its folder)";
  return nullptr;
}

template <typename Fn>
bool bind(void* handle, const char* symbol, Fn* slot, std::string* why) {
  return bind_symbol(handle, symbol, slot, "NCCL", why);
}

NcclStatusInfo load() {
  NcclStatusInfo info;
  void* handle = open_library(&info.path, &info.why_not);
  if (!handle) return info;
  info.why_not.clear();
  bool ok = bind(handle, "ncclGetVersion", &g_api.GetVersion, &info.why_not) &&
            bind(handle, "ncclGetUniqueId", &g_api.GetUniqueId, &info.why_not) &&
            bind(handle, "ncclCommInitRank", &g_api.CommInitRank, &info.why_not) &&
            bind(handle, "ncclCommInitAll", &g_api.CommInitAll, &info.why_not) &&
            bind(handle, "ncclCommInitRankConfig", &g_api.CommInitRankConfig, &info.why_not) &&
            bind(handle, "ncclCommFinalize", &g_api.CommFinalize, &info.why_not) &&
            bind(handle, "ncclCommDestroy", &g_api.CommDestroy, &info.why_not) &&
            bind(handle, "ncclCommAbort", &g_api.CommAbort, &info.why_not) &&
            bind(handle, "ncclCommGetAsyncError", &g_api.CommGetAsyncError, &info.why_not) &&
            bind(handle, "ncclAllReduce", &g_api.AllReduce, &info.why_not) &&
            bind(handle, "ncclBroadcast", &g_api.Broadcast, &info.why_not) &&
            bind(handle, "ncclAllGather", &g_api.AllGather, &info.why_not) &&
            bind(handle, "ncclGroupStart", &g_api.GroupStart, &info.why_not) &&
            bind(handle, "ncclGroupEnd", &g_api.GroupEnd, &info.why_not) &&
            bind(handle, "ncclGetErrorString", &g_api.GetErrorString, &info.why_not);
  if (!ok || g_api.GetVersion(&info.version) != ncclSuccess) {
    if (info.why_not.empty()) info.why_not = "ncclGetVersion failed";
    info.why_not = info.path + ": " + info.why_not;
    return info;
  }
  info.loaded = true;
  return info;
}

}  // namespace

const NcclStatusInfo& nccl_status() {
  static const NcclStatusInfo info = load();
  return info;
}

const NcclApi& nccl() {
  if (!nccl_status().loaded) throw Error("NCCL is not available: " + nccl_status().why_not);
  return g_api;
}

#else

const NcclStatusInfo& nccl_status() {
  static const NcclStatusInfo info{false, "", 0,
                                   YOLO_CUDA ? "this build found no nccl.h (set NCCL_HOME= and rebuild)"
                                             : "this build has no CUDA backend"};
  return info;
}

#endif

}  // namespace yolo
