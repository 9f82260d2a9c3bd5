// Drawing: rectangle outlines pixel-exact and clipped at every edge, text rendered exactly as
// the font table says (scaled, clipped), the font itself (complete, distinct), class colours,
// labelled detections near and beyond the edges, and a drawn image surviving a PNG round trip.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "data/draw.h"
#include "data/image.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

constexpr Rgb kGrey = {7, 7, 7};
constexpr Rgb kRed = {250, 10, 20};
constexpr Rgb kInk = {1, 2, 3};
constexpr Rgb kPaper = {200, 210, 220};

Image blank(int width, int height, Rgb colour = kGrey) {
  Image image;
  image.width = width;
  image.height = height;
  for (int i = 0; i < width * height; ++i) image.rgb.insert(image.rgb.end(), colour.begin(), colour.end());
  return image;
}

Rgb at(const Image& image, int x, int y) {
  const uint8_t* p = image.pixel(x, y);
  return {p[0], p[1], p[2]};
}

// The outline rule of draw.h, per pixel, in 64 bits so extreme corners cannot overflow;
// corners may come in either order.
bool on_outline(int x, int y, int64_t x0, int64_t y0, int64_t x1, int64_t y1, int64_t t) {
  if (x0 > x1) std::swap(x0, x1);
  if (y0 > y1) std::swap(y0, y1);
  if (x < x0 || x > x1 || y < y0 || y > y1) return false;
  return x - x0 < t || x1 - x < t || y - y0 < t || y1 - y < t;
}

// Draws one rectangle on a grey image and checks every pixel; returns how many changed.
int check_rectangle(int width, int height, int x0, int y0, int x1, int y1, int t) {
  CAPTURE(x0);
  CAPTURE(y0);
  CAPTURE(x1);
  CAPTURE(y1);
  CAPTURE(t);
  Image image = blank(width, height);
  draw_rectangle(image, x0, y0, x1, y1, kRed, t);
  int changed = 0, wrong = 0;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      bool outline = on_outline(x, y, x0, y0, x1, y1, t);
      changed += outline;
      wrong += at(image, x, y) != (outline ? kRed : kGrey);
    }
  CHECK(wrong == 0);
  return changed;
}

int glyph_bits(char c) {
  int bits = 0;
  for (int r = 0; r < 7; ++r)
    for (int b = 0; b < 5; ++b) bits += (glyph_rows(c)[r] >> b) & 1;
  return bits;
}

int pixels_of(const Image& image, int x0, int y0, int x1, int y1, Rgb colour) {
  int n = 0;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) n += at(image, x, y) == colour;
  return n;
}

}  // namespace

TEST_CASE("draw: rectangle outline pixel-exact, thickness inward, nothing else changed") {
  // 10 x 9 outer, 6 x 5 hole: 60 pixels.
  CHECK(check_rectangle(20, 15, 3, 2, 12, 10, 2) == 60);
  CHECK(check_rectangle(20, 15, 12, 10, 3, 2, 2) == 60);  // corners in either order
  CHECK(check_rectangle(20, 15, 3, 2, 12, 10, 1) == 2 * 10 + 2 * 7);
  CHECK(check_rectangle(20, 15, 3, 2, 12, 10, 5) == 90);  // thicker than half: filled
  CHECK(check_rectangle(20, 15, 4, 4, 4, 4, 3) == 1);     // a single pixel
  Image image = blank(4, 4);
  CHECK_THROWS_WITH_AS(draw_rectangle(image, 0, 0, 3, 3, kRed, 0), doctest::Contains("thickness 0"), Error);
}

TEST_CASE("draw: rectangles clip at every edge") {
  // The image's own border, 1 pixel in: the part of a 2-thick outline that falls inside.
  CHECK(check_rectangle(20, 15, -1, -1, 20, 15, 2) == 2 * 20 + 2 * 13);
  CHECK(check_rectangle(20, 15, -5, -5, 24, 19, 2) == 0);  // outline wholly around the image
  CHECK(check_rectangle(20, 15, -5, 3, 6, 8, 2) == 4 * 7 + 2 * 2);  // left edge
  CHECK(check_rectangle(20, 15, 15, 3, 30, 8, 2) == 4 * 5 + 2 * 2);  // right edge
  CHECK(check_rectangle(20, 15, 3, -8, 8, 4, 2) == 2 * 6 + 4 * 3);  // top edge
  CHECK(check_rectangle(20, 15, 3, 12, 8, 40, 2) == 2 * 6 + 4 * 1);  // bottom edge
  CHECK(check_rectangle(20, 15, 30, 30, 40, 40, 2) == 0);  // off the image
  CHECK(check_rectangle(20, 15, INT_MIN, INT_MIN, INT_MAX, INT_MAX, 3) == 0);
  CHECK(check_rectangle(20, 15, INT_MIN, 2, 5, 4, INT_MAX) == 6 * 3);  // filled, clipped
  Rng rng;
  CAPTURE(rng.seed());
  for (int i = 0; i < 200; ++i)
    check_rectangle(17, 11, rng.integer(-20, 30), rng.integer(-20, 30), rng.integer(-20, 30), rng.integer(-20, 30),
                    rng.integer(1, 6));
}

