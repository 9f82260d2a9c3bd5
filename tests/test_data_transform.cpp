// Tests of data/transform: placements and their inverse, augmentation draws, the network-input
// render against a slow double-precision reference, box transforms and multi-scale sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>

#include "data/transform.h"
#include "runtime/check.h"
#include "tests/test_support.h"

namespace {

using namespace yolo::data;

bool same_placement(const Placement& a, const Placement& b) {
  return a.image_w == b.image_w && a.image_h == b.image_h && a.net_w == b.net_w && a.net_h == b.net_h &&
         a.scale_x == b.scale_x && a.scale_y == b.scale_y && a.offset_x == b.offset_x && a.offset_y == b.offset_y &&
         a.flip == b.flip;
}

Image random_image(yolo::testing::Rng& rng, int w, int h) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (uint8_t& b : img.rgb) b = static_cast<uint8_t>(rng.integer(0, 255));
  return img;
}

Image solid_image(int w, int h, std::array<uint8_t, 3> color) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = color[i % 3];
  return img;
}

// ---- a slow, straightforward reference of render_input, in double ------------------------

std::array<double, 3> hsv_shift_reference(std::array<double, 3> rgb, const ColorShift& c) {
  double r = rgb[0], g = rgb[1], b = rgb[2];
  double mx = std::max({r, g, b}), mn = std::min({r, g, b}), d = mx - mn;
  double h = 0;
  if (d > 0) {
    if (mx == r)
      h = (g - b) / d;
    else if (mx == g)
      h = (b - r) / d + 2;
    else
      h = (r - g) / d + 4;
    h /= 6;
  }
  double s = mx > 0 ? d / mx : 0, v = mx;
  h += c.hue;
  h -= std::floor(h);
  s = std::min(1.0, s * c.saturation);
  v = std::min(1.0, v * c.exposure);
  double h6 = h * 6;
  int sector = static_cast<int>(std::floor(h6)) % 6;
  double f = h6 - std::floor(h6);
  double p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
  switch (sector) {
    case 0: return {v, t, p};
    case 1: return {q, v, p};
    case 2: return {p, v, t};
    case 3: return {p, q, v};
    case 4: return {t, p, v};
    default: return {v, p, q};
  }
}

std::vector<double> render_reference(const Image& img, const Placement& p, const ColorShift& c) {
  std::vector<double> out(static_cast<size_t>(p.net_w) * p.net_h * 3);
  auto at = [&](int x, int y, int ch) {
    x = std::clamp(x, 0, img.width - 1);
    y = std::clamp(y, 0, img.height - 1);
    return img.rgb[(static_cast<size_t>(y) * img.width + x) * 3 + ch] / 255.0;
  };
  for (int v = 0; v < p.net_h; ++v) {
    for (int u = 0; u < p.net_w; ++u) {
      int source_u = p.flip ? p.net_w - 1 - u : u;
      double x = (source_u + 0.5 - static_cast<double>(p.offset_x)) / static_cast<double>(p.scale_x);
      double y = (v + 0.5 - static_cast<double>(p.offset_y)) / static_cast<double>(p.scale_y);
      std::array<double, 3> rgb = {0.5, 0.5, 0.5};
      if (x >= 0 && x < img.width && y >= 0 && y < img.height) {
        double sx = x - 0.5, sy = y - 0.5;
        int x0 = static_cast<int>(std::floor(sx)), y0 = static_cast<int>(std::floor(sy));
        double fx = sx - x0, fy = sy - y0;
        for (int ch = 0; ch < 3; ++ch)
          rgb[ch] = (1 - fy) * ((1 - fx) * at(x0, y0, ch) + fx * at(x0 + 1, y0, ch)) +
                    fy * ((1 - fx) * at(x0, y0 + 1, ch) + fx * at(x0 + 1, y0 + 1, ch));
      }
      if (!c.identity()) rgb = hsv_shift_reference(rgb, c);
      for (int ch = 0; ch < 3; ++ch) out[(static_cast<size_t>(v) * p.net_w + u) * 3 + ch] = rgb[ch];
    }
  }
  return out;
}

