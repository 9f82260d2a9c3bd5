// Shared pieces of the dataset readers: box checks, names files, YOLO text labels, the
// image -> label path rule, the final per-split checks, and format detection.
#include "data/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/verify.h"
#include "runtime/check.h"

namespace fs = std::filesystem;

namespace yolo::data {

LabelCounts& LabelCounts::operator+=(const LabelCounts& o) {
  images += o.images;
  boxes += o.boxes;
  missing_label_files += o.missing_label_files;
  clipped_boxes += o.clipped_boxes;
  empty_boxes += o.empty_boxes;
  boxes_over_limit += o.boxes_over_limit;
  difficult_boxes += o.difficult_boxes;
  missing_images += o.missing_images;
  polygon_rows += o.polygon_rows;
  return *this;
}

std::string LabelCounts::summary() const {
  std::ostringstream out;
  out << images << " images, " << boxes << " boxes";
  auto add = [&](int64_t n, const char* what) {
    if (n) out << ", " << n << " " << what;
  };
  add(difficult_boxes, "difficult");
  add(missing_label_files, "without a label file (background)");
  add(missing_images, "images missing (left out)");
  add(clipped_boxes, "boxes clipped to the image");
  add(empty_boxes, "empty boxes dropped");
  add(boxes_over_limit, "boxes beyond 90 per image dropped");
  add(polygon_rows, "polygon rows read as their bounding boxes");
  return out.str();
}

const char* format_name(Format format) {
  switch (format) {
    case Format::Darknet: return "darknet";
    case Format::Folders: return "folders";
    case Format::Voc: return "voc";
    case Format::Coco: return "coco";
  }
  return "?";
}

Format parse_format(const std::string& name) {
  for (Format f : {Format::Darknet, Format::Folders, Format::Voc, Format::Coco})
    if (name == format_name(f)) return f;
  throw Error("unknown dataset format '" + name + "' (choose darknet, folders, voc or coco)");
}

void add_normalized_box(Sample& sample, Box box, int classes, const std::string& where, LabelCounts& counts) {
  if (!std::isfinite(box.x) || !std::isfinite(box.y) || !std::isfinite(box.w) || !std::isfinite(box.h))
    throw ItemError("malformed label file", where + ": box coordinates are not finite numbers");
  if (box.class_id < 0 || box.class_id >= classes)
    throw ItemError("unknown class", where + ": class id " + std::to_string(box.class_id) + " is outside [0, " +
                                         std::to_string(classes) + ") (the dataset has " + std::to_string(classes) +
                                         " classes)");
  auto far = [](float v) { return v < -kFarOutside || v > 1 + kFarOutside; };
  if (far(box.x) || far(box.y) || far(box.w) || far(box.h) || box.w < 0 || box.h < 0) {
    std::ostringstream msg;
    msg << where << ": box (" << box.x << " " << box.y << " " << box.w << " " << box.h
        << ") is far outside [0, 1]: coordinates must be normalised by the image size (pixel coordinates given by "
           "mistake?)";
    throw ItemError("box outside the image", msg.str());
  }
  float x0 = box.x - box.w / 2, x1 = box.x + box.w / 2, y0 = box.y - box.h / 2, y1 = box.y + box.h / 2;
  float cx0 = std::clamp(x0, 0.0f, 1.0f), cx1 = std::clamp(x1, 0.0f, 1.0f);
  float cy0 = std::clamp(y0, 0.0f, 1.0f), cy1 = std::clamp(y1, 0.0f, 1.0f);
  if (cx1 <= cx0 || cy1 <= cy0) {
    ++counts.empty_boxes;
    return;
  }
  constexpr float kRounding = 1e-6f;  // clipping below this is float noise, not worth a count
  if (std::abs(cx0 - x0) > kRounding || std::abs(cx1 - x1) > kRounding || std::abs(cy0 - y0) > kRounding ||
      std::abs(cy1 - y1) > kRounding) {
    ++counts.clipped_boxes;
    box.x = (cx0 + cx1) / 2;
    box.y = (cy0 + cy1) / 2;
    box.w = cx1 - cx0;
    box.h = cy1 - cy0;
  }
  if (static_cast<int>(sample.boxes.size()) >= kMaxBoxes) {
    ++counts.boxes_over_limit;
    return;
  }
  if (box.difficult) ++counts.difficult_boxes;
  sample.boxes.push_back(box);
}

std::string beyond_image(double x0, double y0, double x1, double y1, double width, double height,
                         const EdgeWords& words) {
  const double slack_x = width * kFarOutside, slack_y = height * kFarOutside;
  std::vector<std::pair<const char*, const std::string*>> crossed;
  if (x0 < -slack_x) crossed.push_back({"left", &words.left});
  if (x1 > width + slack_x) crossed.push_back({"right", &words.right});
  if (y0 < -slack_y) crossed.push_back({"top", &words.top});
  if (y1 > height + slack_y) crossed.push_back({"bottom", &words.bottom});
  if (crossed.empty()) return "";
  const bool overlaps = x0 < width && x1 > 0 && y0 < height && y1 > 0;
  std::string text = overlaps ? "extends past the image's " : "lies entirely outside the image, past its ";
  for (size_t i = 0; i < crossed.size(); ++i)
    text += std::string(i ? " and its " : "") + crossed[i].first + " edge (" + *crossed[i].second + ")";
  return text;
}

static std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> read_names_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open names file " + path + ": " + std::strerror(errno));
  std::vector<std::string> names;
  std::vector<int> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::string name = trim(line);
    if (name.empty()) continue;
    if (name.size() > 256 || name.find('\0') != std::string::npos)
      throw Error(path + ":" + std::to_string(number) + ": not a class name (binary data or over 256 characters)");
    auto it = std::find(names.begin(), names.end(), name);
    if (it != names.end())
      throw Error(path + ":" + std::to_string(number) + ": class name '" + name + "' repeats line " +
                  std::to_string(lines[it - names.begin()]));
    names.push_back(name);
    lines.push_back(number);
  }
  if (names.empty()) throw Error("names file " + path + " has no class names (one per line)");
  return names;
}