TEST_CASE("draw: text renders the font table exactly, scaled") {
  for (int scale : {1, 2, 3}) {
    CAPTURE(scale);
    Image image = blank(40, 40);
    int width = draw_text(image, 2, 3, "A", kInk, kPaper, scale);
    CHECK(width == 7 * scale);
    CHECK(text_width("A", scale) == width);
    const uint8_t* rows = glyph_rows('A');
    int wrong = 0;
    for (int y = 0; y < 40; ++y)
      for (int x = 0; x < 40; ++x) {
        int u = (x - 2) / scale, v = (y - 3) / scale;  // unscaled position in the text box
        bool in_box = x >= 2 && y >= 3 && u < 7 && v < 9;
        bool ink = in_box && u >= 1 && u <= 5 && v >= 1 && v <= 7 && ((rows[v - 1] >> (5 - u)) & 1);
        wrong += at(image, x, y) != (!in_box ? kGrey : ink ? kInk : kPaper);
      }
    CHECK(wrong == 0);
    CHECK(pixels_of(image, 0, 0, 40, 40, kInk) == glyph_bits('A') * scale * scale);
  }
  // 'A' really is an A: a closed top, a crossbar, two legs.
  const uint8_t a[7] = {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11};
  CHECK(std::equal(a, a + 7, glyph_rows('A')));

  CHECK(text_width("ab", 3) == 13 * 3);
  CHECK(text_width("") == 0);
  Image image = blank(10, 10);
  CHECK(draw_text(image, 0, 0, "", kInk, kPaper) == 0);
  CHECK(pixels_of(image, 0, 0, 10, 10, kGrey) == 100);
  CHECK_THROWS_WITH_AS(text_width("a", 0), doctest::Contains("scale 0"), Error);
  CHECK_THROWS_WITH_AS(draw_text(image, 0, 0, "a", kInk, kPaper, -1), doctest::Contains("scale -1"), Error);
}

TEST_CASE("draw: non-printable characters draw as '?'") {
  CHECK(glyph_rows('\n') == glyph_rows('?'));
  CHECK(glyph_rows('\x7f') == glyph_rows('?'));
  CHECK(glyph_rows(static_cast<char>(0xC3)) == glyph_rows('?'));  // a UTF-8 lead byte
  Image a = blank(20, 12), b = blank(20, 12);
  draw_text(a, 1, 1, "\t", kInk, kPaper);
  draw_text(b, 1, 1, "?", kInk, kPaper);
  CHECK(a.rgb == b.rgb);
}

TEST_CASE("draw: text clips at every edge exactly like the unclipped rendering") {
  const std::string text = "Hi 0.87%";
  const int scale = 2;
  int width = text_width(text, scale), height = 9 * scale;
  Image full = blank(width + 200, height + 200);
  draw_text(full, 100, 100, text, kInk, kPaper, scale);
  for (auto [x, y] : std::vector<std::pair<int, int>>{{-10, -5}, {-width + 3, 2}, {15, -height + 1}, {20, 8}, {-3, 10}, {25, 17}}) {
    CAPTURE(x);
    CAPTURE(y);
    Image image = blank(30, 20);
    draw_text(image, x, y, text, kInk, kPaper, scale);
    int wrong = 0, drawn = 0;
    for (int py = 0; py < 20; ++py)
      for (int px = 0; px < 30; ++px) {
        bool inside = px >= x && px < x + width && py >= y && py < y + height;
        drawn += inside;
        wrong += at(image, px, py) != (inside ? at(full, 100 + px - x, 100 + py - y) : kGrey);
      }
    CHECK(wrong == 0);
    CHECK(drawn > 0);
  }
  Image image = blank(30, 20);
  draw_text(image, INT_MAX, INT_MIN, text, kInk, kPaper, scale);
  draw_text(image, INT_MIN, INT_MAX, text, kInk, kPaper, scale);
  draw_text(image, INT_MIN, 0, text, kInk, kPaper, scale);
  CHECK(pixels_of(image, 0, 0, 30, 20, kGrey) == 600);
}