std::vector<float> render(const Image& img, const Placement& p, const ColorShift& c) {
  std::vector<float> out(static_cast<size_t>(p.net_w) * p.net_h * 3, std::numeric_limits<float>::quiet_NaN());
  render_input(img, p, c, out.data());
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(a[i] - b[i]);
    if (!(d <= worst)) worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return worst;
}

}  // namespace

TEST_CASE("resize mode names round trip and unknown names list the choices") {
  CHECK(std::string(resize_mode_name(ResizeMode::Letterbox)) == "letterbox");
  CHECK(std::string(resize_mode_name(ResizeMode::Stretch)) == "stretch");
  CHECK(parse_resize_mode("letterbox") == ResizeMode::Letterbox);
  CHECK(parse_resize_mode("stretch") == ResizeMode::Stretch);
  CHECK_THROWS_WITH_AS(parse_resize_mode("squash"), doctest::Contains("letterbox"), yolo::Error);
  CHECK_THROWS_WITH_AS(parse_resize_mode("Letterbox"), doctest::Contains("stretch"), yolo::Error);
}

TEST_CASE("fit_placement: letterbox and stretch of 640x480 into 416x416") {
  Placement lb = fit_placement(640, 480, 416, 416, ResizeMode::Letterbox);
  CHECK(lb.image_w == 640);
  CHECK(lb.image_h == 480);
  CHECK(lb.net_w == 416);
  CHECK(lb.net_h == 416);
  CHECK(lb.scale_x == doctest::Approx(0.65).epsilon(1e-6));
  CHECK(lb.scale_y == doctest::Approx(0.65).epsilon(1e-6));
  CHECK(lb.offset_x == doctest::Approx(0).epsilon(1e-6));
  CHECK(lb.offset_y == doctest::Approx(52).epsilon(1e-6));
  CHECK_FALSE(lb.flip);

  Placement portrait = fit_placement(480, 640, 416, 416, ResizeMode::Letterbox);
  CHECK(portrait.offset_x == doctest::Approx(52).epsilon(1e-6));
  CHECK(portrait.offset_y == doctest::Approx(0).epsilon(1e-6));

  Placement st = fit_placement(640, 480, 416, 416, ResizeMode::Stretch);
  CHECK(st.scale_x == doctest::Approx(0.65).epsilon(1e-6));
  CHECK(st.scale_y == doctest::Approx(416.0 / 480).epsilon(1e-6));
  CHECK(st.offset_x == 0);
  CHECK(st.offset_y == 0);

  CHECK_THROWS_WITH_AS(fit_placement(0, 480, 416, 416, ResizeMode::Letterbox), doctest::Contains("positive"),
                       yolo::Error);
  CHECK_THROWS_AS(fit_placement(640, 480, 416, -1, ResizeMode::Stretch), yolo::Error);
}

