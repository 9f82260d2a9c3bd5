// COCO detection annotations: one instances_*.json file, or a folder holding
// annotations/instances_train*.json (and instances_val*.json) with the image folders beside.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include "data/dataset.h"
#include "data/json.h"
#include "runtime/check.h"

namespace fs = std::filesystem;

namespace yolo::data {

namespace {

struct Category {
  int64_t id = 0;
  std::string name;
  int line = 0;
};

// One annotation file and where its images are.
struct CocoSource {
  fs::path json;
  fs::path image_dir;
};

std::string at(const std::string& file, int line) { return file + ":" + std::to_string(line); }

std::string show(double number) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", number);
  return text;
}

const JsonValue& member(const JsonValue& object, std::string_view key, JsonKind kind, const std::string& where) {
  const JsonValue* value = object.find(key);
  if (!value) throw Error(where + ": no \"" + std::string(key) + "\" member");
  if (value->kind != kind)
    throw Error(where + ": \"" + std::string(key) + "\" is " + json_kind_name(value->kind) + ", expected " +
                json_kind_name(kind));
  return *value;
}

int64_t whole_number(const JsonValue& object, std::string_view key, const std::string& where) {
  const JsonValue& value = member(object, key, JsonKind::Number, where);
  constexpr double kLargestExact = 9007199254740992.0;  // 2^53: beyond it doubles skip integers
  if (value.number != std::floor(value.number) || std::abs(value.number) > kLargestExact)
    throw Error(where + ": \"" + std::string(key) + "\" is " + show(value.number) + ", expected a whole number");
  return static_cast<int64_t>(value.number);
}

// `where` for an element of a top-level array: "FILE:LINE: images[3]". COCO files are often a
// single line, so the index is what finds the element.
std::string element_at(const std::string& file, const JsonValue& value, const char* array, size_t index) {
  return at(file, value.line) + ": " + array + "[" + std::to_string(index) + "]";
}

const JsonValue& object_in(const JsonValue& array_item, const std::string& where) {
  if (array_item.kind != JsonKind::Object)
    throw Error(where + " is " + json_kind_name(array_item.kind) + ", expected an object");
  return array_item;
}

std::vector<Category> read_categories(const JsonValue& root, const std::string& file) {
  const JsonValue& array = member(root, "categories", JsonKind::Array, at(file, root.line));
  std::vector<Category> categories;
  std::unordered_map<int64_t, int> line_of_id;
  std::unordered_map<std::string, int64_t> id_of_name;
  for (size_t i = 0; i < array.items.size(); ++i) {
    std::string where = element_at(file, array.items[i], "categories", i);
    const JsonValue& c = object_in(array.items[i], where);
    Category category{whole_number(c, "id", where), member(c, "name", JsonKind::String, where).string, c.line};
    if (auto [it, added] = line_of_id.emplace(category.id, c.line); !added)
      throw Error(where + ": category id " + std::to_string(category.id) + " repeats (first at line " +
                  std::to_string(it->second) + ")");
    if (auto [it, added] = id_of_name.emplace(category.name, category.id); !added)
      throw Error(where + ": category name '" + category.name + "' repeats (id " + std::to_string(it->second) +
                  " has it too)");
    categories.push_back(std::move(category));
  }
  if (categories.empty()) throw Error(at(file, array.line) + ": \"categories\" is empty");
  return categories;
}

// Category id -> class id, by the category's name: `class_of_name` comes from the names file,
// or else from the training file's categories sorted by id (`train_categories`, in class
// order), and then a validation file must give each category the training file's id.
std::unordered_map<int64_t, int> map_categories(const std::vector<Category>& categories, const std::string& file,
                                                const std::unordered_map<std::string, int>& class_of_name,
                                                const std::string& names_file,
                                                const std::vector<Category>& train_categories) {
  std::unordered_map<int64_t, int> classes;
  for (const Category& c : categories) {
    std::string where = at(file, c.line) + ": category " + std::to_string(c.id) + " '" + c.name + "'";
    auto it = class_of_name.find(c.name);
    if (it == class_of_name.end())
      throw Error(where + (names_file.empty() ? " is not among the training file's categories"
                                              : " is not in the names file " + names_file));
    if (!train_categories.empty() && train_categories[size_t(it->second)].id != c.id)
      throw Error(where + ": the training file gives it id " + std::to_string(train_categories[size_t(it->second)].id) +
                  "; the files must agree");
    classes[c.id] = it->second;
  }
  return classes;
}

void read_split(const JsonValue& root, const std::string& file, const fs::path& image_dir,
                const std::unordered_map<int64_t, int>& category_classes, int classes, Split& split) {
  const JsonValue& images = member(root, "images", JsonKind::Array, at(file, root.line));
  struct ImageSize {
    double width, height;
  };
  std::vector<ImageSize> sizes;
  std::unordered_map<int64_t, size_t> sample_of_image;
  for (size_t i = 0; i < images.items.size(); ++i) {
    std::string where = element_at(file, images.items[i], "images", i);
    const JsonValue& image = object_in(images.items[i], where);
    int64_t id = whole_number(image, "id", where);
    if (!sample_of_image.emplace(id, split.samples.size()).second)
      throw Error(where + ": image id " + std::to_string(id) + " repeats");
    ImageSize size{member(image, "width", JsonKind::Number, where).number,
                   member(image, "height", JsonKind::Number, where).number};
    if (!(size.width > 0) || !(size.height > 0))
      throw Error(where + ": image size " + show(size.width) + "x" + show(size.height) + " is not positive");
    Sample sample;
    sample.image = (image_dir / member(image, "file_name", JsonKind::String, where).string).string();
    sample.image_id = id;
    split.samples.push_back(std::move(sample));
    sizes.push_back(size);
  }

  const JsonValue& annotations = member(root, "annotations", JsonKind::Array, at(file, root.line));
  // An annotation's problem leaves its image out (the first problem of each image is kept).
  std::vector<std::optional<Problem>> bad(split.samples.size());
  std::vector<LabelCounts> counts(split.samples.size());
  for (size_t i = 0; i < annotations.items.size(); ++i) {
    std::string where = element_at(file, annotations.items[i], "annotations", i);
    size_t index = SIZE_MAX;
    try {
      const JsonValue& a = object_in(annotations.items[i], where);
      int64_t image_id = whole_number(a, "image_id", where);
      auto sample = sample_of_image.find(image_id);
      if (sample == sample_of_image.end()) {
        split.problems.push_back({"annotation of no image",
                                  where + ": image_id " + std::to_string(image_id) + " is not in \"images\"", false});
        continue;
      }
      index = sample->second;
      if (bad[index]) continue;
      int64_t category_id = whole_number(a, "category_id", where);
      auto class_id = category_classes.find(category_id);
      if (class_id == category_classes.end())
        throw ItemError("unknown class",
                        where + ": category_id " + std::to_string(category_id) + " is not in \"categories\"");
      bool crowd = false;
      if (const JsonValue* iscrowd = a.find("iscrowd")) {
        bool number = iscrowd->kind == JsonKind::Number && (iscrowd->number == 0 || iscrowd->number == 1);
        if (!number && iscrowd->kind != JsonKind::Bool) throw Error(where + ": \"iscrowd\" must be 0 or 1");
        crowd = number ? iscrowd->number == 1 : iscrowd->boolean;
      }
      const JsonValue& bbox = member(a, "bbox", JsonKind::Array, where);
      if (bbox.items.size() != 4 || std::any_of(bbox.items.begin(), bbox.items.end(),
                                                [](const JsonValue& v) { return v.kind != JsonKind::Number; }))
        throw Error(where + ": \"bbox\" must be 4 numbers [x, y, width, height] in pixels");
      double bx = bbox.items[0].number, by = bbox.items[1].number, bw = bbox.items[2].number, bh = bbox.items[3].number;
      if (bw < 0 || bh < 0)
        throw ItemError("box with swapped corners", where + ": \"bbox\" has a negative width or height");
      // COCO boxes are continuous pixel coordinates: top-left corner, then width and height; one
      // well beyond the image (more than 1%: a little over is clipped) names the edge it crosses
      // and the image's size.
      const ImageSize& size = sizes[index];
      const EdgeWords words{"x " + show(bx) + " < 0", "y " + show(by) + " < 0",
                            "x + width " + show(bx + bw) + " > " + show(size.width),
                            "y + height " + show(by + bh) + " > " + show(size.height)};
      if (const std::string beyond = beyond_image(bx, by, bx + bw, by + bh, size.width, size.height, words);
          !beyond.empty())
        throw ItemError("box outside the image", where + ": \"bbox\" [" + show(bx) + ", " + show(by) + ", " + show(bw) +
                                                     ", " + show(bh) + "] " + beyond + "; the image is " +
                                                     show(size.width) + "x" + show(size.height) +
                                                     " pixels by \"images\"");
      Box box;
      box.x = static_cast<float>((bx + bw / 2) / size.width);
      box.y = static_cast<float>((by + bh / 2) / size.height);
      box.w = static_cast<float>(bw / size.width);
      box.h = static_cast<float>(bh / size.height);
      box.class_id = class_id->second;
      box.difficult = crowd;  // crowd regions: kept for evaluation to ignore, as VOC's difficult
      add_normalized_box(split.samples[index], box, classes, where, counts[index]);
    } catch (const ItemError& e) {
      if (index == SIZE_MAX) throw;
      bad[index] = Problem{e.kind(), e.what()};
    } catch (const Error& e) {
      if (index == SIZE_MAX) throw;  // not even its image is known: the file is malformed
      bad[index] = Problem{"malformed annotation", e.what()};
    }
  }
  std::vector<Sample> kept;
  for (size_t k = 0; k < split.samples.size(); ++k) {
    if (bad[k]) {
      split.problems.push_back(*bad[k]);
      continue;
    }
    split.counts += counts[k];
    kept.push_back(std::move(split.samples[k]));
  }
  split.samples = std::move(kept);
  split.counts.images = static_cast<int64_t>(split.samples.size());
  for (const Sample& s : split.samples) split.counts.boxes += static_cast<int64_t>(s.boxes.size());
}

// For DIR/annotations/instances_NAME.json (or DIR/instances_NAME.json): the first folder that
// exists of DIR/NAME/images, DIR/NAME, DIR/images/NAME, DIR/images.
fs::path find_image_dir(const fs::path& json) {
  fs::path dir = json.parent_path();
  if (dir.filename() == "annotations") dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  std::string name = json.stem().string();
  if (name.rfind("instances_", 0) == 0) name.erase(0, 10);
  std::vector<fs::path> candidates{dir / name / "images", dir / name, dir / "images" / name, dir / "images"};
  std::error_code ec;
  for (const fs::path& candidate : candidates)
    if (fs::is_directory(candidate, ec)) return candidate;
  std::string tried;
  for (const fs::path& candidate : candidates) tried += (tried.empty() ? "" : ", ") + candidate.string();
  throw Error("COCO " + json.string() + ": no image folder found; looked for " + tried);
}

// The train and (optional) validation files of a COCO folder: annotations/instances_train*.json
// and annotations/instances_val*.json.
std::vector<fs::path> find_annotation_files(const fs::path& dir) {
  fs::path annotations = dir / "annotations";
  std::vector<fs::path> train, valid, others;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(annotations, ec)) {
    std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json" || name.rfind("instances_", 0) != 0) continue;
    std::string split = name.substr(10);
    (split.rfind("train", 0) == 0 ? train : split.rfind("val", 0) == 0 ? valid : others).push_back(entry.path());
  }
  auto list = [](const std::vector<fs::path>& files) {
    std::string text;
    for (const fs::path& f : files) text += " " + f.filename().string();
    return text.empty() ? std::string(" none") : text;
  };
  if (train.size() != 1 || valid.size() > 1)
    throw Error("COCO " + dir.string() + ": expected exactly one " + annotations.string() +
                "/instances_train*.json and at most one instances_val*.json; found train:" + list(train) +
                ", validation:" + list(valid) + ", other:" + list(others));
  train.insert(train.end(), valid.begin(), valid.end());
  return train;
}

}  // namespace