TEST_CASE("draw: the font covers printable ASCII with distinct glyphs") {
  std::set<std::vector<uint8_t>> seen;
  for (int c = 32; c <= 126; ++c) {
    CAPTURE(char(c));
    const uint8_t* rows = glyph_rows(char(c));
    for (int r = 0; r < 7; ++r) CHECK(rows[r] < 32);  // 5 columns only
    CHECK((glyph_bits(char(c)) == 0) == (c == ' '));
    seen.insert(std::vector<uint8_t>(rows, rows + 7));
  }
  CHECK(seen.size() == 95);
}

TEST_CASE("draw: class colours are deterministic, saturated and distinct") {
  std::set<Rgb> colours;
  for (int id = 0; id < 20; ++id) {
    CAPTURE(id);
    Rgb c = class_colour(id);
    CHECK(c == class_colour(id));
    CHECK(*std::max_element(c.begin(), c.end()) == 255);
    CHECK(*std::min_element(c.begin(), c.end()) == 0);
    colours.insert(c);
  }
  CHECK(colours.size() == 20);
  CHECK(class_colour(0) == Rgb{255, 0, 0});
  Rgb negative = class_colour(-3);  // never crashes, still a full colour
  CHECK(*std::max_element(negative.begin(), negative.end()) == 255);
}

TEST_CASE("draw: detection labels sit above the box, or inside it at the top edge") {
  const int w = 120, h = 80;
  Rgb colour = class_colour(0);
  SUBCASE("room above") {
    Image image = blank(w, h);
    draw_detections(image, {{10.0f, 30.0f, 70.0f, 60.0f, 0, 0.87f}}, {"cat"});
    // "cat 0.87": 8 characters, 49 x 9, at (10, 21): its background is the class colour
    // except the ink, whose pixel count is the glyphs' bits.
    int bits = 0;
    for (char c : std::string("cat 0.87")) bits += glyph_bits(c);
    CHECK(pixels_of(image, 10, 21, 59, 30, colour) == 49 * 9 - bits);
    CHECK(pixels_of(image, 0, 0, w, 21, kGrey) == w * 21);  // nothing above the label
    CHECK(at(image, 59, 25) == kGrey);                       // nothing right of it
    CHECK(at(image, 10, 30) == colour);                       // the box's corner
    CHECK(at(image, 69, 59) == colour);                       // x1 = 70 -> last pixel 69
    CHECK(at(image, 70, 59) == kGrey);
    CHECK(at(image, 40, 45) == kGrey);                        // the box is hollow
  }
  SUBCASE("box at the top edge: label inside the image") {
    Image image = blank(w, h);
    draw_detections(image, {{10.0f, 0.0f, 70.0f, 60.0f, 0, 0.87f}}, {"cat"});
    int bits = 0;
    for (char c : std::string("cat 0.87")) bits += glyph_bits(c);
    CHECK(pixels_of(image, 10, 0, 59, 9, colour) == 49 * 9 - bits);
  }
  SUBCASE("no name for the class: its id") {
    Image image = blank(w, h);
    draw_detections(image, {{10.0f, 30.0f, 70.0f, 60.0f, 3, 0.5f}}, {"cat"});
    Rgb c3 = class_colour(3);
    int bits = 0;
    for (char c : std::string("3 0.50")) bits += glyph_bits(c);
    CHECK(pixels_of(image, 10, 21, 47, 30, c3) == 37 * 9 - bits);
    CHECK(at(image, 47, 25) == kGrey);
  }
  SUBCASE("label near the right edge shifts left to stay whole") {
    Image image = blank(w, h);
    draw_detections(image, {{100.0f, 30.0f, 119.0f, 60.0f, 0, 0.87f}}, {"cat"});
    int bits = 0;
    for (char c : std::string("cat 0.87")) bits += glyph_bits(c);
    CHECK(pixels_of(image, w - 49, 21, w, 30, colour) == 49 * 9 - bits);
  }
}