TEST_CASE("Placement maps boxes to the network and back, flip mirrors x") {
  Placement lb = fit_placement(640, 480, 416, 416, ResizeMode::Letterbox);
  Box whole{0.5f, 0.5f, 1, 1, 3, true};
  Box n = lb.to_network(whole);
  CHECK(n.x == doctest::Approx(0.5));
  CHECK(n.y == doctest::Approx(0.5));
  CHECK(n.w == doctest::Approx(1));
  CHECK(n.h == doctest::Approx(0.75));
  CHECK(n.class_id == 3);
  CHECK(n.difficult);

  Placement st = fit_placement(200, 100, 416, 416, ResizeMode::Stretch);
  st.flip = true;
  Box left{0.25f, 0.4f, 0.1f, 0.2f, 0, false};
  Box f = st.to_network(left);
  CHECK(f.x == doctest::Approx(0.75));
  CHECK(f.y == doctest::Approx(0.4));
  CHECK(f.w == doctest::Approx(0.1));

  yolo::testing::Rng rng;
  INFO("seed " << rng.seed());
  for (int trial = 0; trial < 500; ++trial) {
    Placement p;
    p.image_w = rng.integer(1, 2000);
    p.image_h = rng.integer(1, 2000);
    p.net_w = rng.integer(32, 1024);
    p.net_h = rng.integer(32, 1024);
    // Anything from a small part of the image to a small picture in the network.
    p.scale_x = static_cast<float>(p.net_w) / p.image_w * rng.uniform(0.3f, 3);
    p.scale_y = static_cast<float>(p.net_h) / p.image_h * rng.uniform(0.3f, 3);
    p.offset_x = rng.uniform(-1, 1) * p.net_w;
    p.offset_y = rng.uniform(-1, 1) * p.net_h;
    p.flip = rng.integer(0, 1) == 1;
    Box b{rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 1), trial, false};
    Box back = p.to_image(p.to_network(b));
    CHECK(std::fabs(back.x - b.x) < 1e-5);
    CHECK(std::fabs(back.y - b.y) < 1e-5);
    CHECK(std::fabs(back.w - b.w) < 1e-5);
    CHECK(std::fabs(back.h - b.h) < 1e-5);
    CHECK(back.class_id == trial);
  }
}

TEST_CASE("draw_augmentation is a function of the key, and with everything off equals fit_placement") {
  AugmentParams params;
  params.jitter = 0.3f;
  params.hue = 0.1f;
  params.saturation = 1.5f;
  params.exposure = 1.5f;
  for (uint64_t key = 0; key < 20; ++key) {
    KeyedRng r1(7, key), r2(7, key);
    Augmentation a = draw_augmentation(640, 480, 416, 416, ResizeMode::Letterbox, params, r1);
    Augmentation b = draw_augmentation(640, 480, 416, 416, ResizeMode::Letterbox, params, r2);
    CHECK(same_placement(a.placement, b.placement));
    CHECK(a.color.hue == b.color.hue);
    CHECK(a.color.saturation == b.color.saturation);
    CHECK(a.color.exposure == b.color.exposure);
  }
  // Different keys give different draws.
  KeyedRng k1(7, 1), k2(7, 2);
  CHECK_FALSE(same_placement(draw_augmentation(640, 480, 416, 416, ResizeMode::Stretch, params, k1).placement,
                             draw_augmentation(640, 480, 416, 416, ResizeMode::Stretch, params, k2).placement));

  AugmentParams off;
  off.flip = false;
  for (ResizeMode mode : {ResizeMode::Letterbox, ResizeMode::Stretch}) {
    for (uint64_t key = 0; key < 20; ++key) {
      KeyedRng rng(3, key);
      int w = 37 + static_cast<int>(key) * 31, h = 500 - static_cast<int>(key) * 13;
      Augmentation a = draw_augmentation(w, h, 416, 288, mode, off, rng);
      CHECK(same_placement(a.placement, fit_placement(w, h, 416, 288, mode)));
      CHECK(a.color.identity());
    }
  }
}

TEST_CASE("draw_augmentation: each knob leaves the other knobs' draws unchanged") {
  AugmentParams all;
  all.jitter = 0.3f;
  all.hue = 0.1f;
  all.saturation = 1.5f;
  all.exposure = 1.5f;
  AugmentParams no_hue = all, no_flip = all, no_jitter = all, no_colour = all;
  no_hue.hue = 0;
  no_flip.flip = false;
  no_jitter.jitter = 0;
  no_colour.hue = 0;
  no_colour.saturation = 1;
  no_colour.exposure = 1;
  int flips = 0;
  for (uint64_t key = 0; key < 50; ++key) {
    auto draw = [&](const AugmentParams& p) {
      KeyedRng rng(11, key);
      return draw_augmentation(500, 300, 320, 320, ResizeMode::Letterbox, p, rng);
    };
    Augmentation a = draw(all), h = draw(no_hue), f = draw(no_flip), j = draw(no_jitter), c = draw(no_colour);
    flips += a.placement.flip;
    CHECK(same_placement(a.placement, h.placement));
    CHECK(h.color.hue == 0);
    CHECK(h.color.saturation == a.color.saturation);
    CHECK(h.color.exposure == a.color.exposure);
    CHECK_FALSE(f.placement.flip);
    f.placement.flip = a.placement.flip;
    CHECK(same_placement(a.placement, f.placement));
    CHECK(f.color.hue == a.color.hue);
    CHECK(j.placement.flip == a.placement.flip);
    CHECK(j.color.hue == a.color.hue);
    CHECK(j.color.exposure == a.color.exposure);
    CHECK(same_placement(a.placement, c.placement));
    CHECK(c.color.identity());
  }
  CHECK(flips > 0);
  CHECK(flips < 50);
}

