// Fuzzes YOLO text labels (parse_yolo_labels) and names files (read_names_file) with the same
// bytes. The first byte picks the class count (1..256) so that class-id checks are reached.
#include <cstddef>
#include <cstdint>

#include "data/dataset.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const yolo::fuzz::MemoryFile file("fuzz.names");
  if (size == 0) return 0;
  const int classes = data[0] + 1;
  const std::string text = yolo::fuzz::as_text(data + 1, size - 1);
  try {
    yolo::data::Sample sample;
    yolo::data::LabelCounts counts;
    yolo::data::parse_yolo_labels(text, "fuzz.txt", classes, sample, counts);
    if (sample.boxes.size() > yolo::data::kMaxBoxes) __builtin_trap();  // the documented limit
  } catch (const yolo::Error&) {
  }
  try {
    yolo::data::read_names_file(file.write(text));
  } catch (const yolo::Error&) {
  }
  return 0;
}
