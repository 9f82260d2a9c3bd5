// Fuzzes COCO annotations: the JSON parser (parse_json, with the reader's skipped keys) on the
// input, then, when it is an object, the COCO reader (read_coco) on it as a file.
#include <cstddef>
#include <cstdint>

#include "data/dataset.h"
#include "data/json.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const yolo::fuzz::Scratch scratch("fuzz_coco");
  const std::string text = yolo::fuzz::as_text(data, size);
  yolo::data::JsonOptions options;
  options.skip_keys = {"segmentation"};
  try {
    if (yolo::data::parse_json(text, "fuzz.json", options).kind != yolo::data::JsonKind::Object) return 0;
  } catch (const yolo::Error&) {
    return 0;
  }
  const std::string path = scratch.write("annotations/instances_train.json", text);
  std::filesystem::create_directories(scratch.path("images"));  // where read_coco looks for the images
  try {
    yolo::data::read_coco(path, {});
  } catch (const yolo::Error&) {
  }
  return 0;
}
