// Drawing detections: clipped rectangles, text in our own 5x7 bitmap font (printable ASCII),
// a colour per class, and boxes with "name score" labels.
#include "data/draw.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/check.h"

namespace yolo::data {

namespace {

// Glyphs for ASCII 32..126, 7 rows each, bit 4 the leftmost of 5 columns. Everything fits the
// 7 rows: g, p, q and y have short bowls so that their tails fit below the other small letters' baseline.
constexpr uint8_t kFont[95][7] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // space
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04},  // '!'
    {0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00},  // '"'
    {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A},  // '#'
    {0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04},  // '$'
    {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03},  // '%'
    {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D},  // '&'
    {0x04, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00},  // '\''
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02},  // '('
    {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08},  // ')'
    {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00},  // '*'
    {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00},  // '+'
    {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08},  // ','
    {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00},  // '-'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C},  // '.'
    {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00},  // '/'
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E},  // '0'
    {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},  // '1'
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F},  // '2'
    {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},  // '3'
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02},  // '4'
    {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},  // '5'
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E},  // '6'
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},  // '7'
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E},  // '8'
    {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},  // '9'
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00},  // ':'
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08},  // ';'
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02},  // '<'
    {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00},  // '='
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08},  // '>'
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04},  // '?'
    {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E},  // '@'
    {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11},  // 'A'
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E},  // 'B'
    {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E},  // 'C'
    {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C},  // 'D'
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F},  // 'E'
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10},  // 'F'
    {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F},  // 'G'
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11},  // 'H'
    {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},  // 'I'
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C},  // 'J'
    {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11},  // 'K'
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F},  // 'L'
    {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11},  // 'M'
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11},  // 'N'
    {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},  // 'O'
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10},  // 'P'
    {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D},  // 'Q'
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11},  // 'R'
    {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E},  // 'S'
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},  // 'T'
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E},  // 'U'
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04},  // 'V'
    {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A},  // 'W'
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11},  // 'X'
    {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04},  // 'Y'
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F},  // 'Z'
    {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E},  // '['
    {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00},  // '\\'
    {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E},  // ']'
    {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00},  // '^'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F},  // '_'
    {0x08, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00},  // '`'
    {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F},  // 'a'
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E},  // 'b'
    {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E},  // 'c'
    {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F},  // 'd'
    {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E},  // 'e'
    {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08},  // 'f'
    {0x00, 0x00, 0x0F, 0x11, 0x0F, 0x01, 0x0E},  // 'g'
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11},  // 'h'
    {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E},  // 'i'
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C},  // 'j'
    {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12},  // 'k'
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},  // 'l'
    {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11},  // 'm'
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11},  // 'n'
    {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E},  // 'o'
    {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10},  // 'p'
    {0x00, 0x00, 0x0F, 0x11, 0x0F, 0x01, 0x01},  // 'q'
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10},  // 'r'
    {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E},  // 's'
    {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06},  // 't'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D},  // 'u'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04},  // 'v'
    {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A},  // 'w'
    {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11},  // 'x'
    {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // 'y'
    {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F},  // 'z'
    {0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02},  // '{'
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04},  // '|'
    {0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08},  // '}'
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00},  // '~'
};

// Text layout, in unscaled pixels: 1 pixel of background before the first glyph and after
// every glyph (so each glyph has a 6x9 cell and the box is symmetric), 1 above and 1 below.
constexpr int kCellWidth = 6, kCellHeight = 9, kGlyphWidth = 5, kGlyphHeight = 7;

void check_image(const Image& image, const char* what) {
  if (image.width < 0 || image.height < 0 ||
      image.rgb.size() != size_t(image.width) * size_t(image.height) * 3)
    throw Error(std::string(what) + ": image is " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                " but holds " + std::to_string(image.rgb.size()) + " bytes (expected width * height * 3)");
}

void put(Image& image, int x, int y, Rgb colour) {
  uint8_t* p = image.pixel(x, y);
  p[0] = colour[0];
  p[1] = colour[1];
  p[2] = colour[2];
}

// Fills [x0, x1] x [y0, y1] (inclusive, 64-bit so far-off coordinates cannot overflow) clipped to the image.
void fill(Image& image, int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb colour) {
  x0 = std::max<int64_t>(x0, 0);
  y0 = std::max<int64_t>(y0, 0);
  x1 = std::min<int64_t>(x1, image.width - 1);
  y1 = std::min<int64_t>(y1, image.height - 1);
  for (int64_t y = y0; y <= y1; ++y)
    for (int64_t x = x0; x <= x1; ++x) put(image, int(x), int(y), colour);
}

