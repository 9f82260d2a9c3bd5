// The fixed layer set the .weights harness loads into (and make_seeds writes for): a conv layer,
// a conv layer with batch_normalize, a layer without parameters, a connected layer.
#pragma once
#include <vector>

#include "graph/weights.h"

namespace yolo::fuzz {

class FuzzLayers {
 public:
  FuzzLayers() {
    add(0, graph::LayerType::Convolutional, 4, 3, 3, 1, 1, false);
    add(1, graph::LayerType::Convolutional, 8, 4, 1, 1, 1, true);
    add(3, graph::LayerType::Connected, 5, 8, 1, 2, 2, false);  // after a maxpool (layer 2)
  }
  FuzzLayers(const FuzzLayers&) = delete;
  FuzzLayers& operator=(const FuzzLayers&) = delete;

  const std::vector<graph::LayerParams>& params() const { return params_; }

 private:
  // Buffers are sized first and pointed to once they no longer move.
  void add(int layer, graph::LayerType type, int c_out, int c_in, int k, int in_h, int in_w, bool bn) {
    graph::LayerParams p;
    p.layer = layer;
    p.type = type;
    p.c_out = c_out, p.c_in = c_in, p.k = k, p.in_h = in_h, p.in_w = in_w;
    p.batch_normalize = bn;
    Storage& s = storage_[params_.size()];
    s.weights.assign(p.weight_count(), 0.5f);
    for (std::vector<float>* v : {&s.biases, &s.scales, &s.mean, &s.variance}) v->assign(size_t(c_out), 1.0f);
    p.weights = s.weights.data();
    p.biases = s.biases.data();
    if (bn) p.scales = s.scales.data(), p.rolling_mean = s.mean.data(), p.rolling_variance = s.variance.data();
    params_.push_back(p);
  }

  struct Storage {
    std::vector<float> weights, biases, scales, mean, variance;
  };
  Storage storage_[3];
  std::vector<graph::LayerParams> params_;
};

}  // namespace yolo::fuzz
