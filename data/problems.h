// What opening a dataset found wrong (Split::problems), told to the user all at once: grouped by
// kind, the first few of each on the console and every one in a file; and whether training may
// go on: unusable items are left out unless they are more than a few percent of a split (then the
// dataset is probably wrong, not a few files), and --strict stops at any problem.
#pragma once
#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace yolo::data {

constexpr double kMaxUnusableFraction = 0.05;

int64_t problem_count(const Dataset& dataset);

// Per split with problems: "train: 12 problems, 11 items left out of 10000 listed:" then each
// kind with its count and its first `per_kind` messages. "" when there is none.
std::string problem_report(const Dataset& dataset, int per_kind = 3);

// Every problem, grouped by split and kind, one per line; throws yolo::Error naming the file if
// it cannot be written.
void write_problem_list(const Dataset& dataset, const std::string& path);

// Throws yolo::Error when training must not start: `strict` and any problem; a split with more
// than kMaxUnusableFraction of its listed items unusable; no usable training image. `list_path`
// (where the full list was written, or "") is named in the message.
void check_usable(const Dataset& dataset, bool strict, const std::string& list_path);

}  // namespace yolo::data
