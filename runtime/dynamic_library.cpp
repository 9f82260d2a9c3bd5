// See dynamic_library.h.
#include "runtime/dynamic_library.h"

namespace yolo {

void* try_dlopen(const std::string& name, std::string* path, std::string* why) {
  if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    *path = name;
    return handle;
  }
  const char* err = dlerror();
  *why += (why->empty() ? "" : "; ") + std::string(err ? err : name + ": dlopen failed");
  return nullptr;
}

}  // namespace yolo
