// Tests for graph/cfg: the darknet .cfg syntax, the typed model description with its errors
// (file:line and what is wrong), warnings, hostile input, and the shipped models checked against
// published facts by a shape/FLOP/parameter counter written here, independent of graph/.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "graph/cfg.h"
#include "runtime/check.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

namespace {

using namespace yolo::graph;
using yolo::testing::TempDir;
using yolo::testing::write_text_file;

ModelSpec model_from(const std::string& text) { return parse_model(parse_cfg_text(text, "t.cfg")); }

// The yolo::Error message `f` throws ("(no error)" if none; any other exception escapes).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const yolo::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Checks that `text` fails (syntax or model) at t.cfg:`line` with a message containing `part`.
void check_error(const std::string& text, int line, const std::string& part) {
  CAPTURE(text);
  std::string message = error_of([&] { model_from(text); });
  CAPTURE(message);
  CHECK(message.rfind("t.cfg:" + std::to_string(line) + ": ", 0) == 0);
  CHECK(has(message, part));
}

// A [net] of 3 lines; a body after it starts at line 4.
std::string net_then(const std::string& body) { return "[net]\nwidth=64\nheight=64\n" + body; }

using yolo::testing::model_path;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("cfg syntax: comments, blank lines, CRLF, trailing comments, case") {
  std::string text =
      "\xEF\xBB\xBF# a comment\r\n"
      "; another\r\n"
      "\r\n"
      "  [NET]  \r\n"
      "Batch = 4 # trailing comment\r\n"
      "\twidth=64;also a comment\r\n"
      "[Convolutional] # header comment\n"
      "filters = 8\n"
      "   # indented comment\n"
      "anchors = 1, 2 ,3\n";
  CfgFile cfg = parse_cfg_text(text, "s.cfg");
  CHECK(cfg.path == "s.cfg");
  REQUIRE(cfg.sections.size() == 2);
  CHECK(cfg.sections[0].type == "net");
  CHECK(cfg.sections[0].line == 4);
  REQUIRE(cfg.sections[0].options.size() == 2);
  CHECK(cfg.sections[0].options[0].key == "batch");
  CHECK(cfg.sections[0].options[0].value == "4");
  CHECK(cfg.sections[0].options[0].line == 5);
  CHECK(cfg.sections[0].options[1].key == "width");
  CHECK(cfg.sections[0].options[1].value == "64");
  CHECK(cfg.sections[1].type == "convolutional");
  CHECK(cfg.sections[1].line == 7);
  REQUIRE(cfg.sections[1].options.size() == 2);
  CHECK(cfg.sections[1].options[0].value == "8");
  CHECK(cfg.sections[1].options[1].value == "1, 2 ,3");
  CHECK(cfg.sections[1].options[1].line == 10);
  // The same key in different sections is fine.
  CHECK(parse_cfg_text("[a]\nx=1\n[b]\nx=2", "s.cfg").sections.size() == 2);
  CHECK(parse_cfg_text("", "s.cfg").sections.empty());
}

TEST_CASE("cfg syntax errors name file and line") {
  struct Case {
    std::string text;
    int line;
    const char* part;
  };
  const Case cases[] = {
      {"[net]\nwidth=64\nthis is garbage\n", 3, "expected a [section] header, key=value or a comment"},
      {"width=64\n[net]\n", 1, "option 'width' comes before any [section]"},
      {std::string("[net]\nwidth=6\0"
                   "4\n",
                   16),
       2, "binary data, not a cfg file"},
      {"[net]\n\x01\n", 2, "binary data, not a cfg file"},
      {"[net\nwidth=64\n", 1, "malformed section header"},
      {"[net]\n[]\n", 2, "malformed section header"},
      {"[net]\n[a b]\n", 2, "malformed section header"},
      {"[net]\nwidth=\n", 2, "option 'width' has no value"},
      {"[net]\nwidth= # nothing\n", 2, "option 'width' has no value"},
      {"[net]\n=5\n", 2, "malformed option name"},
      {"[net]\nmy key=5\n", 2, "malformed option name"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    std::string message = error_of([&] { parse_cfg_text(c.text, "t.cfg"); });
    CAPTURE(message);
    CHECK(message.rfind("t.cfg:" + std::to_string(c.line) + ": ", 0) == 0);
    CHECK(has(message, c.part));
  }
}

TEST_CASE("cfg files: unreadable, directory, over 16 MiB") {
  TempDir dir;
  std::string missing = dir / "missing.cfg";
  std::string message = error_of([&] { read_cfg_file(missing); });
  CHECK(has(message, missing));
  CHECK(has(message, "cannot open"));
  message = error_of([&] { read_cfg_file(dir.path()); });
  CHECK(has(message, dir.path()));
  CHECK(has(message, "directory"));

  std::string big = dir / "big.cfg";
  {
    std::string line = "# " + std::string(1022, 'x') + "\n";  // 1 KiB of comment
    std::ofstream out(big, std::ios::binary);
    out << "[net]\n";
    for (int i = 0; i < 17 * 1024; ++i) out << line;
  }
  message = error_of([&] { read_cfg_file(big); });
  CHECK(has(message, big));
  CHECK(has(message, "16 MiB"));
  message = error_of([&] { parse_cfg_text(std::string((16 << 20) + 1, '#'), "t.cfg"); });
  CHECK(has(message, "16 MiB"));

  std::string good = dir / "good.cfg";
  write_text_file(good, "[net]\nwidth=32\nheight=32\n[upsample]\n");
  ModelSpec model = read_model(good);
  CHECK(model.path == good);
  CHECK(model.net.width == 32);
  REQUIRE(model.layers.size() == 1);
  CHECK(model.layers[0].type == LayerType::Upsample);
  CHECK(model.layers[0].stride == 2);
  CHECK(model.layers[0].line == 4);
}

TEST_CASE("cfg model: typed values and defaults") {
  ModelSpec m = model_from(
      "[network]\nbatch=8\nsubdivisions=2\nwidth=96\nheight=64\nchannels=1\nmomentum=0.8\ndecay=0.001\n"
      "learning_rate=1e-2\nburn_in=10\nmax_batches=100\npolicy=Steps\nsteps=20, 50\nscales=.5,0.25\n"
      "angle=5\nsaturation=1.25\nexposure=2\nhue=.05\n"                                    // lines 1-18
      "[conv]\nfilters=16\nsize=3\nstride=2\npad=1\nbatch_normalize=1\nactivation=leaky\n"  // 19-25
      "[convolutional]\nfilters=4\nsize=1\nstride=1\npad=0\n"                               // 26-30
      "[shortcut]\nfrom=-2\n"                                                                // 31-32
      "[route]\nlayers=-1, 0\n"                                                              // 33-34
      "[upsample]\nstride=4\n"                                                               // 35-36
      "[max]\nsize=3\nstride=2\npadding=2\n"                                                 // 37-40
      "[yolo]\nmask=2,0\nanchors=1,2, 3,4, 5.5,6\nclasses=3\nnum=3\njitter=.25\nignore_thresh=.6\n"
      "truth_thresh=.9\nrandom=1\n"  // 41-49
      "[yolo]\nanchors=1,2\n"        // 50-51
      "[connected]\noutput=10\nactivation=relu\n"
      "[softmax]\n");
  const NetParams& n = m.net;
  CHECK(n.line == 1);
  CHECK(n.batch == 8);
  CHECK(n.subdivisions == 2);
  CHECK(n.width == 96);
  CHECK(n.height == 64);
  CHECK(n.channels == 1);
  CHECK(n.momentum == doctest::Approx(0.8));
  CHECK(n.decay == doctest::Approx(0.001));
  CHECK(n.learning_rate == doctest::Approx(0.01));
  CHECK(n.burn_in == 10);
  CHECK(n.max_batches == 100);
  CHECK(n.policy == NetParams::Policy::Steps);
  CHECK(n.steps == std::vector<int>{20, 50});
  REQUIRE(n.scales.size() == 2);
  CHECK(n.scales[0] == 0.5f);
  CHECK(n.scales[1] == 0.25f);
  CHECK(n.angle == 5);
  CHECK(n.saturation == 1.25f);
  CHECK(n.exposure == 2);
  CHECK(n.hue == doctest::Approx(0.05));
  CHECK(m.warnings.empty());

  REQUIRE(m.layers.size() == 10);
  const LayerSpec& c0 = m.layers[0];
  CHECK(c0.type == LayerType::Convolutional);
  CHECK(c0.line == 19);
  CHECK(c0.filters == 16);
  CHECK(c0.size == 3);
  CHECK(c0.stride == 2);
  CHECK(c0.pad == 1);
  CHECK(c0.batch_normalize);
  CHECK(c0.activation == yolo::Activation::Leaky);
  const LayerSpec& c1 = m.layers[1];
  CHECK(c1.line == 26);
  CHECK(c1.pad == 0);
  CHECK(!c1.batch_normalize);
  CHECK(c1.activation == yolo::Activation::Logistic);  // darknet's default
  CHECK(m.layers[2].type == LayerType::Shortcut);
  CHECK(m.layers[2].from == -2);
  CHECK(m.layers[2].activation == yolo::Activation::Linear);
  CHECK(m.layers[3].type == LayerType::Route);
  CHECK(m.layers[3].layers == std::vector<int>{-1, 0});
  CHECK(m.layers[4].type == LayerType::Upsample);
  CHECK(m.layers[4].stride == 4);
  const LayerSpec& mp = m.layers[5];
  CHECK(mp.type == LayerType::Maxpool);
  CHECK(mp.size == 3);
  CHECK(mp.stride == 2);
  CHECK(mp.pad == 2);
  const LayerSpec& y = m.layers[6];
  CHECK(y.type == LayerType::Yolo);
  CHECK(y.line == 41);
  CHECK(y.mask == std::vector<int>{2, 0});
  CHECK(y.anchors == std::vector<float>{1, 2, 3, 4, 5.5f, 6});
  CHECK(y.classes == 3);
  CHECK(y.num == 3);
  CHECK(y.jitter == 0.25f);
  CHECK(y.ignore_thresh == doctest::Approx(0.6));
  CHECK(y.truth_thresh == doctest::Approx(0.9));
  CHECK(y.random);
  CHECK(m.layers[7].mask == std::vector<int>{0});  // absent mask: all num anchors
  CHECK(m.layers[7].num == 1);
  CHECK(!m.layers[7].random);
  CHECK(m.layers[8].type == LayerType::Connected);
  CHECK(m.layers[8].output == 10);
  CHECK(m.layers[8].activation == yolo::Activation::Relu);
  CHECK(m.layers[9].type == LayerType::Softmax);
  CHECK(m.layers[9].groups == 1);

  // Defaults of an almost empty [net]; maxpool size defaults to its stride.
  ModelSpec d = model_from("[net]\n[maxpool]\nstride=2\n[maxpool]\n");
  CHECK(d.net.batch == 1);
  CHECK(d.net.width == 416);
  CHECK(d.net.height == 416);
  CHECK(d.net.channels == 3);
  CHECK(d.net.policy == NetParams::Policy::Constant);
  CHECK(d.layers[0].size == 2);
  CHECK(d.layers[0].pad == 1);
  CHECK(d.layers[1].size == 1);
  CHECK(d.layers[1].stride == 1);
  CHECK(d.layers[1].pad == 0);
}

TEST_CASE("cfg model: inputs= describes a flat input") {
  ModelSpec m = model_from("[net]\ninputs=784\n[connected]\noutput=10\nactivation=linear\n[softmax]\n[cost]\ntype=sse\n");
  CHECK(m.net.width == 1);
  CHECK(m.net.height == 1);
  CHECK(m.net.channels == 784);
  REQUIRE(m.layers.size() == 2);  // [cost] folds into [softmax]
  CHECK(m.layers[1].type == LayerType::Softmax);
  check_error("[net]\ninputs=784\nwidth=32\n[softmax]\n", 3, "either inputs=");
  check_error("[net]\ninputs=0\n[softmax]\n", 2, "out of range");
}

TEST_CASE("cfg model errors name file, line and what is wrong") {
  struct Case {
    std::string text;
    int line;
    const char* part;
  };
  const std::string conv = "[convolutional]\nfilters=8\nsize=3\npad=1\n";  // lines 4-7 after net_then
  const Case cases[] = {
      // structure
      {"[convolutional]\nfilters=8\n", 1, "the first section must be [net] or [network], got [convolutional]"},
      {"[net]\n", 1, "no layers after [net]"},
      {net_then("[upsample]\n[net]\n"), 5, "[net] may appear only once"},
      {net_then("[upsample]\n[foo]\n"), 5, "unknown section [foo]"},
      {net_then("[upsample]\n[avgpool]\n"), 5, "[avgpool] is a darknet layer this trainer does not implement"},
      {net_then("[dropout]\nprobability=.5\n"), 4, "[dropout] is not supported"},
      {net_then(conv + "bogus=1\n"), 8, "unknown option 'bogus' in [convolutional]"},
      {"[net]\nclasses=80\n[upsample]\n", 2, "unknown option 'classes' in [net]"},
      // [net]
      {"[net]\nwidth=100\n[conv]\nfilters=18\n[yolo]\nmask=0\nanchors=1,1\nnum=1\nclasses=1\n", 2,
       "not a multiple of 32"},
      {"[net]\nheight=1000000000\n[upsample]\n", 2, "out of range (expected an integer in 1..65536)"},
      {"[net]\nwidth=1e9\n[upsample]\n", 2, "'1e9' is not an integer"},
      {"[net]\nchannels=0\n[upsample]\n", 2, "out of range"},
      {"[net]\nbatch=3.5\n[upsample]\n", 2, "'3.5' is not an integer"},
      {"[net]\nbatch=2000000\n[upsample]\n", 2, "out of range"},
      {"[net]\nbatch=64\nsubdivisions=5\n[upsample]\n", 3, "batch=64 is not a multiple of subdivisions=5"},
      {"[net]\nbatch=64\nsubdivisions=128\n[upsample]\n", 3, "out of range (expected an integer in 1..64)"},
      {"[net]\npolicy=sigm\n[upsample]\n", 2,
       "'sigm' is not a policy (constant, steps, step, exp, poly, sigmoid, random)"},
      {"[net]\npolicy=exp\ngamma=0\n[upsample]\n", 3, "expected > 0 (the rate is lr * gamma^iteration)"},
      {"[net]\npolicy=step\nstep=0\nscale=.5\n[upsample]\n", 3, "out of range"},
      {"[net]\npolicy=step\nstep=10\nscale=0\n[upsample]\n", 4, "expected > 0"},
      {"[net]\npolicy=poly\npower=-1\n[upsample]\n", 3, "expected >= 0"},
      {"[net]\npolicy=steps\nsteps=30,20\nscales=.1,.1\n[upsample]\n", 3, "must be increasing"},
      {"[net]\npolicy=steps\nsteps=10,20\nscales=.1\n[upsample]\n", 4, "1 scales for 2 steps"},
      {"[net]\npolicy=steps\n[upsample]\n", 1, "policy=steps needs steps="},
      {"[net]\npolicy=steps\nsteps=10,,20\nscales=.1,.1\n[upsample]\n", 3, "empty item"},
      {"[net]\nlearning_rate=0\n[upsample]\n", 2, "expected > 0"},
      {"[net]\nlearning_rate=nan\n[upsample]\n", 2, "not a finite number"},
      {"[net]\nlearning_rate=inf\n[upsample]\n", 2, "not a finite number"},
      {"[net]\nlearning_rate=fast\n[upsample]\n", 2, "'fast' is not a number"},
      {"[net]\nmomentum=1\n[upsample]\n", 2, "in [0, 1)"},
      {"[net]\ndecay=-0.1\n[upsample]\n", 2, ">= 0"},
      {"[net]\nburn_in=-1\n[upsample]\n", 2, "out of range"},
      {"[net]\nmax_batches=-5\n[upsample]\n", 2, "out of range"},
      {"[net]\nhue=2\n[upsample]\n", 2, "in [0, 1]"},
      {"[net]\nprecision=fp8\n[upsample]\n", 2, "'fp8' is not auto, fp32, tf32, bf16 or fp16"},
      // [convolutional]
      {net_then("[convolutional]\nfilters=99999999999\n"), 5,
       "'99999999999' is out of range (expected an integer in 1..65536)"},
      {net_then("[convolutional]\nfilters=2147483647\n"), 5, "out of range"},
      {net_then("[convolutional]\nfilters=" + std::string(400, '9') + "\n"), 5, "out of range"},
      {net_then("[convolutional]\nfilters=0\n"), 5, "out of range"},
      {net_then("[convolutional]\nsize=4\npad=1\n"), 5, "is even"},
      {net_then("[convolutional]\nsize=17\npad=1\n"), 5, "out of range"},
      {net_then("[convolutional]\nstride=9\n"), 5, "out of range"},
      {net_then("[convolutional]\nsize=3\npad=0\n"), 6, "only 'same' padding (pad=1) is supported"},
      {net_then("[convolutional]\nsize=3\n"), 4, "only 'same' padding (pad=1) is supported"},
      {net_then("[convolutional]\nsize=5\npadding=1\n"), 6, "only 'same' padding (pad=1) is supported"},
      {net_then(conv + "padding=2\n"), 8, "conflicts with pad=1"},
      {net_then(conv + "activation=mish\n"), 8, "unknown activation 'mish' (expected linear, leaky, relu or logistic)"},
      {net_then(conv + "groups=2\n"), 8, "'2' is not supported (only 1)"},
      {net_then(conv + "dilation=2\n"), 8, "not supported (only 1)"},
      {net_then(conv + "batch_normalize=2\n"), 8, "out of range"},
      // [shortcut]
      {net_then(conv + "[shortcut]\nactivation=linear\n"), 8, "missing from="},
      {net_then(conv + "[shortcut]\nfrom=0\n"), 9, "must be nonzero"},
      {net_then(conv + "[shortcut]\nfrom=-1\nactivation=leaky\n"), 10,
       "only activation=linear is supported for [shortcut]"},
      {net_then(conv + "[shortcut]\nfrom=-1\nweights_type=per_feature\n"), 10, "not supported"},
      {net_then(conv + "[shortcut]\nfrom=-1\nweights_normalization=softmax\n"), 10, "not supported"},
      // [route]
      {net_then(conv + "[route]\n"), 8, "missing layers="},
      {net_then(conv + "[route]\nlayers=-1,-2,-3,-4,-5\n"), 9, "at most 4"},
      {net_then(conv + "[route]\nlayers=a\n"), 9, "'a' is not an integer"},
      {net_then(conv + "[route]\nlayers=-1\ngroups=2\n"), 10, "not supported (only 1)"},
      {net_then(conv + "[route]\nlayers=-1\ngroup_id=1\n"), 10, "not supported (only 0)"},
      // [upsample], [maxpool]
      {net_then("[upsample]\nstride=0\n"), 5, "out of range"},
      {net_then("[upsample]\nstride=16\n"), 5, "out of range"},
      {net_then("[maxpool]\nsize=2\nstride=2\npadding=0\n"), 7, "only padding = size-1"},
      // [yolo]
      {net_then("[yolo]\nnum=2\n"), 4, "missing anchors="},
      {net_then("[yolo]\nnum=2\nanchors=1,2,3\n"), 6, "3 numbers, need 2*num = 4"},
      {net_then("[yolo]\nanchors=-1,2\n"), 5, "out of range"},
      {net_then("[yolo]\nanchors=1e999,2\n"), 5, "not a finite number"},
      {net_then("[yolo]\nnum=2\nanchors=1,2,3,4\nmask=2\n"), 7, "out of range (expected an integer in 0..1)"},
      {net_then("[yolo]\nnum=2\nanchors=1,2,3,4\nmask=1,1\n"), 7, "repeats an anchor index"},
      {net_then("[yolo]\nanchors=1,2\nclasses=0\n"), 6, "out of range"},
      {net_then("[yolo]\nanchors=1,2\njitter=1\n"), 6, "in [0, 1)"},
      {net_then("[yolo]\nanchors=1,2\nignore_thresh=1.5\n"), 6, "in [0, 1]"},
      {net_then("[yolo]\nanchors=1,2\ntruth_thresh=-0.5\n"), 6, "in [0, 1]"},
      {net_then("[yolo]\nanchors=1,2\nrandom=2\n"), 6, "out of range"},
      {net_then("[yolo]\nanchors=1,2\nscale_x_y=1.05\n"), 6, "only 1"},
      {net_then("[yolo]\nanchors=1,2\nnum=0\n"), 6, "out of range"},
      // [connected], [softmax], [cost]
      {net_then("[connected]\noutput=0\n"), 5, "out of range"},
      {net_then("[connected]\noutput=99999999\n"), 5, "out of range"},
      {net_then("[connected]\noutput=10\nbatch_normalize=1\n"), 6, "not supported"},
      {net_then("[softmax]\ngroups=2\n"), 5, "not supported (only 1)"},
      {net_then("[softmax]\ntemperature=2\n"), 5, "only 1"},
      {net_then(conv + "[cost]\n"), 8, "[cost] is supported only directly after [softmax]"},
      {net_then("[softmax]\n[cost]\n[cost]\n"), 6, "only directly after [softmax]"},
      {net_then("[softmax]\n[cost]\ntype=smooth\n"), 6, "only type=sse"},
  };
  for (const Case& c : cases) check_error(c.text, c.line, c.part);
}

TEST_CASE("cfg: a repeated option keeps its first value, as darknet does, with a warning naming both lines") {
  CfgFile cfg = parse_cfg_text("[net]\nwidth=64\nbatch=2\nWIDTH=32\n[b]\nwidth=5\n", "t.cfg");
  REQUIRE(cfg.sections[0].options.size() == 2);
  CHECK(cfg.sections[0].options[0].value == "64");
  CHECK(cfg.sections[1].options[0].value == "5");  // another section's is its own
  REQUIRE(cfg.warnings.size() == 1);
  CHECK(cfg.warnings[0] ==
        "t.cfg:4: option 'width' repeated in [net] (first at line 2): the first value counts, as in darknet: "
        "width=64 is used, width=32 ignored");
  // pjreddie's yolov3-openimages.cfg: "Testing" values first, "Training" ones after.
  ModelSpec m = model_from(
      "[net]\n# Testing\nbatch=1\nsubdivisions=1\n# Training\nbatch=64\nsubdivisions=16\nwidth=64\nheight=64\n"
      "[upsample]\n");
  CHECK(m.net.batch == 1);
  CHECK(m.net.subdivisions == 1);
  REQUIRE(m.warnings.size() == 2);
  CHECK(has(m.warnings[0], "t.cfg:6: option 'batch' repeated in [net] (first at line 3)"));
  CHECK(has(m.warnings[0], "batch=1 is used, batch=64 ignored (to train with another, pass --batch)"));
  CHECK(has(m.warnings[1],
            "subdivisions=1 is used, subdivisions=16 ignored (to train with another, pass --subdivisions)"));
}

TEST_CASE("cfg: darknet's learning-rate policies and their options; options a policy does not read warn") {
  struct Case {
    const char* text;
    NetParams::Policy policy;
  };
  const Case cases[] = {{"policy=poly\npower=2\nmax_batches=100\n", NetParams::Policy::Poly},
                        {"policy=exp\ngamma=0.99\n", NetParams::Policy::Exp},
                        {"policy=step\nstep=100\nscale=0.5\n", NetParams::Policy::Step},
                        {"policy=sigmoid\ngamma=0.1\nstep=50\n", NetParams::Policy::Sigmoid},
                        {"policy=random\npower=1\n", NetParams::Policy::Random}};
  for (const Case& c : cases) {
    CAPTURE(c.text);
    ModelSpec m = model_from(std::string("[net]\n") + c.text + "[upsample]\n");
    CHECK(m.net.policy == c.policy);
    CHECK(m.warnings.empty());
  }
  ModelSpec poly = model_from("[net]\npolicy=poly\npower=2\n[upsample]\n");
  CHECK(poly.net.power == 2.0f);
  ModelSpec step = model_from("[net]\npolicy=step\nstep=100\nscale=0.5\n[upsample]\n");
  CHECK(step.net.step == 100);
  CHECK(step.net.scale == 0.5f);
  ModelSpec sig = model_from("[net]\npolicy=sigmoid\ngamma=-0.1\nstep=50\n[upsample]\n");  // any slope
  CHECK(sig.net.gamma == -0.1f);
  ModelSpec unread = model_from("[net]\npolicy=exp\ngamma=0.9\nstep=5\nscale=2\npower=3\n[upsample]\n");
  const std::vector<std::string> expected = {"t.cfg:4: option 'step' of [net] is accepted but not used",
                                             "t.cfg:5: option 'scale' of [net] is accepted but not used",
                                             "t.cfg:6: option 'power' of [net] is accepted but not used"};
  CHECK(unread.warnings == expected);
  // power is read for burn-in whatever the policy.
  CHECK(model_from("[net]\nburn_in=10\npower=2\n[upsample]\n").warnings.empty());
}

TEST_CASE("cfg model: accepted-but-unused options warn once per section type and option") {
  ModelSpec m = model_from(
      "[net]\nmosaic=1\nflip=0\npolicy=constant\nsteps=5\n"            // 1-5
      "[yolo]\nanchors=1,2\niou_normalizer=0.07\nscale_x_y=1.0\n"      // 6-9
      "[yolo]\nanchors=1,2\niou_normalizer=0.07\nnms_kind=greedynms\n"  // 10-13
      "[softmax]\n[cost]\ntype=sse\n");                                 // 14-16
  const std::vector<std::string> expected = {
      "t.cfg:2: option 'mosaic' of [net] is accepted but not used",
      "t.cfg:3: option 'flip' of [net] is accepted but not used",
      "t.cfg:5: option 'steps' of [net] is accepted but not used",
      "t.cfg:8: option 'iou_normalizer' of [yolo] is accepted but not used",
      "t.cfg:9: option 'scale_x_y' of [yolo] is accepted but not used",
      "t.cfg:13: option 'nms_kind' of [yolo] is accepted but not used",
      "t.cfg:16: option 'type' of [cost] is accepted but not used",
  };
  CHECK(m.warnings == expected);
  CHECK(m.layers.size() == 3);
}

TEST_CASE("cfg hostile input gives an error, never a crash") {
  yolo::testing::Rng rng;
  CAPTURE(rng.seed());
  for (int round = 0; round < 20; ++round) {
    std::string bytes(size_t(rng.integer(1, 4096)), '\0');
    for (char& ch : bytes) ch = char(rng.integer(0, 255));
    std::string message = error_of([&] { model_from(bytes); });
    CAPTURE(message);
    CHECK(message.rfind("t.cfg:", 0) == 0);
  }
  // Printable garbage: an error at the first line that is not a header, option or comment.
  std::string nested;
  for (int i = 0; i < 10000; ++i) nested += std::string(size_t(i % 50 + 1), '[') + "x" + std::string(size_t(i % 7), ']') + "\n";
  CHECK(has(error_of([&] { model_from(nested); }), "t.cfg:1: malformed section header"));
  std::string braces = "[net]\n";
  for (int i = 0; i < 10000; ++i) braces += "{{{{(((( " + std::to_string(i) + " ))))}}}}\n";
  CHECK(has(error_of([&] { model_from(braces); }), "t.cfg:2: expected a [section] header"));
  std::string equals = "[net]\n";
  for (int i = 0; i < 10000; ++i) equals += "a=b=c=[d]\n";
  CHECK(has(error_of([&] { model_from(equals); }), "t.cfg:2: unknown option 'a' in [net]"));

  // Random edits of a real cfg: each either parses or throws yolo::Error (anything else fails).
  const std::string tiny = read_all(model_path("yolov3-tiny.cfg"));
  const std::string alphabet = "0123456789-.,=[]#; \nabcxyz\r";
  int parsed = 0, rejected = 0;
  for (int round = 0; round < 300; ++round) {
    std::string text = tiny;
    for (int edit = rng.integer(1, 4); edit > 0; --edit)
      text[size_t(rng.integer(0, int(text.size()) - 1))] = alphabet[size_t(rng.integer(0, int(alphabet.size()) - 1))];
    try {
      model_from(text);
      ++parsed;
    } catch (const yolo::Error& e) {
      CHECK(has(e.what(), "t.cfg:"));
      ++rejected;
    }
  }
  CHECK(parsed + rejected == 300);
  CHECK(rejected > 0);
}

namespace {

// An independent count over a parsed cfg: shapes (same padding conv: out = ceil(in / stride);
// route concatenates channels; shortcut and yolo keep the shape; upsample multiplies; maxpool
// with darknet's size-1 padding), conv FLOPs (2*k*k*c_in*c_out*H_out*W_out) and parameters.
struct Shape3 {
  int h, w, c;
  bool operator==(const Shape3&) const = default;
};
std::ostream& operator<<(std::ostream& out, const Shape3& s) { return out << s.h << "x" << s.w << "x" << s.c; }
struct Count {
  std::vector<Shape3> out;
  std::map<LayerType, int> layers;
  double conv_flops = 0;
  int64_t trainable = 0, bn_stats = 0;
};

Count count(const ModelSpec& m) {
  Count r;
  Shape3 s{m.net.height, m.net.width, m.net.channels};
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerSpec& l = m.layers[i];
    ++r.layers[l.type];
    switch (l.type) {
      case LayerType::Convolutional: {
        Shape3 o{(s.h + l.stride - 1) / l.stride, (s.w + l.stride - 1) / l.stride, l.filters};
        r.conv_flops += 2.0 * l.size * l.size * s.c * o.c * o.h * o.w;
        r.trainable += int64_t(l.size) * l.size * s.c * o.c + (l.batch_normalize ? 2 : 1) * int64_t(o.c);
        if (l.batch_normalize) r.bn_stats += 2 * int64_t(o.c);
        s = o;
        break;
      }
      case LayerType::Route: {
        Shape3 o{0, 0, 0};
        for (int index : l.layers) {
          const Shape3& in = r.out.at(size_t(index < 0 ? int(i) + index : index));
          o = {in.h, in.w, o.c + in.c};
        }
        s = o;
        break;
      }
      case LayerType::Upsample: s = {s.h * l.stride, s.w * l.stride, s.c}; break;
      case LayerType::Maxpool:
        s = {(s.h + (l.size - 1) - l.size) / l.stride + 1, (s.w + (l.size - 1) - l.size) / l.stride + 1, s.c};
        break;
      case LayerType::Connected:
        r.trainable += int64_t(s.h) * s.w * s.c * l.output + l.output;
        s = {1, 1, l.output};
        break;
      default: break;  // shortcut, yolo, softmax keep the shape
    }
    r.out.push_back(s);
  }
  return r;
}

int64_t mega(double flops) { return std::llround(flops / 1e6); }  // BFLOPs to 3 decimals

}  // namespace

TEST_CASE("models/yolov3.cfg is darknet's YOLOv3 (416, COCO)") {
  ModelSpec m = read_model(model_path("yolov3.cfg"));
  CHECK(m.warnings.empty());
  const NetParams& n = m.net;
  CHECK(n.batch == 64);
  CHECK(n.subdivisions == 16);
  CHECK(n.width == 416);
  CHECK(n.height == 416);
  CHECK(n.channels == 3);
  CHECK(n.momentum == 0.9f);
  CHECK(n.decay == 0.0005f);
  CHECK(n.learning_rate == 0.001f);
  CHECK(n.burn_in == 1000);
  CHECK(n.max_batches == 500200);
  CHECK(n.policy == NetParams::Policy::Steps);
  CHECK(n.steps == std::vector<int>{400000, 450000});
  CHECK(n.scales == std::vector<float>{0.1f, 0.1f});
  CHECK(n.saturation == 1.5f);
  CHECK(n.exposure == 1.5f);
  CHECK(n.hue == 0.1f);

  Count c = count(m);
  REQUIRE(m.layers.size() == 107);
  CHECK(c.layers[LayerType::Convolutional] == 75);
  CHECK(c.layers[LayerType::Shortcut] == 23);
  CHECK(c.layers[LayerType::Route] == 4);
  CHECK(c.layers[LayerType::Upsample] == 2);
  CHECK(c.layers[LayerType::Yolo] == 3);
  CHECK(mega(c.conv_flops) == 65864);
  CHECK(c.trainable == 61949149);
  CHECK(c.bn_stats == 52608);

  const std::vector<float> anchors = {10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326};
  const int yolo_at[] = {82, 94, 106};
  const std::vector<int> masks[] = {{6, 7, 8}, {3, 4, 5}, {0, 1, 2}};
  const Shape3 grids[] = {{13, 13, 255}, {26, 26, 255}, {52, 52, 255}};
  for (int head = 0; head < 3; ++head) {
    const LayerSpec& y = m.layers[size_t(yolo_at[head])];
    REQUIRE(y.type == LayerType::Yolo);
    CHECK(y.mask == masks[head]);
    CHECK(y.anchors == anchors);
    CHECK(y.classes == 80);
    CHECK(y.num == 9);
    CHECK(y.jitter == 0.3f);
    CHECK(y.ignore_thresh == 0.7f);
    CHECK(y.truth_thresh == 1.0f);
    CHECK(y.random);
    CHECK(c.out[size_t(yolo_at[head])] == grids[head]);
  }
  CHECK(m.layers[83].layers == std::vector<int>{-4});
  CHECK(m.layers[86].layers == std::vector<int>{-1, 61});
  CHECK(m.layers[95].layers == std::vector<int>{-4});
  CHECK(m.layers[98].layers == std::vector<int>{-1, 36});
  // Every shortcut adds equal shapes: the layer three back.
  for (size_t i = 0; i < m.layers.size(); ++i)
    if (m.layers[i].type == LayerType::Shortcut) {
      CHECK(m.layers[i].from == -3);
      CHECK(c.out[i - 3] == c.out[i - 1]);
    }
  CHECK(c.out[74] == Shape3{13, 13, 1024});  // end of Darknet-53
}

TEST_CASE("models/yolov3-tiny.cfg is darknet's YOLOv3-tiny") {
  ModelSpec m = read_model(model_path("yolov3-tiny.cfg"));
  CHECK(m.warnings.empty());
  CHECK(m.net.width == 416);
  CHECK(m.net.height == 416);
  Count c = count(m);
  REQUIRE(m.layers.size() == 24);
  CHECK(c.layers[LayerType::Convolutional] == 13);
  CHECK(c.layers[LayerType::Maxpool] == 6);
  CHECK(c.layers[LayerType::Route] == 2);
  CHECK(c.layers[LayerType::Upsample] == 1);
  CHECK(c.layers[LayerType::Yolo] == 2);
  CHECK(mega(c.conv_flops) == 5565);
  CHECK(c.trainable + c.bn_stats == 8858734);  // the values in darknet's .weights file
  REQUIRE(m.layers[11].type == LayerType::Maxpool);
  CHECK(m.layers[11].size == 2);
  CHECK(m.layers[11].stride == 1);
  CHECK(c.out[11] == Shape3{13, 13, 512});
  const std::vector<float> anchors = {10, 14, 23, 27, 37, 58, 81, 82, 135, 169, 344, 319};
  REQUIRE(m.layers[16].type == LayerType::Yolo);
  REQUIRE(m.layers[23].type == LayerType::Yolo);
  CHECK(m.layers[16].mask == std::vector<int>{3, 4, 5});
  CHECK(m.layers[23].mask == std::vector<int>{1, 2, 3});
  for (int at : {16, 23}) {
    CHECK(m.layers[size_t(at)].anchors == anchors);
    CHECK(m.layers[size_t(at)].num == 6);
    CHECK(m.layers[size_t(at)].classes == 80);
  }
  CHECK(c.out[16] == Shape3{13, 13, 255});
  CHECK(c.out[23] == Shape3{26, 26, 255});
  CHECK(m.layers[20].layers == std::vector<int>{-1, 8});
  CHECK(c.out[20] == Shape3{26, 26, 384});
}

TEST_CASE("models/mnist-mlp.cfg is a 784-4096-2048-512-64-10 MLP") {
  ModelSpec m = read_model(model_path("mnist-mlp.cfg"));
  CHECK(m.warnings.empty());
  CHECK(m.net.width == 1);
  CHECK(m.net.height == 1);
  CHECK(m.net.channels == 784);
  CHECK(m.net.batch == 128);
  CHECK(m.net.subdivisions == 1);
  CHECK(m.net.max_batches == 2000);
  REQUIRE(m.layers.size() == 6);
  const int outputs[] = {4096, 2048, 512, 64, 10};
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(m.layers[size_t(i)].type == LayerType::Connected);
    CHECK(m.layers[size_t(i)].output == outputs[i]);
    CHECK(m.layers[size_t(i)].activation == (i < 4 ? yolo::Activation::Relu : yolo::Activation::Linear));
  }
  CHECK(m.layers[5].type == LayerType::Softmax);
  Count c = count(m);
  CHECK(c.trainable == 784 * 4096 + 4096 + 4096 * 2048 + 2048 + 2048 * 512 + 512 + 512 * 64 + 64 + 64 * 10 + 10);
  CHECK(c.out[4] == Shape3{1, 1, 10});
}