Dataset read_coco(const std::string& path, const OpenOptions& options) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    files = find_annotation_files(path);
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else {
    throw Error("COCO " + path + ": no such file or directory (expected an instances_*.json file or a folder with "
                "annotations/instances_*.json)");
  }
  std::vector<CocoSource> sources;
  for (const fs::path& json : files) sources.push_back({json, find_image_dir(json)});

  Dataset dataset;
  dataset.format = Format::Coco;
  dataset.source = path;
  dataset.train.name = "train";
  dataset.valid.name = "valid";
  if (!options.names_file.empty()) dataset.class_names = read_names_file(options.names_file);
  JsonOptions json_options;
  json_options.skip_keys = {"segmentation"};  // polygons: most of the file, and not needed for boxes
  std::vector<Category> train_categories;  // in class order; empty with a names file
  std::unordered_map<std::string, int> class_of_name;
  for (size_t s = 0; s < sources.size(); ++s) {
    std::string file = sources[s].json.string();
    JsonValue root = read_json_file(file, json_options);
    if (root.kind != JsonKind::Object)
      throw Error(at(file, root.line) + ": the file holds " + json_kind_name(root.kind) +
                  ", expected a COCO object with \"images\", \"annotations\" and \"categories\"");
    std::vector<Category> categories = read_categories(root, file);
    if (s == 0) {
      if (options.names_file.empty()) {
        std::sort(categories.begin(), categories.end(),
                  [](const Category& a, const Category& b) { return a.id < b.id; });
        train_categories = categories;
        for (const Category& c : categories) dataset.class_names.push_back(c.name);
      }
      for (size_t i = 0; i < dataset.class_names.size(); ++i) class_of_name[dataset.class_names[i]] = int(i);
    }
    std::unordered_map<int64_t, int> category_classes =
        map_categories(categories, file, class_of_name, options.names_file, train_categories);
    // Class -> the file's category id (COCO's are not contiguous), for --save-json.
    dataset.category_ids.assign(dataset.class_names.size(), -1);
    for (const auto& [id, class_id] : category_classes) dataset.category_ids[static_cast<size_t>(class_id)] = id;
    read_split(root, file, sources[s].image_dir, category_classes, static_cast<int>(dataset.class_names.size()),
               s == 0 ? dataset.train : dataset.valid);
  }

  dataset.description = "COCO at " + path + ": " + std::to_string(dataset.class_names.size()) + " classes" +
                        (options.names_file.empty()
                             ? std::string(", category ids sorted ascending -> classes 0..") +
                                   std::to_string(dataset.class_names.size() - 1)
                             : " from " + options.names_file + " by category name");
  const Split* splits[] = {&dataset.train, &dataset.valid};
  for (size_t s = 0; s < sources.size(); ++s)
    dataset.description +=
        "; " + splits[s]->name + " (" + sources[s].json.string() + ", images in " + sources[s].image_dir.string() + ")";
  return dataset;
}

}  // namespace yolo::data