TEST_CASE("draw: labels of detections on the same box do not overlap, and each text is whole") {
  const int w = 120, h = 80;
  const std::vector<std::string> names = {"ellipse", "rectangle", "triangle"};
  // The demo's case: two classes on one box, the lower score first (it used to be drawn over).
  const std::vector<DrawnBox> boxes = {{10.0f, 30.0f, 70.0f, 60.0f, 2, 0.27f}, {10.0f, 30.0f, 70.0f, 60.0f, 0, 0.37f},
                                       {10.5f, 30.2f, 70.0f, 60.0f, 1, 0.31f}};
  const std::vector<DetectionLabel> labels = place_labels(w, h, boxes, names);
  REQUIRE(labels.size() == 3);
  for (size_t a = 0; a < labels.size(); ++a)
    for (size_t b = a + 1; b < labels.size(); ++b) {
      CAPTURE(labels[a].text);
      CAPTURE(labels[b].text);
      CHECK((labels[a].x + labels[a].width <= labels[b].x || labels[b].x + labels[b].width <= labels[a].x ||
             labels[a].y + labels[a].height <= labels[b].y || labels[b].y + labels[b].height <= labels[a].y));
    }
  // The best score keeps the place above the box; the others stack below it.
  CHECK(labels[0].text == "ellipse 0.37");
  CHECK(labels[0].box == 1);
  CHECK((labels[0].x == 10 && labels[0].y == 21));
  CHECK((labels[1].text == "rectangle 0.31" && labels[1].y == 30));
  CHECK((labels[2].text == "triangle 0.27" && labels[2].y == 39));

  // Drawn: each label's pixels are exactly its text alone on its background.
  Image image = blank(w, h);
  draw_detections(image, boxes, names);
  for (const DetectionLabel& label : labels) {
    CAPTURE(label.text);
    Image alone = blank(w, h);
    draw_text(alone, label.x, label.y, label.text, label.ink, label.background, label.scale);
    int wrong = 0;
    for (int y = label.y; y < label.y + label.height; ++y)
      for (int x = label.x; x < label.x + label.width; ++x) wrong += at(image, x, y) != at(alone, x, y);
    CHECK(wrong == 0);
  }
}

TEST_CASE("draw: boxes partly or wholly outside the image are clipped") {
  const int w = 60, h = 40;
  Rgb colour = class_colour(1);
  Image image = blank(w, h);
  float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  draw_detections(image,
                  {{-500.0f, -500.0f, -10.0f, -10.0f, 1, 0.9f},
                   {100.0f, 10.0f, 200.0f, 20.0f, 1, 0.9f},
                   {10.0f, 100.0f, 20.0f, 120.0f, 1, 0.9f},
                   {-inf, 5.0f, -1e30f, 9.0f, 1, 0.9f},
                   {nan, nan, nan, nan, 1, 0.9f}},
                  {"a", "b"});
  CHECK(pixels_of(image, 0, 0, w, h, kGrey) == w * h);

  // Across the bottom-right corner: clipped to the image, so the outline runs along both edges.
  draw_detections(image, {{40.0f, 25.0f, 1e30f, inf, 1, 0.9f}}, {"a", "b"});
  CHECK(at(image, 59, 39) == colour);
  CHECK(at(image, 58, 32) == colour);
  CHECK(at(image, 50, 38) == colour);
  CHECK(at(image, 50, 32) == kGrey);
  CHECK(at(image, 39, 30) == kGrey);

  // Across the top-left corner: the label goes inside, at (0, 0).
  Image corner = blank(w, h);
  draw_detections(corner, {{-20.0f, -20.0f, 30.0f, 30.0f, 1, 0.25f}}, {"a", "b"});
  int bits = 0;
  for (char c : std::string("b 0.25")) bits += glyph_bits(c);
  CHECK(pixels_of(corner, 0, 0, 37, 9, colour) == 37 * 9 - bits);
  CHECK(at(corner, 29, 20) == colour);
  CHECK(at(corner, 20, 20) == kGrey);

  Image empty;
  draw_detections(empty, {{0.0f, 0.0f, 5.0f, 5.0f, 0, 0.5f}}, {});
  CHECK(empty.rgb.empty());
}

TEST_CASE("draw: malformed images are errors") {
  Image image = blank(5, 5);
  image.rgb.pop_back();
  CHECK_THROWS_WITH_AS(draw_rectangle(image, 0, 0, 2, 2, kRed), doctest::Contains("draw_rectangle: image is 5x5"),
                       Error);
  CHECK_THROWS_WITH_AS(draw_text(image, 0, 0, "a", kInk, kPaper), doctest::Contains("holds 74 bytes"), Error);
  CHECK_THROWS_WITH_AS(draw_detections(image, {}, {}), doctest::Contains("draw_detections"), Error);
}

TEST_CASE("draw: a drawn image survives a PNG round trip") {
  TempDir dir;
  Image image = blank(96, 64, {30, 60, 90});
  draw_detections(image, {{5.0f, 20.0f, 50.0f, 60.0f, 2, 0.91f}, {40.0f, 0.0f, 95.0f, 30.0f, 7, 0.5f}},
                  {"person", "car", "dog"});
  draw_text(image, 2, 50, "mAP 0.5: 99%", {255, 255, 255}, {0, 0, 0});
  write_image(dir / "sample.png", image);
  Image back;
  std::string error;
  REQUIRE_MESSAGE(read_image(dir / "sample.png", back, error), error);
  CHECK(back.width == 96);
  CHECK(back.height == 64);
  CHECK(back.rgb == image.rgb);
  CHECK(at(back, 5, 30) == class_colour(2));  // the first box's left edge
  CHECK(pixels_of(back, 0, 0, 96, 64, {30, 60, 90}) < 96 * 64 - 300);  // plenty was drawn
}
