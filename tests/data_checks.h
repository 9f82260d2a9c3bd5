// Checks shared by the dataset reader tests.
#pragma once
#include <doctest/doctest.h>

#include "data/dataset.h"

namespace yolo::testing {

// A box equals the expected normalised centre/size (relative 1e-6), class and difficult flag.
inline void check_box(const data::Box& box, double x, double y, double w, double h, int class_id, bool difficult) {
  CHECK(box.x == doctest::Approx(x).epsilon(1e-6));
  CHECK(box.y == doctest::Approx(y).epsilon(1e-6));
  CHECK(box.w == doctest::Approx(w).epsilon(1e-6));
  CHECK(box.h == doctest::Approx(h).epsilon(1e-6));
  CHECK(box.class_id == class_id);
  CHECK(box.difficult == difficult);
}

}  // namespace yolo::testing