// Parses a whole token as a float or an int; false if anything is left over.
static bool parse_float(const std::string& token, float& value) {
  char* end = nullptr;
  errno = 0;
  value = std::strtof(token.c_str(), &end);
  return end != token.c_str() && *end == '\0' && errno != ERANGE;
}

static bool parse_int(const std::string& token, int& value) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(token.c_str(), &end, 10);
  if (end == token.c_str() || *end != '\0' || errno == ERANGE || v < -1000000000L || v > 1000000000L) return false;
  value = static_cast<int>(v);
  return true;
}

namespace {

// A polygon row's bounds as a darknet box (class x_center y_center width height): the points
// are tokens[1..], x y pairs, normalised like a box's.
Box polygon_bounds(const std::vector<std::string>& tokens, const std::string& where) {
  float x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  for (size_t k = 1; k < tokens.size(); ++k) {
    float v = 0;
    if (!parse_float(tokens[k], v) || !std::isfinite(v))
      throw ItemError("malformed label file", where + ": '" + tokens[k] + "' is not a number (a polygon row: class x1 y1 "
                                                       "x2 y2 x3 y3 ...)");
    const bool is_x = k % 2 == 1;
    float& lo = is_x ? x0 : y0;
    float& hi = is_x ? x1 : y1;
    if (k <= 2 || v < lo) lo = v;
    if (k <= 2 || v > hi) hi = v;
  }
  Box box;
  box.x = (x0 + x1) / 2;
  box.y = (y0 + y1) / 2;
  box.w = x1 - x0;
  box.h = y1 - y0;
  return box;
}

}  // namespace

void parse_yolo_labels(const std::string& text, const std::string& file, int classes, Sample& sample,
                       LabelCounts& counts) {
  // A UTF-8 byte-order mark (Windows editors write one) is not part of the first row.
  const bool bom = text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0;
  std::istringstream in(bom ? text.substr(3) : text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::string where = file + ":" + std::to_string(number);
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> tokens;
    for (std::string t; fields >> t && tokens.size() <= kMaxPolygonValues;) tokens.push_back(t);
    if (tokens.empty()) continue;
    // class x1 y1 x2 y2 x3 y3 ... (segmentation sets): a polygon of three or more points, whose
    // bounds are the box.
    const bool polygon = tokens.size() >= 7 && tokens.size() % 2 == 1 && tokens.size() <= kMaxPolygonValues;
    if (tokens.size() != 5 && !polygon)
      throw ItemError("malformed label file",
                      where + ": expected 5 values 'class x_center y_center width height' (or a polygon: class x1 y1 "
                              "x2 y2 x3 y3 ..., an odd count of 7 or more), found " +
                          (tokens.size() > kMaxPolygonValues ? "more than " + std::to_string(kMaxPolygonValues)
                                                             : std::to_string(tokens.size())));
    Box box;
    if (!parse_int(tokens[0], box.class_id))
      throw ItemError("malformed label file", where + ": class id '" + tokens[0] + "' is not an integer");
    if (polygon) {
      const int class_id = box.class_id;
      box = polygon_bounds(tokens, where);
      box.class_id = class_id;
      ++counts.polygon_rows;
    } else {
      float* coords[4] = {&box.x, &box.y, &box.w, &box.h};
      for (int k = 0; k < 4; ++k)
        if (!parse_float(tokens[k + 1], *coords[k]))
          throw ItemError("malformed label file", where + ": '" + tokens[k + 1] + "' is not a number");
    }
    add_normalized_box(sample, box, classes, where, counts);
  }
}

std::string label_path_for_image(const std::string& image_path) {
  // The last folder named images (or VOC's JPEGImages) becomes labels, as darknet does.
  std::string path = "/" + image_path;
  for (const std::string from : {"/images/", "/JPEGImages/"}) {
    if (size_t at = path.rfind(from); at != std::string::npos) {
      path.replace(at, from.size(), "/labels/");
      break;
    }
  }
  path.erase(0, 1);
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) path.resize(dot);
  return path + ".txt";
}

