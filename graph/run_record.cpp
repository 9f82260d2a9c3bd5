// results.csv and chart.png (see run_record.h).
#include "graph/run_record.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/draw.h"
#include "runtime/check.h"

namespace yolo::graph {

namespace {

// The record's fields in column order.
std::vector<double*> fields(EpochRecord& r) {
  return {&r.epoch,    &r.loss,       &r.box,         &r.obj,           &r.noobj,
          &r.cls,      &r.iou,        &r.recall,      &r.learning_rate, &r.images_per_second,
          &r.data_ms,  &r.forward_ms, &r.backward_ms, &r.comm_ms,       &r.optimizer_ms,
          &r.other_ms, &r.idle_ms,    &r.map50};
}

std::string number(double v) {
  if (std::isnan(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

const data::Rgb kWhite{255, 255, 255}, kAxis{60, 60, 60}, kGrid{225, 225, 225}, kLoss{30, 90, 200}, kMap{210, 40, 40};

}  // namespace

const std::vector<std::string>& results_columns() {
  static const std::vector<std::string> columns = {
      "epoch",   "iteration",    "loss",     "loss_box",       "loss_obj", "loss_noobj", "loss_cls",
      "iou",     "recall",       "lr",       "images_per_s",   "data_ms",  "forward_ms", "backward_ms",
      "comm_ms", "optimizer_ms", "other_ms", "device_idle_ms", "map50"};
  return columns;
}

void append_results(const std::string& path, const EpochRecord& record) {
  std::error_code ec;
  const bool fresh = !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
  std::ofstream out(path, std::ios::app);
  if (fresh) {
    const std::vector<std::string>& columns = results_columns();
    for (size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c];
    out << "\n";
  }
  EpochRecord r = record;
  std::vector<double*> f = fields(r);
  out << number(r.epoch) << "," << r.iteration;
  for (size_t k = 1; k < f.size(); ++k) {
    const bool unset = f[k] == &r.map50 && r.map50 < 0;
    out << "," << (unset ? "" : number(*f[k]));
  }
  out << "\n";
  if (!out) throw Error("cannot write " + path);
}

std::vector<EpochRecord> read_results(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path);
  std::vector<EpochRecord> rows;
  std::string line;
  for (int number_of_line = 1; std::getline(in, line); ++number_of_line) {
    if (number_of_line == 1 || line.empty()) continue;  // the header
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    EpochRecord r;
    std::vector<double*> f = fields(r);
    if (cells.size() != f.size() + 1)
      throw Error(path + ":" + std::to_string(number_of_line) + ": " + std::to_string(cells.size()) +
                  " columns, expected " + std::to_string(f.size() + 1));
    auto parse = [&](const std::string& cell, double fallback) {
      if (cell.empty()) return fallback;
      char* end = nullptr;
      double v = std::strtod(cell.c_str(), &end);
      if (*end) throw Error(path + ":" + std::to_string(number_of_line) + ": '" + cell + "' is not a number");
      return v;
    };
    r.epoch = parse(cells[0], 0);
    r.iteration = static_cast<int64_t>(parse(cells[1], 0));
    for (size_t k = 1; k < f.size(); ++k) *f[k] = parse(cells[k + 1], f[k] == &r.map50 ? -1.0 : std::nan(""));
    rows.push_back(r);
  }
  return rows;
}

bool record_final_map(const std::string& out_dir, int64_t iteration, double map50) {
  const std::string csv = out_dir + "/results.csv", tmp = csv + ".tmp";
  std::error_code ec;
  if (!std::filesystem::exists(csv, ec)) return false;
  std::vector<EpochRecord> rows = read_results(csv);
  if (rows.empty() || rows.back().iteration != iteration) return false;
  rows.back().map50 = map50;
  std::filesystem::remove(tmp, ec);
  for (const EpochRecord& row : rows) append_results(tmp, row);
  std::filesystem::rename(tmp, csv);
  data::write_image(out_dir + "/chart.png", draw_chart(rows));
  return true;
}

int ChartFrame::x_of(double iteration) const {
  return left + static_cast<int>(std::lround((right - left) * std::clamp(iteration / max_iteration, 0.0, 1.0)));
}

int ChartFrame::y_of_loss(double loss) const {
  return bottom - static_cast<int>(std::lround((bottom - top) * std::clamp(loss / max_loss, 0.0, 1.0)));
}

int ChartFrame::y_of_map(double map) const {
  return bottom - static_cast<int>(std::lround((bottom - top) * std::clamp(map, 0.0, 1.0)));
}

ChartFrame chart_frame(const std::vector<EpochRecord>& records, int width, int height) {
  ChartFrame f;
  f.left = 70;
  f.right = width - 60;
  f.top = 40;
  f.bottom = height - 50;
  for (const EpochRecord& r : records) {
    f.max_iteration = std::max(f.max_iteration, static_cast<double>(r.iteration));
    if (std::isfinite(r.loss)) f.max_loss = std::max(f.max_loss, r.loss * 1.05);
  }
  return f;
}

data::Image draw_chart(const std::vector<EpochRecord>& records, int width, int height) {
  if (width < 200 || height < 150)
    throw Error("draw_chart: " + std::to_string(width) + "x" + std::to_string(height) +
                " is too small (200x150 at least)");
  data::Image image;
  image.width = width;
  image.height = height;
  image.rgb.assign(static_cast<size_t>(width) * height * 3, 255);
  const ChartFrame f = chart_frame(records, width, height);
  char label[64];
  for (int k = 0; k <= 4; ++k) {  // grid and tick labels: loss left, mAP right, iterations below
    const int y = f.bottom - (f.bottom - f.top) * k / 4, x = f.left + (f.right - f.left) * k / 4;
    data::draw_line(image, f.left, y, f.right, y, kGrid);
    std::snprintf(label, sizeof label, "%.3g", f.max_loss * k / 4);
    data::draw_text(image, f.left - 8 - data::text_width(label), y - 4, label, kLoss, kWhite);
    std::snprintf(label, sizeof label, "%.2f", k / 4.0);
    data::draw_text(image, f.right + 8, y - 4, label, kMap, kWhite);
    std::snprintf(label, sizeof label, "%.0f", f.max_iteration * k / 4);
    data::draw_text(image, x - data::text_width(label) / 2, f.bottom + 10, label, kAxis, kWhite);
  }
  data::draw_rectangle(image, f.left, f.top, f.right, f.bottom, kAxis, 1);
  data::draw_text(image, f.left, 12, "loss", kLoss, kWhite, 2);
  data::draw_text(image, f.right - data::text_width("mAP@0.5", 2), 12, "mAP@0.5", kMap, kWhite, 2);
  const std::string x_title = "iterations";
  data::draw_text(image, (f.left + f.right - data::text_width(x_title)) / 2, f.bottom + 28, x_title, kAxis, kWhite);
  const EpochRecord* prev = nullptr;
  const EpochRecord* prev_map = nullptr;
  for (const EpochRecord& r : records) {
    if (std::isfinite(r.loss)) {
      data::draw_rectangle(image, f.x_of(r.iteration) - 1, f.y_of_loss(r.loss) - 1, f.x_of(r.iteration) + 1,
                           f.y_of_loss(r.loss) + 1, kLoss, 1);
      if (prev)
        data::draw_line(image, f.x_of(prev->iteration), f.y_of_loss(prev->loss), f.x_of(r.iteration),
                        f.y_of_loss(r.loss), kLoss, 2);
      prev = &r;
    }
    if (r.map50 >= 0) {
      if (prev_map)
        data::draw_line(image, f.x_of(prev_map->iteration), f.y_of_map(prev_map->map50), f.x_of(r.iteration),
                        f.y_of_map(r.map50), kMap, 2);
      data::draw_rectangle(image, f.x_of(r.iteration) - 2, f.y_of_map(r.map50) - 2, f.x_of(r.iteration) + 2,
                           f.y_of_map(r.map50) + 2, kMap, 3);  // filled 5x5
      prev_map = &r;
    }
  }
  return image;
}

}  // namespace yolo::graph
