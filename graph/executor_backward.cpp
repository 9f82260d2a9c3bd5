// The executor's backward pass (see executor.h): every layer's gradient op on the compute
// stream, the parameter gradients into the flat buffer in backward order.
#include "graph/executor_impl.h"
#include "runtime/fault.h"
#include "runtime/nvtx.h"

namespace yolo::graph {

using namespace detail;

void Executor::backward(bool accumulate) {
  Impl& m = *impl_;
  const int n = micro_batch_;
  const OpContext c = m.context(*stream_);
  float* p = m.params;
  float* g = accumulate ? m.micro_grads : m.grads;  // parameter gradients are written (=) by the ops
  const int L = static_cast<int>(graph_.nodes.size());
  for (NodeBuffers& nb : m.nodes) nb.first_writer_pending = true;
  for (const Node& node : graph_.nodes)
    if (node.consumers.empty() && m.nodes[node.index].grad)
      fill_bytes(m.nodes[node.index].grad, 0, static_cast<size_t>(n) * node.out.elements() * m.elem, *stream_);
  // A loss writes its input's gradient at forward time.
  for (const Node& node : graph_.nodes)
    if (node.spec.type == LayerType::Yolo || node.spec.type == LayerType::Softmax)
      m.nodes[node.inputs[0]].first_writer_pending = false;
  // Whether this writer adds to the gradient of producer `q` (false for its first writer).
  auto accumulate_into = [&](int q) {
    bool add = !m.nodes[q].first_writer_pending;
    m.nodes[q].first_writer_pending = false;
    return add;
  };
  for (int i = L - 1; i >= 0; --i) {
    const Node& node = graph_.nodes[i];
    NodeBuffers& nb = m.nodes[i];
    const LayerSpec& l = node.spec;
    if (l.type == LayerType::Yolo || l.type == LayerType::Softmax) continue;
    if (before_backward_) before_backward_(i);
    if (tracing_) stream_->record(m.events[4 * i + 2]);
    if (kNvtxRanges) nvtx_push(std::to_string(i) + " " + layer_type_name(l.type) + " backward");
    const bool has_params = nb.param_end > nb.param_begin;
    // A planted fault (emulated build only): the data-parallel driver hears of this layer's
    // gradients before its kernels are queued.
    const bool early = has_params && gradients_ready_ && fault_injected(Fault::AllReduceBeforeLastKernel);
    if (early) gradients_ready_(nb.param_end);
    Act grad = grad_view(nb.grad, nb.out);
    int q0 = node.inputs[0];
    Act grad_in = q0 == kNetworkInput ? Act{} : grad_view(m.nodes[q0].grad, m.nodes[q0].out);
    switch (l.type) {
      case LayerType::Convolutional: {
        Conv2dShape shape{n, node.in.h, node.in.w, node.in.c, node.out.c, l.size, l.stride};
        const ConvInput source = m.conv_input(
            graph_, node,
            q0 == kNetworkInput ? ConstAct{m.current_images, n, node.in.h, node.in.w, node.in.c, node.in.c}
                                : as_const(m.nodes[q0].out),
            n);
        if (l.batch_normalize) {
          ConstAct pre{nb.pre, n, node.out.h, node.out.w, node.out.c, node.out.c};
          const float* saved_mean = m.saved + nb.saved;
          const float* saved_var = saved_mean + node.out.c;
          // GPUs recompute the activation's output from pre (its storage may already hold another
          // layer's: the memory plan); the CPU backend reads it.
          const ConstAct out = m.kernels ? ConstAct{} : as_const(nb.out);
          const BatchNormAffine<float> recompute =
              m.kernels ? BatchNormAffine<float>{p + nb.s, p + nb.b} : BatchNormAffine<float>{};
          if (m.bn_comm) {
            // This replica's gamma/beta gradients stay local (the gradient all-reduce adds them);
            // the copy in sums2 is all-reduced for grad_x.
            const double total = static_cast<double>(pre.pixels()) * m.bn_comm->size();
            float* sums2 = static_cast<float*>(m.bn_scratch.data()) + 2 * node.out.c;
            batchnorm_activation_backward_sums(c, l.activation, out, as_const(grad), pre, saved_mean, saved_var,
                                               g + nb.s, g + nb.b, sums2, recompute);
            sync_batchnorm_sums(sums2, 2 * node.out.c);
            batchnorm_activation_backward_apply(c, l.activation, out, as_const(grad), pre, p + nb.s, saved_mean,
                                                saved_var, sums2, total, grad, recompute);
          } else {
            batchnorm_activation_backward(c, l.activation, out, as_const(grad), pre, p + nb.s, saved_mean, saved_var,
                                          grad, g + nb.s, g + nb.b, recompute);
          }
        } else if (l.activation != Activation::Linear) {
          activation_backward(c, l.activation, as_const(nb.out), as_const(grad), grad);
        }
        conv2d_backward_weights(c, shape, source.in, as_const(grad), g + nb.w, l.batch_normalize ? nullptr : g + nb.b,
                                source.norm);
        if (q0 != kNetworkInput)
          conv2d_backward_data(c, shape, as_const(grad), m.weights_at(nb.w), grad_in, accumulate_into(q0));
        break;
      }
      case LayerType::Shortcut: {
        int q1 = node.inputs[1];
        Act grad_b = grad_view(m.nodes[q1].grad, m.nodes[q1].out);
        if (q0 == q1) {  // x + x: two contributions to one gradient
          shortcut_backward(c, as_const(grad), grad_in, Act{}, accumulate_into(q0), false);
          shortcut_backward(c, as_const(grad), grad_in, Act{}, true, false);
        } else {
          bool add_a = accumulate_into(q0), add_b = accumulate_into(q1);
          shortcut_backward(c, as_const(grad), grad_in, grad_b, add_a, add_b);
        }
        break;
      }
      case LayerType::Route: {
        int channel = 0;
        for (int q : node.inputs) {
          const Node& producer = graph_.nodes[q];
          ConstAct slice{m.advance(grad.data, channel), n, node.out.h, node.out.w, producer.out.c, node.out.c};
          Act target = grad_view(m.nodes[q].grad, m.nodes[q].out);
          route_backward(c, slice, std::span<const Act>(&target, 1), accumulate_into(q));
          channel += producer.out.c;
        }
        break;
      }
      case LayerType::Upsample:
        upsample_backward(c, as_const(grad), grad_in, l.stride, accumulate_into(q0));
        break;
      case LayerType::Maxpool:
        maxpool_backward(c, as_const(grad), nb.argmax, grad_in, l.size, l.stride, accumulate_into(q0));
        break;
      case LayerType::Connected: {
        int inputs = static_cast<int>(node.in.elements()), outputs = node.out.c;
        if (l.activation != Activation::Linear) activation_backward(c, l.activation, as_const(nb.out), as_const(grad), grad);
        const float* in = q0 == kNetworkInput ? m.current_images : m.nodes[q0].out.data;
        gemm(c, GemmShape{outputs, inputs, n, true, false}, grad.data, in, nullptr, g + nb.w, false);  // dW = grad^T in
        if (m.half)  // db = grad^T 1: the A^T B layout, which writes FP32 from 16-bit operands
          gemm(c, GemmShape{outputs, 1, n, true, false}, grad.data, m.ones16, nullptr, g + nb.b, false);
        else  // db = 1 grad
          gemm(c, GemmShape{1, outputs, n, false, false}, m.ones, grad.data, nullptr, g + nb.b, false);
        if (q0 != kNetworkInput)  // d in = grad W
          gemm(c, GemmShape{n, inputs, outputs, false, false}, grad.data, m.weights_at(nb.w), nullptr, grad_in.data,
               accumulate_into(q0));
        break;
      }
      default:
        break;
    }
    // This layer's parameter gradients are complete: add this micro-batch's to the earlier
    // ones, and tell the data-parallel driver the final prefix of the flat buffer.
    if (has_params) {
      if (accumulate) {
        size_t count = nb.param_end - nb.param_begin;
        Act sum = flat(m.grads + nb.param_begin, count);
        shortcut_forward(m.fp32_context(*stream_), as_const(sum), as_const(flat(m.micro_grads + nb.param_begin, count)),
                         sum);
      }
      if (gradients_ready_ && !early) gradients_ready_(nb.param_end);
    }
    if (kNvtxRanges) nvtx_pop();
    if (tracing_) stream_->record(m.events[4 * i + 3]);
  }
}

}  // namespace yolo::graph