TEST_CASE("draw_augmentation stays within the documented ranges") {
  const int W = 640, H = 480, NW = 416, NH = 320;
  AugmentParams params;
  params.jitter = 0.3f;
  params.hue = 0.1f;
  params.saturation = 1.5f;
  params.exposure = 0.5f;  // read as 2
  const float eps = 1e-3f;
  int flips = 0, cut_in = 0, extend_out = 0, sat_up = 0, sat_down = 0, hue_neg = 0, hue_pos = 0;
  const int draws = 2000;
  for (int i = 0; i < draws; ++i) {
    KeyedRng rng(5, static_cast<uint64_t>(i));
    Augmentation a = draw_augmentation(W, H, NW, NH, ResizeMode::Stretch, params, rng);
    const Placement& p = a.placement;
    // Stretch: the crop window is recoverable exactly from the placement.
    float left = -p.offset_x / p.scale_x, right = left + NW / p.scale_x;
    float top = -p.offset_y / p.scale_y, bottom = top + NH / p.scale_y;
    CHECK(left >= -0.3f * W - eps);
    CHECK(left <= 0.3f * W + eps);
    CHECK(right >= 0.7f * W - eps);
    CHECK(right <= 1.3f * W + eps);
    CHECK(top >= -0.3f * H - eps);
    CHECK(top <= 0.3f * H + eps);
    CHECK(bottom >= 0.7f * H - eps);
    CHECK(bottom <= 1.3f * H + eps);
    cut_in += left > 0;
    extend_out += left < 0;
    flips += p.flip;
    CHECK(std::fabs(a.color.hue) <= 0.1f);
    hue_neg += a.color.hue < 0;
    hue_pos += a.color.hue > 0;
    CHECK(a.color.saturation >= 1 / 1.5f - 1e-6f);
    CHECK(a.color.saturation <= 1.5f + 1e-6f);
    sat_up += a.color.saturation > 1;
    sat_down += a.color.saturation < 1;
    CHECK(a.color.exposure >= 0.5f - 1e-6f);
    CHECK(a.color.exposure <= 2.0f + 1e-6f);

    KeyedRng rng2(5, static_cast<uint64_t>(i));
    Augmentation l = draw_augmentation(W, H, NW, NH, ResizeMode::Letterbox, params, rng2);
    float fit = fit_placement(W, H, NW, NH, ResizeMode::Letterbox).scale_x;
    CHECK(l.placement.scale_x == l.placement.scale_y);
    CHECK(l.placement.scale_x >= fit / 1.6f - eps);
    CHECK(l.placement.scale_x <= fit / 0.4f + eps);
  }
  CHECK(flips > draws / 3);
  CHECK(flips < 2 * draws / 3);
  CHECK(cut_in > draws / 4);
  CHECK(extend_out > draws / 4);
  CHECK(sat_up > draws / 4);
  CHECK(sat_down > draws / 4);
  CHECK(hue_neg > draws / 4);
  CHECK(hue_pos > draws / 4);

  // Huge jitter: the crop never shrinks below 10% of the image.
  params.jitter = 3;
  for (int i = 0; i < 500; ++i) {
    KeyedRng rng(9, static_cast<uint64_t>(i));
    Placement p = draw_augmentation(W, H, NW, NH, ResizeMode::Stretch, params, rng).placement;
    CHECK(NW / p.scale_x >= 0.1f * W * (1 - 1e-5f));
    CHECK(NH / p.scale_y >= 0.1f * H * (1 - 1e-5f));
    CHECK(std::isfinite(p.offset_x));
  }
}