// Whether unscaled text pixel (u, v), inside the text box, is a glyph's ink.
bool ink(const std::string& text, int64_t u, int64_t v) {
  int64_t col = u - 1, row = v - 1;
  if (col < 0 || row < 0 || row >= kGlyphHeight) return false;
  int64_t index = col / kCellWidth, gx = col % kCellWidth;
  if (index >= int64_t(text.size()) || gx >= kGlyphWidth) return false;
  return (glyph_rows(text[size_t(index)])[row] >> (kGlyphWidth - 1 - gx)) & 1;
}

// Black text on light class colours, white on dark ones (pure blue, say), for legibility.
Rgb label_ink(Rgb background) {
  double luma = 0.299 * background[0] + 0.587 * background[1] + 0.114 * background[2];
  return luma >= 100 ? Rgb{0, 0, 0} : Rgb{255, 255, 255};
}

// A pixel coordinate (not NaN) as an int, limited to far beyond any image so it is safe to add to.
int to_pixel(double v) { return int(std::clamp(v, -1e8, 1e8)); }

// A detection's box as inclusive pixels clipped to the image (continuous corners floored and
// ceiled, so a box reaching past an edge shows its outline along that edge); false when nothing of
// it is in the image or a corner is NaN.
bool box_pixels(const DrawnBox& box, int width, int height, int& x0, int& y0, int& x1, int& y1) {
  if (std::isnan(box.x0) || std::isnan(box.y0) || std::isnan(box.x1) || std::isnan(box.y1)) return false;
  x0 = to_pixel(std::floor(box.x0));
  y0 = to_pixel(std::floor(box.y0));
  x1 = to_pixel(std::ceil(box.x1)) - 1;
  y1 = to_pixel(std::ceil(box.y1)) - 1;
  if (x0 > x1) std::swap(x0, x1);
  if (y0 > y1) std::swap(y0, y1);
  if (x1 < 0 || y1 < 0 || x0 >= width || y0 >= height) return false;
  x0 = std::max(x0, 0);
  y0 = std::max(y0, 0);
  x1 = std::min(x1, width - 1);
  y1 = std::min(y1, height - 1);
  return true;
}

int detection_scale(int width, int height) { return std::max(1, std::min(width, height) / 400); }

bool overlap(const DetectionLabel& a, const DetectionLabel& b) {
  return a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
}

}  // namespace

const uint8_t* glyph_rows(char c) {
  auto code = static_cast<unsigned char>(c);
  if (code < 32 || code > 126) code = '?';
  return kFont[code - 32];
}

// Hues a golden-ratio turn apart never repeat and stay well spread for any number of classes;
// full saturation and value keep them bright.
Rgb class_colour(int class_id) {
  double hue = std::fmod(double(class_id) * 0.6180339887498949, 1.0);
  if (hue < 0) hue += 1;
  double h6 = hue * 6;
  int sector = std::min(int(h6), 5);
  double f = h6 - sector;
  auto level = [](double v) { return uint8_t(std::lround(v * 255)); };
  uint8_t rise = level(f), fall = level(1 - f);
  switch (sector) {
    case 0: return {255, rise, 0};
    case 1: return {fall, 255, 0};
    case 2: return {0, 255, rise};
    case 3: return {0, fall, 255};
    case 4: return {rise, 0, 255};
    default: return {255, 0, fall};
  }
}

void draw_rectangle(Image& image, int x0, int y0, int x1, int y1, Rgb colour, int thickness) {
  check_image(image, "draw_rectangle");
  if (thickness < 1) throw Error("draw_rectangle: thickness " + std::to_string(thickness) + " (must be 1 or more)");
  if (x0 > x1) std::swap(x0, x1);
  if (y0 > y1) std::swap(y0, y1);
  int64_t t = thickness;
  int64_t left = x0, top = y0, right = x1, bottom = y1;
  fill(image, left, top, right, std::min(bottom, top + t - 1), colour);      // top band
  fill(image, left, std::max(top, bottom - t + 1), right, bottom, colour);   // bottom band
  fill(image, left, top, std::min(right, left + t - 1), bottom, colour);     // left band
  fill(image, std::max(left, right - t + 1), top, right, bottom, colour);    // right band
}

