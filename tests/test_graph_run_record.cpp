// results.csv and chart.png (graph/run_record.h): the columns, appending (one header), reading
// back; a chart drawn from a planted series has its loss curve and mAP points on the pixels the
// frame maps them to, and nothing where the curve is not; the final mAP recorded in the last row
// and drawn; draw_line's ends and clipping.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "data/draw.h"
#include "data/image.h"
#include "graph/run_record.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

data::Rgb pixel(const data::Image& image, int x, int y) {
  const uint8_t* p = image.pixel(x, y);
  return {p[0], p[1], p[2]};
}

}  // namespace

TEST_CASE("results.csv: the header once, a row per epoch, read back (an empty mAP or idle stays unset)") {
  yolo::testing::TempDir dir;
  const std::string path = dir / "results.csv";
  EpochRecord a;
  a.epoch = 1;
  a.iteration = 7;
  a.loss = 70.25;
  a.box = 12.5;
  a.recall = 0.25;
  a.learning_rate = 1e-3;
  a.idle_ms = std::nan("");
  EpochRecord b = a;
  b.epoch = 2;
  b.iteration = 14;
  b.map50 = 0.375;
  b.idle_ms = 0.125;
  append_results(path, a);
  append_results(path, b);
  const std::string text = read_all(path);
  CHECK(text.rfind("epoch,iteration,loss,loss_box,loss_obj,loss_noobj,loss_cls,iou,recall,lr,images_per_s,", 0) == 0);
  CHECK(text.find("epoch", 1) == std::string::npos);  // one header
  std::vector<EpochRecord> rows = read_results(path);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].iteration == 7);
  CHECK(rows[0].loss == 70.25);
  CHECK(rows[0].box == 12.5);
  CHECK(rows[0].learning_rate == doctest::Approx(1e-3));
  CHECK(rows[0].map50 == -1);
  CHECK(std::isnan(rows[0].idle_ms));
  CHECK(rows[1].map50 == 0.375);
  CHECK(rows[1].idle_ms == 0.125);
  std::ofstream(path, std::ios::app) << "3,21,oops\n";
  std::string error;
  try {
    read_results(path);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK(error.find(path + ":4: 3 columns, expected 19") == 0);
}

TEST_CASE("chart.png: a planted loss line and mAP points land on the frame's pixels") {
  std::vector<EpochRecord> records;
  for (int i = 0; i <= 10; ++i) {
    EpochRecord r;
    r.iteration = i * 10;
    r.loss = 10 - i;  // (0, 10) to (100, 0)
    r.map50 = i == 5 ? 0.5 : -1;
    records.push_back(r);
  }
  data::Image chart = draw_chart(records, 640, 400);
  const ChartFrame f = chart_frame(records, 640, 400);
  const data::Rgb loss{30, 90, 200}, map{210, 40, 40}, white{255, 255, 255};
  for (double it : {5.0, 25.0, 55.0, 95.0}) {
    CAPTURE(it);
    CHECK(pixel(chart, f.x_of(it), f.y_of_loss(10 - it / 10)) == loss);
  }
  CHECK(pixel(chart, f.x_of(50), f.y_of_map(0.5)) == map);
  // Above the line, away from grid lines and the mAP point: background.
  CHECK(pixel(chart, f.x_of(30), f.y_of_loss(9.5)) == white);
  CHECK(pixel(chart, f.x_of(80), f.y_of_loss(6.5)) == white);
}

TEST_CASE("the final weights' mAP goes into results.csv's last row and onto chart.png") {
  yolo::testing::TempDir dir;
  EpochRecord r;
  r.loss = 5;
  for (int64_t iteration : {12, 24, 30}) {  // two epochs and a partial third, none validated
    r.iteration = iteration;
    r.epoch = static_cast<double>(iteration) / 12;
    append_results(dir / "results.csv", r);
  }
  CHECK_FALSE(record_final_map(dir.path(), 24, 0.625));  // not the last row: nothing changes
  CHECK(read_results(dir / "results.csv").back().map50 == -1);
  CHECK_FALSE(record_final_map(dir / "elsewhere", 30, 0.625));  // no record at all

  REQUIRE(record_final_map(dir.path(), 30, 0.625));
  const std::vector<EpochRecord> rows = read_results(dir / "results.csv");
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].map50 == -1);
  CHECK(rows[1].map50 == -1);
  CHECK(rows[2].map50 == 0.625);
  CHECK(rows[2].epoch == 2.5);
  CHECK(rows[2].loss == 5);
  data::Image chart;
  std::string error;
  REQUIRE(data::read_image(dir / "chart.png", chart, error));
  const ChartFrame f = chart_frame(rows, chart.width, chart.height);
  CHECK(pixel(chart, f.x_of(30), f.y_of_map(0.625)) == data::Rgb{210, 40, 40});
}

TEST_CASE("draw_line: both ends drawn, diagonal steps, clipped at the image's edge") {
  data::Image image;
  image.width = 20;
  image.height = 10;
  image.rgb.assign(20 * 10 * 3, 0);
  const data::Rgb c{1, 2, 3};
  data::draw_line(image, 2, 3, 9, 3, c);
  CHECK(pixel(image, 2, 3) == c);
  CHECK(pixel(image, 9, 3) == c);
  CHECK(pixel(image, 10, 3) == data::Rgb{0, 0, 0});
  data::draw_line(image, 0, 0, 5, 5, c);
  for (int k = 0; k <= 5; ++k) CHECK(pixel(image, k, k) == c);
  data::draw_line(image, -5, 8, 40, 8, c);  // off both sides: clipped
  CHECK(pixel(image, 0, 8) == c);
  CHECK(pixel(image, 19, 8) == c);
}