TEST_CASE("draw_augmentation rejects bad parameters and sizes") {
  KeyedRng rng(1);
  AugmentParams p;
  p.jitter = -0.1f;
  CHECK_THROWS_WITH_AS(draw_augmentation(64, 64, 32, 32, ResizeMode::Letterbox, p, rng), doctest::Contains("jitter"),
                       yolo::Error);
  p = {};
  p.saturation = 0;
  CHECK_THROWS_WITH_AS(draw_augmentation(64, 64, 32, 32, ResizeMode::Letterbox, p, rng),
                       doctest::Contains("saturation"), yolo::Error);
  p = {};
  p.exposure = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(draw_augmentation(64, 64, 32, 32, ResizeMode::Letterbox, p, rng),
                       doctest::Contains("exposure"), yolo::Error);
  p = {};
  p.hue = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(draw_augmentation(64, 64, 32, 32, ResizeMode::Letterbox, p, rng), doctest::Contains("hue"),
                       yolo::Error);
  p = {};
  CHECK_THROWS_WITH_AS(draw_augmentation(64, 0, 32, 32, ResizeMode::Letterbox, p, rng), doctest::Contains("positive"),
                       yolo::Error);
}

TEST_CASE("render_input matches a slow double-precision reference") {
  yolo::testing::Rng rng;
  INFO("seed " << rng.seed());
  for (int trial = 0; trial < 60; ++trial) {
    int w = rng.integer(1, 23) * 2 - 1, h = rng.integer(1, 23) * 2 - 1;
    Image img = random_image(rng, w, h);
    Placement p;
    ColorShift c;
    if (trial % 2 == 0) {
      // Arbitrary placements: bars on any side, up- and downscaling, flips.
      p.image_w = w;
      p.image_h = h;
      p.net_w = rng.integer(1, 57);
      p.net_h = rng.integer(1, 57);
      p.scale_x = rng.uniform(0.3f, 5);
      p.scale_y = rng.uniform(0.3f, 5);
      p.offset_x = rng.uniform(-20, 30);
      p.offset_y = rng.uniform(-20, 30);
      p.flip = rng.integer(0, 1) == 1;
      if (rng.integer(0, 2) > 0) c = {rng.uniform(-1.5f, 1.5f), rng.uniform(0, 3), rng.uniform(0, 3)};
    } else {
      AugmentParams params;
      params.jitter = 0.4f;
      params.hue = 0.5f;
      params.saturation = 2;
      params.exposure = 2;
      KeyedRng key(static_cast<uint64_t>(trial), rng.seed());
      ResizeMode mode = trial % 4 == 1 ? ResizeMode::Letterbox : ResizeMode::Stretch;
      Augmentation a = draw_augmentation(w, h, rng.integer(8, 49), rng.integer(8, 49), mode, params, key);
      p = a.placement;
      c = a.color;
    }
    INFO("trial " << trial << ": image " << w << "x" << h << ", net " << p.net_w << "x" << p.net_h << ", scale "
                  << p.scale_x << "," << p.scale_y << ", offset " << p.offset_x << "," << p.offset_y << ", flip "
                  << p.flip << ", hsv " << c.hue << "," << c.saturation << "," << c.exposure);
    CHECK(max_abs_diff(render(img, p, c), render_reference(img, p, c)) < 1e-4);
  }
}

