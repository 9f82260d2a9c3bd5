// Run-time loading of cuBLAS for the benchmark (see cublas_loader.h).
#include "tools/cublas_loader.h"

#include "runtime/dynamic_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace yolo::bench {

#if YOLO_HAVE_CUBLAS
namespace {

CublasApi g_api{};

// The library names tried, newest first (cuBLAS 13 ships with CUDA 13, 12 with CUDA 12).
const char* const kNames[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};


void* open_library(std::string* path, std::string* why) {
  if (const char* env = std::getenv("YOLO_CUBLAS_LIB"); env && *env) {
    const std::filesystem::path p(env);
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      bool any = false;
      for (const char* name : kNames) {
        const std::filesystem::path file = p / name;
        if (!std::filesystem::exists(file, ec)) continue;
        any = true;
        // cuBLAS needs cuBLASLt of the same version; a Python package's folder is not on the
        // loader's path, so load the one beside it first (a later DT_NEEDED matches its soname).
        const std::string suffix = std::string(name).substr(std::strlen("libcublas"));  // ".so.13"
        const std::string lt = (p / ("libcublasLt" + suffix)).string();
        if (std::filesystem::exists(lt, ec)) dlopen(lt.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (void* handle = try_dlopen(file.string(), path, why)) return handle;
      }
      if (!any) *why += std::string(why->empty() ? "" : "; ") + p.string() + " holds no libcublas.so.13, .so.12 or .so";
    } else if (void* handle = try_dlopen(p.string(), path, why)) {
      return handle;
    }
  }
  for (const char* name : kNames)
    if (void* handle = try_dlopen(name, path, why)) return handle;
  *why += " (set YOLO_CUBLAS_LIB to the library or its folder, e.g. Python's nvidia/cublas/lib)";
  return nullptr;
}

template <typename Fn>
bool bind(void* handle, const char* symbol, Fn* slot, std::string* why) {
  return bind_symbol(handle, symbol, slot, "cuBLAS", why);
}

CublasStatusInfo load() {
  CublasStatusInfo info;
  void* handle = open_library(&info.path, &info.why_not);
  if (!handle) return info;
  info.why_not.clear();
  bool ok = bind(handle, "cublasCreate_v2", &g_api.Create, &info.why_not) &&
            bind(handle, "cublasDestroy_v2", &g_api.Destroy, &info.why_not) &&
            bind(handle, "cublasSetStream_v2", &g_api.SetStream, &info.why_not) &&
            bind(handle, "cublasSetMathMode", &g_api.SetMathMode, &info.why_not) &&
            bind(handle, "cublasGemmEx", &g_api.GemmEx, &info.why_not) &&
            bind(handle, "cublasGetProperty", &g_api.GetProperty, &info.why_not);
  if (ok) g_api.GetStatusString = reinterpret_cast<const char* (*)(cublasStatus_t)>(dlsym(handle, "cublasGetStatusString"));
  int major = 0, minor = 0, patch = 0;
  if (ok && (g_api.GetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
             g_api.GetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
             g_api.GetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)) {
    ok = false;
    info.why_not = "cublasGetProperty failed";
  }
  if (!ok) {
    info.why_not = info.path + ": " + info.why_not;
    return info;
  }
  info.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  info.loaded = true;
  return info;
}

}  // namespace

const CublasStatusInfo& cublas_status() {
  static const CublasStatusInfo info = load();
  return info;
}

const CublasApi& cublas() {
  if (!cublas_status().loaded) throw Error("cuBLAS is not available: " + cublas_status().why_not);
  return g_api;
}

#else

const CublasStatusInfo& cublas_status() {
  static const CublasStatusInfo info{false, "", "",
                                     YOLO_CUDA ? "this build found no cublas_v2.h (the CUDA toolkit's)"
                                               : "this build has no CUDA backend"};
  return info;
}

#endif

}  // namespace yolo::bench
