// Drawing detections onto images: rectangles, and labels in a small bitmap font of our own
// (printable ASCII), each class in its own colour.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"

namespace yolo::data {

using Rgb = std::array<uint8_t, 3>;

// A distinct, saturated colour for a class id (deterministic).
Rgb class_colour(int class_id);

// An axis-aligned rectangle outline, `thickness` pixels inward from the corners (x0, y0) ..
// (x1, y1) inclusive; clipped to the image.
void draw_rectangle(Image& image, int x0, int y0, int x1, int y1, Rgb colour, int thickness = 2);

// A line from (x0, y0) to (x1, y1), both ends included, `thickness` pixels wide (a square brush
// centred on each point of the line); clipped to the image.
void draw_line(Image& image, int x0, int y0, int x1, int y1, Rgb colour, int thickness = 1);

// Text with its top-left corner at (x, y), each glyph 5x7 pixels in a 6x9 cell, scaled by
// `scale`, on a filled background box; clipped to the image. Characters outside printable
// ASCII draw as '?'. Returns the width in pixels.
int draw_text(Image& image, int x, int y, const std::string& text, Rgb foreground, Rgb background, int scale = 1);
int text_width(const std::string& text, int scale = 1);

// The 7 rows of a character's 5x7 glyph, bit 4 the leftmost column ('?' for non-printable).
const uint8_t* glyph_rows(char c);

struct DrawnBox {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // pixels
  int class_id = 0;
  float score = 0;
};
// A detection's label as draw_detections places it: "name 0.87" in the class colour.
struct DetectionLabel {
  size_t box = 0;  // index into the boxes
  std::string text;
  Rgb background{}, ink{};
  int scale = 1;
  int x = 0, y = 0, width = 0, height = 0;  // top-left corner and size in pixels
};

// The labels of `boxes` on a width x height image, no two overlapping: each above its box (just
// inside it at the image's top edge), or else in the first free row of label height below that
// place, or else above it; the boxes in order of descending score, so that the best keeps its
// place beside its box. A label with no free row is left out (its box is still drawn); so is the
// label of a box that is not drawn (wholly outside the image, or a NaN corner).
std::vector<DetectionLabel> place_labels(int width, int height, const std::vector<DrawnBox>& boxes,
                                         const std::vector<std::string>& names);

// Boxes with their labels as place_labels places them, drawn over every outline.
void draw_detections(Image& image, const std::vector<DrawnBox>& boxes, const std::vector<std::string>& names);

}  // namespace yolo::data