TEST_CASE("render_input: a constant image renders its colour inside and grey in the letterbox bars") {
  Image img = solid_image(37, 23, {200, 100, 50});
  Placement p = fit_placement(37, 23, 64, 64, ResizeMode::Letterbox);
  std::vector<float> out = render(img, p, {});
  int grey_top = 0, grey_bottom = 0, coloured = 0;
  for (int v = 0; v < 64; ++v) {
    for (int u = 0; u < 64; ++u) {
      const float* px = &out[(static_cast<size_t>(v) * 64 + u) * 3];
      bool grey = px[0] == 0.5f && px[1] == 0.5f && px[2] == 0.5f;
      bool colour = std::fabs(px[0] - 200 / 255.0) < 1e-6 && std::fabs(px[1] - 100 / 255.0) < 1e-6 &&
                    std::fabs(px[2] - 50 / 255.0) < 1e-6;
      CHECK((grey || colour));
      // The image spans rows 12.1 .. 51.9 (scale 64/37, height 23 -> 39.8, centred).
      if (v + 0.5 < 12.1) CHECK(grey);
      if (v + 0.5 > 12.2 && v + 0.5 < 51.8) CHECK(colour);
      grey_top += grey && v < 32;
      grey_bottom += grey && v >= 32;
      coloured += colour;
    }
  }
  CHECK(grey_top == 12 * 64);
  CHECK(grey_bottom == 12 * 64);
  CHECK(coloured == 40 * 64);
}

TEST_CASE("render_input: hue by a full circle is the identity, hue 1/3 turns red into green") {
  yolo::testing::Rng rng;
  INFO("seed " << rng.seed());
  Image img = random_image(rng, 31, 17);
  Placement p = fit_placement(31, 17, 40, 40, ResizeMode::Stretch);
  std::vector<float> plain = render(img, p, {});
  for (float hue : {1.0f, -1.0f, 2.0f}) {
    std::vector<float> turned = render(img, p, {hue, 1, 1});
    double worst = 0;
    for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(plain[i] - turned[i])));
    CHECK(worst < 1e-4);
  }

  Image red = solid_image(9, 9, {255, 0, 0});
  std::vector<float> green = render(red, fit_placement(9, 9, 9, 9, ResizeMode::Stretch), {1.0f / 3, 1, 1});
  for (size_t i = 0; i < green.size(); i += 3) {
    CHECK(green[i] == doctest::Approx(0).epsilon(1e-4));
    CHECK(green[i + 1] == doctest::Approx(1).epsilon(1e-4));
    CHECK(green[i + 2] == doctest::Approx(0).epsilon(1e-4));
  }
}

TEST_CASE("render_input rejects a placement for another image or a broken image") {
  Image img = solid_image(10, 8, {1, 2, 3});
  std::vector<float> out(16 * 16 * 3);
  Placement other = fit_placement(8, 10, 16, 16, ResizeMode::Letterbox);
  CHECK_THROWS_WITH_AS(render_input(img, other, {}, out.data()), doctest::Contains("10x8"), yolo::Error);
  Placement p = fit_placement(10, 8, 16, 16, ResizeMode::Letterbox);
  img.rgb.pop_back();
  CHECK_THROWS_WITH_AS(render_input(img, p, {}, out.data()), doctest::Contains("bytes"), yolo::Error);
  img.rgb.push_back(0);
  p.scale_x = 0;
  CHECK_THROWS_WITH_AS(render_input(img, p, {}, out.data()), doctest::Contains("positive"), yolo::Error);
}

