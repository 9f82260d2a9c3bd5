// Counts in messages: "1 detection", "3 detections" (`many` when the plural is not one + "s").
#pragma once
#include <cstdint>
#include <string>

namespace yolo {

inline std::string counted(int64_t n, const std::string& one, const std::string& many = "") {
  return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
}

}  // namespace yolo