TEST_CASE("layer_type_name gives darknet's short names") {
  CHECK(std::string(layer_type_name(LayerType::Convolutional)) == "conv");
  CHECK(std::string(layer_type_name(LayerType::Shortcut)) == "shortcut");
  CHECK(std::string(layer_type_name(LayerType::Route)) == "route");
  CHECK(std::string(layer_type_name(LayerType::Upsample)) == "upsample");
  CHECK(std::string(layer_type_name(LayerType::Maxpool)) == "max");
  CHECK(std::string(layer_type_name(LayerType::Yolo)) == "yolo");
  CHECK(std::string(layer_type_name(LayerType::Connected)) == "connected");
  CHECK(std::string(layer_type_name(LayerType::Softmax)) == "softmax");
}

TEST_CASE("cfg: [net] precision= (our option) is read; absent it is unset") {
  CHECK(model_from("[net]\nprecision=tf32\n[upsample]\n").net.precision == yolo::Precision::Tf32);
  CHECK(model_from("[net]\nprecision=bf16\n[upsample]\n").net.precision == yolo::Precision::Bf16);
  CHECK(!model_from("[net]\nprecision=auto\n[upsample]\n").net.precision);  // auto: chosen per device
  CHECK_FALSE(model_from("[net]\n[upsample]\n").net.precision.has_value());
}
