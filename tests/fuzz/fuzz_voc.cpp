// Fuzzes Pascal VOC annotations: the XML parser (parse_xml) on the input, then, when it is an
// <annotation>, the VOC reader (read_voc) over a scratch dataset whose only annotation it is.
#include <cstddef>
#include <cstdint>

#include "data/dataset.h"
#include "data/xml.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const yolo::fuzz::Scratch scratch("fuzz_voc");
  const std::string text = yolo::fuzz::as_text(data, size);
  try {
    if (yolo::data::parse_xml(text, "fuzz.xml").name != "annotation") return 0;
  } catch (const yolo::Error&) {
    return 0;
  }
  scratch.write("train/annotations/a.xml", text);
  std::filesystem::create_directories(scratch.path("train/images"));
  try {
    yolo::data::read_voc(scratch.dir().string(), {});
  } catch (const yolo::Error&) {
  }
  return 0;
}