void draw_line(Image& image, int x0, int y0, int x1, int y1, Rgb colour, int thickness) {
  check_image(image, "draw_line");
  if (thickness < 1) throw Error("draw_line: thickness " + std::to_string(thickness) + " (must be 1 or more)");
  // Bresenham over 64-bit coordinates (ends far outside the image stay exact), the brush at each step.
  int64_t x = x0, y = y0;
  const int64_t dx = std::abs(int64_t(x1) - x0), dy = -std::abs(int64_t(y1) - y0);
  const int64_t sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int64_t lo = (thickness - 1) / 2, hi = thickness / 2;
  if (dx - dy > 4 * (int64_t(image.width) + image.height) + 16)
    throw Error("draw_line: a line of " + std::to_string(dx - dy) + " steps, far beyond the " +
                std::to_string(image.width) + "x" + std::to_string(image.height) + " image");
  for (int64_t err = dx + dy;;) {
    fill(image, x - lo, y - lo, x + hi, y + hi, colour);
    if (x == x1 && y == y1) break;
    const int64_t e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y += sy;
    }
  }
}

int text_width(const std::string& text, int scale) {
  if (scale < 1) throw Error("text: scale " + std::to_string(scale) + " (must be 1 or more)");
  if (text.empty()) return 0;
  int64_t width = (int64_t(text.size()) * kCellWidth + 1) * scale;
  if (width > 1000000000)
    throw Error("text: " + std::to_string(text.size()) + " characters at scale " + std::to_string(scale) +
                " are too wide to draw");
  return int(width);
}

int draw_text(Image& image, int x, int y, const std::string& text, Rgb foreground, Rgb background, int scale) {
  check_image(image, "draw_text");
  int width = text_width(text, scale);
  if (width == 0) return 0;
  int64_t height = int64_t(kCellHeight) * scale;
  // Only the part of the text box inside the image is visited.
  int64_t px0 = std::max<int64_t>(x, 0), px1 = std::min<int64_t>(int64_t(x) + width, image.width);
  int64_t py0 = std::max<int64_t>(y, 0), py1 = std::min<int64_t>(int64_t(y) + height, image.height);
  for (int64_t py = py0; py < py1; ++py)
    for (int64_t px = px0; px < px1; ++px)
      put(image, int(px), int(py), ink(text, (px - x) / scale, (py - y) / scale) ? foreground : background);
  return width;
}

std::vector<DetectionLabel> place_labels(int width, int height, const std::vector<DrawnBox>& boxes,
                                         const std::vector<std::string>& names) {
  const int scale = detection_scale(width, height), label_height = kCellHeight * scale;
  std::vector<size_t> order(boxes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return boxes[a].score > boxes[b].score; });
  std::vector<DetectionLabel> placed;
  for (size_t i : order) {
    const DrawnBox& box = boxes[i];
    int x0, y0, x1, y1;
    if (!box_pixels(box, width, height, x0, y0, x1, y1)) continue;
    DetectionLabel label;
    label.box = i;
    const bool named = box.class_id >= 0 && size_t(box.class_id) < names.size();
    char score[32];
    std::snprintf(score, sizeof score, " %.2f", double(box.score));
    label.text = (named ? names[size_t(box.class_id)] : std::to_string(box.class_id)) + score;
    label.background = class_colour(box.class_id);
    label.ink = label_ink(label.background);
    label.scale = scale;
    label.width = text_width(label.text, scale);
    label.height = label_height;
    label.x = std::max(0, std::min(x0, width - label.width));
    const int preferred = y0 >= label_height ? y0 - label_height : y0;  // above the box, else just inside it
    // The first free row: the preferred one, then down a label at a time, then up.
    std::vector<int> rows;
    for (int y = preferred; y + label_height <= height; y += label_height) rows.push_back(y);
    for (int y = preferred - label_height; y >= 0; y -= label_height) rows.push_back(y);
    if (rows.empty()) rows.push_back(0);  // an image lower than a label: clipped at its bottom
    for (int y : rows) {
      label.y = y;
      if (std::none_of(placed.begin(), placed.end(), [&](const DetectionLabel& p) { return overlap(label, p); })) {
        placed.push_back(label);
        break;
      }
    }
  }
  return placed;
}

void draw_detections(Image& image, const std::vector<DrawnBox>& boxes, const std::vector<std::string>& names) {
  check_image(image, "draw_detections");
  if (image.width == 0 || image.height == 0) return;
  const int thickness = detection_scale(image.width, image.height) + 1;
  for (const DrawnBox& box : boxes) {
    int x0, y0, x1, y1;
    if (box_pixels(box, image.width, image.height, x0, y0, x1, y1))
      draw_rectangle(image, x0, y0, x1, y1, class_colour(box.class_id), thickness);
  }
  // The labels after every outline, so that no outline crosses a label.
  for (const DetectionLabel& label : place_labels(image.width, image.height, boxes, names))
    draw_text(image, label.x, label.y, label.text, label.ink, label.background, label.scale);
}

}  // namespace yolo::data
