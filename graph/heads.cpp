// Heads that follow the dataset (see heads.h).
#include "graph/heads.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "runtime/check.h"

namespace yolo::graph {

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool is_conv(const std::string& type) { return type == "convolutional" || type == "conv"; }

// The text with the lines in `replace` (1-based) replaced and those in `after` added after theirs.
std::string rewrite_lines(const std::string& text, const std::map<int, std::string>& replace,
                          const std::map<int, std::vector<std::string>>& after) {
  std::string result;
  const std::vector<std::string> lines = split_lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + 1;
    auto r = replace.find(line);
    result += (r != replace.end() ? r->second : lines[i]) + "\n";
    if (auto a = after.find(line); a != after.end())
      for (const std::string& added : a->second) result += added + "\n";
  }
  return result;
}

// The anchors a [yolo] predicts at: its mask's length, or num when it has no mask (darknet).
int anchors_of(const CfgSection& yolo) {
  for (const CfgOption& o : yolo.options)
    if (o.key == "mask") return static_cast<int>(std::count(o.value.begin(), o.value.end(), ',')) + 1;
  for (const CfgOption& o : yolo.options)
    if (o.key == "num") return std::stoi(o.value);
  return 1;
}

}  // namespace

std::vector<int> yolo_head_layers(const ModelSpec& spec) {
  std::vector<int> heads;
  for (size_t i = 1; i < spec.layers.size(); ++i)
    if (spec.layers[i].type == LayerType::Yolo && spec.layers[i - 1].type == LayerType::Convolutional)
      heads.push_back(static_cast<int>(i) - 1);
  return heads;
}

ResizedHeads resize_yolo_heads(const std::string& text, const std::string& path, int classes) {
  const CfgFile cfg = parse_cfg_text(text, path);
  const ModelSpec spec = parse_model(cfg);  // checked first: only a valid cfg is rewritten
  ResizedHeads out;
  out.classes = classes;
  out.head_layers = yolo_head_layers(spec);
  for (const LayerSpec& layer : spec.layers)
    if (layer.type == LayerType::Yolo) out.old_classes = layer.classes;
  std::map<int, std::string> replace;             // line (1-based) -> new text
  std::map<int, std::vector<std::string>> after;  // header line -> lines to add after it
  // Sections: [net] is sections[0]; layer k is sections[k + 1] (no [cost] in a detector).
  for (size_t s = 1; s < cfg.sections.size(); ++s) {
    const CfgSection& yolo = cfg.sections[s];
    if (yolo.type != "yolo") continue;
    const CfgSection& conv = cfg.sections[s - 1];
    if (!is_conv(conv.type))
      throw Error(path + ":" + std::to_string(yolo.line) + ": this [yolo] does not follow a [convolutional], so its " +
                  "head cannot be resized for the dataset's " + std::to_string(classes) + " classes");
    bool has_classes = false, has_filters = false;
    for (const CfgOption& o : yolo.options)
      if (o.key == "classes") {
        has_classes = true;
        replace[o.line] = "classes=" + std::to_string(classes);
      }
    if (!has_classes) after[yolo.line].push_back("classes=" + std::to_string(classes));
    const std::string filters = "filters=" + std::to_string(anchors_of(yolo) * (5 + classes));
    for (const CfgOption& o : conv.options)
      if (o.key == "filters") {
        has_filters = true;
        replace[o.line] = filters;
      }
    if (!has_filters) after[conv.line].push_back(filters);
  }
  out.cfg_text = rewrite_lines(text, replace, after);
  return out;
}

std::string set_yolo_anchors(const std::string& text, const std::string& path, const std::string& anchors) {
  const CfgFile cfg = parse_cfg_text(text, path);
  std::map<int, std::string> replace;
  std::map<int, std::vector<std::string>> after;
  for (const CfgSection& section : cfg.sections) {
    if (section.type != "yolo") continue;
    bool found = false;
    for (const CfgOption& o : section.options)
      if (o.key == "anchors") {
        found = true;
        replace[o.line] = "anchors = " + anchors;
      }
    if (!found) after[section.line].push_back("anchors = " + anchors);
  }
  return rewrite_lines(text, replace, after);
}

}  // namespace yolo::graph
