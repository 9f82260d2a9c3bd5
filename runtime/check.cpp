// Error formatting for the checked-call macros of check.h.
#include "runtime/check.h"

namespace yolo {

void fail_call(const char* call, const char* file, int line, const std::string& why) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + why);
}

void fail_at(const char* file, int line, const std::string& message) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": " + message);
}

}  // namespace yolo
