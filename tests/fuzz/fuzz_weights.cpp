// Fuzzes darknet .weights files (read_darknet_weights) for a fixed layer set, loading all of it
// (the file must match exactly) and only the first two layers (a backbone: trailing data allowed).
#include <cstddef>
#include <cstdint>

#include "graph/weights.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_layers.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const yolo::fuzz::MemoryFile file("fuzz.weights");
  static const yolo::fuzz::FuzzLayers layers;
  const std::string path = file.write({reinterpret_cast<const char*>(data), size});
  for (int load_layers : {-1, 2}) {
    try {
      yolo::graph::read_darknet_weights(path, layers.params(), load_layers);
    } catch (const yolo::Error&) {
    }
  }
  return 0;
}
