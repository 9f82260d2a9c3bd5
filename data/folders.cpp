// A folder of images with YOLO labels beside it: images/ + labels/ (all training), split as
// images/{train,val}/ + labels/{train,val}/ (ultralytics' layout) or {train,val}/images/ +
// {train,val}/labels/, and a names file (classes.txt or one *.names in the folder).
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "data/dataset.h"
#include "runtime/check.h"

namespace fs = std::filesystem;

namespace yolo::data {

namespace {

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp";
}

void read_folder(const fs::path& images, const fs::path& labels, int classes, Split& split) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(images, ec))
    if (entry.is_regular_file(ec) && is_image_file(entry.path())) files.push_back(entry.path());
  if (ec) throw Error("cannot list " + images.string() + ": " + ec.message());
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i < files.size(); ++i) {
    const fs::path& file = files[i];
    Sample sample;
    sample.image = file.string();
    sample.image_id = static_cast<int64_t>(i) + 1;
    add_labelled_sample(std::move(sample), (labels / file.stem()).string() + ".txt", classes, split);
  }
}

std::vector<std::string> find_names(const fs::path& root, const OpenOptions& options) {
  if (!options.names_file.empty()) return read_names_file(options.names_file);
  std::error_code ec;
  if (fs::is_regular_file(root / "classes.txt", ec)) return read_names_file((root / "classes.txt").string());
  std::vector<fs::path> names;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.path().extension() == ".names") names.push_back(entry.path());
  if (names.size() == 1) return read_names_file(names[0].string());
  throw Error(root.string() + ": " + (names.empty() ? "no names file" : "more than one *.names file") +
              ": put one class name per line in " + (root / "classes.txt").string() + " or pass --names FILE");
}

}  // namespace

Dataset read_folders(const std::string& root_path, const OpenOptions& options) {
  fs::path root(root_path);
  Dataset dataset;
  dataset.class_names = find_names(root, options);
  int classes = static_cast<int>(dataset.class_names.size());
  std::error_code ec;
  const char* valid_names[] = {"val", "valid", "validation"};
  auto first_existing = [&](auto make_path) -> fs::path {
    for (const char* name : valid_names)
      if (fs::is_directory(make_path(name), ec)) return make_path(name);
    return {};
  };
  std::string layout;
  if (fs::is_directory(root / "images" / "train", ec)) {
    layout = "images/{train,val}/ + labels/{train,val}/";
    read_folder(root / "images" / "train", root / "labels" / "train", classes, dataset.train);
    fs::path valid = first_existing([&](const char* n) { return root / "images" / n; });
    if (!valid.empty()) read_folder(valid, root / "labels" / valid.filename(), classes, dataset.valid);
  } else if (fs::is_directory(root / "train" / "images", ec)) {
    layout = "{train,val}/images/ + {train,val}/labels/";
    read_folder(root / "train" / "images", root / "train" / "labels", classes, dataset.train);
    fs::path valid = first_existing([&](const char* n) { return root / n / "images"; });
    if (!valid.empty()) read_folder(valid, valid.parent_path() / "labels", classes, dataset.valid);
  } else if (fs::is_directory(root / "images", ec)) {
    layout = "images/ + labels/ (no validation split)";
    read_folder(root / "images", root / "labels", classes, dataset.train);
  } else {
    throw Error(root_path + ": expected images/ and labels/ folders (optionally images/train, images/val or "
                            "train/images, val/images)");
  }
  dataset.description = "image folders at " + root_path + ", " + layout + ", " + std::to_string(classes) + " classes";
  return dataset;
}

}  // namespace yolo::data