void read_yolo_label_file(const std::string& label_path, int classes, Sample& sample, LabelCounts& counts) {
  std::error_code ec;
  if (!fs::exists(label_path, ec)) {
    ++counts.missing_label_files;
    return;
  }
  std::ifstream in(label_path, std::ios::binary);
  if (!in) throw ItemError("unreadable label file", label_path + ": cannot be read (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  parse_yolo_labels(text.str(), label_path, classes, sample, counts);
}

void add_labelled_sample(Sample sample, const std::string& label_path, int classes, Split& split) {
  LabelCounts counts;
  try {
    read_yolo_label_file(label_path, classes, sample, counts);
  } catch (const ItemError& e) {
    split.problems.push_back({e.kind(), e.what()});
    return;
  }
  split.counts += counts;
  split.samples.push_back(std::move(sample));
}

std::string resolve_listed_path(const std::string& path, const std::string& base_dir) {
  std::error_code ec;
  if (path.empty() || path[0] == '/' || fs::exists(path, ec) || base_dir.empty()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

int64_t Split::left_out() const {
  int64_t n = 0;
  for (const Problem& p : problems) n += p.item ? 1 : 0;
  return n;
}

void finish_split(Split& split, const std::string& source, const OpenOptions& options,
                  std::vector<std::string>& warnings) {
  (void)source;
  (void)warnings;
  std::vector<Sample> kept;
  kept.reserve(split.samples.size());
  for (Sample& sample : split.samples) {
    std::error_code ec;
    if (fs::is_regular_file(sample.image, ec))
      kept.push_back(std::move(sample));
    else
      split.problems.push_back({"missing image", sample.image + ": does not exist"});
  }
  split.samples = std::move(kept);
  split.counts.missing_images = std::count_if(split.problems.begin(), split.problems.end(),
                                              [](const Problem& p) { return p.kind == "missing image"; });
  if (options.verify_images) verify_images(split, options);
  split.counts.images = static_cast<int64_t>(split.samples.size());
  split.counts.boxes = 0;
  for (const Sample& s : split.samples) split.counts.boxes += static_cast<int64_t>(s.boxes.size());
}

// The format of a directory, by what it contains.
static Format detect_directory(const fs::path& dir) {
  std::error_code ec;
  int data_files = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".data") ++data_files;
  if (data_files == 1) return Format::Darknet;
  for (const auto& entry : fs::directory_iterator(dir / "annotations", ec))
    if (entry.path().filename().string().rfind("instances_", 0) == 0 && entry.path().extension() == ".json")
      return Format::Coco;
  if (fs::is_directory(dir / "train" / "annotations", ec)) return Format::Voc;
  for (const char* images : {"images", "train/images"})
    if (fs::is_directory(dir / images, ec)) return Format::Folders;
  throw Error(dir.string() +
              ": not a dataset this program recognises; expected one of: a darknet .data file (or a folder with "
              "exactly one), a COCO folder with annotations/instances_*.json, a VOC folder with train/annotations/, "
              "or a folder with images/ and labels/ (optionally split into train/ and val/)");
}

Dataset open_dataset(const std::string& path, const OpenOptions& options) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("--data " + path + ": no such file or directory");
  Format format = options.format;
  if (!options.force_format) {
    fs::path p(path);
    if (fs::is_directory(p, ec)) {
      format = detect_directory(p);
    } else if (p.extension() == ".data") {
      format = Format::Darknet;
    } else if (p.extension() == ".json") {
      format = Format::Coco;
    } else {
      throw Error("--data " + path + ": expected a darknet .data file, a COCO .json file or a dataset folder");
    }
  }
  Dataset dataset;
  if (format == Format::Darknet) {
    std::string file = path;
    if (fs::is_directory(path, ec))
      for (const auto& entry : fs::directory_iterator(path, ec))
        if (entry.path().extension() == ".data") file = entry.path().string();
    dataset = read_darknet(file, options);
  } else if (format == Format::Folders) {
    dataset = read_folders(path, options);
  } else if (format == Format::Voc) {
    dataset = read_voc(path, options);
  } else {
    dataset = read_coco(path, options);
  }
  dataset.format = format;
  dataset.source = path;
  dataset.train.name = "train";
  dataset.valid.name = "valid";
  OpenOptions finishing = options;
  if (finishing.cache_file.empty()) finishing.cache_file = default_verify_cache(path);
  finish_split(dataset.train, path, finishing, dataset.warnings);
  finish_split(dataset.valid, path, finishing, dataset.warnings);
  for (const Split* split : {&dataset.train, &dataset.valid})
    if (split->counts.missing_label_files && options.strict)
      throw Error(path + ": " + std::to_string(split->counts.missing_label_files) +
                  " images have no label file (--strict)");
  return dataset;
}

}  // namespace yolo::data
