// bench_kernels' verdict on issue 36's targets (tools/cublas_verdict.h): which rows count, and
// each of the three targets missed alone, on made-up timings.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tools/cublas_verdict.h"

using namespace yolo::bench;

namespace {

// Every bf16 conv_tc row bench_kernels prints (all shapes, all passes), ours at `ratio` times
// cuBLAS's 0.1 ms.
std::vector<TimedRow> every_row(double ratio, const std::string& precision = "bf16") {
  std::vector<TimedRow> rows;
  for (const std::string& op : verdict_ops(precision))
    for (const YoloConv& layer : kYoloConvs) rows.push_back({op, layer.label, 0.1 * ratio, 0.1});
  return rows;
}

TimedRow& row(std::vector<TimedRow>& rows, const std::string& op, const std::string& shape) {
  for (TimedRow& r : rows)
    if (r.op == op && r.shape == shape) return r;
  FAIL("no row " << op << " " << shape);
  return rows.front();
}

}  // namespace

TEST_CASE("cublas verdict: the rows issue 36 names, all within the targets, are met") {
  const CublasVerdict v = judge_against_cublas(every_row(1.05), "bf16");
  // 26 shapes less the three COCO heads, three passes, less the first layer's backward data.
  CHECK(v.expected == 68);
  CHECK(v.judged == 68);
  CHECK(v.complete);
  CHECK(v.met);
  CHECK(v.worst == doctest::Approx(1.05));
  CHECK(v.median == doctest::Approx(1.05));
  CHECK(v.sum == doctest::Approx(1.05));
  CHECK(v.line.find("68 of 68 rows") != std::string::npos);
  CHECK(v.line.find("targets met") != std::string::npos);
}

TEST_CASE("cublas verdict: the excluded rows and other precisions do not count") {
  std::vector<TimedRow> rows = every_row(1.0);
  for (TimedRow& r : rows)
    if (r.shape.find("->255 ") != std::string::npos) r.ms = 10 * r.cublas_ms;
  row(rows, "conv bwd data bf16", "416x416 3->32 3x3 s1").ms = 1.0;
  for (TimedRow r : every_row(5.0, "fp16")) rows.push_back(r);
  const CublasVerdict v = judge_against_cublas(rows, "bf16");
  CHECK(v.met);
  CHECK(v.worst == doctest::Approx(1.0));
  // The first layer's other passes do count.
  row(rows, "conv bwd weights bf16", "416x416 3->32 3x3 s1").ms = 0.2;
  CHECK_FALSE(judge_against_cublas(rows, "bf16").met);
}

TEST_CASE("cublas verdict: each target missed alone") {
  SUBCASE("one row past 1.25x") {
    std::vector<TimedRow> rows = every_row(1.0);
    row(rows, "conv bwd weights bf16", "13x13 512->1024 3x3 s1").ms = 0.126;
    const CublasVerdict v = judge_against_cublas(rows, "bf16");
    CHECK_FALSE(v.met);
    CHECK(v.worst == doctest::Approx(1.26));
    CHECK(v.worst_row == "conv bwd weights bf16 13x13 512->1024 3x3 s1");
    CHECK(v.median <= 1.1);
    CHECK(v.sum <= 1.15);
    CHECK(v.line.find("targets not met") != std::string::npos);
  }
  SUBCASE("the median past 1.1x, every row within 1.25x") {
    // Two passes of three at 1.12x, the one in the middle of the rows' order at 1x: the median
    // is of the sorted ratios, not the middle row.
    std::vector<TimedRow> rows = every_row(1.12);
    for (TimedRow& r : rows)
      if (r.op == "conv bwd data bf16") r.ms = r.cublas_ms;
    const CublasVerdict v = judge_against_cublas(rows, "bf16");
    CHECK_FALSE(v.met);
    CHECK(v.worst <= 1.25);
    CHECK(v.median == doctest::Approx(1.12));
  }
  SUBCASE("the sum past 1.15x, the median at 1x") {
    std::vector<TimedRow> rows = every_row(1.0);
    TimedRow& heavy = row(rows, "conv fwd bf16", "52x52 128->256 3x3 s1");
    heavy.cublas_ms = 20, heavy.ms = 24.8;
    const CublasVerdict v = judge_against_cublas(rows, "bf16");
    CHECK_FALSE(v.met);
    CHECK(v.worst == doctest::Approx(1.24));
    CHECK(v.median == doctest::Approx(1.0));
    CHECK(v.sum > 1.15);
  }
}

TEST_CASE("cublas verdict: a missing row or cuBLAS time is incomplete, never met") {
  std::vector<TimedRow> rows = every_row(1.0);
  SUBCASE("no cuBLAS time") { row(rows, "conv fwd bf16", "26x26 512->256 1x1 s1").cublas_ms = 0; }
  SUBCASE("a row filtered out") { rows.erase(rows.begin()); }
  const CublasVerdict v = judge_against_cublas(rows, "bf16");
  CHECK(v.judged == 67);
  CHECK_FALSE(v.complete);
  CHECK_FALSE(v.met);
  CHECK(v.line.find("incomplete") != std::string::npos);
  CHECK(judge_against_cublas({}, "bf16").line.find("none of the 68 rows") != std::string::npos);
}
