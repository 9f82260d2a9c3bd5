// wgmma_self_check and tma_im2col_self_check (kernels/wgmma_check.h): on a device that runs the wgmma kernels as the PTX ISA
// says (a GPU natively; the emulated H200's twins) every pass agrees with the FP64 reference; and,
// under emulation, with the tensor cores planted to get a fact wrong (each wgmma op leaves out
// its slice's last k), the check names the first pass that disagrees.
#include <doctest/doctest.h>

#include <string>

#include "kernels/hopper.h"
#include "kernels/wgmma_check.h"
#include "runtime/fault.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"

using namespace yolo;

TEST_CASE("kernel: the wgmma and im2col self-checks pass where wgmma follows the ISA, and name a wrong pass") {
  KERNEL_TEST_DEVICE(device);  // the check runs on the current device: the harness's
  (void)device;
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  CHECK(wgmma_self_check() == "");
  CHECK(tma_im2col_self_check() == "");
#if YOLO_EMU
  inject_fault(Fault::WgmmaDropsLastK, true);
  std::string why, im2col_why;
  try {
    why = wgmma_self_check();
    im2col_why = tma_im2col_self_check();
  } catch (...) {
    inject_fault(Fault::WgmmaDropsLastK, false);
    throw;
  }
  inject_fault(Fault::WgmmaDropsLastK, false);
  INFO(why);
  INFO(im2col_why);
  CHECK(why.rfind("bf16 3x3 s1 forward: element ", 0) == 0);
  CHECK(im2col_why.rfind("im2col bf16 3x3 s1 forward: element ", 0) == 0);
  CHECK(wgmma_self_check() == "");  // the fault gone, the check passes again
  CHECK(tma_im2col_self_check() == "");
#endif
}
