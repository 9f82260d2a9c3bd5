// Pascal VOC as imageai lays it out: ROOT/train/{images,annotations/*.xml} and optionally the
// same under ROOT/validation/ (or val/, valid/); one XML file per image, class names by name.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "data/dataset.h"
#include "data/image.h"
#include "data/xml.h"
#include "runtime/check.h"
#include "runtime/plural.h"

namespace fs = std::filesystem;

namespace yolo::data {

namespace {

struct VocObject {
  std::string name;
  int name_line = 0;
  int line = 0;  // of <object>
  bool difficult = false;
  double xmin = 0, ymin = 0, xmax = 0, ymax = 0;
};

// One annotation file, read and checked before class ids are known (they may be collected
// from every file first).
struct VocFile {
  std::string xml_path;
  int64_t position = 0;  // 1-based, among the split's annotation files sorted by name
  std::string image;
  double width = 0, height = 0;  // 0: unknown (no <size> and no image to read it from)
  int size_line = 0;             // of <size>, 0 when the size came from the image
  std::vector<VocObject> objects;
};

struct VocSplit {
  std::string dir;  // ROOT/train etc.
  std::vector<VocFile> files;
  std::vector<Problem> problems;  // annotation files left out
};

std::string at(const std::string& file, int line) { return file + ":" + std::to_string(line); }

const XmlElement& required_child(const XmlElement& parent, std::string_view name, const std::string& file) {
  const XmlElement* child = parent.child(name);
  if (!child)
    throw Error(at(file, parent.line) + ": <" + parent.name + "> has no <" + std::string(name) + "> element");
  return *child;
}

double number_in(const XmlElement& element, const std::string& file) {
  std::string_view text = element.trimmed_text();
  double value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    throw Error(at(file, element.line) + ": <" + element.name + "> is '" + std::string(text) +
                "', expected a number");
  return value;
}

bool file_exists(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// <filename> as written if that file exists; otherwise, when it has no extension, with each
// image extension; otherwise the XML file's own name with each image extension. When nothing
// exists the <filename> path is kept, and the missing image is reported with the others.
std::string find_image(const fs::path& images_dir, const XmlElement* filename, const fs::path& xml_path) {
  static const char* const kExtensions[] = {".jpg", ".jpeg", ".png", ".bmp", ".JPG", ".JPEG", ".PNG", ".BMP"};
  std::string given = filename ? std::string(filename->trimmed_text()) : std::string();
  std::vector<fs::path> candidates;
  if (!given.empty()) {
    candidates.push_back(images_dir / given);
    if (!fs::path(given).has_extension())
      for (const char* ext : kExtensions) candidates.push_back(images_dir / (given + ext));
  }
  for (const char* ext : kExtensions) candidates.push_back(images_dir / (xml_path.stem().string() + ext));
  for (const fs::path& candidate : candidates)
    if (file_exists(candidate)) return candidate.string();
  return given.empty() ? candidates.front().string() : (images_dir / given).string();
}

VocObject read_object(const XmlElement& object, const std::string& file) {
  VocObject o;
  o.line = object.line;
  const XmlElement& name = required_child(object, "name", file);
  o.name = std::string(name.trimmed_text());
  o.name_line = name.line;
  if (o.name.empty()) throw Error(at(file, name.line) + ": <name> is empty (the object's class name)");
  if (const XmlElement* difficult = object.child("difficult")) {
    std::string_view flag = difficult->trimmed_text();
    if (flag != "0" && flag != "1")
      throw Error(at(file, difficult->line) + ": <difficult> is '" + std::string(flag) + "', expected 0 or 1");
    o.difficult = flag == "1";
  }
  const XmlElement& box = required_child(object, "bndbox", file);
  o.xmin = number_in(required_child(box, "xmin", file), file);
  o.ymin = number_in(required_child(box, "ymin", file), file);
  o.xmax = number_in(required_child(box, "xmax", file), file);
  o.ymax = number_in(required_child(box, "ymax", file), file);
  if (o.xmax < o.xmin || o.ymax < o.ymin)
    throw ItemError("box with swapped corners",
                    at(file, box.line) + ": the box has xmax < xmin or ymax < ymin (corners swapped?)");
  return o;
}

VocFile read_annotation(const fs::path& xml_path, const fs::path& images_dir) {
  VocFile f;
  f.xml_path = xml_path.string();
  const std::string& file = f.xml_path;
  XmlElement root = read_xml_file(file);
  if (root.name != "annotation")
    throw Error(at(file, root.line) + ": the root element is <" + root.name + ">, expected <annotation> (Pascal VOC)");
  f.image = find_image(images_dir, root.child("filename"), xml_path);
  const XmlElement* size = root.child("size");
  if (size) {
    const XmlElement* width = size->child("width");
    const XmlElement* height = size->child("height");
    if (width) f.width = number_in(*width, file);
    if (height) f.height = number_in(*height, file);
    if (f.width < 0 || f.height < 0)
      throw Error(at(file, size->line) + ": negative image size in <size>");
    f.size_line = size->line;
  }
  if ((f.width == 0 || f.height == 0) && file_exists(f.image)) {
    // Some tools leave <size> out or write 0 there; the image header has the truth.
    int w = 0, h = 0;
    std::string why;
    if (!read_image_size(f.image, w, h, why))
      throw Error(at(file, size ? size->line : root.line) + ": no usable <size> and the image size cannot be read: " +
                  why);
    f.width = w;
    f.height = h;
  }
  for (const XmlElement& child : root.children)
    if (child.name == "object") f.objects.push_back(read_object(child, file));
  return f;
}

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

bool is_xml_file(const fs::path& path) { return lower_extension(path) == ".xml"; }

bool is_image_file(const fs::path& path) {
  const std::string ext = lower_extension(path);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp";
}

// imageai's convention: an image without an annotation file is not part of the set. Each one is
// reported (nothing is left out: it was never in), so that a lost XML file does not go unnoticed.
// An image counts as annotated when an XML file has its name (stem) or an annotation names it.
void report_unannotated(const fs::path& images, const std::vector<fs::path>& xml_files, VocSplit& split) {
  std::set<std::string> stems, named;
  for (const fs::path& xml : xml_files) stems.insert(xml.stem().string());
  for (const VocFile& f : split.files) named.insert(f.image);
  std::vector<fs::path> unannotated;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(images, ec))
    if (entry.is_regular_file(ec) && is_image_file(entry.path()) && !stems.count(entry.path().stem().string()) &&
        !named.count(entry.path().string()))
      unannotated.push_back(entry.path());
  if (ec) throw Error("Pascal VOC: cannot list " + images.string() + ": " + ec.message());
  std::sort(unannotated.begin(), unannotated.end());
  for (const fs::path& image : unannotated)
    split.problems.push_back({"image without annotation",
                              image.string() + ": no annotation file (" +
                                  (images.parent_path() / "annotations" / (image.stem().string() + ".xml")).string() +
                                  ", or one whose <filename> names it): not part of the set, as in imageai",
                              false});
}

VocSplit read_split(const fs::path& dir) {
  VocSplit split;
  split.dir = dir.string();
  fs::path annotations = dir / "annotations", images = dir / "images";
  std::error_code ec;
  for (const fs::path& needed : {annotations, images})
    if (!fs::is_directory(needed, ec))
      throw Error("Pascal VOC: " + needed.string() + " is missing (expected " + dir.string() +
                  "/images/ and " + dir.string() + "/annotations/*.xml)");
  std::vector<fs::path> xml_files;
  for (const auto& entry : fs::directory_iterator(annotations, ec))
    if (entry.is_regular_file(ec) && is_xml_file(entry.path())) xml_files.push_back(entry.path());
  if (ec) throw Error("Pascal VOC: cannot list " + annotations.string() + ": " + ec.message());
  if (xml_files.empty()) throw Error("Pascal VOC: no .xml annotation files in " + annotations.string());
  std::sort(xml_files.begin(), xml_files.end());
  // One file's problem leaves that item out; the others are read (every problem reported at once).
  for (size_t i = 0; i < xml_files.size(); ++i) {
    try {
      split.files.push_back(read_annotation(xml_files[i], images));
      split.files.back().position = static_cast<int64_t>(i) + 1;
    } catch (const ItemError& e) {
      split.problems.push_back({e.kind(), e.what()});
    } catch (const Error& e) {
      split.problems.push_back({"malformed label file", e.what()});
    }
  }
  report_unannotated(images, xml_files, split);
  return split;
}

// VOC's numbers for beyond_image's message: "xmax 900 > width 160" and the like.
EdgeWords voc_edge_words(const VocObject& o, double width, double height) {
  auto number = [](double v) {
    std::ostringstream text;
    text << v;
    return text.str();
  };
  return {"xmin " + number(o.xmin) + " < 1", "ymin " + number(o.ymin) + " < 1",
          "xmax " + number(o.xmax) + " > width " + number(width),
          "ymax " + number(o.ymax) + " > height " + number(height)};
}

// The sample's boxes. VOC boxes are pixels of the image's <size>, corners 1-based and inclusive
// (xmin = 1, xmax = W covers the whole width: the continuous box is [xmin - 1, xmax] x
// [ymin - 1, ymax]); one well beyond the size (more than 1%: a little over is clipped) leaves the
// item out with a message naming the edge it crosses and the size.
void add_objects(const VocFile& f, const std::map<std::string, int>& class_ids, const std::string& names_source,
                 Sample& sample, LabelCounts& counts) {
  for (const VocObject& o : f.objects) {
    auto id = class_ids.find(o.name);
    if (id == class_ids.end())
      throw ItemError("unknown class", at(f.xml_path, o.name_line) + ": class '" + o.name +
                                           "' is not in the names file " + names_source);
    // Without a size (no <size>, no image on disk) the sample is left out as a missing image.
    if (f.width == 0 || f.height == 0) continue;
    if (const std::string beyond = beyond_image(o.xmin - 1, o.ymin - 1, o.xmax, o.ymax, f.width, f.height,
                                                voc_edge_words(o, f.width, f.height));
        !beyond.empty()) {
      std::ostringstream msg;
      msg << at(f.xml_path, o.line) << ": the box (" << o.xmin << ", " << o.ymin << ") - (" << o.xmax << ", " << o.ymax
          << ") " << beyond << "; the image is " << f.width << "x" << f.height << " pixels"
          << (f.size_line ? " by its <size> (line " + std::to_string(f.size_line) + ")"
                          : std::string(" (read from the image)"));
      throw ItemError("box outside the image", msg.str());
    }
    Box box;
    box.x = static_cast<float>((o.xmin - 1 + o.xmax) / 2 / f.width);
    box.y = static_cast<float>((o.ymin - 1 + o.ymax) / 2 / f.height);
    box.w = static_cast<float>((o.xmax - o.xmin + 1) / f.width);
    box.h = static_cast<float>((o.ymax - o.ymin + 1) / f.height);
    box.class_id = id->second;
    box.difficult = o.difficult;
    add_normalized_box(sample, box, static_cast<int>(class_ids.size()), at(f.xml_path, o.line), counts);
  }
}

// The usable files of a split as samples; the others' problems recorded.
void build_split(const VocSplit& voc, const std::map<std::string, int>& class_ids, const std::string& names_source,
                 Split& split) {
  split.problems = voc.problems;
  for (const VocFile& f : voc.files) {
    Sample sample;
    sample.image = f.image;
    sample.image_id = f.position;
    LabelCounts counts;
    try {
      add_objects(f, class_ids, names_source, sample, counts);
    } catch (const ItemError& e) {
      split.problems.push_back({e.kind(), e.what()});
      continue;
    }
    split.counts += counts;
    split.counts.boxes += static_cast<int64_t>(sample.boxes.size());
    split.samples.push_back(std::move(sample));
  }
  split.counts.images = static_cast<int64_t>(split.samples.size());
}

// A class in validation annotations but in no training one gets no training boxes: the net cannot
// learn it and its AP is 0 (a misspelt name, or a split made by hand, most often). Reported once
// per class, at its first box in the validation split; nothing is left out. (A class the names
// file lacks is an unknown class instead, reported by build_split.)
void report_validation_only(const VocSplit& train, const VocSplit& valid, const std::map<std::string, int>& class_ids,
                            Split& split) {
  std::set<std::string> trained;
  for (const VocFile& f : train.files)
    for (const VocObject& o : f.objects) trained.insert(o.name);
  struct Use {
    std::string first;  // file:line of its first <name>
    int64_t boxes = 0;
    std::set<std::string> files;
  };
  std::vector<std::string> order;
  std::map<std::string, Use> uses;
  for (const VocFile& f : valid.files)
    for (const VocObject& o : f.objects) {
      if (trained.count(o.name) || !class_ids.count(o.name)) continue;
      auto [use, fresh] = uses.try_emplace(o.name);
      if (fresh) {
        order.push_back(o.name);
        use->second.first = at(f.xml_path, o.name_line);
      }
      ++use->second.boxes;
      use->second.files.insert(f.xml_path);
    }
  for (const std::string& name : order) {
    const Use& use = uses[name];
    split.problems.push_back({"class with no training boxes",
                              use.first + ": class '" + name + "' appears only in the validation split (" +
                                  counted(use.boxes, "box", "boxes") + " in " +
                                  counted(static_cast<int64_t>(use.files.size()), "file") +
                                  ", the first here): training has no boxes for it, so the net cannot learn it and "
                                  "its AP will be 0",
                              false});
  }
}

}  // namespace

Dataset read_voc(const std::string& root_path, const OpenOptions& options) {
  fs::path root(root_path);
  std::error_code ec;
  if (!fs::is_directory(root / "train", ec))
    throw Error("Pascal VOC: " + (root / "train").string() + " is missing; expected imageai's layout: " + root_path +
                "/train/images/, " + root_path + "/train/annotations/*.xml and optionally the same under " +
                root_path + "/validation/");
  std::vector<VocSplit> splits{read_split(root / "train")};
  for (const char* name : {"validation", "val", "valid"}) {
    if (fs::is_directory(root / name, ec)) {
      splits.push_back(read_split(root / name));
      break;
    }
  }

  Dataset dataset;
  std::string classes_from;
  if (!options.names_file.empty()) {
    dataset.class_names = read_names_file(options.names_file);
    classes_from = " from " + options.names_file;
  } else {
    for (const VocSplit& split : splits)
      for (const VocFile& f : split.files)
        for (const VocObject& o : f.objects) dataset.class_names.push_back(o.name);
    std::sort(dataset.class_names.begin(), dataset.class_names.end());
    dataset.class_names.erase(std::unique(dataset.class_names.begin(), dataset.class_names.end()),
                              dataset.class_names.end());
    if (dataset.class_names.empty())
      throw Error("Pascal VOC at " + root_path + ": no <object> in any annotation, so no class names; pass a names file");
    classes_from = " collected from the annotations, sorted";
  }
  std::map<std::string, int> class_ids;
  for (size_t i = 0; i < dataset.class_names.size(); ++i) class_ids[dataset.class_names[i]] = static_cast<int>(i);

  dataset.format = Format::Voc;
  dataset.source = root_path;
  dataset.train.name = "train";
  dataset.valid.name = "valid";
  build_split(splits[0], class_ids, options.names_file, dataset.train);
  if (splits.size() > 1) {
    build_split(splits[1], class_ids, options.names_file, dataset.valid);
    report_validation_only(splits[0], splits[1], class_ids, dataset.valid);
  }

  dataset.description = "Pascal VOC at " + root_path + ": " + std::to_string(dataset.class_names.size()) + " classes" +
                        classes_from + "; train: " + splits[0].dir;
  if (splits.size() > 1) dataset.description += "; valid: " + splits[1].dir;
  return dataset;
}

}  // namespace yolo::data
