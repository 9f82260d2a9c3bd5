// The two steps every run-time-loaded library (NCCL in runtime/nccl_loader.cpp, cuBLAS in the
// benchmark's tools/cublas_loader.cpp) goes through: dlopen a candidate, collecting why each
// candidate failed, and bind each symbol into a typed function pointer.
#pragma once
#include <dlfcn.h>

#include <string>

namespace yolo {

// dlopen(name) with RTLD_NOW | RTLD_LOCAL: the handle, and `name` in *path; or null with the
// loader's message appended to *why ("; "-separated).
void* try_dlopen(const std::string& name, std::string* path, std::string* why);

// *slot = the symbol's address; false with *why = "symbol S missing from the <library> library".
template <typename Fn>
bool bind_symbol(void* handle, const char* symbol, Fn* slot, const char* library, std::string* why) {
  *slot = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (!*slot) *why = std::string("symbol ") + symbol + " missing from the " + library + " library";
  return *slot != nullptr;
}

}  // namespace yolo
