// darknet's dataset description: a .data file (classes=, train=, valid=, names=) naming list
// files of image paths, each image's YOLO labels at the path label_path_for_image gives.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "data/dataset.h"
#include "runtime/check.h"

namespace fs = std::filesystem;

namespace yolo::data {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

struct Option {
  std::string value;
  int line = 0;
};

std::map<std::string, Option> read_key_values(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot open " + file + ": " + std::strerror(errno));
  std::map<std::string, Option> options;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (trim(line).empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos)
      throw Error(file + ":" + std::to_string(number) + ": expected 'key = value', found '" + trim(line) + "'");
    options[trim(line.substr(0, eq))] = {trim(line.substr(eq + 1)), number};
  }
  return options;
}

void read_list(const std::string& list_file, const std::string& base_dir, int classes, Split& split) {
  std::ifstream in(list_file, std::ios::binary);
  if (!in) throw Error("cannot open image list " + list_file + ": " + std::strerror(errno));
  std::string list_dir = fs::path(list_file).parent_path().string();
  std::string line;
  int64_t position = 0;
  while (std::getline(in, line)) {
    std::string listed = trim(line);
    if (listed.empty() || listed[0] == '#') continue;
    Sample sample;
    sample.image_id = ++position;
    // Image paths in a list are relative to the working directory (darknet) or else to the
    // list's folder, then the .data file's.
    sample.image = resolve_listed_path(listed, list_dir);
    std::error_code ec;
    if (!fs::exists(sample.image, ec)) sample.image = resolve_listed_path(listed, base_dir);
    const std::string labels = label_path_for_image(sample.image);
    add_labelled_sample(std::move(sample), labels, classes, split);
  }
}

}  // namespace

Dataset read_darknet(const std::string& data_file, const OpenOptions& options) {
  std::map<std::string, Option> values = read_key_values(data_file);
  std::string base_dir = fs::path(data_file).parent_path().string();
  auto where = [&](const std::string& key) { return data_file + ":" + std::to_string(values[key].line); };

  if (!values.count("classes")) throw Error(data_file + ": no 'classes = N' line");
  char* end = nullptr;
  long classes = std::strtol(values["classes"].value.c_str(), &end, 10);
  if (*end != '\0' || end == values["classes"].value.c_str() || classes < 1 || classes > 100000)
    throw Error(where("classes") + ": classes must be a whole number in 1..100000, found '" +
                values["classes"].value + "'");
  if (!values.count("train") || values["train"].value.empty()) throw Error(data_file + ": no 'train = LIST' line");

  Dataset dataset;
  if (!options.names_file.empty()) {
    dataset.class_names = read_names_file(options.names_file);
  } else if (values.count("names") && !values["names"].value.empty()) {
    dataset.class_names = read_names_file(resolve_listed_path(values["names"].value, base_dir));
  } else {
    for (long c = 0; c < classes; ++c) dataset.class_names.push_back("class" + std::to_string(c));
  }
  if (static_cast<long>(dataset.class_names.size()) != classes)
    throw Error(where("classes") + ": classes = " + std::to_string(classes) + " but the names file has " +
                std::to_string(dataset.class_names.size()) + " names");

  read_list(resolve_listed_path(values["train"].value, base_dir), base_dir, static_cast<int>(classes), dataset.train);
  if (values.count("valid") && !values["valid"].value.empty())
    read_list(resolve_listed_path(values["valid"].value, base_dir), base_dir, static_cast<int>(classes),
              dataset.valid);
  dataset.description = "darknet .data file " + data_file + " (" + std::to_string(classes) + " classes)";
  return dataset;
}

}  // namespace yolo::data
