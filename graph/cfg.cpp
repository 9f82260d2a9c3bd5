// darknet .cfg files: the line syntax (sections, key=value options, comments) and the typed,
// range-checked model description built from it. Every error names file:line.
#include "graph/cfg.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "kernels/precision.h"
#include "runtime/check.h"

namespace yolo::graph {
namespace {

constexpr size_t kMaxCfgBytes = size_t(16) << 20;
constexpr int kMaxIndex = 1 << 20;  // bound on route/shortcut indices (real nets have < 1000 layers)

[[noreturn]] void fail(const std::string& path, int line, const std::string& message) {
  fail_at(path.c_str(), line, message);
}

std::string_view trim(std::string_view s) {
  constexpr const char* kSpace = " \t\r\v\f";
  size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out)
    if (ch >= 'A' && ch <= 'Z') ch = char(ch - 'A' + 'a');
  return out;
}

// Control bytes other than whitespace mean the file is not text.
bool is_binary_byte(unsigned char ch) {
  return (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r' && ch != '\v' && ch != '\f') || ch == 0x7f;
}

// A line quoted in an error: short, printable.
std::string excerpt(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    auto ch = static_cast<unsigned char>(s[i]);
    out += (ch >= 0x20 && ch < 0x7f) ? char(ch) : '?';
  }
  if (s.size() > kMax) out += "...";
  return "'" + out + "'";
}

bool is_name_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
         ch == '-' || ch == '.';
}

bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char ch : s)
    if (!is_name_char(ch)) return false;
  return true;
}

}  // namespace

CfgFile parse_cfg_text(const std::string& text, const std::string& path) {
  if (text.size() > kMaxCfgBytes)
    throw Error(path + ": " + std::to_string(text.size()) + " bytes, over the 16 MiB limit for a cfg file");
  CfgFile cfg;
  cfg.path = path;
  std::string_view rest(text);
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);  // UTF-8 byte order mark
  // Keys of the current section -> line, to find repeats without a quadratic scan.
  std::unordered_map<std::string, int> seen;
  for (int line_no = 1; !rest.empty(); ++line_no) {
    size_t end = rest.find('\n');
    std::string_view raw = rest.substr(0, end);
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
    for (size_t i = 0; i < raw.size(); ++i)
      if (is_binary_byte(static_cast<unsigned char>(raw[i])))
        fail(path, line_no, "binary data, not a cfg file (byte " + std::to_string(int(static_cast<unsigned char>(raw[i]))) +
                                " in column " + std::to_string(i + 1) + ")");
    std::string_view line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      line = trim(line.substr(0, line.find_first_of("#;")));  // a trailing comment
      std::string_view name = line.back() == ']' ? trim(line.substr(1, line.size() - 2)) : std::string_view{};
      if (!is_name(name))
        fail(path, line_no, "malformed section header " + excerpt(line) + " (expected [name], e.g. [convolutional])");
      cfg.sections.push_back({lower(name), line_no, {}});
      seen.clear();
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos)
      fail(path, line_no, "expected a [section] header, key=value or a comment, got " + excerpt(line));
    std::string_view key = trim(line.substr(0, eq));
    if (!is_name(key)) fail(path, line_no, "malformed option name in " + excerpt(line));
    std::string_view value = line.substr(eq + 1);
    value = trim(value.substr(0, value.find_first_of("#;")));  // a trailing comment
    std::string key_lower = lower(key);
    if (value.empty()) fail(path, line_no, "option '" + key_lower + "' has no value");
    if (cfg.sections.empty())
      fail(path, line_no, "option '" + key_lower + "' comes before any [section] header");
    auto [it, fresh] = seen.emplace(key_lower, line_no);
    if (!fresh) {
      // darknet's option_find returns the first match: the later lines are never read.
      std::string first;
      for (const CfgOption& option : cfg.sections.back().options)
        if (option.key == key_lower) first = option.value;
      std::string hint = key_lower == "batch" || key_lower == "subdivisions"
                             ? " (to train with another, pass --" + key_lower + ")"
                             : "";
      cfg.warnings.push_back(path + ":" + std::to_string(line_no) + ": option '" + key_lower + "' repeated in [" +
                             cfg.sections.back().type + "] (first at line " + std::to_string(it->second) +
                             "): the first value counts, as in darknet: " + key_lower + "=" + first + " is used, " +
                             key_lower + "=" + std::string(value) + " ignored" + hint);
      continue;
    }
    cfg.sections.back().options.push_back({std::move(key_lower), std::string(value), line_no});
  }
  return cfg;
}

