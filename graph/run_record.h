// A record of the training users can look at: runs/<name>/results.csv (a row per epoch: losses
// by part, IoU, recall, learning rate, images/s, the step split, mAP@0.5 when validated) and
// runs/<name>/chart.png (loss and validation mAP over iterations, drawn with data/draw.h and
// written as PNG), both rewritten each epoch, as darknet rewrites its chart.png; a resumed run
// appends to the same file and the chart shows the whole history.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"
#include "graph/train.h"

namespace yolo::graph {

struct EpochRecord {
  double epoch = 0;                                       // epochs completed (fractional for the partial last one)
  int64_t iteration = 0;                                  // optimizer steps done
  double loss = 0, box = 0, obj = 0, noobj = 0, cls = 0;  // mean per image over the epoch's steps
  double iou = 0, recall = 0;
  double learning_rate = 0, images_per_second = 0;
  // The step split, milliseconds per step (device idle: NaN where not measured).
  double data_ms = 0, forward_ms = 0, backward_ms = 0, comm_ms = 0, optimizer_ms = 0, other_ms = 0, idle_ms = 0;
  double map50 = -1;  // -1: not validated this epoch
};

// The columns, in order (the CSV's header).
const std::vector<std::string>& results_columns();

// Appends `record` to the CSV at `path` (the header first when the file is new or empty).
void append_results(const std::string& path, const EpochRecord& record);

// The rows of a results.csv (written by append_results); throws yolo::Error naming the file and
// line on a row that does not parse.
std::vector<EpochRecord> read_results(const std::string& path);

// The mAP@0.5 of the run's final weights, measured after training (train_yolo's report on the
// validation split), into the record in `out_dir`: results.csv's last row becomes validated with
// `map50` when it is the row of `iteration` (the run's last step), and chart.png is redrawn.
// Returns false, changing nothing, when there is no such row (a run that trained no step).
bool record_final_map(const std::string& out_dir, int64_t iteration, double map50);

// Where the chart draws: the plot area in pixels and the ranges it maps.
struct ChartFrame {
  int left = 0, top = 0, right = 0, bottom = 0;  // the plot area, inclusive
  double max_iteration = 1, max_loss = 1;
  int x_of(double iteration) const;
  int y_of_loss(double loss) const;
  int y_of_map(double map) const;  // mAP 0..1 on the right axis
};
ChartFrame chart_frame(const std::vector<EpochRecord>& records, int width, int height);

// Loss (blue) and mAP@0.5 (red, where validated) against iterations, with axes and labels.
data::Image draw_chart(const std::vector<EpochRecord>& records, int width = 800, int height = 500);

}  // namespace yolo::graph
