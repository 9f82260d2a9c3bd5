// darknet's .cfg format, read into a typed model description. Syntax: [section] headers,
// key=value lines, '#' and ';' comments, blank lines; values may be lists ("1,2,3"). Every
// error names file:line. Options we accept but do not use are collected as warnings (one per
// option name and section type), so nothing the user wrote is silently ignored.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/precision.h"

namespace yolo::graph {

// ---- raw syntax ---------------------------------------------------------------------------
struct CfgOption {
  std::string key, value;
  int line = 0;
};
struct CfgSection {
  std::string type;  // without brackets, lower case: "net", "convolutional", ...
  int line = 0;
  std::vector<CfgOption> options;
};
struct CfgFile {
  std::string path;
  std::vector<CfgSection> sections;
  std::vector<std::string> warnings;  // "file:line: option 'x' repeated in [y] ..."
};
// Reads the syntax only. Throws yolo::Error "file:line: ..." for a line that is neither a
// section header, an option nor a comment, an option before the first section, binary data, or
// a file over 16 MiB. An option repeated within a section keeps its first value, as darknet's
// option lookup does (it returns the first match), with a warning naming both lines.
CfgFile read_cfg_file(const std::string& path);
CfgFile parse_cfg_text(const std::string& text, const std::string& path);

// ---- typed description --------------------------------------------------------------------
struct NetParams {
  int batch = 1, subdivisions = 1;
  int width = 416, height = 416, channels = 3;
  float momentum = 0.9f, decay = 0.0005f, learning_rate = 0.001f;
  int burn_in = 0, max_batches = 0;
  // darknet's learning-rate policies (graph/learning_rate.h has the formulas).
  enum class Policy { Constant, Steps, Step, Exp, Poly, Sigmoid, Random } policy = Policy::Constant;
  std::vector<int> steps;      // policy=steps: iterations where the rate is multiplied ...
  std::vector<float> scales;   // ... by these (same count as steps)
  float power = 4;             // burn-in, poly and random: the exponent
  float gamma = 1;             // exp: the base; sigmoid: the slope
  int step = 1;                // step: the period; sigmoid: the midpoint
  float scale = 1;             // step: the factor per period
  float angle = 0, saturation = 1, exposure = 1, hue = 0;
  std::optional<Precision> precision;  // precision= (our option; --precision overrides it); unset or auto: none
  int line = 0;                // of the [net] header
};

enum class LayerType { Convolutional, Shortcut, Route, Upsample, Maxpool, Yolo, Connected, Softmax };
const char* layer_type_name(LayerType type);  // darknet's short names: "conv", "shortcut", "route", ...

struct LayerSpec {
  LayerType type = LayerType::Convolutional;
  int line = 0;  // of the section header, for error messages
  // [convolutional]
  int filters = 1, size = 1, stride = 1, pad = 0;
  bool batch_normalize = false;
  Activation activation = Activation::Linear;  // also [shortcut] and [connected]
  // [shortcut]: from (relative, negative, or absolute index)
  int from = 0;
  // [route]: layers as written (negative = relative to this layer, else absolute)
  std::vector<int> layers;
  // [upsample] stride is `stride`; [maxpool] size/stride are `size`/`stride`
  // [yolo]
  std::vector<int> mask;
  std::vector<float> anchors;  // (w, h) pairs, network pixels
  int classes = 20, num = 1;
  float jitter = 0.2f, ignore_thresh = 0.5f, truth_thresh = 1.0f;
  bool random = false;
  // [connected]
  int output = 1;
  // [softmax] groups (1 supported), and whether a [cost] section followed (accepted, folded in)
  int groups = 1;
};

struct ModelSpec {
  std::string path;
  NetParams net;
  std::vector<LayerSpec> layers;      // in file order, [net] and [cost] excluded
  std::vector<std::string> warnings;  // "file:line: option 'x' of [y] is accepted but not used"
};

// Reads and checks a cfg: the first section must be [net] (or [network]); unknown sections,
// unknown options, values of the wrong type or out of range (e.g. filters < 1, size even,
// stride < 1, an activation we do not have, a mask index >= num, anchors not 2*num numbers,
// steps and scales of different lengths, batch not a multiple of subdivisions) are errors
// naming file:line. Shape-dependent checks (route/shortcut indices, a [yolo] input's channel
// count) come when the graph is built.
ModelSpec parse_model(const CfgFile& cfg);
ModelSpec read_model(const std::string& path);  // read_cfg_file + parse_model

}  // namespace yolo::graph
