// Max pooling's fast CPU version: one work item per output (forward) or input (backward) row,
// each pixel's channels in the micro-kernels' per-ISA loops (kernels/cpu_micro_pool.inc). The
// reference and the CUDA kernels are in maxpool.cu.
#include <algorithm>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"
#include "kernels/maxpool.h"
#include "kernels/maxpool_shared.h"

namespace yolo {

using namespace maxpool_detail;

void maxpool_forward_cpu(ConstAct in, Act out, int* argmax, int size, int stride) {
  check_shapes(in, out, size, stride, "maxpool_forward", "in", "out");
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::MaxpoolForward, static_cast<CpuIsa>(tiles.variant));
  parallel_for(size_t(out.n) * out.h, [&](size_t row) {
    int b = int(row / out.h), oy = int(row % out.h);
    Span rows = window_rows(oy, size, stride, in.h);
    std::vector<int> scratch(argmax ? 0 : size_t(out.c));
    std::vector<const float*> cells(size_t(size) * size);
    std::vector<int> cell_index(size_t(size) * size);
    for (int ox = 0; ox < out.w; ++ox) {
      Span cols = window_rows(ox, size, stride, in.w);
      int count = 0;
      for (int y = rows.first; y < rows.last; ++y)
        for (int x = cols.first; x < cols.last; ++x, ++count)
          cells[size_t(count)] = in.data + in.at(b, y, x, 0), cell_index[size_t(count)] = y * in.w + x;
      int* index = argmax ? argmax + ((size_t(b) * out.h + oy) * out.w + ox) * out.c : scratch.data();
      tiles.pool.window_max(cells.data(), cell_index.data(), count, out.c, out.data + out.at(b, oy, ox, 0), index);
    }
  });
}

void maxpool_backward_cpu(ConstAct grad_out, const int* argmax, Act grad_in, int size, int stride, bool accumulate) {
  check_shapes(grad_in, grad_out, size, stride, "maxpool_backward", "grad_in", "grad_out");
  if (!argmax && grad_out.elements() > 0) throw Error("maxpool_backward: argmax is a null pointer");
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::MaxpoolBackward, static_cast<CpuIsa>(tiles.variant));
  parallel_for(size_t(grad_in.n) * grad_in.h, [&](size_t row) {
    int b = int(row / grad_in.h), iy = int(row % grad_in.h);
    Span rows = covering_outputs(iy, size, stride, grad_out.h);
    // The outputs covering one pixel, at most (none for a pixel between windows).
    const size_t most = size_t(std::max(rows.last - rows.first, 0)) * size_t(size);
    std::vector<const float*> grads(most);
    std::vector<const int*> chosen(most);
    for (int ix = 0; ix < grad_in.w; ++ix) {
      Span cols = covering_outputs(ix, size, stride, grad_out.w);
      int count = 0;
      for (int oy = rows.first; oy < rows.last; ++oy)  // the kernel's order: outputs row-major
        for (int ox = cols.first; ox < cols.last; ++ox, ++count) {
          chosen[size_t(count)] = argmax + ((size_t(b) * grad_out.h + oy) * grad_out.w + ox) * grad_out.c;
          grads[size_t(count)] = grad_out.data + grad_out.at(b, oy, ox, 0);
        }
      tiles.pool.chosen_gradient(grads.data(), chosen.data(), count, iy * grad_in.w + ix, grad_in.c, accumulate,
                                 grad_in.data + grad_in.at(b, iy, ix, 0));
    }
  });
}

}  // namespace yolo