TEST_CASE("transform_boxes: the augmented box still covers the drawn rectangle") {
  yolo::testing::Rng rng;
  INFO("seed " << rng.seed());
  const std::array<uint8_t, 3> A = {230, 30, 30}, B = {30, 90, 220};
  auto nearest_is_a = [&](const float* px) {
    auto dist = [&](double r, double g, double b) {
      return (px[0] - r) * (px[0] - r) + (px[1] - g) * (px[1] - g) + (px[2] - b) * (px[2] - b);
    };
    double da = dist(A[0] / 255.0, A[1] / 255.0, A[2] / 255.0);
    return da < dist(B[0] / 255.0, B[1] / 255.0, B[2] / 255.0) && da < dist(0.5, 0.5, 0.5);
  };
  int kept = 0;
  for (int trial = 0; trial < 40; ++trial) {
    int W = rng.integer(48, 160), H = rng.integer(48, 160);
    int rw = rng.integer(16, W / 2), rh = rng.integer(16, H / 2);
    int rx = rng.integer(0, W - rw), ry = rng.integer(0, H - rh);
    Image img = solid_image(W, H, B);
    for (int y = ry; y < ry + rh; ++y)
      for (int x = rx; x < rx + rw; ++x) std::copy(A.begin(), A.end(), img.pixel(x, y));
    Box box{(rx + rw / 2.0f) / W, (ry + rh / 2.0f) / H, static_cast<float>(rw) / W, static_cast<float>(rh) / H, 4,
            false};

    AugmentParams params;
    params.jitter = 0.3f;
    params.flip = true;
    int NW = rng.integer(64, 128), NH = rng.integer(64, 128);
    KeyedRng key(static_cast<uint64_t>(trial), rng.seed());
    ResizeMode mode = trial % 2 ? ResizeMode::Letterbox : ResizeMode::Stretch;
    Augmentation a = draw_augmentation(W, H, NW, NH, mode, params, key);
    REQUIRE(a.color.identity());
    std::vector<float> out = render(img, a.placement, a.color);
    std::vector<Box> boxes;
    int dropped = transform_boxes({box}, a.placement, 2, boxes);
    CHECK(dropped + static_cast<int>(boxes.size()) == 1);
    if (boxes.empty()) continue;
    ++kept;
    const Box& b = boxes[0];
    CHECK(b.class_id == 4);
    double x0 = (b.x - b.w / 2) * NW, x1 = (b.x + b.w / 2) * NW;
    double y0 = (b.y - b.h / 2) * NH, y1 = (b.y + b.h / 2) * NH;
    INFO("trial " << trial << " flip " << a.placement.flip << " box " << x0 << ".." << x1 << " x " << y0 << ".."
                  << y1);
    int inside = 0, inside_a = 0, outside_a = 0;
    for (int v = 0; v < NH; ++v) {
      for (int u = 0; u < NW; ++u) {
        double cx = u + 0.5, cy = v + 0.5;
        bool is_a = nearest_is_a(&out[(static_cast<size_t>(v) * NW + u) * 3]);
        if (cx > x0 + 1.5 && cx < x1 - 1.5 && cy > y0 + 1.5 && cy < y1 - 1.5) {
          ++inside;
          inside_a += is_a;
        }
        if (cx < x0 - 1.5 || cx > x1 + 1.5 || cy < y0 - 1.5 || cy > y1 + 1.5) outside_a += is_a;
      }
    }
    if (inside > 0) CHECK(inside_a > 0.95 * inside);
    CHECK(outside_a == 0);
  }
  CHECK(kept > 20);
}

TEST_CASE("transform_boxes clips to the network and drops thin boxes") {
  Placement p = fit_placement(100, 50, 100, 50, ResizeMode::Stretch);
  std::vector<Box> in = {
      {0.95f, 0.5f, 0.2f, 0.4f, 1, true},   // right part cut off: x 0.85..1
      {1.0f, 0.5f, 0.02f, 0.5f, 2, false},  // 1 pixel wide after clipping
      {1.5f, 0.5f, 0.2f, 0.2f, 3, false},   // entirely outside
      {0.5f, 0.5f, std::numeric_limits<float>::quiet_NaN(), 0.2f, 4, false},
      {0.5f, 0.02f, 0.5f, 0.1f, 5, false},  // y -0.03..0.07: 3.5 pixels of 50 remain
      {0.5f, 0.985f, 0.5f, 0.04f, 6, false},  // y 0.965..1: 1.75 pixels of 50 remain
  };
  std::vector<Box> out = {Box{}};
  CHECK(transform_boxes(in, p, 2, out) == 4);
  REQUIRE(out.size() == 3);
  CHECK(out[1].x == doctest::Approx(0.925));
  CHECK(out[1].w == doctest::Approx(0.15));
  CHECK(out[1].y == doctest::Approx(0.5));
  CHECK(out[1].h == doctest::Approx(0.4));
  CHECK(out[1].class_id == 1);
  CHECK(out[1].difficult);
  CHECK(out[2].class_id == 5);
  CHECK(out[2].y == doctest::Approx(0.035));
  CHECK(out[2].h == doctest::Approx(0.07));

  std::vector<Box> lenient;
  CHECK(transform_boxes(in, p, 0.5f, lenient) == 2);
  REQUIRE(lenient.size() == 4);
  CHECK(lenient[1].class_id == 2);
  CHECK(lenient[3].class_id == 6);
  CHECK(lenient[3].h * 50 == doctest::Approx(1.75));

  // Flipped: a box on the left lands on the right.
  p.flip = true;
  std::vector<Box> flipped;
  CHECK(transform_boxes({{0.2f, 0.5f, 0.2f, 0.2f, 0, false}}, p, 2, flipped) == 0);
  REQUIRE(flipped.size() == 1);
  CHECK(flipped[0].x == doctest::Approx(0.8));
}

