// Heads that follow the dataset (graph/heads.h): the demo cfg rewritten for 4 classes builds with
// 4-class heads and 3 x (5 + 4) filters before each, every other line of the file unchanged;
// missing classes=/filters= lines are added; a [yolo] after something else is refused.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/heads.h"
#include "runtime/check.h"
#include "tests/graph_fixtures.h"

using namespace yolo::graph;

namespace {

using yolo::testing::model_path;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("heads: the demo cfg for 4 classes: classes and filters rewritten, the rest of the file as it was") {
  const std::string path = model_path("demo.cfg");
  const std::string text = read_text(path);
  ResizedHeads r = resize_yolo_heads(text, path, 4);
  CHECK(r.old_classes == 3);
  ModelSpec spec = parse_model(parse_cfg_text(r.cfg_text, "model.cfg"));
  Graph graph = build_graph(spec);
  CHECK(graph.classes == 4);
  const std::vector<int> heads = yolo_head_layers(spec);
  CHECK(heads == r.head_layers);
  REQUIRE(heads.size() == 2);
  for (int h : heads) CHECK(spec.layers[h].filters == 3 * (5 + 4));
  // Only the 4 lines (2 classes=, 2 filters=) differ.
  std::vector<std::string> before = lines_of(text), after = lines_of(r.cfg_text);
  REQUIRE(before.size() == after.size());
  int changed = 0;
  for (size_t i = 0; i < before.size(); ++i) changed += before[i] != after[i];
  CHECK(changed == 4);
  // The same class count: nothing changes.
  CHECK(resize_yolo_heads(text, path, 3).cfg_text == text + (text.back() == '\n' ? "" : "\n"));
}

TEST_CASE("heads: absent classes= and filters= lines are added; a [yolo] not after a convolution is refused") {
  const std::string cfg =
      "[net]\nwidth=64\nheight=64\n# the backbone\n[convolutional]\nsize=3\npad=1\nfilters=8\n"
      "[convolutional]\nsize=1\n[yolo]\nmask=0,1\nanchors=10,10, 20,20\nnum=2\n";
  ResizedHeads r = resize_yolo_heads(cfg, "t.cfg", 7);
  CHECK(r.old_classes == 20);  // darknet's default
  ModelSpec spec = parse_model(parse_cfg_text(r.cfg_text, "t.cfg"));
  CHECK(spec.layers[1].filters == 2 * (5 + 7));
  CHECK(spec.layers[2].classes == 7);
  CHECK(r.cfg_text.find("# the backbone\n") != std::string::npos);
  const std::string after_pool =
      "[net]\nwidth=64\nheight=64\n[convolutional]\nsize=3\npad=1\nfilters=12\n[maxpool]\nsize=2\nstride=2\n"
      "[yolo]\nmask=0\nanchors=10,10\nnum=1\nclasses=7\n";
  std::string error;
  try {
    resize_yolo_heads(after_pool, "p.cfg", 3);
  } catch (const yolo::Error& e) {
    error = e.what();
  }
  CHECK(error.find("p.cfg:11: this [yolo] does not follow a [convolutional]") == 0);
}

TEST_CASE(
    "heads: set_yolo_anchors puts the list in every [yolo] (each head picks by mask), adding the line if absent") {
  const std::string cfg =
      "[net]\nwidth=64\nheight=64\n[convolutional]\nsize=1\nfilters=14\n[yolo]\nmask=0,1\nanchors=1,1, 2,2\nnum=2\n"
      "classes=2\n[convolutional]\nsize=1\nfilters=14\n[yolo]\nmask=0,1\nnum=2\nclasses=2\n";
  ModelSpec spec = parse_model(parse_cfg_text(set_yolo_anchors(cfg, "t.cfg", "10,13, 30,61"), "t.cfg"));
  for (int layer : {1, 3}) {
    CAPTURE(layer);
    CHECK(spec.layers[layer].anchors == std::vector<float>{10, 13, 30, 61});
  }
}