CfgFile read_cfg_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(path + ": is a directory, not a cfg file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open cfg file (" + std::strerror(errno) + ")");
  // Read at most one byte past the limit: enough to know a file is too big, whatever stat says.
  std::string text(kMaxCfgBytes + 1, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  if (in.bad()) throw Error(path + ": read error");
  text.resize(size_t(in.gcount()));
  if (text.size() > kMaxCfgBytes) throw Error(path + ": over the 16 MiB limit for a cfg file");
  return parse_cfg_text(text, path);
}

const char* layer_type_name(LayerType type) {
  switch (type) {
    case LayerType::Convolutional: return "conv";
    case LayerType::Shortcut: return "shortcut";
    case LayerType::Route: return "route";
    case LayerType::Upsample: return "upsample";
    case LayerType::Maxpool: return "max";
    case LayerType::Yolo: return "yolo";
    case LayerType::Connected: return "connected";
    case LayerType::Softmax: return "softmax";
  }
  return "?";
}

namespace {

enum class Kind { Net, Convolutional, Shortcut, Route, Upsample, Maxpool, Yolo, Connected, Softmax, Cost, Dropout };

// darknet's section names, aliases included.
std::optional<Kind> kind_of(const std::string& type) {
  static const std::pair<const char*, Kind> kNames[] = {
      {"net", Kind::Net},           {"network", Kind::Net},        {"convolutional", Kind::Convolutional},
      {"conv", Kind::Convolutional}, {"shortcut", Kind::Shortcut},  {"route", Kind::Route},
      {"upsample", Kind::Upsample}, {"maxpool", Kind::Maxpool},    {"max", Kind::Maxpool},
      {"yolo", Kind::Yolo},         {"connected", Kind::Connected}, {"conn", Kind::Connected},
      {"softmax", Kind::Softmax},   {"soft", Kind::Softmax},       {"cost", Kind::Cost},
      {"dropout", Kind::Dropout}};
  for (const auto& [name, kind] : kNames)
    if (type == name) return kind;
  return std::nullopt;
}

// Options each section accepts: those we read, and those accepted but not used (a warning).
struct KnownOptions {
  std::vector<const char*> used, unused;
};

const KnownOptions& known_options(Kind kind) {
  static const KnownOptions kNet{
      {"batch",         "subdivisions", "width",       "height",     "channels", "inputs", "momentum", "decay",
       "learning_rate", "burn_in",      "max_batches", "policy",     "steps",    "scales", "power",    "gamma",
       "step",          "scale",        "angle",       "saturation", "exposure", "hue",    "precision"},
      {"max_chart_loss", "letter_box", "flip", "adam", "b1", "b2", "eps", "mixup", "blur", "aspect", "min_crop",
       "max_crop", "random", "cutmix", "mosaic", "track", "time_steps"}};
  static const KnownOptions kConv{
      {"filters", "size", "stride", "pad", "padding", "batch_normalize", "activation", "groups", "dilation"}, {}};
  static const KnownOptions kShortcut{{"from", "activation", "weights_type", "weights_normalization"}, {}};
  static const KnownOptions kRoute{{"layers", "groups", "group_id"}, {}};
  static const KnownOptions kUpsample{{"stride"}, {}};
  static const KnownOptions kMaxpool{{"size", "stride", "padding"}, {}};
  static const KnownOptions kYolo{
      {"mask", "anchors", "classes", "num", "jitter", "ignore_thresh", "truth_thresh", "random"},
      {"scale_x_y", "iou_normalizer", "cls_normalizer", "iou_loss", "nms_kind", "beta_nms", "max_delta",
       "counters_per_class", "label_smooth_eps", "resize", "new_coords", "iou_thresh"}};
  static const KnownOptions kConnected{{"output", "activation", "batch_normalize"}, {}};
  static const KnownOptions kSoftmax{{"groups", "temperature"}, {}};
  static const KnownOptions kCost{{}, {"type"}};
  static const KnownOptions kNone{};
  switch (kind) {
    case Kind::Net: return kNet;
    case Kind::Convolutional: return kConv;
    case Kind::Shortcut: return kShortcut;
    case Kind::Route: return kRoute;
    case Kind::Upsample: return kUpsample;
    case Kind::Maxpool: return kMaxpool;
    case Kind::Yolo: return kYolo;
    case Kind::Connected: return kConnected;
    case Kind::Softmax: return kSoftmax;
    case Kind::Cost: return kCost;
    case Kind::Dropout: return kNone;
  }
  return kNone;
}

bool contains(const std::vector<const char*>& names, const std::string& key) {
  for (const char* name : names)
    if (key == name) return true;
  return false;
}

std::string join(const std::vector<const char*>& a, const std::vector<const char*>& b) {
  std::string out;
  std::set<std::string> done;
  for (const auto* list : {&a, &b})
    for (const char* name : *list)
      if (done.insert(name).second) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

// Collects "accepted but not used" warnings, one per (section kind, option).
class Warnings {
 public:
  explicit Warnings(ModelSpec& model) : model_(model) {}
  void add(Kind kind, const CfgSection& section, const CfgOption& option) {
    if (!done_.emplace(int(kind), option.key).second) return;
    model_.warnings.push_back(model_.path + ":" + std::to_string(option.line) + ": option '" + option.key + "' of [" +
                              section.type + "] is accepted but not used");
  }

 private:
  ModelSpec& model_;
  std::set<std::pair<int, std::string>> done_;
};

// Typed access to one section's options; every error names the option's line.
class Reader {
 public:
  Reader(const std::string& path, const CfgSection& section) : path_(path), section_(section) {}

  const CfgOption* find(std::string_view key) const {
    for (const CfgOption& option : section_.options)
      if (option.key == key) return &option;
    return nullptr;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  int line_of(std::string_view key) const {
    const CfgOption* option = find(key);
    return option ? option->line : section_.line;
  }

  [[noreturn]] void fail_option(std::string_view key, const std::string& why) const {
    fail(path_, line_of(key), "option '" + std::string(key) + "' of [" + section_.type + "]: " + why);
  }
  [[noreturn]] void fail_section(const std::string& why) const {
    fail(path_, section_.line, "[" + section_.type + "]: " + why);
  }

  int integer(std::string_view key, int fallback, long long lo, long long hi) const {
    const CfgOption* option = find(key);
    return option ? parse_int(key, option->value, lo, hi) : fallback;
  }
  // An option whose only supported value is `only` (e.g. groups=1).
  void require_int(std::string_view key, int only) const {
    if (integer(key, only, LLONG_MIN, LLONG_MAX) != only)
      fail_option(key, "'" + find(key)->value + "' is not supported (only " + std::to_string(only) + ")");
  }
  bool boolean(std::string_view key, bool fallback) const { return integer(key, fallback ? 1 : 0, 0, 1) != 0; }

  // A finite float; `ok` checks the range, `expect` describes it ("in [0, 1)").
  float real(std::string_view key, float fallback, bool (*ok)(double), const char* expect) const {
    const CfgOption* option = find(key);
    if (!option) return fallback;
    return parse_real(key, option->value, ok, expect);
  }

  std::string text(std::string_view key, const char* fallback) const {
    const CfgOption* option = find(key);
    return option ? lower(option->value) : fallback;
  }

  Activation activation(const char* fallback) const {
    std::string name = text("activation", fallback);
    try {
      return activation_from_name(name);
    } catch (const Error& e) {
      fail_option("activation", e.what());
    }
  }

  std::vector<int> int_list(std::string_view key, long long lo, long long hi) const {
    std::vector<int> out;
    for (std::string_view item : items(key)) out.push_back(parse_int(key, item, lo, hi));
    return out;
  }
  std::vector<float> real_list(std::string_view key, bool (*ok)(double), const char* expect) const {
    std::vector<float> out;
    for (std::string_view item : items(key)) out.push_back(parse_real(key, item, ok, expect));
    return out;
  }

 private:
  int parse_int(std::string_view key, std::string_view s, long long lo, long long hi) const {
    long long v = 0;
    auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
    bool whole = end == s.data() + s.size();
    if (err == std::errc::invalid_argument || (err == std::errc() && !whole))
      fail_option(key, excerpt(s) + " is not an integer");
    // lo/hi are clamped to int so a value that passes always fits.
    lo = std::max<long long>(lo, INT_MIN);
    hi = std::min<long long>(hi, INT_MAX);
    if (err == std::errc::result_out_of_range || v < lo || v > hi)
      fail_option(key, excerpt(s) + " is out of range (expected an integer in " + std::to_string(lo) + ".." +
                           std::to_string(hi) + ")");
    return int(v);
  }

  float parse_real(std::string_view key, std::string_view s, bool (*ok)(double), const char* expect) const {
    double v = 0;
    auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (err == std::errc::invalid_argument || end != s.data() + s.size())
      fail_option(key, excerpt(s) + " is not a number");
    if (err == std::errc::result_out_of_range || !std::isfinite(v) || std::fabs(v) > 3.0e38)
      fail_option(key, excerpt(s) + " is not a finite number in the float range");
    if (!ok(v)) fail_option(key, excerpt(s) + " is out of range (expected " + expect + ")");
    return float(v);
  }

  // The comma-separated items of a list option; none when the option is absent.
  std::vector<std::string_view> items(std::string_view key) const {
    std::vector<std::string_view> out;
    const CfgOption* option = find(key);
    if (!option) return out;
    std::string_view rest = option->value;
    while (true) {
      size_t comma = rest.find(',');
      std::string_view item = trim(rest.substr(0, comma));
      if (item.empty()) fail_option(key, "empty item in the list " + excerpt(option->value));
      out.push_back(item);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return out;
  }

  const std::string& path_;
  const CfgSection& section_;
};

bool positive(double v) { return v > 0; }
bool non_negative(double v) { return v >= 0; }
bool unit_half_open(double v) { return v >= 0 && v < 1; }
bool unit_closed(double v) { return v >= 0 && v <= 1; }
bool any_value(double) { return true; }

NetParams parse_net(const Reader& r, const CfgSection& section, Warnings& warnings, bool detector) {
  NetParams net;
  net.line = section.line;
  net.batch = r.integer("batch", net.batch, 1, 1 << 20);
  net.subdivisions = r.integer("subdivisions", net.subdivisions, 1, net.batch);
  if (net.batch % net.subdivisions != 0)
    r.fail_option("subdivisions", "batch=" + std::to_string(net.batch) + " is not a multiple of subdivisions=" +
                                      std::to_string(net.subdivisions));
  if (r.has("inputs")) {
    // darknet's flat input (MLPs): inputs=N is a 1x1 image with N channels.
    for (const char* key : {"width", "height", "channels"})
      if (r.has(key))
        r.fail_option(key, "give either inputs= (a flat input) or width/height/channels, not both");
    net.width = net.height = 1;
    net.channels = r.integer("inputs", 0, 1, 1 << 24);
  } else {
    net.width = r.integer("width", net.width, 1, 65536);
    net.height = r.integer("height", net.height, 1, 65536);
    net.channels = r.integer("channels", net.channels, 1, 65536);
    // A detector's heads are at strides up to 32; a plain classifier may take any size.
    for (const char* key : {"width", "height"})
      if (detector && r.integer(key, 32, 1, 65536) % 32 != 0)
        r.fail_option(key, r.find(key)->value + " is not a multiple of 32 (the network's total stride)");
  }
  net.momentum = r.real("momentum", net.momentum, unit_half_open, "in [0, 1)");
  net.decay = r.real("decay", net.decay, non_negative, ">= 0");
  net.learning_rate = r.real("learning_rate", net.learning_rate, positive, "> 0");
  net.burn_in = r.integer("burn_in", net.burn_in, 0, INT_MAX);
  net.max_batches = r.integer("max_batches", net.max_batches, 0, INT_MAX);
  if (const std::string precision = r.text("precision", ""); !precision.empty()) {
    try {
      net.precision = parse_precision_choice(precision, "precision");
    } catch (const Error&) {
      r.fail_option("precision", "'" + precision + "' is not auto, fp32, tf32, bf16 or fp16");
    }
  }
  using Policy = NetParams::Policy;
  static const std::pair<const char*, Policy> kPolicies[] = {
      {"constant", Policy::Constant}, {"steps", Policy::Steps},     {"step", Policy::Step},    {"exp", Policy::Exp},
      {"poly", Policy::Poly},         {"sigmoid", Policy::Sigmoid}, {"random", Policy::Random}};
  const std::string policy = r.text("policy", "constant");
  bool known_policy = false;
  for (const auto& [name, value] : kPolicies)
    if (policy == name) {
      net.policy = value;
      known_policy = true;
    }
  if (!known_policy)
    r.fail_option("policy", "'" + policy + "' is not a policy (constant, steps, step, exp, poly, sigmoid, random)");
  net.steps = r.int_list("steps", 0, INT_MAX);
  for (size_t i = 1; i < net.steps.size(); ++i)
    if (net.steps[i] <= net.steps[i - 1]) r.fail_option("steps", "must be increasing");
  net.scales = r.real_list("scales", positive, "> 0");
  if (net.policy == Policy::Steps) {
    if (net.steps.empty()) r.fail_section("policy=steps needs steps= (and scales=)");
    if (net.scales.size() != net.steps.size())
      r.fail_option("scales", std::to_string(net.scales.size()) + " scales for " + std::to_string(net.steps.size()) +
                                  " steps (need one each)");
  }
  net.power = r.real("power", net.power, non_negative, ">= 0");
  net.gamma = net.policy == Policy::Exp ? r.real("gamma", net.gamma, positive, "> 0 (the rate is lr * gamma^iteration)")
                                        : r.real("gamma", net.gamma, any_value, "");
  net.step = r.integer("step", net.step, 1, INT_MAX);
  net.scale = r.real("scale", net.scale, positive, "> 0");
  // Options this policy does not read: accepted, with a warning (darknet ignores them too).
  const bool uses_power = net.burn_in > 0 || net.policy == Policy::Poly || net.policy == Policy::Random;
  const std::pair<const char*, bool> read[] = {{"steps", net.policy == Policy::Steps},
                                               {"scales", net.policy == Policy::Steps},
                                               {"power", uses_power},
                                               {"gamma", net.policy == Policy::Exp || net.policy == Policy::Sigmoid},
                                               {"step", net.policy == Policy::Step || net.policy == Policy::Sigmoid},
                                               {"scale", net.policy == Policy::Step}};
  for (const CfgOption& option : section.options)  // in file order
    for (const auto& [key, used] : read)
      if (option.key == key && !used) warnings.add(Kind::Net, section, option);
  net.angle = r.real("angle", net.angle, [](double v) { return v >= 0 && v <= 180; }, "in [0, 180]");
  net.saturation = r.real("saturation", net.saturation, positive, "> 0");
  net.exposure = r.real("exposure", net.exposure, positive, "> 0");
  net.hue = r.real("hue", net.hue, unit_closed, "in [0, 1]");
  return net;
}

LayerSpec parse_convolutional(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Convolutional;
  l.filters = r.integer("filters", 1, 1, 65536);
  l.size = r.integer("size", 1, 1, 15);
  if (l.size % 2 == 0) r.fail_option("size", "size=" + std::to_string(l.size) + " is even (only odd sizes are supported)");
  l.stride = r.integer("stride", 1, 1, 8);
  // darknet: pad=1 means padding = size/2 and overrides padding=; our kernels do only that.
  bool pad = r.boolean("pad", false);
  int padding = r.integer("padding", pad ? l.size / 2 : 0, 0, 15);
  if (pad && padding != l.size / 2)
    r.fail_option("padding", "conflicts with pad=1 (which means padding = size/2 = " + std::to_string(l.size / 2) + ")");
  if (padding != l.size / 2)
    r.fail_option(r.has("padding") ? "padding" : "pad", "only 'same' padding (pad=1) is supported");
  l.pad = padding;
  l.batch_normalize = r.boolean("batch_normalize", false);
  l.activation = r.activation("logistic");  // darknet's default for [convolutional]
  r.require_int("groups", 1);
  r.require_int("dilation", 1);
  return l;
}

LayerSpec parse_shortcut(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Shortcut;
  if (!r.has("from")) r.fail_section("missing from= (the layer to add)");
  l.from = r.integer("from", 0, -kMaxIndex, kMaxIndex);
  if (l.from == 0) r.fail_option("from", "must be nonzero");
  if (r.activation("linear") != Activation::Linear)
    r.fail_option("activation", "only activation=linear is supported for [shortcut]");
  l.activation = Activation::Linear;
  for (const char* key : {"weights_type", "weights_normalization"})
    if (r.text(key, "none") != "none") r.fail_option(key, "weighted shortcuts are not supported (only none)");
  return l;
}

LayerSpec parse_route(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Route;
  l.layers = r.int_list("layers", -kMaxIndex, kMaxIndex);
  if (l.layers.empty()) r.fail_section("missing layers= (1 to 4 layer indices)");
  if (l.layers.size() > 4) r.fail_option("layers", "at most 4 layers can be joined");
  r.require_int("groups", 1);
  r.require_int("group_id", 0);
  return l;
}

LayerSpec parse_upsample(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Upsample;
  l.stride = r.integer("stride", 2, 1, 8);
  return l;
}

LayerSpec parse_maxpool(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Maxpool;
  l.stride = r.integer("stride", 1, 1, 8);
  l.size = r.integer("size", l.stride, 1, 15);
  // Our maxpool pads like darknet's default: size - 1 cells in all (see kernels/maxpool.h).
  l.pad = l.size - 1;
  if (r.integer("padding", l.pad, 0, 15) != l.pad)
    r.fail_option("padding", "only padding = size-1 (darknet's default) is supported");
  return l;
}

LayerSpec parse_yolo(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Yolo;
  l.num = r.integer("num", 1, 1, 1024);
  l.classes = r.integer("classes", l.classes, 1, 65536);
  if (!r.has("anchors")) r.fail_section("missing anchors= (num (w, h) pairs)");
  l.anchors = r.real_list("anchors", [](double v) { return v > 0 && v <= 65536; }, "in (0, 65536]");
  if (l.anchors.size() != size_t(2) * size_t(l.num))
    r.fail_option("anchors", std::to_string(l.anchors.size()) + " numbers, need 2*num = " + std::to_string(2 * l.num) +
                                 " (a width and a height per anchor)");
  if (r.has("mask")) {
    l.mask = r.int_list("mask", 0, l.num - 1);
    std::set<int> distinct(l.mask.begin(), l.mask.end());
    if (distinct.size() != l.mask.size()) r.fail_option("mask", "repeats an anchor index");
  } else {
    for (int i = 0; i < l.num; ++i) l.mask.push_back(i);
  }
  l.jitter = r.real("jitter", l.jitter, unit_half_open, "in [0, 1)");
  l.ignore_thresh = r.real("ignore_thresh", l.ignore_thresh, unit_closed, "in [0, 1]");
  l.truth_thresh = r.real("truth_thresh", l.truth_thresh, unit_closed, "in [0, 1]");
  l.random = r.boolean("random", false);
  if (r.real("scale_x_y", 1.0f, any_value, "") != 1.0f)
    r.fail_option("scale_x_y", "only 1 (no grid-sensitivity scaling) is supported");
  return l;
}

LayerSpec parse_connected(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Connected;
  l.output = r.integer("output", 1, 1, 1 << 24);
  l.activation = r.activation("logistic");  // darknet's default for [connected]
  if (r.boolean("batch_normalize", false))
    r.fail_option("batch_normalize", "batch normalization is not supported in [connected]");
  return l;
}

LayerSpec parse_softmax(const Reader& r) {
  LayerSpec l;
  l.type = LayerType::Softmax;
  r.require_int("groups", 1);
  l.groups = 1;
  if (r.real("temperature", 1.0f, any_value, "") != 1.0f) r.fail_option("temperature", "only 1 is supported");
  return l;
}

}  // namespace

ModelSpec parse_model(const CfgFile& cfg) {
  ModelSpec model;
  model.path = cfg.path;
  model.warnings = cfg.warnings;
  Warnings warnings(model);
  if (cfg.sections.empty()) throw Error(cfg.path + ": no sections; a cfg starts with [net]");
  const CfgSection* previous = nullptr;
  for (const CfgSection& section : cfg.sections) {
    std::optional<Kind> kind = kind_of(section.type);
    if (!kind) {
      // darknet's other layer types (parser.c, string_to_layer_type): known, not implemented here.
      static const char* const kDarknetOnly[] = {
          "avg",        "avgpool",  "crop",   "detection", "region", "reorg", "local", "deconv", "deconvolutional",
          "activation", "logistic", "l2norm", "crnn",      "gru",    "lstm",  "rnn",   "lrn",    "normalization",
          "batchnorm",  "iseg"};
      for (const char* name : kDarknetOnly)
        if (section.type == name)
          fail(cfg.path, section.line,
               "[" + section.type + "] is a darknet layer this trainer does not implement (docs/darknet-compat.md)");
      fail(cfg.path, section.line, "unknown section [" + section.type + "]");
    }
    bool first = previous == nullptr;
    if (first != (*kind == Kind::Net))
      fail(cfg.path, section.line,
           first ? "the first section must be [net] or [network], got [" + section.type + "]"
                 : "[" + section.type + "] may appear only once, as the first section (the first is at line " +
                       std::to_string(cfg.sections.front().line) + ")");
    if (*kind == Kind::Dropout) fail(cfg.path, section.line, "[dropout] is not supported");
    if (*kind == Kind::Cost && !(previous && kind_of(previous->type) == Kind::Softmax))
      fail(cfg.path, section.line, "[cost] is supported only directly after [softmax]");

    const KnownOptions& known = known_options(*kind);
    for (const CfgOption& option : section.options) {
      if (contains(known.unused, option.key)) warnings.add(*kind, section, option);
      else if (!contains(known.used, option.key))
        fail(cfg.path, option.line, "unknown option '" + option.key + "' in [" + section.type + "] (known: " +
                                        join(known.used, known.unused) + ")");
    }

    Reader r(cfg.path, section);
    switch (*kind) {
      case Kind::Net: {
        bool detector = std::any_of(cfg.sections.begin(), cfg.sections.end(),
                                    [](const CfgSection& s) { return s.type == "yolo"; });
        model.net = parse_net(r, section, warnings, detector);
        break;
      }
      case Kind::Convolutional: model.layers.push_back(parse_convolutional(r)); break;
      case Kind::Shortcut: model.layers.push_back(parse_shortcut(r)); break;
      case Kind::Route: model.layers.push_back(parse_route(r)); break;
      case Kind::Upsample: model.layers.push_back(parse_upsample(r)); break;
      case Kind::Maxpool: model.layers.push_back(parse_maxpool(r)); break;
      case Kind::Yolo: model.layers.push_back(parse_yolo(r)); break;
      case Kind::Connected: model.layers.push_back(parse_connected(r)); break;
      case Kind::Softmax: model.layers.push_back(parse_softmax(r)); break;
      case Kind::Cost:
        // Folded into the [softmax] before it (whose loss is cross-entropy); only sse is accepted.
        if (r.text("type", "sse") != "sse") r.fail_option("type", "only type=sse is accepted");
        break;
      case Kind::Dropout: break;  // rejected above
    }
    if (*kind != Kind::Net && *kind != Kind::Cost) model.layers.back().line = section.line;
    previous = &section;
  }
  if (model.layers.empty()) fail(cfg.path, model.net.line, "no layers after [" + cfg.sections.front().type + "]");
  return model;
}

ModelSpec read_model(const std::string& path) { return parse_model(read_cfg_file(path)); }

}  // namespace yolo::graph