TEST_CASE("multiscale_size: deterministic, constant within a period, multiples of 32 in range") {
  std::set<int> widths;
  for (int64_t period = 0; period < 400; ++period) {
    auto first = multiscale_size(42, period * 10, 416, 416);
    for (int64_t i = 1; i < 10; ++i) CHECK(multiscale_size(42, period * 10 + i, 416, 416) == first);
    CHECK(multiscale_size(42, period * 10, 416, 416) == first);
    CHECK(first.first % 32 == 0);
    CHECK(first.second == first.first);
    widths.insert(first.first);
  }
  std::set<int> expected;
  for (int w = 320; w <= 576; w += 32) expected.insert(w);
  CHECK(widths == expected);

  // Another seed gives another sequence; other periods group iterations differently.
  int differ = 0;
  for (int64_t it = 0; it < 200; it += 10) differ += multiscale_size(42, it, 416, 416) != multiscale_size(43, it, 416, 416);
  CHECK(differ > 5);
  CHECK(multiscale_size(42, 25, 416, 416, 50) == multiscale_size(42, 49, 416, 416, 50));

  // Non-square bases keep the aspect ratio, rounded to 32.
  for (int64_t it = 0; it < 500; it += 10) {
    auto [w, h] = multiscale_size(1, it, 608, 416);
    CHECK(w >= 448);  // ceil32(608 / 1.4 = 434.3)
    CHECK(w <= 832);  // floor32(608 * 1.4 = 851.2)
    CHECK(h == static_cast<int>(std::lround(w * 416.0 / 608 / 32)) * 32);
  }
  // 448 / 1.4 is exactly 320, which must stay in the range.
  std::set<int> from448;
  for (int64_t it = 0; it < 4000; it += 10) from448.insert(multiscale_size(5, it, 448, 448).first);
  CHECK(*from448.begin() == 320);
  CHECK(*from448.rbegin() == 608);
  // Tiny bases fall back to the base rounded to 32 (at least 32).
  CHECK(multiscale_size(1, 0, 10, 10) == std::pair<int, int>(32, 32));
  CHECK(multiscale_size(1, 0, 40, 1000) == std::pair<int, int>(32, 800));
}

TEST_CASE("multiscale_size rejects bad arguments") {
  CHECK_THROWS_WITH_AS(multiscale_size(1, 0, 0, 416), doctest::Contains("positive"), yolo::Error);
  CHECK_THROWS_WITH_AS(multiscale_size(1, 0, 416, -32), doctest::Contains("positive"), yolo::Error);
  CHECK_THROWS_WITH_AS(multiscale_size(1, 0, 416, 416, 0), doctest::Contains("period"), yolo::Error);
  CHECK_THROWS_WITH_AS(multiscale_size(1, -1, 416, 416), doctest::Contains("iteration"), yolo::Error);
  CHECK_THROWS_AS(multiscale_size(1, 0, 2000000000, 416), yolo::Error);
}
