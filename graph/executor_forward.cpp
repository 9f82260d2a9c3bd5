// The executor's forward pass (see executor.h): every layer's op on the compute stream, in
// training (batch statistics, the losses) or inference.
#include "graph/executor_impl.h"
#include "runtime/fault.h"
#include "runtime/nvtx.h"

namespace yolo::graph {

using namespace detail;

void Executor::forward(bool training) {
  Impl& m = *impl_;
  const float* images = m.in_images;
  const YoloTruth* truths = m.in_truths;
  const int* truth_counts = m.in_counts;
  const int* labels = m.in_labels;
  m.current_images = images;
  const int n = micro_batch_;
  const OpContext c = m.context(*stream_);
  if (m.half) {  // the images as 16-bit activations, for the first layer's forward and backward
    to_storage(c, images, m.input16, static_cast<size_t>(n) * graph_.input.elements());
    images = m.input16;
    m.current_images = images;
  }
  ConstAct image = ConstAct{images, n, graph_.input.h, graph_.input.w, graph_.input.c, graph_.input.c};
  auto output_of = [&](int p) { return p == kNetworkInput ? image : as_const(m.nodes[p].out); };
  auto input_of = [&](const Node& node, size_t k = 0) { return output_of(node.inputs[k]); };
  for (const Node& node : graph_.nodes) {
    NodeBuffers& nb = m.nodes[node.index];
    const LayerSpec& l = node.spec;
    if (tracing_) stream_->record(m.events[4 * node.index]);
    if (kNvtxRanges) nvtx_push(std::to_string(node.index) + " " + layer_type_name(l.type) + " forward");
    ConstAct in = input_of(node);
    float* p = m.params;
    switch (l.type) {
      case LayerType::Convolutional: {
        Conv2dShape shape{n, node.in.h, node.in.w, node.in.c, node.out.c, l.size, l.stride};
        const ConvInput source = m.conv_input(graph_, node, in, n);
        if (!l.batch_normalize) {
          conv2d_forward(c, shape, source.in, m.weights_at(nb.w), p + nb.b, nb.out, {}, source.norm);
          if (l.activation != Activation::Linear) activation_forward(c, l.activation, as_const(nb.out), nb.out);
          break;
        }
        Act pre{nb.pre, n, node.out.h, node.out.w, node.out.c, node.out.c};
        // A folded shortcut: the apply adds its other input and writes its output (nb.out is it).
        const int shortcut = m.plan.folded_into[node.index];
        const ConstAct residual =
            shortcut < 0 ? ConstAct{} : output_of(folded_residual(graph_, node.index, shortcut));
        // GPUs, training: the conv's epilogue also writes BatchNorm's statistics (per block of
        // pixels), so that the BatchNorm reads its input once (with --sync-bn: its sums too).
        const bool moments = training && m.moment_partials;
        conv2d_forward(c, shape, source.in, m.weights_at(nb.w), nullptr, pre,
                       moments ? ConvMoments{m.moment_partials, m.moment_counts} : ConvMoments{}, source.norm);
        // Applied where its readers load it: the statistics alone here, then the apply's table.
        const bool applied_in_loads = m.plan.applied_in_loads[node.index];
        const Act y = applied_in_loads ? Act{} : nb.out;
        float* table = applied_in_loads ? m.load_tables + nb.table : nullptr;
        if (!training && applied_in_loads) {
          batchnorm_input_table(c, node.out.c, m.stats + nb.mean, m.stats + nb.var, p + nb.s, p + nb.b, table);
          break;
        }
        if (!training) {
          batchnorm_activation_forward_inference(c, l.activation, as_const(pre), p + nb.s, p + nb.b, m.stats + nb.mean,
                                                 m.stats + nb.var, nb.out, residual);
          break;
        }
        float* saved_mean = m.saved + nb.saved;
        float* saved_var = saved_mean + node.out.c;
        float* running_mean = m.stats + nb.mean;
        float* running_var = m.stats + nb.var;
        if (m.bn_comm) {
          // Statistics over every replica: sums, then squares about the global mean.
          const double total = static_cast<double>(pre.pixels()) * m.bn_comm->size();
          float* sums = static_cast<float*>(m.bn_scratch.data());
          float* squares = sums + node.out.c;
          const int blocks = moments ? conv2d_forward_moment_blocks(m.precision, shape) : 0;
          if (moments)
            batchnorm_sums_from_moments(c, node.out.c, m.moment_partials, m.moment_counts, blocks, sums);
          else
            batchnorm_sums(c, as_const(pre), sums);
          sync_batchnorm_sums(sums, node.out.c);
          if (moments)
            batchnorm_centered_squares_from_moments(c, node.out.c, m.moment_partials, m.moment_counts, blocks, sums,
                                                    total, squares);
          else
            batchnorm_centered_squares(c, as_const(pre), sums, total, squares);
          sync_batchnorm_sums(squares, node.out.c);
          batchnorm_activation_forward_from_sums(c, l.activation, as_const(pre), p + nb.s, p + nb.b, y, sums, squares,
                                                 total, saved_mean, saved_var, running_mean, running_var, residual);
        } else if (moments) {
          batchnorm_activation_forward_from_moments(
              c, l.activation, as_const(pre), p + nb.s, p + nb.b, y, m.moment_partials, m.moment_counts,
              conv2d_forward_moment_blocks(m.precision, shape), saved_mean, saved_var, running_mean, running_var,
              residual);
        } else {
          batchnorm_activation_forward_training(c, l.activation, as_const(pre), p + nb.s, p + nb.b, y, saved_mean,
                                                saved_var, running_mean, running_var, residual);
        }
        if (applied_in_loads) batchnorm_input_table(c, node.out.c, saved_mean, saved_var, p + nb.s, p + nb.b, table);
        break;
      }
      case LayerType::Shortcut:
        if (!m.shortcut_folded[node.index]) shortcut_forward(c, in, input_of(node, 1), nb.out);
        break;
      case LayerType::Route: {
        if (node.inputs.size() == 1) break;  // the input itself
        ConstAct inputs[kRouteMaxInputs];
        for (size_t k = 0; k < node.inputs.size(); ++k) inputs[k] = input_of(node, k);
        route_forward(c, std::span<const ConstAct>(inputs, node.inputs.size()), nb.out);
        break;
      }
      case LayerType::Upsample:
        upsample_forward(c, in, nb.out, l.stride);
        break;
      case LayerType::Maxpool:
        maxpool_forward(c, in, nb.out, nb.argmax, l.size, l.stride);
        break;
      case LayerType::Yolo: {
        if (!training) break;
        NodeBuffers& producer = m.nodes[node.inputs[0]];
        YoloLossConfig config = node.yolo;
        config.grad_scale = m.loss_scale;
        config.grad_scale_at = m.loss_scale_at;  // GPUs: read when the kernel runs (a replayed graph)
        yolo_loss(c, in, config, truths, truth_counts, kYoloMaxTruths, grad_view(producer.grad, producer.out),
                  m.queued().yolo_stats + node.index);
        break;
      }
      case LayerType::Connected: {
        int inputs = static_cast<int>(node.in.elements()), outputs = node.out.c;
        gemm(c, GemmShape{n, outputs, inputs, false, true}, in.data, m.weights_at(nb.w), p + nb.b, nb.out.data,
             false);  // in W^T + b
        if (l.activation != Activation::Linear) activation_forward(c, l.activation, as_const(nb.out), nb.out);
        break;
      }
      case LayerType::Softmax: {
        NodeBuffers& producer = m.nodes[node.inputs[0]];
        if (training)
          softmax_cross_entropy(c, in.data, labels, n, node.out.c, m.queued().softmax_loss, producer.grad,
                                nb.out.data, m.queued().bad_label, m.loss_scale, m.loss_scale_at);
        else  // the op wants labels even when it computes no loss
          softmax_cross_entropy(c, in.data, m.zero_labels, n, node.out.c, nullptr, nullptr, nb.out.data,
                                m.queued().bad_label);
        break;
      }
    }
    if (kNvtxRanges) nvtx_pop();
    if (tracing_) stream_->record(m.events[4 * node.index + 1]);
  }
}

}  // namespace yolo::graph
