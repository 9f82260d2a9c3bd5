// Fuzzes darknet .cfg files: the syntax (parse_cfg_text) and the typed model (parse_model).
#include <cstddef>
#include <cstdint>

#include "graph/cfg.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    yolo::graph::CfgFile cfg = yolo::graph::parse_cfg_text(yolo::fuzz::as_text(data, size), "fuzz.cfg");
    yolo::graph::parse_model(cfg);
  } catch (const yolo::Error&) {
    // A rejected file: the expected outcome for most inputs.
  }
  return 0;
}
