// Fuzzes our .ckpt checkpoints (read_checkpoint): every length and count is checked against the
// bytes left before the checksum, which is compared last, so mutated files reach every check.
#include <cstddef>
#include <cstdint>

#include "graph/weights.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const yolo::fuzz::MemoryFile file("fuzz.ckpt");
  const std::string path = file.write({reinterpret_cast<const char*>(data), size});
  try {
    yolo::graph::read_checkpoint(path);
  } catch (const yolo::Error&) {
  }
  return 0;
}
