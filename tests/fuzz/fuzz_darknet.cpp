// Fuzzes darknet .data files (read_darknet): key = value lines naming the class count, the
// names file and the image lists. The scratch folder holds a names file, a list and a label
// file for the input to name. Inputs with '/' are skipped: the fuzzer must not make the reader
// open files elsewhere on the machine (/dev/zero as a names file is no parser bug).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "data/dataset.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

const yolo::fuzz::Scratch& scratch() {
  static const yolo::fuzz::Scratch dir("fuzz_darknet");
  static const bool written = [] {
    dir.write("names.txt", "cat\ndog\n");
    dir.write("train.txt", "images/a.jpg\n# a comment\nimages/b.png\n");
    dir.write("labels/a.txt", "0 0.5 0.5 0.25 0.25\n1 0.2 0.3 0.1 0.1\n");
    dir.write("labels/b.txt", "2 0.5 0.5 0.25 0.25\n");  // an unknown class: b is left out
    return true;
  }();
  (void)written;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (std::memchr(data, '/', size)) return 0;
  const std::string path = scratch().write("fuzz.data", yolo::fuzz::as_text(data, size));
  try {
    yolo::data::read_darknet(path, {});
  } catch (const yolo::Error&) {
  }
  return 0;
}
